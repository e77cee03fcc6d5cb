"""Pipelines with ``ranks = "auto"`` (issue 20): a real run on data of a planted rank chooses it, writes the
selection (table and choice) beside the fit, fits the chosen rank bitwise as a direct fit, reports the held-out
error by rank (checked in headless Chromium where installed); a resumed fit stage reuses a finished selection;
spec errors; the [select] and ``distfact select-rank`` defaults are select_rank's; ``select-rank --report``."""

import inspect
import json
import os
import shutil

import matplotlib.image
import numpy as np
import pandas as pd
import pytest

import distfact
from distfact.cli import _parser
from distfact.pipeline import SpecError, load_spec, run_pipeline
from distfact.reports.selection import read_selection

from conftest import cli_here, cli_in_process
from test_pipeline import CHROMIUM, DATE, rendered_in_chromium, write_spec
from test_select_rank import low_rank

PLANTED = 3
AUTO = """
name = "auto"
[input]
source = "x.npz"
block_rows = 40
[[fit]]
method = "nmf"
ranks = "auto"
solver = "hals"
max_iter = 100
tol = 0.0
[select]
ranks = "1:5"
n_splits = 4
[report]
title = "auto"
"""


def planted_data(directory):
    X, groups = low_rank(0, m=150, n=30, rank=PLANTED)
    np.savez(directory / "x.npz", X=X, groups=groups)


def events_of(log_path):
    return [json.loads(line) for line in open(log_path) if line.startswith("{")]


@pytest.fixture(scope="module")
def auto_run(tmp_path_factory):
    """One pipeline run of AUTO (its run directory and the events it logged on its stream)."""
    directory = tmp_path_factory.mktemp("auto")
    planted_data(directory)
    spec = write_spec(directory, AUTO)
    with open(directory / "stream.txt", "w") as stream:
        result = run_pipeline(spec, root=str(directory / "runs"), date=DATE, stream=stream)
    return directory, spec, result["run_dir"], events_of(directory / "stream.txt")


def test_auto_chooses_the_planted_rank_and_fits_it_as_a_direct_fit(auto_run):
    directory, spec, run_dir, events = auto_run
    fit_dir = os.path.join(run_dir, "fit", "nmf-auto")
    choice = json.load(open(os.path.join(fit_dir, "selection.json")))
    assert choice["rank"] == PLANTED and choice["choices"]["min"] == PLANTED and choice["rule"] == "min"
    assert (choice["ranks"], choice["n_splits"], choice["holdout"], choice["random_state"]) == ([1, 2, 3, 4, 5], 4,
                                                                                               0.1, 0)
    assert [row["rank"] for row in choice["summary"]] == [1, 2, 3, 4, 5]
    # the table is select_rank's on the ingested store, with the fit's estimator and the [select] settings
    data = distfact.open(os.path.join(run_dir, "ingest", "data.zarr"))
    expected = distfact.select_rank(distfact.NMF(solver="hals", max_iter=100, tol=0.0, random_state=0), data,
                                    ranks=range(1, 6), n_splits=4, random_state=0)
    table = pd.read_csv(os.path.join(fit_dir, "selection.csv"), keep_default_na=False, dtype={"group": str})
    pd.testing.assert_frame_equal(table, expected.table.astype({"group": str}), check_exact=True)
    # the fit is a fit of the chosen rank: bitwise a direct fit with the same seed
    direct = distfact.NMF(PLANTED, solver="hals", max_iter=100, tol=0.0, random_state=0).fit(data)
    assert np.array_equal(np.load(os.path.join(fit_dir, "components.npy")), direct.components_)
    assert json.load(open(os.path.join(fit_dir, "fit.json")))["rank"] == PLANTED
    metrics = pd.read_csv(os.path.join(run_dir, "evaluate", "group_metrics.csv"))
    assert set(metrics["fit"]) == {"nmf-auto"} and set(metrics["rank"]) == {PLANTED}
    # progress of the selection's sweep, as of every long step, and its end in the log
    selecting = [e for e in events if e["event"] == "progress" and "selecting among ranks 1..5" in e["message"]]
    assert selecting and all(e["fit"] == "nmf-auto" for e in selecting)
    done = [e for e in events if e["event"] == "select-done"]
    assert len(done) == 1 and done[0]["rank"] == PLANTED and done[0]["rule"] == "min"
    # a rerun with the same spec and data does nothing
    assert run_pipeline(spec, root=str(directory / "runs"), date=DATE, stream=open(os.devnull, "w"))["ran"] == []


