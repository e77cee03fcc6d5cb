"""The distfact command line, run as a user would: a real process for an ingest, info and fit, and for a fit on
a local cluster; the other commands in this process (main() as the console script runs it, in the test's
directory), which skips a process's start-up (importing the library, loading numba's cache) and nothing the
commands do."""

import functools
import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from conftest import cli_here, grouped_data


def run(*args, cwd):
    return subprocess.run([sys.executable, "-m", "distfact.cli", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def cli(capsys):
    """:func:`run` in this process: ``distfact ARGS`` run by main() in ``cwd``, its exit status and output in a
    ``CompletedProcess`` as a real process's."""
    return functools.partial(cli_here, capsys)


@pytest.fixture
def npz_source(tmp_path):
    X, groups = grouped_data(m=80, n=12)
    path = tmp_path / "data.npz"
    np.savez(path, X=X, groups=groups)
    return path, X, groups


def test_ingest_info_fit(npz_source, tmp_path):
    path, X, groups = npz_source
    out = run("ingest", path, tmp_path / "x.zarr", "--block-rows", "10", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    info = run("info", tmp_path / "x.zarr", "--json", cwd=tmp_path)
    doc = json.loads(info.stdout)
    assert doc["shape"] == [80, 12] and [g["rows"] for g in doc["groups"]] == [
        int((groups == name).sum()) for name in ("g0", "g1", "g2")]
    fit = run("fit", tmp_path / "x.zarr", "--rank", "3", "--max-iter", "20", "--tol", "0", "--no-progress",
              "--output", tmp_path / "fit", cwd=tmp_path)
    assert fit.returncode == 0, fit.stderr
    metrics = json.loads((tmp_path / "fit" / "metrics.json").read_text())
    assert metrics["n_iter"] == 20 and metrics["n_passes"] == 21
    H = np.load(tmp_path / "fit" / "components.npy")
    assert H.shape == (3, 12)
    assert sorted(os.listdir(tmp_path / "fit" / "W"))[:1] == ["000000"]
    assert sorted(np.load(tmp_path / "fit" / "rows.npy")) == list(range(80))


def test_fit_on_a_local_cluster_matches_in_process(npz_source, tmp_path, cli):
    path, _, _ = npz_source
    assert cli("ingest", path, tmp_path / "x.zarr", "--block-rows", "10", cwd=tmp_path).returncode == 0
    common = ["--rank", "3", "--max-iter", "10", "--tol", "0", "--no-progress"]
    a = cli("fit", tmp_path / "x.zarr", *common, "--output", tmp_path / "a", cwd=tmp_path)
    b = run("fit", tmp_path / "x.zarr", *common, "--output", tmp_path / "b", "--local-cluster", "2", cwd=tmp_path)
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert "dashboard" in b.stderr
    assert json.loads((tmp_path / "b" / "metrics.json").read_text())["scheduler"]["workers"] == 2
    np.testing.assert_array_equal(np.load(tmp_path / "a" / "components.npy"), np.load(tmp_path / "b" / "components.npy"))


def test_bad_input_exits_2_with_a_message(npz_source, tmp_path, cli):
    path, X, groups = npz_source
    missing = cli("fit", tmp_path / "nowhere.zarr", "--rank", "2", cwd=tmp_path)
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    X[5, 3] = -2.0
    np.savez(tmp_path / "neg.npz", X=X, groups=groups)
    neg = cli("ingest", tmp_path / "neg.npz", tmp_path / "neg.zarr", cwd=tmp_path)
    assert neg.returncode == 2 and "negative value (-2.0) at row 5, column 3" in neg.stderr
    assert not (tmp_path / "neg.zarr").exists()
    assert cli("ingest", path, tmp_path / "x.zarr", cwd=tmp_path).returncode == 0
    rank = cli("fit", tmp_path / "x.zarr", "--rank", "50", "--output", tmp_path / "never", cwd=tmp_path)
    assert rank.returncode == 2 and "n_components=50 is larger" in rank.stderr
    assert not (tmp_path / "never").exists()
    usage = cli("fit", tmp_path / "x.zarr", cwd=tmp_path)
    assert usage.returncode == 2 and "--rank" in usage.stderr
    often = cli("fit", tmp_path / "x.zarr", "--rank", "2", "--checkpoint-every", "often", cwd=tmp_path)
    assert often.returncode == 2
    assert "--checkpoint-every: 'often': expected an integer >= 0 (0: never) or 'auto'" in often.stderr
    none = cli("warmup", "--processes", "0", cwd=tmp_path)
    assert none.returncode == 2 and "--processes: '0' must be >= 1" in none.stderr


def test_every_command_has_help(tmp_path, cli):
    for command in ("ingest", "info", "fit", "report", "run", "demo"):
        out = cli(command, "--help", cwd=tmp_path)
        assert out.returncode == 0 and "usage: distfact" in out.stdout


def test_demo_runs_the_demo_pipeline(tmp_path, cli):
    import datetime

    out = cli("demo", "--output", tmp_path / "demo", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "digit 0" in out.stdout and "relative_error" in out.stdout
    run_dir = tmp_path / "demo" / "demo" / datetime.date.today().isoformat()
    metrics = json.loads((run_dir / "metrics.json").read_text())
    errors = [row for row in metrics["worst_group"] if row["metric"] == "relative_error"]
    assert [row["rank"] for row in errors] == [5, 10] and all(0 < row["value"] < 1 for row in errors)
    page = (run_dir / "report" / "report.html").read_text()
    assert page.count("data:image/png;base64,") >= 4 and "digit 9" in page
    again = cli("demo", "--output", tmp_path / "demo", cwd=tmp_path)
    assert again.returncode == 0 and "nothing was rerun" in again.stdout


def test_fit_fairer_nmf(npz_source, tmp_path, cli):
    path, X, groups = npz_source
    assert cli("ingest", path, tmp_path / "x.zarr", cwd=tmp_path).returncode == 0
    out = cli("fit", tmp_path / "x.zarr", "--method", "fairer-nmf", "--rank", "2", "--max-iter", "30",
              "--no-progress", "--output", tmp_path / "fair", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    metrics = json.loads((tmp_path / "fair" / "metrics.json").read_text())
    table = pd.read_csv(tmp_path / "fair" / "group_metrics.csv")
    assert len(metrics["E"]) == 3
    assert metrics["max_group_loss"] == pytest.approx(table[table.metric == "relative_loss"].value.max(), rel=1e-12)
    assert sorted(os.listdir(tmp_path / "fair" / "W"))[:1] == ["000000"]


def test_fit_and_report_stratified_nmf(tmp_path, cli):
    from distfact.datasets import load_digit_strata

    X, strata, _ = load_digit_strata(per_digit=30)
    np.savez(tmp_path / "digits.npz", X=X, groups=strata)
    assert cli("ingest", tmp_path / "digits.npz", tmp_path / "d.zarr", cwd=tmp_path).returncode == 0
    out = cli("fit", tmp_path / "d.zarr", "--method", "stratified-nmf", "--rank", "3", "--max-iter", "20",
              "--no-progress", "--output", tmp_path / "fit", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    metrics = json.loads((tmp_path / "fit" / "metrics.json").read_text())
    assert metrics["strata"] == ["S1", "S2"] and metrics["n_passes"] == 21
    v = np.load(tmp_path / "fit" / "v.npy")
    model = __import__("distfact").StratifiedNMF(3, max_iter=20, random_state=0).fit(X, groups=strata)
    np.testing.assert_allclose(v, model.strata_features_, rtol=1e-10)
    assert cli("fit", tmp_path / "d.zarr", "--method", "stratified-nmf", "--solver", "hals", "--rank", "3",
               cwd=tmp_path).returncode == 2
    out = cli("report", tmp_path / "d.zarr", "--stratified", "--rank", "3", "--max-iter", "20", "--image-shape",
              "8x8", "--top", "4", "--output", tmp_path / "rep", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    for name in ("stratified.html", "top_features.csv", "fig3_strata_features.png", "fig4_strata_features_images.png",
                 "fig5_topics_images.png", "fig1_normalised_loss.png"):
        assert (tmp_path / "rep" / name).stat().st_size > 0
    rows = (tmp_path / "rep" / "top_features.csv").read_text().splitlines()
    assert rows[0] == "stratum,1,2,3,4" and rows[1].startswith("S1,x") and len(rows) == 3
    bad = cli("report", tmp_path / "d.zarr", "--stratified", "--image-shape", "7x7", cwd=tmp_path)
    assert bad.returncode == 2 and "49 pixels" in bad.stderr


def test_fit_wl1_nmf(tmp_path, cli):
    import scipy.sparse as sp

    X, groups = grouped_data(m=60, n=15, density=0.3, seed=3)
    np.savez(tmp_path / "data.npz", X=X, groups=groups)
    out = cli("ingest", tmp_path / "data.npz", tmp_path / "x.zarr", "--block-rows", "12", "--column-blocks",
              cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(cli("info", tmp_path / "x.zarr", "--json", cwd=tmp_path).stdout)["n_column_blocks"] >= 1
    out = cli("fit", tmp_path / "x.zarr", "--method", "wl1-nmf", "--rank", "3", "--lam", "0.5", "--hals-iter", "4",
              "--max-iter", "5", "--tol", "0", "--no-progress", "--output", tmp_path / "fit", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    metrics = json.loads((tmp_path / "fit" / "metrics.json").read_text())
    assert metrics["lam"] == 0.5 and metrics["n_iter"] == 5 and metrics["n_passes"] == (4 + 1) + 1 + 2 * 5
    model = __import__("distfact").WeightedL1NMF(3, lam=0.5, hals_iter=4, max_iter=5, tol=0, random_state=0)
    model.fit(sp.csr_matrix(X), groups=groups)
    np.testing.assert_allclose(np.load(tmp_path / "fit" / "components.npy"), model.components_, rtol=1e-10, atol=1e-12)
    assert metrics["l1_error"] == pytest.approx(model.reconstruction_err_, rel=1e-10)
    bad = cli("fit", tmp_path / "x.zarr", "--method", "nmf", "--lam", "0.5", "--rank", "3", cwd=tmp_path)
    assert bad.returncode == 2 and "--lam does not apply to nmf" in bad.stderr
    bad = cli("fit", tmp_path / "x.zarr", "--method", "wl1-nmf", "--lam", "2", "--rank", "3", cwd=tmp_path)
    assert bad.returncode == 2 and "The 'lam' parameter of WeightedL1NMF must be a float in the range [0.0, 1.0]" \
        in bad.stderr


def test_fit_ssnmf_with_the_groups_as_classes(npz_source, tmp_path, cli):
    path, X, groups = npz_source
    assert cli("ingest", path, tmp_path / "x.zarr", "--block-rows", "16", cwd=tmp_path).returncode == 0
    out = cli("fit", tmp_path / "x.zarr", "--method", "ssnmf", "--model", "FD", "--rank", "3", "--lam", "0.5",
              "--max-iter", "8", "--tol", "0", "--no-progress", "--output", tmp_path / "fit", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    metrics = json.loads((tmp_path / "fit" / "metrics.json").read_text())
    assert metrics["classes"] == ["g0", "g1", "g2"] and metrics["n_passes"] == 9
    model = __import__("distfact").SSNMF(3, model="FD", lam=0.5, max_iter=8, tol=0, random_state=0)
    model.fit(X, y=groups, groups=groups)  # the same stored row order as the store, so the same start
    np.testing.assert_allclose(np.load(tmp_path / "fit" / "B.npy"), model.B_, rtol=1e-10)
    np.testing.assert_allclose(np.load(tmp_path / "fit" / "components.npy"), model.components_, rtol=1e-10)
    bad = cli("fit", tmp_path / "x.zarr", "--method", "nmf", "--model", "DD", "--rank", "3", cwd=tmp_path)
    assert bad.returncode == 2 and "--model does not apply to nmf" in bad.stderr


def test_report_ssnmf(tmp_path, cli):
    from distfact.datasets import load_digits_grouped

    X, groups, _ = load_digits_grouped()
    keep = np.isin(groups, ["digit 0", "digit 1", "digit 7"])
    np.savez(tmp_path / "d.npz", X=X[keep], groups=groups[keep])
    assert cli("ingest", tmp_path / "d.npz", tmp_path / "d.zarr", cwd=tmp_path).returncode == 0
    out = cli("report", tmp_path / "d.zarr", "--ssnmf", "--rank", "4", "--max-iter", "30", "--top", "3",
              "--output", tmp_path / "rep", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    page = (tmp_path / "rep" / "ssnmf.html").read_text()
    assert page.count("data:image/png;base64,") == 2 and "digit 7" in page
    rows = (tmp_path / "rep" / "top_features.csv").read_text().splitlines()
    assert rows[0] == "topic,class,1,2,3" and len(rows) == 5
    B = np.array(json.loads((tmp_path / "rep" / "ssnmf.json").read_text())["normalised_B"])
    assert B.shape == (3, 4) and np.allclose(B.sum(axis=0), 1.0)


def test_multigroup_svd_from_a_signed_table(tmp_path, cli):
    """ingest --signed a CSV with negative values, fit --method multigroup-svd, report --multigroup."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((90, 5)) @ rng.standard_normal((5, 5)) - 1.0
    sex = np.where(rng.random(90) < 0.6, "M", "F")
    pd.DataFrame(X, columns=list("abcde")).assign(sex=sex).to_csv(tmp_path / "t.csv", index=False)
    refused = cli("ingest", tmp_path / "t.csv", tmp_path / "x.zarr", "--group-column", "sex", cwd=tmp_path)
    assert refused.returncode == 2 and "negative value" in refused.stderr and not (tmp_path / "x.zarr").exists()
    assert cli("ingest", tmp_path / "t.csv", tmp_path / "x.zarr", "--group-column", "sex", "--signed",
               cwd=tmp_path).returncode == 0
    nmf = cli("fit", tmp_path / "x.zarr", "--rank", "2", "--no-progress", cwd=tmp_path)
    assert nmf.returncode == 2 and "signed=True" in nmf.stderr
    fit = cli("fit", tmp_path / "x.zarr", "--method", "multigroup-svd", "--rank", "3", "--center", "--scale",
              "--output", tmp_path / "fit", cwd=tmp_path)
    assert fit.returncode == 0, fit.stderr
    import distfact

    direct = distfact.MultigroupSVD(3, center=True, scale=True).fit(X, groups=sex)
    np.testing.assert_allclose(np.load(tmp_path / "fit" / "components.npy"), direct.components_, atol=1e-12)
    metrics = json.loads((tmp_path / "fit" / "metrics.json").read_text())
    assert metrics["solver"] == "brent" and metrics["n_passes"] == 1 and max(map(abs, metrics["duality_gap"])) < 1e-8
    report = cli("report", tmp_path / "x.zarr", "--multigroup", "--rank", "3", "--center", "--scale",
                 "--output", tmp_path / "rep", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    page = (tmp_path / "rep" / "multigroup.html").read_text()
    assert page.count("data:image/png;base64,") == 2 and "Primal and dual objective" in page
    table = pd.read_csv(tmp_path / "rep" / "group_losses.csv")
    assert len(table) == 6 and {"incremental", "incremental_svd"} <= set(table.columns)
    np.testing.assert_allclose(table.groupby("rank").incremental.agg(np.ptp), 0, atol=1e-8)  # Lemma 7.3
    bad = cli("fit", tmp_path / "x.zarr", "--method", "multigroup-svd", "--rank", "2", "--solver", "hals",
              cwd=tmp_path)
    assert bad.returncode == 2 and "The 'solver' parameter of MultigroupSVD must be a str among" in bad.stderr


def test_fit_on_text_prints_the_groups_metrics_and_each_components_top_words(tmp_path, cli):
    """For a corpus (feature names are words) `distfact fit` prints the per-group metrics and the top words of
    each component, the same words the fitted H ranks highest."""
    import distfact

    topics = {"sport": "goal match team score league", "food": "bread cheese wine soup salad"}
    rng = np.random.default_rng(0)
    with open(tmp_path / "c.jsonl", "w") as f:
        for i in range(60):
            group = "sport" if i % 2 else "food"
            f.write(json.dumps({"text": " ".join(rng.choice(topics[group].split(), 8)), "group": group}) + "\n")
    ingest = cli("ingest", tmp_path / "c.jsonl", tmp_path / "c.zarr", "--vectorizer", "count", cwd=tmp_path)
    assert ingest.returncode == 0, ingest.stderr
    out = cli("fit", tmp_path / "c.zarr", "--rank", "2", "--no-progress", "-o", tmp_path / "fit", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "relative_error" in out.stdout and "sport" in out.stdout and "top features per component" in out.stdout
    model = distfact.load(tmp_path / "fit" / "model.npz")
    words = model.feature_names_in_[np.argsort(-model.components_[0], kind="stable")[:10]]
    assert f"  1  {', '.join(words)}" in out.stdout
