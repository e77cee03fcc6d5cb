"""Pipelines (distfact run): end to end as a user runs them (a real process), reruns, resume after a SIGKILL,
spec errors, a failing stage, publishing to an fsspec URL, the report in headless Chromium, scheduling files.

A real ``distfact`` process runs a pipeline's first run, the run killed mid-fit, and the run that holds the lock
a second one is refused; the other commands run in this process (main() as the console script runs it), which
skips a process's start-up (importing the library, loading numba's cache) and nothing the commands do."""

import configparser
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from distfact.pipeline import SpecError, load_spec, run_pipeline

from conftest import cli_in_process

# a complete checkpoint: its staging directory iter-NNNNNN.partial-<hex>/ holds COMMITTED before the rename
COMMITTED_CHECKPOINT = "iter-" + "[0-9]" * 6 + "/COMMITTED"

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATE = "2026-11-22"
SMALL = """
name = "small"
[input]
dataset = "digits"
block_rows = 300
[[fit]]
method = "nmf"
ranks = [3, 5]
solver = "hals"
max_iter = 20
tol = 0.0
[[fit]]
method = "fairer-nmf"
rank = 3
n_estimates = 1
max_iter = 10
estimate_max_iter = 10
[report]
title = "small"
image_shape = [8, 8]
"""