def test_the_report_shows_held_out_error_by_rank_with_the_choice(auto_run, tmp_path):
    _, _, run_dir, _ = auto_run
    report = os.path.join(run_dir, "report")
    page = open(os.path.join(report, "report.html")).read()
    figure = "nmf-auto-heldout-by-rank.png"
    assert f"<figcaption>{figure}</figcaption>" in page and "Rank selection: nmf-auto" in page
    assert "<td>chosen rank</td><td>3</td>" in page and "<td>&lt;- chosen</td>" in page
    summary = pd.read_csv(os.path.join(report, "nmf-auto-selection.csv"))
    assert summary["rank"].tolist() == [1, 2, 3, 4, 5]
    pixels = matplotlib.image.imread(os.path.join(report, figure))[..., :3]
    assert pixels.shape[1] > 400 and pixels.shape[0] > 250
    red = (pixels[..., 0] > 0.7) & (pixels[..., 1] < 0.5) & (pixels[..., 2] < 0.5)  # the chosen rank's line
    assert red.sum() > 100
    if CHROMIUM is not None:  # in a real browser: every image decodes, the selection's among them
        widths, dom = rendered_in_chromium(os.path.join(report, "report.html"), tmp_path)
        assert "Rank selection" in dom and len(widths) == len([n for n in os.listdir(report) if n.endswith(".png")])


def test_a_resumed_fit_stage_reuses_a_finished_selection(auto_run, tmp_path):
    """As if a run was killed in the chosen rank's fit, after its selection: --resume does not select again."""
    directory, spec, run_dir, _ = auto_run
    root = tmp_path / "runs"
    shutil.copytree(os.path.dirname(run_dir), root / "auto")
    build = root / "auto" / f".{DATE}.partial"
    os.rename(root / "auto" / DATE, build)
    os.rename(build / "fit", build / "fit.partial")  # keeps the stage's HASH, which --resume matches
    os.remove(build / "fit.partial" / "COMMITTED")
    fit_dir = build / "fit.partial" / "nmf-auto"
    for name in ("DONE", "model.npz", "components.npy", "fit.json"):
        os.remove(fit_dir / name)
    shutil.rmtree(fit_dir / "W")
    open(build / "distfact-partial.json", "w").write("{}")
    selected = os.stat(fit_dir / "selection.csv").st_mtime_ns
    with open(tmp_path / "stream.txt", "w") as stream:
        result = run_pipeline(spec, root=str(root), date=DATE, resume=True, stream=stream)
    events = events_of(tmp_path / "stream.txt")
    assert "fit" in result["ran"] and [e["event"] for e in events if "select" in e["event"]] == ["skip-select"]
    final = os.path.join(result["run_dir"], "fit", "nmf-auto")
    assert os.stat(os.path.join(final, "selection.csv")).st_mtime_ns == selected
    assert np.array_equal(np.load(os.path.join(final, "components.npy")),
                          np.load(os.path.join(run_dir, "fit", "nmf-auto", "components.npy")))


FIT_BLOCK = 'method = "nmf"\nranks = "auto"\nsolver = "hals"\nmax_iter = 100\ntol = 0.0'


@pytest.mark.parametrize("change, line, words", [
    (("[select]\nranks = \"1:5\"\nn_splits = 4\n", ""), 8, ["[fit] #1 key 'ranks'", "needs a [select] table"]),
    (('ranks = "auto"', "ranks = [2, 3]"), 12, ["[select]", "no [[fit]] has it"]),
    (('ranks = "auto"', 'ranks = "aut"'), 8, ["[fit] #1 key 'ranks'", "expected a list of ranks or 'auto'"]),
    (("n_splits = 4", "n_split = 4"), 14, ["[select] key 'n_split'", "did you mean 'n_splits'"]),
    (("n_splits = 4", 'rule = "best"'), 14, ["[select] key 'rule'", "rule must be one of"]),
    (("n_splits = 4", 'fit = "both"'), 14, ["[select] key 'fit'", "fit must be one of ('joint', 'per_group')"]),
    (("n_splits = 4", "fit = 1"), 14, ["[select] key 'fit'", "expected a string"]),
    (("n_splits = 4", "n_splits = 1"), 14, ["[select] key 'n_splits'", "n_splits must be an integer >= 2"]),
    (("n_splits = 4", "holdout = 0.3"), 14, ["[select] key 'holdout'", "n_splits * holdout must be <= 1"]),
    (("n_splits = 4", "holdout = 1"), 14, ["[select] key 'holdout'", "holdout must be a fraction in (0, 1)"]),
    (("n_splits = 4", "random_state = -1"), 14, ["[select] key 'random_state'", "non-negative"]),
    (('ranks = "1:5"', 'ranks = "5:2"'), 13, ["[select] key 'ranks'", "1 <= FIRST <= LAST"]),
    (('ranks = "1:5"', "ranks = [0, 2]"), 13, ["[select] key 'ranks'", "positive integers"]),
    (('ranks = "1:5"', 'rnks = "1:5"'), 13, ["[select] key 'rnks'", "unknown key"]),
    ((FIT_BLOCK, 'method = "multigroup-svd"\nranks = "auto"'), 8, ["[fit] #1 key 'ranks'", "multigroup-svd cannot "
                                                                   "take", "cannot use MultigroupSVD", "takes no mask"]),
])
def test_spec_errors_name_the_key_and_line(tmp_path, change, line, words):
    planted_data(tmp_path)
    assert change[0] in AUTO
    with pytest.raises(SpecError) as error:
        load_spec(write_spec(tmp_path, AUTO.replace(*change)))
    message = str(error.value)
    assert f"spec.toml:{line}:" in message and all(word in message for word in words), message


def test_select_defaults_are_select_ranks_and_the_seed_the_fits(tmp_path):
    planted_data(tmp_path)
    spec = load_spec(write_spec(tmp_path, AUTO.replace("n_splits = 4", "").replace("tol = 0.0", "tol = 0.0\nseed = 7")))
    defaults = {name: p.default for name, p in inspect.signature(distfact.select_rank).parameters.items()}
    assert spec.fits[0].select == {"ranks": [1, 2, 3, 4, 5], "n_splits": defaults["n_splits"],
                                   "holdout": defaults["holdout"], "rule": defaults["rule"],
                                   "fit": defaults["fit"], "random_state": 7}
    assert spec.fits[0].ranks == []
    chosen = load_spec(write_spec(tmp_path, AUTO.replace("n_splits = 4", "random_state = 3\nrule = \"one_se\"\n"
                                                                          "fit = \"per_group\"")))
    assert chosen.fits[0].select["random_state"] == 3 and chosen.fits[0].select["rule"] == "one_se"
    assert chosen.fits[0].select["fit"] == "per_group"
    listed = load_spec(write_spec(tmp_path, AUTO.replace('ranks = "1:5"', "ranks = [4, 2, 4]")))
    assert listed.fits[0].select["ranks"] == [2, 4]


def test_the_command_line_defaults_are_select_ranks():
    args = _parser().parse_args(["select-rank", "store", "--ranks", "1:3"])
    defaults = inspect.signature(distfact.select_rank).parameters
    assert (args.n_splits, args.holdout, args.rule, args.fit) == tuple(defaults[k].default for k in (
        "n_splits", "holdout", "rule", "fit"))
    assert args.no_progress is False and args.report is None