def run(*args, cwd):
    return subprocess.run([sys.executable, "-m", "distfact.cli", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def write_spec(tmp_path, text=SMALL, name="spec.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def snapshot(directory):
    return {os.path.relpath(p, directory): os.stat(p).st_mtime_ns
            for p in glob.glob(os.path.join(directory, "**"), recursive=True) if os.path.isfile(p)}


def test_end_to_end_then_a_rerun_does_nothing(tmp_path, monkeypatch, capsys):
    spec = write_spec(tmp_path)
    out = run("run", spec, "--output", tmp_path / "runs", "--date", DATE, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    run_dir = tmp_path / "runs" / "small" / DATE
    for stage in ("ingest", "fit", "evaluate", "report", "publish"):
        assert json.loads((run_dir / stage / "COMMITTED").read_text())["stage"] == stage
        assert not (run_dir / f"{stage}.partial").exists()
    assert not (run_dir.parent / f".{DATE}.partial").exists()  # built aside, swapped into place
    events = [json.loads(line) for line in out.stderr.splitlines() if line.startswith("{")]
    assert [e["stage"] for e in events if e["event"] == "done"] == ["ingest", "fit", "evaluate", "report", "publish"]
    assert all("seconds" in e for e in events if e["event"] == "done")
    # each fit's progress on stderr (lines with its rate and ETA, off a terminal), not in the run's log file
    progress = [e for e in events if e["event"] == "progress"]
    # (a fit alone names itself, a sweep of a [[fit]] table's ranks names its fits)
    assert ({name for e in progress for name in e.get("fits", [e.get("fit")])}
            == {e["fit"] for e in events if e["event"] == "fit-done"})
    assert any("it/s" in e["message"] and "ETA at most" in e["message"] and e["rate"] > 0 for e in progress)
    assert (run_dir / "log.jsonl").read_text().count("\n") == len(events) - len(progress)
    # the report: every PNG written is embedded and captioned in the page, with the tables
    page = (run_dir / "report" / "report.html").read_text()
    pngs = sorted(p.name for p in (run_dir / "report").glob("*.png"))
    assert len(pngs) >= 5 and page.count("data:image/png;base64,") == len(pngs)
    assert all(f"<figcaption>{name}</figcaption>" in page for name in pngs)
    assert "digit 9" in page and "Top features per component" in page and "passes over X" in page
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert set(metrics["stage_seconds"]) == {"ingest", "fit", "evaluate", "report"}
    assert [f["fit"] for f in metrics["fits"]] == ["nmf-r3", "nmf-r5", "fairer-nmf-r3"]
    assert (tmp_path / "runs" / "small" / "LATEST").read_text().strip() == DATE
    # the factors are the library's: same fit by hand
    import distfact

    H = distfact.NMF(5, solver="hals", max_iter=20, tol=0.0, random_state=0).fit(
        str(run_dir / "ingest" / "data.zarr")).components_
    assert np.array_equal(np.load(run_dir / "fit" / "nmf-r5" / "components.npy"), H)
    # ranks 3 and 5 were fitted in the same passes: 21 over X for both (pass 0 and 20 iterations), as for each alone
    sweep = [e for e in events if e["event"] == "sweep-done"]
    assert [e["fits"] for e in sweep] == [["nmf-r3", "nmf-r5"]] and sweep[0]["n_passes"] == 21
    for name in ("nmf-r3", "nmf-r5"):
        facts = json.loads((run_dir / "fit" / name / "fit.json").read_text())
        assert facts["sweep_passes"] == 21 and facts["n_passes"] == 21

    monkeypatch.chdir(tmp_path)
    before = snapshot(run_dir)
    code, out, _ = cli_in_process(capsys, "run", spec, "--output", tmp_path / "runs", "--date", DATE)
    assert code == 0 and "up to date" in out and "nothing to do" in out
    assert snapshot(run_dir) == before  # not a file touched

    spec.write_text(SMALL.replace('title = "small"', 'title = "small, retitled"'))
    code, out, _ = cli_in_process(capsys, "run", spec, "--output", tmp_path / "runs", "--date", DATE)
    assert code == 0 and "ran report, publish" in out
    assert "small, retitled" in (run_dir / "report" / "report.html").read_text()

    code, out, _ = cli_in_process(capsys, "run", spec, "--output", tmp_path / "runs", "--date", DATE, "--force")
    assert code == 0 and "ran ingest, fit, evaluate, report, publish" in out


# 150 iterations with a checkpoint every 5: a fit of a few seconds, long enough after its first checkpoint for a
# kill 0.3 s later to land mid-fit (checked), and for a second run to find the first still running
RESUMABLE = """
name = "resumable"
[input]
dataset = "digits"
block_rows = 300
[[fit]]
method = "nmf"
rank = 8
max_iter = 1000
tol = 0.0
[output]
checkpoint_every = 5
"""


def test_a_killed_fit_resumes_to_the_same_factors(tmp_path, monkeypatch, capsys):
    spec = write_spec(tmp_path, RESUMABLE)
    monkeypatch.chdir(tmp_path)
    code, _, err = cli_in_process(capsys, "run", spec, "--output", tmp_path / "whole", "--date", DATE)
    assert code == 0, err
    process = subprocess.Popen([sys.executable, "-m", "distfact.cli", "run", str(spec), "--output",
                                str(tmp_path / "cut"), "--date", DATE], cwd=tmp_path, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    partial = tmp_path / "cut" / "resumable" / f".{DATE}.partial" / "fit.partial" / "nmf-r8" / "checkpoints"
    deadline = time.time() + 300
    while not list(partial.glob(COMMITTED_CHECKPOINT)) and time.time() < deadline and process.poll() is None:
        time.sleep(0.05)
    # at once: the rest of the fit (1,000 iterations) takes about 1.5 s here; at 150 iterations a 0.3 s wait
    # outlasted it on CI
    process.send_signal(signal.SIGKILL)
    process.wait()
    run_dir = tmp_path / "cut" / "resumable" / DATE
    assert list(partial.glob(COMMITTED_CHECKPOINT)) and not (run_dir / "fit").exists(), "the kill must land mid-fit"
    code, _, err = cli_in_process(capsys, "run", spec, "--output", tmp_path / "cut", "--date", DATE, "--resume")
    assert code == 0, err
    assert "skip" in err and '"stage": "ingest", "event": "skip"' in err
    whole = tmp_path / "whole" / "resumable" / DATE / "fit" / "nmf-r8"
    assert np.array_equal(np.load(run_dir / "fit" / "nmf-r8" / "components.npy"), np.load(whole / "components.npy"))
    assert json.loads((run_dir / "fit" / "nmf-r8" / "fit.json").read_text())["n_iter"] == 1000


#: SMALL with one NMF rank: the pipeline of the resume, fsspec and scheduler tests
SMALL_R3 = SMALL.replace("ranks = [3, 5]", "ranks = [3]")


@pytest.fixture(scope="module")
def small_r3_run(tmp_path_factory):
    """A complete run of SMALL_R3 in this process (``run_pipeline``) under a root of its own, made once for the
    module: returns the root. Tests read it, or copy the root to change their copy."""
    tmp_path = tmp_path_factory.mktemp("small-r3")
    spec = write_spec(tmp_path, SMALL_R3)
    result = run_pipeline(spec, root=str(tmp_path / "runs"), date=DATE, stream=open(os.devnull, "w"))
    assert result["ran"] == ["ingest", "fit", "evaluate", "report", "publish"]
    return tmp_path / "runs"


def test_resume_redoes_fits_whose_spec_changed(tmp_path, small_r3_run):
    """A leftover fit.partial with finished fits of another spec is discarded, not reused. (The first run of the
    spec: ``small_r3_run``'s, copied.)"""
    spec = write_spec(tmp_path, SMALL_R3)
    shutil.copytree(small_r3_run, tmp_path / "runs")
    run_dir = str(tmp_path / "runs" / "small" / DATE)
    assert os.path.isdir(run_dir)
    build = os.path.join(os.path.dirname(run_dir), f".{DATE}.partial")  # as if a rerun was killed after its fits
    shutil.copytree(run_dir, build)
    os.rename(os.path.join(build, "fit"), os.path.join(build, "fit.partial"))
    os.remove(os.path.join(build, "fit.partial", "COMMITTED"))
    open(os.path.join(build, "distfact-partial.json"), "w").write("{}")
    spec.write_text(SMALL_R3.replace("max_iter = 20", "max_iter = 7"))
    log = tmp_path / "log.txt"
    with open(log, "w") as stream:
        second = run_pipeline(spec, root=str(tmp_path / "runs"), date=DATE, resume=True, stream=stream)
    assert "fit" in second["ran"] and "made with another spec or data" in log.read_text()
    assert json.loads(open(os.path.join(run_dir, "fit", "nmf-r3", "fit.json")).read())["n_iter"] == 7
    assert not os.path.exists(os.path.join(run_dir, "fit", "nmf-r3", "checkpoints"))  # dropped once DONE


def test_a_second_run_of_the_same_date_is_refused_while_one_runs(tmp_path, monkeypatch, capsys):
    spec = write_spec(tmp_path, RESUMABLE)
    first = subprocess.Popen([sys.executable, "-m", "distfact.cli", "run", str(spec), "--output",
                              str(tmp_path / "runs"), "--date", DATE], cwd=tmp_path, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    partial = tmp_path / "runs" / "resumable" / f".{DATE}.partial" / "fit.partial"
    deadline = time.time() + 120
    while not partial.exists() and time.time() < deadline:
        time.sleep(0.05)
    monkeypatch.chdir(tmp_path)
    code, _, err = cli_in_process(capsys, "run", spec, "--output", tmp_path / "runs", "--date", DATE)
    first.kill()
    first.wait()
    assert code == 1 and "is in progress" in err, err
    assert partial.exists()  # the second run touched nothing of the first's


NA_SPEC = """
name = "na"
[input]
source = "x.npz"
[[fit]]
method = "nmf"
ranks = [2, 3]
max_iter = 5
"""


def test_groups_named_like_missing_values_stay_in_the_report(tmp_path):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "x.npz", X=rng.random((60, 6)), groups=np.repeat(["NA", "EU"], 30))
    spec = write_spec(tmp_path, NA_SPEC)
    result = run_pipeline(spec, root=str(tmp_path / "runs"), date=DATE, stream=open(os.devnull, "w"))
    page = open(os.path.join(result["run_dir"], "report", "report.html")).read()
    assert page.count("<td>NA</td>") == 2 and page.count("<td>EU</td>") == 2  # relative_error and loss tables


@pytest.mark.parametrize("change, line, words", [
    (('solver = "hals"', 'solvr = "hals"'), 9, ["[fit] #1 key 'solvr'", "unknown key", "did you mean 'solver'"]),
    (("max_iter = 20", 'max_iter = "twenty"'), 10, ["[fit] #1 key 'max_iter'", "expected an integer", "'twenty'"]),
    (('dataset = "digits"', 'source = "missing.csv"\ngroup_column = "g"'), 4, ["[input] key 'source'",
                                                                             "does not exist"]),
    (('method = "nmf"', 'method = "nfm"'), 7, ["unknown method 'nfm'", "did you mean 'nmf'"]),
    (("[report]", "[reprot]"), 18, ["[reprot]: unknown key", "did you mean 'report'"]),
    (("n_estimates = 1", "n_estimates = 1.5"), 15, ["[fit] #2 key 'n_estimates'", "expected an integer"]),
    (('solver = "hals"', 'solver = "halss"'), 9, ["[fit] #1 key 'solver'", "The 'solver' parameter of NMF must be a "
                                                                           "str among", "'halss'"]),
    (("max_iter = 20", "max_iter = -1"), 10, ["[fit] #1 key 'max_iter'", "in the range [0, inf)"]),
    (("image_shape = [8, 8]", 'image_shape = [8, 8]\n[output]\ncheckpoint_every = "often"'), 22,
     ["[output] key 'checkpoint_every'", 'an integer >= 0 (0: no checkpoints) or "auto"', "str 'often'"]),
    (("image_shape = [8, 8]", "image_shape = [8, 8]\n[output]\ncheckpoint_every = true"), 22,
     ["[output] key 'checkpoint_every'", "got bool True"]),
])
def test_spec_errors_name_the_key_and_line_before_any_work(tmp_path, monkeypatch, capsys, change, line, words):
    spec = write_spec(tmp_path, SMALL.replace(*change))
    monkeypatch.chdir(tmp_path)
    code, _, err = cli_in_process(capsys, "run", spec, "--output", tmp_path / "runs")
    assert code == 2
    assert f"spec.toml:{line}:" in err, err
    assert all(word in err for word in words), err
    assert not (tmp_path / "runs").exists()  # nothing was started


def test_a_failing_stage_publishes_nothing_and_its_committed_stages_are_reused(tmp_path, monkeypatch, capsys):
    spec = write_spec(tmp_path, SMALL.replace("ranks = [3, 5]", "ranks = [3, 100]"))  # 100 > 64 features
    monkeypatch.chdir(tmp_path)
    code, _, err = cli_in_process(capsys, "run", spec, "--output", tmp_path / "runs", "--date", DATE)
    assert code == 1
    assert "stage 'fit' failed" in err and "n_components=100" in err
    run_dir, build = tmp_path / "runs" / "small" / DATE, tmp_path / "runs" / "small" / f".{DATE}.partial"
    assert not run_dir.exists() and not (tmp_path / "runs" / "small" / "LATEST").exists()  # nothing published
    assert (build / "ingest" / "COMMITTED").exists()  # built aside, kept for the next run
    assert not (build / "fit").exists() and not (build / "fit.partial").exists()
    assert '"event": "fail"' in (build / "log.jsonl").read_text()
    spec.write_text(SMALL)
    code, out, err = cli_in_process(capsys, "run", spec, "--output", tmp_path / "runs", "--date", DATE)
    assert code == 0 and "ran fit, evaluate, report, publish" in out, err
    assert not build.exists() and (run_dir / "report" / "report.html").exists()
    assert '"event": "fail"' in (run_dir / "log.jsonl").read_text()  # the date's whole history


def test_publish_to_an_fsspec_url(tmp_path, monkeypatch):
    import fsspec

    monkeypatch.setenv("HOME", str(tmp_path))  # the local work directory of a remote root: ~/.cache/distfact
    spec = write_spec(tmp_path, SMALL_R3)
    result = run_pipeline(spec, root="memory://published", date=DATE, stream=open(os.devnull, "w"))
    assert result["ran"][-1] == "publish" and str(tmp_path) in result["run_dir"]
    fs = fsspec.filesystem("memory")
    base = f"/published/small/{DATE}"
    assert fs.exists(f"{base}/PUBLISHED") and fs.exists(f"{base}/report/report.html")
    assert json.loads(fs.cat(f"{base}/metrics.json"))["pipeline"] == "small"


@pytest.mark.cluster
def test_on_a_dask_scheduler(tmp_path, local_cluster_client, small_r3_run):
    """The fits of a run on a scheduler are those of the same spec run here (``small_r3_run``)."""
    spec = write_spec(tmp_path, SMALL_R3)
    here = {"run_dir": str(small_r3_run / "small" / DATE)}
    there = run_pipeline(spec, root=str(tmp_path / "there"), date=DATE, stream=open(os.devnull, "w"),
                         scheduler=local_cluster_client.scheduler.address)
    marker = json.loads(open(os.path.join(there["run_dir"], "fit", "COMMITTED")).read())
    assert marker["scheduler"] == local_cluster_client.scheduler.address and marker["workers"] == 2
    for name in ("nmf-r3", "fairer-nmf-r3"):
        assert np.array_equal(np.load(os.path.join(here["run_dir"], "fit", name, "components.npy")),
                              np.load(os.path.join(there["run_dir"], "fit", name, "components.npy")))


def test_the_example_pipelines_validate():
    specs = glob.glob(os.path.join(ROOT, "pipelines", "*.toml")) + [os.path.join(ROOT, "distfact", "pipeline",
                                                                                "demo.toml")]
    methods = {fit.method for path in specs for fit in load_spec(path).fits}
    assert methods == {"nmf", "fairer-nmf", "stratified-nmf", "wl1-nmf", "ssnmf", "multigroup-svd"}
    with pytest.raises(SpecError, match="no such pipeline spec"):
        load_spec(os.path.join(ROOT, "pipelines", "missing.toml"))


def test_multigroup_pipeline_gives_every_rank_from_one_fit(tmp_path):
    spec = write_spec(tmp_path, open(os.path.join(ROOT, "pipelines", "heart-multigroup.toml")).read()
                      .replace('root = "runs"', f'root = "{tmp_path / "runs"}"'))
    result = run_pipeline(spec, date=DATE, stream=open(os.devnull, "w"))
    import pandas as pd

    table = pd.read_csv(os.path.join(result["run_dir"], "evaluate", "group_metrics.csv"))
    assert sorted(table["rank"].unique()) == list(range(1, 9)) and table["fit"].unique().tolist() == ["multigroup-svd-r8"]
    incremental = table[table.metric == "incremental_loss"].pivot(index="rank", columns="group", values="value")
    np.testing.assert_allclose(incremental["Female"], incremental["Male"], rtol=1e-9)  # Lemma 7.3, two groups
    page = open(os.path.join(result["run_dir"], "report", "report.html")).read()
    assert "multigroup-svd-r8-fig2_losses.png" in page and "multigroup-svd-r8-fig3_duality.png" in page


def test_scheduling_files():
    cron = [line for line in open(os.path.join(ROOT, "pipelines", "crontab.example")) if not line.startswith("#")]
    fields = cron[0].split()
    assert len(fields) > 5 and all(re.fullmatch(r"[\d*/,-]+", f) for f in fields[:5])
    assert "distfact run pipelines/" in cron[0]
    units = {}
    for name in ("distfact-nightly.service", "distfact-nightly.timer"):
        parser = configparser.ConfigParser(strict=False, interpolation=None)
        parser.optionxform = str
        parser.read(os.path.join(ROOT, "pipelines", "systemd", name))
        units[name] = parser
    assert units["distfact-nightly.timer"]["Timer"]["Persistent"] == "true"
    assert units["distfact-nightly.timer"]["Timer"]["OnCalendar"]
    assert "distfact run" in units["distfact-nightly.service"]["Service"]["ExecStart"]
    assert units["distfact-nightly.service"]["Service"]["Type"] == "oneshot"
    import yaml

    job = yaml.safe_load(open(os.path.join(ROOT, "cluster", "k8s", "pipeline-cronjob.yaml")))
    assert job["kind"] == "CronJob" and job["apiVersion"] == "batch/v1"
    assert len(job["spec"]["schedule"].split()) == 5
    command = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:2] == ["distfact", "run"] and "--scheduler" in command


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def chromium_flags(tmp_path) -> list[str]:
    return ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}"]


def rendered_in_chromium(page, tmp_path) -> tuple[list[int], str]:
    """The decoded width of each image of ``page`` after Chromium loaded it, and the DOM; checks that the page
    fetches nothing (readable offline) and that every PNG beside it is one of its images, decoded wider than 100
    pixels."""
    # the DOM after load, with each image's decoded width written into the page by a script
    probe = tmp_path / "probe.html"
    probe.write_text(open(page).read().replace("</body>", "<script>window.addEventListener('load', () => "
                     "document.body.setAttribute('data-widths', [...document.images].map(i => i.naturalWidth)"
                     ".join(',')));</script></body>"))
    browser = subprocess.run([CHROMIUM, *chromium_flags(tmp_path), "--virtual-time-budget=5000", "--dump-dom",
                              f"file://{probe}"], capture_output=True, text=True, timeout=120)
    dom = browser.stdout
    found = re.search(r'data-widths="([\d,]*)"', dom)
    assert browser.returncode == 0 and found, f"Chromium did not render the page: {browser.stderr[-2000:]}"
    widths = [int(w) for w in found.group(1).split(",")]
    assert not re.search(r'(src|href)="(?!data:)', open(page).read())  # nothing to fetch: readable offline
    assert len(widths) == len(glob.glob(os.path.join(os.path.dirname(page), "*.png"))) and min(widths) > 100
    return widths, dom


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine (apt install chromium); "
                                             "docs/pipelines.md has the documented check")
def test_the_report_renders_in_headless_chromium(tmp_path):
    spec = write_spec(tmp_path, SMALL.replace("ranks = [3, 5]", "ranks = [3, 4]"))
    result = run_pipeline(spec, root=str(tmp_path / "runs"), date=DATE, stream=open(os.devnull, "w"))
    page = os.path.join(result["run_dir"], "report", "report.html")
    flags = chromium_flags(tmp_path)
    _, dom = rendered_in_chromium(page, tmp_path)
    assert dom.count("<table>") >= 5
    shot = tmp_path / "shot.png"
    subprocess.run([CHROMIUM, *flags, f"--screenshot={shot}", "--window-size=1000,9000", f"file://{page}"],
                   capture_output=True, timeout=120, check=True)
    import matplotlib.image

    pixels = matplotlib.image.imread(str(shot))[..., :3]
    colourful = (pixels.max(axis=2) - pixels.min(axis=2)) > 0.3  # plot lines and markers, not text or borders
    assert colourful.mean() > 1e-3


def test_the_cluster_table_takes_a_tls_directory_relative_to_the_spec(tmp_path):
    cluster = '\n[cluster]\nkind = "scheduler"\naddress = "tls://127.0.0.1:8786"\ntls_dir = "certs"\n'
    with pytest.raises(SpecError, match=r"spec.toml:\d+: \[cluster\] key 'tls_dir'.*is not a directory"):
        load_spec(write_spec(tmp_path, SMALL + cluster))
    (tmp_path / "certs").mkdir()
    assert load_spec(write_spec(tmp_path, SMALL + cluster)).cluster["tls_dir"] == str(tmp_path / "certs")
    with pytest.raises(SpecError, match="key 'tls_dir': is for kind = 'scheduler'"):
        load_spec(write_spec(tmp_path, SMALL + cluster.replace('"scheduler"', '"local"')))


def test_the_data_digest_of_a_store_covers_appended_blocks_and_their_masks(tmp_path):
    """The ingest stage's digest of an [input] store: every block's files, found by its node (an appended block
    lives under versions/<k>/), masks included; column blocks, which fits add, do not count."""
    import distfact
    from distfact.pipeline.run import data_digest

    rng = np.random.default_rng(0)
    X = rng.random((40, 6))
    X[rng.random(X.shape) < 0.1] = np.nan
    groups = np.repeat(["a", "b"], 20)
    store = distfact.from_arrays(X[:30], groups[:30], tmp_path / "s", block_rows=5, missing="nan")
    spec = load_spec(write_spec(tmp_path, SMALL.replace('dataset = "digits"', 'store = "s"')))
    before = data_digest(spec)
    appended = store.append(X[30:], groups[30:], block_rows=5)
    digests = [before, data_digest(spec)]
    block = next(b for b in appended.blocks if b.version == 1 and b.mask.nnz)
    for array in ("X", "mask/data"):  # a chunk of the appended block's X rewritten, then one of its mask
        chunk = os.path.join(appended.path, block.node, array, "c", "0" if "/" in array else "0/0")
        os.utime(chunk, ns=(os.stat(chunk).st_atime_ns, os.stat(chunk).st_mtime_ns + 10**9))
        digests.append(data_digest(spec))
    assert len(set(digests)) == 4
    appended.with_column_blocks(n_blocks=2)
    assert data_digest(spec) == digests[-1]