def test_select_rank_report_on_the_command_line(tmp_path, capsys):
    X, groups = low_rank(1, m=120, n=30, rank=PLANTED)
    distfact.from_arrays(X, groups, path=str(tmp_path / "x.zarr"), block_rows=25)
    command = ["select-rank", tmp_path / "x.zarr", "--method", "nmf", "--solver", "hals", "--max-iter", "100", "--tol",
               "0", "--ranks", "2:5", "--n-splits", "3", "--seed", "1", "--report", tmp_path / "report"]

    def run(*args):
        return cli_here(capsys, *args)

    out = run(*command)
    assert out.returncode == 0, out.stderr
    assert "select-rank: iteration 100/100" in out.stderr  # progress lines off a terminal
    choice = json.load(open(tmp_path / "report" / "selection.json"))
    assert choice["rank"] == PLANTED and choice["method"] == "nmf" and choice["n_splits"] == 3
    page = (tmp_path / "report" / "report.html").read_text()
    assert "<figcaption>nmf-heldout-by-rank.png</figcaption>" in page and "<td>&lt;- chosen</td>" in page
    assert f"chosen rank (min): {PLANTED}" in out.stdout and str(tmp_path / "report" / "report.html") in out.stdout
    again = run(*command, "--no-progress")
    assert again.returncode == 2 and "--report" in again.stderr and "iteration" not in again.stderr
    quiet = run(*command, "--no-progress", "--overwrite")
    assert quiet.returncode == 0 and "iteration" not in quiet.stderr, quiet.stderr
    assert json.load(open(tmp_path / "report" / "selection.json")) == choice


def per_group_reference(X, groups, block_rows, seed):
    """select_rank(fit="per_group") in memory, with the models of the command and the spec below."""
    return distfact.select_rank(distfact.NMF(1, solver="hals", max_iter=100, tol=0.0, random_state=seed),
                                distfact.from_arrays(X, groups, block_rows=block_rows), ranks=range(1, 6),
                                n_splits=4, random_state=seed, fit="per_group")


def test_per_group_fits_on_the_command_line_and_in_a_pipeline(tmp_path, capsys):
    """``--fit per_group`` and [select] ``fit = "per_group"`` reach select_rank: the command's table and the
    pipeline's selection equal select_rank(fit="per_group") called in memory on the same data (a second path:
    no CLI, no spec, no store on disk), and both record the fits."""
    planted_data(tmp_path)
    data = np.load(tmp_path / "x.npz")
    reference = per_group_reference(data["X"], data["groups"], 40, 0)
    assert reference.rank_ == PLANTED
    distfact.from_arrays(data["X"], data["groups"], path=str(tmp_path / "x.zarr"), block_rows=40)
    code, _, err = cli_in_process(capsys, "select-rank", tmp_path / "x.zarr", "--method", "nmf", "--solver", "hals",
                                  "--max-iter", "100", "--tol", "0", "--ranks", "1:5", "--n-splits", "4", "--fit",
                                  "per_group", "--seed", "0", "--no-progress", "--output", tmp_path / "table.csv",
                                  "--report", tmp_path / "report")
    assert code == 0, err
    table = pd.read_csv(tmp_path / "table.csv", keep_default_na=False, dtype={"group": str})
    pd.testing.assert_frame_equal(table, reference.table, check_exact=False, rtol=1e-12)
    assert json.load(open(tmp_path / "report" / "selection.json"))["fit"] == "per_group"
    assert "<td>fits</td><td>per_group</td>" in (tmp_path / "report" / "report.html").read_text()
    spec = write_spec(tmp_path, AUTO.replace("n_splits = 4", "n_splits = 4\nfit = \"per_group\"\nrandom_state = 0"))
    run_dir = run_pipeline(spec, root=str(tmp_path / "runs"), date=DATE, stream=open(os.devnull, "w"))["run_dir"]
    selection, facts = read_selection(os.path.join(run_dir, "fit", "nmf-auto"))
    assert facts["fit"] == selection.fit == "per_group" and selection.rank_ == PLANTED
    pd.testing.assert_frame_equal(selection.table, reference.table, check_exact=False, rtol=1e-12)


def test_a_changed_select_table_redoes_the_fit_stage(tmp_path):
    from distfact.pipeline.run import stage_hashes

    planted_data(tmp_path)
    variants = (AUTO, AUTO.replace("n_splits = 4", "n_splits = 4\nrule = \"one_se\""),
                AUTO.replace('ranks = "1:5"', "ranks = [1, 2, 3, 4, 5]"), AUTO.replace('title = "auto"', 'title = "other"'))
    hashes = [stage_hashes(load_spec(write_spec(tmp_path, text, f"{i}.toml")), "runs") for i, text in enumerate(variants)]
    assert hashes[0]["fit"] != hashes[1]["fit"]  # another rule: selected again
    assert hashes[0] == hashes[2]  # the same ranks, written as a list
    assert hashes[0]["fit"] == hashes[3]["fit"] and hashes[0]["report"] != hashes[3]["report"]
