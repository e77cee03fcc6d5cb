"""Nightly pipelines (issue 21): consecutive runs on data whose rows grow, warm starts from the previous run,
component ids kept across runs, trends and alerts (exit status 3), retention (and a retention killed midway),
``distfact runs``.

The growing data: the same planted factorisation with more rows each night (new rows after the old ones), as
partitions: :func:`write_partition` writes partition ``p`` (``incoming/part-<p>.npz``: the first rows, or the rows
night ``p`` adds), and the spec's ``source = "incoming/*.npz"`` makes each run append to a persistent store only
the partitions it does not hold yet.
"""

import io
import json
import os
import re
import signal
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

import distfact
from distfact.pipeline import SpecError, load_spec, run_pipeline
from distfact.outputs import locked, sibling
from distfact.pipeline.nightly import (is_run, match_components, previous_run, published_runs, read_start,
                                      retain)

from conftest import cli_here, cli_in_process

RANK, FEATURES, FIRST_ROWS, NEW_ROWS = 4, 30, 400, 40
H_TRUE = np.random.default_rng(7).random((RANK, FEATURES)) ** 4  # sparse-ish, distinct components


def night_rows(night: int) -> tuple[np.ndarray, np.ndarray]:
    """Night ``night``'s rows (the previous nights' rows first, in the same order) and their groups: "a" and
    "b" alternate; from night 3 on, a group "c" joins."""
    m = FIRST_ROWS + NEW_ROWS * night
    rng = np.random.default_rng(11)
    W = rng.random((FIRST_ROWS + NEW_ROWS * 10, RANK))[:m]
    noise = 0.01 * np.random.default_rng(12).random((FIRST_ROWS + NEW_ROWS * 10, FEATURES))[:m]
    groups = np.where(np.arange(m) % 2 == 0, "a", "b").astype(object)
    if night >= 3:
        groups[FIRST_ROWS + NEW_ROWS * 2::3] = "c"  # among the rows night 3 adds, and after
    return W @ H_TRUE + noise, groups.astype(str)


def write_partition(directory, partition: int, degrade: str | None = None):
    """Partition ``partition`` into ``directory/incoming``: the rows night ``partition`` adds to
    :func:`night_rows` (night 0: all its rows); ``degrade``: a group whose rows in it get centred unstructured noise
    (that group's error rises several times, the other's barely). Returns its path."""
    X, groups = night_rows(partition)
    start = 0 if partition == 0 else FIRST_ROWS + NEW_ROWS * (partition - 1)
    X, groups = X[start:], groups[start:]
    if degrade is not None:
        rows = groups == degrade
        noise = np.random.default_rng(13).random((int(rows.sum()), FEATURES)) - 0.5
        X[rows] = np.maximum(X[rows] + X.mean() * noise, 0)
    os.makedirs(os.path.join(directory, "incoming"), exist_ok=True)
    path = os.path.join(directory, "incoming", f"part-{partition:02d}.npz")
    np.savez(path, X=X, groups=groups)
    return path


def write_night(directory, night: int, degrade: str | None = None):
    """Night ``night``'s partitions: the ones up to ``night`` not yet written, and night ``night``'s (with
    ``degrade``, see :func:`write_partition`)."""
    for partition in range(night):
        if not os.path.exists(os.path.join(directory, "incoming", f"part-{partition:02d}.npz")):
            write_partition(directory, partition)
    write_partition(directory, night, degrade)


# a checkpoint every 100 iterations, not every 10: a checkpoint costs about 25 ms, far more than a HALS iteration of
# these 400-440 rows (0.3 ms); the checkpoints are still written and removed as a fit commits
CHECKPOINTS = "[output]\ncheckpoint_every = 100\n"


def spec_text(*, warm: bool, seed: int = 0, extra: str = "", name: str = "nightly", solver: str = "hals",
              tol: float = 1e-5, output: str = "") -> str:
    """``output``: more keys of the [output] table."""
    return f"""
name = "{name}"
[input]
source = "incoming/*.npz"
[[fit]]
method = "nmf"
rank = {RANK}
solver = "{solver}"
max_iter = 1000
tol = {tol}
seed = {seed}
{'warm_start = "previous"' if warm else ''}
{extra}
{CHECKPOINTS}{output}
"""


# fits stopped early, for the tests of retention and of the partitions' records, which do not depend on the factors
# (a night converged to tol=1e-5 runs about 500 HALS iterations)
QUICK_TOL = 1e-2


def night(tmp_path, number: int, text: str, degrade=None):
    """Run night ``number`` (dated 2026-01-<number + 1>) in-process; returns run_pipeline's result."""
    write_night(tmp_path, number, degrade)
    (tmp_path / "spec.toml").write_text(text)
    return run_pipeline(tmp_path / "spec.toml", date=f"2026-01-{number + 1:02d}", root=str(tmp_path / "runs"),
                        stream=io.StringIO())


def cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "distfact.cli", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def log_events(run_dir):
    with open(os.path.join(run_dir, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


def model(run_dir, fit="nmf-r4"):
    return distfact.load(os.path.join(run_dir, "fit", fit, "model.npz"))


# -- warm starts ------------------------------------------------------------------------------------

def test_warm_start_reaches_the_cold_error_in_fewer_iterations(tmp_path):
    first = night(tmp_path, 0, spec_text(warm=True))
    assert [e["event"] for e in log_events(first["run_dir"]) if e["stage"] == "fit"].count("cold-start") == 1
    warm = night(tmp_path, 1, spec_text(warm=True))
    events = [e for e in log_events(warm["run_dir"]) if e["event"] == "warm-start"]
    assert events and events[0]["rows_kept"] == FIRST_ROWS and events[0]["rows_new"] == NEW_ROWS
    (tmp_path / "spec.toml").write_text(spec_text(warm=False))
    cold = run_pipeline(tmp_path / "spec.toml", date="2026-01-02", root=str(tmp_path / "cold"), stream=io.StringIO())
    warm_model, cold_model = model(warm["run_dir"]), model(cold["run_dir"])
    assert warm_model.init == "custom" and cold_model.init != "custom"
    # the cold start's final error, to 0.1% (both stop near the noise floor, in nearby local minima): the
    # iteration at which each fit's history first comes within it
    target = cold_model.objective_history_[-1] * 1.001
    warm_reached = np.flatnonzero(warm_model.objective_history_ <= target)
    cold_reached = np.flatnonzero(cold_model.objective_history_ <= target)
    assert warm_reached.size, "the warm start never reached the cold start's error"
    assert warm_reached[0] < cold_reached[0] / 4, (warm_reached[0], cold_reached[0])
    assert warm_model.n_iter_ < cold_model.n_iter_ / 2, (warm_model.n_iter_, cold_model.n_iter_)
    # the start: H and the previous rows' W are the previous run's, bitwise
    H, W = read_start(os.path.join(first["run_dir"], "fit", "nmf-r4"), RANK, FEATURES)
    np.testing.assert_array_equal(H, model(first["run_dir"]).components_)
    assert W.shape == (FIRST_ROWS, RANK)
    with open(os.path.join(warm["run_dir"], "fit", "nmf-r4", "fit.json")) as f:
        assert json.load(f)["warm_start"] == "2026-01-01"


def test_a_damaged_previous_start_is_refused(tmp_path):
    first = night(tmp_path, 0, spec_text(warm=True))
    start = os.path.join(first["run_dir"], "fit", "nmf-r4", "start.npz")
    data = bytearray(open(start, "rb").read())
    data[-200] ^= 1
    os.chmod(start, 0o644)
    with open(start + ".new", "wb") as f:
        f.write(data)
    os.replace(start + ".new", start)
    with pytest.raises(Exception, match="SHA-256"):
        night(tmp_path, 1, spec_text(warm=True))


def test_warm_start_of_a_method_without_a_custom_start_is_a_spec_error(tmp_path):
    write_night(tmp_path, 0)
    text = spec_text(warm=True).replace('method = "nmf"', 'method = "fairer-nmf"').replace('solver = "hals"\n', "")
    (tmp_path / "spec.toml").write_text(text)
    with pytest.raises(SpecError, match=r"spec.toml:\d+: \[fit\] #1 key 'warm_start': method 'fairer-nmf' cannot"):
        load_spec(tmp_path / "spec.toml")


def test_stratified_warm_start_with_a_new_group(tmp_path):
    # fits stopped early (QUICK_TOL): the test is of the start the new group's rows get, not of the factors
    text = spec_text(warm=True, tol=QUICK_TOL).replace('method = "nmf"', 'method = "stratified-nmf"').replace(
        'solver = "hals"\n', "")
    for number in (2, 3):  # night 3 brings group "c", which the previous model never saw
        result = night(tmp_path, number, text)
    warm = [e for e in log_events(result["run_dir"]) if e["event"] == "warm-start"][0]
    assert warm["new_rows"].startswith("mean of the previous rows")
    fitted = model(result["run_dir"], "stratified-nmf-r4")
    assert fitted.strata_names_ == ["a", "b", "c"] and np.isfinite(fitted.components_).all()


# -- stable component ids ---------------------------------------------------------------------------

def test_match_components_against_brute_force():
    rng = np.random.default_rng(3)
    H_before = rng.random((5, 12))
    order = [3, 0, 4, 1, 2]
    H = H_before[order] * rng.uniform(0.5, 2, (5, 1)) + 0.01 * rng.random((5, 12))
    H[2] = rng.random(12) ** 8  # a new component, unlike any
    out = match_components(H, H_before, [10, 11, 12, 13, 14], 15, threshold=0.95)
    import itertools

    def unit(A):
        return A / np.linalg.norm(A, axis=1, keepdims=True)
    S = unit(H) @ unit(H_before).T
    best = max(itertools.permutations(range(5)), key=lambda p: sum(S[i, p[i]] for i in range(5)))
    expected = [10 + best[i] if S[i, best[i]] >= 0.95 else None for i in range(5)]
    assert [e if e is not None else out["ids"][i] for i, e in enumerate(expected)] == out["ids"]
    assert out["new"] == [15] and out["ids"][2] == 15 and out["vanished"] == [10 + order[2]]


def test_a_planted_component_keeps_its_id_across_runs(tmp_path):
    positions, ids = [], []
    for number, seed in enumerate((0, 5, 9)):  # other seeds: the factorisation orders its components differently
        result = night(tmp_path, number, spec_text(warm=False, seed=seed))
        H = model(result["run_dir"]).components_
        similarity = (H / np.linalg.norm(H, axis=1, keepdims=True)) @ (H_TRUE[0] / np.linalg.norm(H_TRUE[0]))
        position = int(np.argmax(similarity))
        with open(os.path.join(result["run_dir"], "evaluate", "components.json")) as f:
            components = json.load(f)["fits"]["nmf-r4"]
        positions.append(position)
        ids.append(components["ids"][position])
        assert sorted(components["ids"]) == list(range(RANK)) and not components["vanished"]
    assert len(set(positions)) > 1, f"the planted component was at {positions}: the test needs its order to change"
    assert len(set(ids)) == 1, (positions, ids)


# -- trends and alerts ------------------------------------------------------------------------------

ALERTS = """
[alerts]
rise = 1.0
spread = 0.5
vanished = true
[report]
trend_runs = 3
"""


def test_a_degraded_group_exits_3_with_everything_committed(tmp_path, capsys):
    text = spec_text(warm=True, extra=ALERTS)
    for number in range(2):  # in this process; the degraded night in a real one (its exit status as a process)
        night(tmp_path, number, text)
    write_night(tmp_path, 2, degrade="b")
    done = cli("run", "spec.toml", "--date", "2026-01-03", "--output", "runs", cwd=tmp_path)
    assert done.returncode == 3, done.stderr[-2000:]
    run_dir = tmp_path / "runs" / "nightly" / "2026-01-03"
    assert is_run(str(run_dir)) and (tmp_path / "runs" / "nightly" / "LATEST").read_text().strip() == "2026-01-03"
    alerts = json.loads((run_dir / "alerts.json").read_text())
    assert {(a["alert"], a.get("group")) for a in alerts} == {("rise", "b")}, alerts
    assert "alert: nmf-r4: group b's relative_error rose" in done.stderr
    assert any(e["event"] == "alert" and e["group"] == "b" for e in log_events(run_dir))
    for stage in ("ingest", "fit", "evaluate", "report", "publish"):
        assert (run_dir / stage / "COMMITTED").is_file()
    trends = (run_dir / "evaluate" / "trends.csv").read_text().splitlines()
    rows = [line.split(",") for line in trends[1:] if ",relative_error," in line]
    assert sorted((r[0], r[3]) for r in rows) == sorted((f"2026-01-0{d}", g) for d in (1, 2, 3) for g in "ab")
    report = (run_dir / "report" / "report.html").read_text()
    assert "group b&#x27;s relative_error rose" in report and "Trends: relative_error" in report
    assert (run_dir / "report" / "nmf-r4-trend.png").is_file()
    # a rerun is a no-op, with the run's status (main()'s, which the console script exits with: in this process)
    again = cli_here(capsys, "run", "spec.toml", "--date", "2026-01-03", "--output", "runs", cwd=tmp_path)
    assert again.returncode == 3 and "up to date" in again.stdout
    listing = cli_here(capsys, "runs", "nightly", "--root", "runs", cwd=tmp_path)
    assert listing.returncode == 0
    lines = listing.stdout.splitlines()
    assert len(lines) == 4 and lines[-1].split()[0] == "2026-01-03" and lines[-1].split()[-1] == "1"


def test_a_rise_is_found_across_a_change_of_the_chosen_rank():
    """An auto-ranked fit (one model a night, its rank chosen each night) is compared night to night whatever its
    rank; a fit with explicit ranks only at the same rank."""
    import pandas as pd

    from distfact.pipeline.alerts import find_alerts

    def table(rows):
        return pd.DataFrame(rows, columns=["fit", "rank", "group", "metric", "value"])

    options = {"metric": "relative_error", "rise": 0.2, "spread": None, "vanished": False}
    now = table([("nmf-auto", 3, "a", "relative_error", 0.5), ("nmf-auto", 3, "b", "relative_error", 0.6),
                 ("svd-r4", 2, "a", "relative_error", 0.5), ("svd-r4", 4, "a", "relative_error", 0.1)])
    before = table([("nmf-auto", 4, "a", "relative_error", 0.11), ("nmf-auto", 4, "b", "relative_error", 0.21),
                    ("svd-r4", 2, "a", "relative_error", 0.45), ("svd-r4", 4, "a", "relative_error", 0.09)])
    found = find_alerts(options, now, before, {"fits": {}}, auto={"nmf-auto"})
    assert [(a["fit"], a["group"], a["rank"], a["previous_rank"], a["previous"]) for a in found] == [
        ("nmf-auto", "a", 3, 4, 0.11), ("nmf-auto", "b", 3, 4, 0.21)]  # svd-r4's rank 2 (0.5) is not its rank 4's
    assert "rank 4 before, 3 tonight" in found[0]["message"]


# 100 iterations (not converged, as 300 were not either: the choice between ranks 3 and 4 of data of rank 4 is
# clear long before, and the alert is about group b's degraded rows)
AUTO_NIGHTLY = """
name = "nightly"
[input]
source = "incoming/*.npz"
[[fit]]
method = "nmf"
ranks = "auto"
solver = "hals"
max_iter = 100
tol = 1e-5
[select]
ranks = "{ranks}"
n_splits = 3
[alerts]
rise = 1.0
[report]
trend_runs = 3
""" + CHECKPOINTS


def test_an_auto_ranked_fit_alerts_and_trends_across_a_change_of_rank(tmp_path, monkeypatch, capsys):
    """Data of rank 4: the first two nights choose among 3 and 4 (4), the third among 5 and 6, and group b
    degrades that night: its rise is found (exit 3) whatever the rank, and the trends keep every night."""
    for number in range(2):
        result = night(tmp_path, number, AUTO_NIGHTLY.format(ranks="3:4"))
        assert model(result["run_dir"], "nmf-auto").n_components == RANK
    write_night(tmp_path, 2, degrade="b")
    (tmp_path / "spec.toml").write_text(AUTO_NIGHTLY.format(ranks="5:6"))
    monkeypatch.chdir(tmp_path)  # the command line in this process (a real process's exit 3: the tests above)
    code, _, err = cli_in_process(capsys, "run", "spec.toml", "--date", "2026-01-03", "--output", "runs")
    assert code == 3, err[-2000:]
    run_dir = tmp_path / "runs" / "nightly" / "2026-01-03"
    chosen = model(str(run_dir), "nmf-auto").n_components
    assert chosen in (5, 6)
    alerts = json.loads((run_dir / "alerts.json").read_text())
    assert [(a["alert"], a["group"], a["previous_rank"], a["rank"]) for a in alerts] == [("rise", "b", RANK, chosen)]
    trend = (run_dir / "report" / "nmf-auto-trend.csv").read_text().splitlines()
    assert trend[0] == "date,rank,a,b"
    assert [line.split(",")[:2] for line in trend[1:]] == [["2026-01-01", str(RANK)], ["2026-01-02", str(RANK)],
                                                           ["2026-01-03", str(chosen)]]
    assert all(value for line in trend[1:] for value in line.split(","))  # every group every night


# -- retention --------------------------------------------------------------------------------------

def test_retention_keeps_the_newest_runs_and_latest(tmp_path):
    text = spec_text(warm=True, output="keep = 2\n", tol=QUICK_TOL)
    for number in range(3):
        night(tmp_path, number, text)
    runs = tmp_path / "runs" / "nightly"
    assert published_runs(str(runs)) == ["2026-01-02", "2026-01-03"]
    assert sorted(os.listdir(runs)) == ["2026-01-02", "2026-01-03", "LATEST", "store.zarr"]
    # a backfill of an older date: its own retention keeps it (LATEST still names the newest), the next removes it
    # (with the oldest of the two before: two runs removed at once)
    result = night(tmp_path, 0, text)
    assert is_run(result["run_dir"]) and (runs / "LATEST").read_text().strip() == "2026-01-03"
    assert published_runs(str(runs)) == ["2026-01-01", "2026-01-02", "2026-01-03"]
    night(tmp_path, 3, text)
    assert published_runs(str(runs)) == ["2026-01-03", "2026-01-04"]


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory):
    """The runs directory of three nights (copied by each test that changes it)."""
    directory = tmp_path_factory.mktemp("three")
    for number in range(3):
        night(directory, number, spec_text(warm=False, tol=QUICK_TOL))
    return directory / "runs" / "nightly"


def test_retention_skips_a_date_whose_run_is_in_progress(three_runs, tmp_path):
    runs = tmp_path / "nightly"
    shutil.copytree(three_runs, runs)
    events = []
    with locked(sibling(str(runs / "2026-01-01"), "lock"), "a rerun of 2026-01-01"):  # as run_pipeline holds it
        assert retain(str(runs), 1, lambda *args, **fields: events.append((args, fields))) == ["2026-01-02"]
    assert published_runs(str(runs)) == ["2026-01-01", "2026-01-03"]
    assert [(args, fields["date"]) for args, fields in events if args[1] == "skipped"] == [
        (("retention", "skipped"), "2026-01-01")]
    assert retain(str(runs), 1, lambda *args, **fields: None) == ["2026-01-01"]  # the lock released


def test_retention_removes_only_its_own_leftovers(three_runs, tmp_path):
    runs = tmp_path / "nightly"
    shutil.copytree(three_runs, runs)
    mine = [runs / ".2024-01-01.removing-old-notes-keep", runs / ".2024-01-01.removing-0123abcd"]
    for directory in mine:  # a user's, one of them named as retention names its own
        directory.mkdir()
        (directory / "notes.txt").write_text("mine")
    shutil.copytree(runs / "2026-01-01", runs / ".2026-01-01.removing-89abcdef")  # a run being removed, killed
    os.remove(runs / "2026-01-01" / "distfact-output.json")  # (now no run, so not retention's to remove)
    (runs / ".2025-12-31.removing-fedcba98").mkdir()  # a removal killed after its manifest, its last file, went
    (runs / ".2025-12-30.lock").write_text("4242")  # a run lock left by a process killed holding it, its run gone
    (runs / ".2025-12-29.lock").write_text("")  # likewise, killed before it wrote its pid
    (runs / ".2024-01-02.lock").write_text("mine")  # a user's file named as a run lock: not a lock's content
    (runs / ".2026-01-03.lock").write_text("4243")  # a lock of a date whose run is there: the next run of it takes it
    with locked(str(runs / ".2025-12-28.lock"), "a backfill of 2025-12-28"):  # held: a run of that date beginning
        assert retain(str(runs), 1, lambda *args, **fields: None) == ["2026-01-02"]
        assert (runs / ".2025-12-28.lock").exists()
    assert sorted(os.listdir(runs)) == sorted(["2026-01-01", "2026-01-03", "LATEST", "store.zarr", ".2024-01-02.lock",
                                               ".2026-01-03.lock", *(d.name for d in mine)])
    assert all((directory / "notes.txt").read_text() == "mine" for directory in mine)


KILLED_RETENTION = """
import os, sys, time
from distfact.pipeline.nightly import retain
if len(sys.argv) > 2:  # each file's removal slowed, so that a kill lands mid-removal even on a loaded machine
    unlink = os.unlink
    def slow_unlink(*args, **kwargs):
        time.sleep(0.0005)
        return unlink(*args, **kwargs)
    os.unlink = os.remove = slow_unlink
retain(sys.argv[1], 1, lambda *args, **fields: None)
"""


def test_a_killed_retention_leaves_no_broken_run(three_runs, tmp_path):
    runs = str(tmp_path / "nightly")
    shutil.copytree(three_runs, runs)
    # many files in each old run, so that removing one takes a while: the two runs retention removes hold 6000
    # files, at 0.5 ms or more a file 3 s of removal, several times what the kills below let it do
    for date in ("2026-01-01", "2026-01-02"):
        padding = os.path.join(runs, date, "fit", "padding")
        os.makedirs(padding)
        for i in range(3000):
            open(os.path.join(padding, str(i)), "w").close()
    dates = published_runs(runs)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    lock, interrupted = os.path.join(runs, ".retention.lock"), 0
    for delay in (0, 0.01, 0.03, 0.06, 0.1, 0.2):
        process = subprocess.Popen([sys.executable, "-c", KILLED_RETENTION, runs, "slow"], env=env)
        deadline = time.monotonic() + 120
        while not (os.path.isfile(lock) and open(lock).read() == str(process.pid)):  # retention has begun
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.002)
        time.sleep(delay)
        process.send_signal(signal.SIGKILL)
        process.wait()
        interrupted += any(".removing-" in name for name in os.listdir(runs))  # a run half removed, aside
        listed = published_runs(runs)
        for date in os.listdir(runs):  # whatever has a date's name is a whole run
            if date in dates:
                assert is_run(os.path.join(runs, date))
                manifest = json.load(open(os.path.join(runs, date, "distfact-output.json")))
                assert all(os.path.exists(os.path.join(runs, date, name)) for name in manifest["files"]), date
        assert "2026-01-03" in listed  # LATEST's
        assert previous_run(runs, "2026-01-04") == os.path.join(runs, "2026-01-03")
    assert interrupted, "no kill landed while a run was being removed"
    done = subprocess.run([sys.executable, "-c", KILLED_RETENTION, runs], env=env)
    assert done.returncode == 0
    assert sorted(os.listdir(runs)) == ["2026-01-03", "LATEST", "store.zarr"]  # (and the lock the kills left is gone)


# -- seven nights of partitions (issue 21) ----------------------------------------------------------

SEVEN_NIGHTS_ALERTS = ALERTS.replace("trend_runs = 3", "trend_runs = 7")


def files_of(directory):
    """Every file under ``directory`` with its modification time (what a no-op rerun leaves as it was)."""
    return {os.path.join(d, f): os.stat(os.path.join(d, f)).st_mtime_ns for d, _, names in os.walk(directory)
            for f in names}


def test_seven_nights_of_a_growing_partitioned_corpus(tmp_path, monkeypatch, capsys):
    """Nights 0-6 of ``source = "incoming/*.npz"``: night 3 brings a new group (c), night 4 no partition, night 6 a
    degraded group b. Each night ingests only its new partition (counted in input.json), its warm-started fit
    reaches the cold start's error in fewer iterations, the planted component keeps its id, the trend table has one
    row per night and group, the degraded night exits 3 with alerts.json, and rerunning any night is a no-op."""
    partition_of = {0: 0, 1: 1, 2: 2, 3: 3, 5: 4, 6: 5}  # night -> the partition it brings (night 4: none)
    warm_text, cold_text = spec_text(warm=True, extra=SEVEN_NIGHTS_ALERTS), spec_text(warm=False)
    runs, store = tmp_path / "runs" / "nightly", tmp_path / "runs" / "nightly" / "store.zarr"
    ids = []
    monkeypatch.chdir(tmp_path)  # the command line runs in this process (a real process's exit 3: the test above)
    for number in range(7):
        date = f"2026-01-{number + 1:02d}"
        if number in partition_of:
            write_partition(tmp_path, partition_of[number], degrade="b" if number == 6 else None)
        (tmp_path / "spec.toml").write_text(warm_text)
        code, _, err = cli_in_process(capsys, "run", "spec.toml", "--date", date, "--output", "runs")
        assert code == (3 if number == 6 else 0), err[-2000:]
        run_dir = runs / date
        with open(run_dir / "ingest" / "input.json") as f:
            ingested = json.load(f)
        expected = [f"part-{partition_of[number]:02d}.npz"] if number in partition_of else []
        assert ingested["partitions"]["ingested"] == expected
        assert len(ingested["partitions"]["skipped"]) == len([n for n in partition_of if n < number])
        rows = FIRST_ROWS + NEW_ROWS * max(0, len([n for n in partition_of if n <= number]) - 1)
        assert ingested["shape"] == [rows, FEATURES] and ingested["version"] == distfact.open(store).meta.version
        # the planted component's id
        H = model(run_dir).components_
        position = int(np.argmax((H / np.linalg.norm(H, axis=1, keepdims=True)) @ H_TRUE[0]))
        with open(run_dir / "evaluate" / "components.json") as f:
            ids.append(json.load(f)["fits"]["nmf-r4"]["ids"][position])
        if number in (1, 3, 5):  # warm against cold, on the same partitions (a root of its own)
            (tmp_path / "spec.toml").write_text(cold_text)
            cold = run_pipeline(tmp_path / "spec.toml", date=date, root=str(tmp_path / "cold"), stream=io.StringIO())
            warm_model, cold_model = model(run_dir), model(cold["run_dir"])
            target = cold_model.objective_history_[-1] * 1.001
            reached = np.flatnonzero(warm_model.objective_history_ <= target)
            assert reached.size and reached[0] < np.flatnonzero(cold_model.objective_history_ <= target)[0]
            assert warm_model.n_iter_ < cold_model.n_iter_, (number, warm_model.n_iter_, cold_model.n_iter_)
        # a rerun of the night: nothing ingested, nothing rerun, nothing of the run or the store rewritten
        (tmp_path / "spec.toml").write_text(warm_text)
        before, version = files_of(run_dir), distfact.open(store).meta.version
        code, out, err = cli_in_process(capsys, "run", "spec.toml", "--date", date, "--output", "runs")
        assert code == (3 if number == 6 else 0) and "up to date" in out, err[-2000:]
        assert files_of(run_dir) == before and distfact.open(store).meta.version == version
    assert len(set(ids)) == 1, ids
    final = runs / "2026-01-07"
    alerts = json.loads((final / "alerts.json").read_text())
    assert {(a["alert"], a.get("group")) for a in alerts} == {("rise", "b")}, alerts
    trends = (final / "evaluate" / "trends.csv").read_text().splitlines()
    rows = sorted((r[0], r[3]) for r in (line.split(",") for line in trends[1:]) if r[4] == "relative_error")
    assert rows == sorted((f"2026-01-0{d}", g) for d in range(1, 8) for g in ("ab" if d <= 3 else "abc"))
    # every night again, after the seven: a no-op (a night reads the partitions its first run recorded, not the
    # pattern's later files), and forced, the same model from the same store version
    dates = [f"2026-01-{number + 1:02d}" for number in range(7)]
    before, version = {d: files_of(runs / d) for d in dates}, distfact.open(store).meta.version
    for date in dates:
        again = run_pipeline(tmp_path / "spec.toml", date=date, root=str(tmp_path / "runs"), stream=io.StringIO())
        assert again["ran"] == [] and files_of(runs / date) == before[date], date
    original = model(runs / dates[3])
    with open(runs / dates[3] / "ingest" / "input.json") as f:
        recorded = json.load(f)
    forced = run_pipeline(tmp_path / "spec.toml", date=dates[3], root=str(tmp_path / "runs"), force=True,
                          stream=io.StringIO())
    assert forced["ran"] == ["ingest", "fit", "evaluate", "report", "publish"]
    with open(runs / dates[3] / "ingest" / "input.json") as f:
        redone = json.load(f)
    assert (redone["version"], redone["shape"], redone["partitions"]["files"]) == \
        (recorded["version"], recorded["shape"], recorded["partitions"]["files"])
    assert recorded["version"] < version  # the store has grown since: the forced night reads its own version
    assert redone["partitions"]["ingested"] == [] and distfact.open(store).meta.version == version
    for name in ("components_", "objective_history_"):
        assert np.array_equal(getattr(model(runs / dates[3]), name), getattr(original, name)), name
    # a backfill: a partition already in the store, under another name, adds nothing
    (tmp_path / "incoming" / "part-99.npz").write_bytes((tmp_path / "incoming" / "part-01.npz").read_bytes())
    result = run_pipeline(tmp_path / "spec.toml", date="2026-01-08", root=str(tmp_path / "runs"), stream=io.StringIO())
    with open(os.path.join(result["run_dir"], "ingest", "input.json")) as f:
        partitions = json.load(f)["partitions"]
    assert {key: partitions[key] for key in ("ingested", "skipped", "rows")} == {
        "ingested": [], "skipped": [f"part-{p:02d}.npz" for p in range(6)] + ["part-99.npz"], "rows": 0}
    # partitions removed from incoming/ once in the store: the nights that read them are still up to date
    for name in ("part-00.npz", "part-01.npz"):
        os.remove(tmp_path / "incoming" / name)
    for date in dates[:3]:
        assert run_pipeline(tmp_path / "spec.toml", date=date, root=str(tmp_path / "runs"),
                            stream=io.StringIO())["ran"] == []


def test_a_night_that_saw_no_partition_stays_a_no_op(tmp_path):
    """incoming/ emptied after each ingest (the files archived): a night that matched nothing records no files, and
    reruns of it stay no-ops when a later partition arrives, which the next night ingests."""
    (tmp_path / "spec.toml").write_text(spec_text(warm=False, tol=QUICK_TOL))

    def run(date):
        return run_pipeline(tmp_path / "spec.toml", date=date, root=str(tmp_path / "runs"), stream=io.StringIO())

    write_partition(tmp_path, 0)
    run("2026-01-01")
    os.makedirs(tmp_path / "archive")
    os.rename(tmp_path / "incoming" / "part-00.npz", tmp_path / "archive" / "part-00.npz")
    assert run("2026-01-02")["ran"] and run("2026-01-02")["ran"] == []
    write_partition(tmp_path, 1)
    assert run("2026-01-02")["ran"] == []
    third = run("2026-01-03")
    with open(os.path.join(third["run_dir"], "ingest", "input.json")) as f:
        assert json.load(f)["partitions"]["ingested"] == ["part-01.npz"]


def test_a_damaged_record_of_a_nights_partitions_is_named(tmp_path):
    """A rerun reads the night's partitions from its ingest/input.json: a damaged record stops the run, naming it."""
    result = night(tmp_path, 0, spec_text(warm=False, tol=QUICK_TOL))
    record = os.path.join(result["run_dir"], "ingest", "input.json")
    with open(record) as f:
        doc = json.load(f)
    doc["partitions"]["files"][0]["sha256"] = "not a digest"
    with open(record, "w") as f:
        json.dump(doc, f)
    with pytest.raises(ValueError, match=re.escape(record) + r": 'partitions' 'files' must be a list"):
        run_pipeline(tmp_path / "spec.toml", date="2026-01-01", root=str(tmp_path / "runs"), stream=io.StringIO())


def test_spec_errors_of_a_source_of_partitions(tmp_path):
    write_night(tmp_path, 0)
    for source, extra, words in (
            ("missing/*.npz", "", r"'missing/\*.npz': a pattern of partitions names files of one existing folder"),
            ("incoming/*.txt", "", r"unknown kind of source 'incoming/\*.txt'"),
            ("incoming/part-00.npz", 'store_path = "s.zarr"', r"key 'store_path': applies to a source of partitions")):
        (tmp_path / "spec.toml").write_text(spec_text(warm=False).replace('source = "incoming/*.npz"',
                                                                          f'source = "{source}"\n{extra}'))
        with pytest.raises(SpecError, match=r"spec.toml:\d+: \[input\].*" + words):
            load_spec(tmp_path / "spec.toml")
    (tmp_path / "spec.toml").write_text(spec_text(warm=False).replace('source = "incoming/*.npz"',
                                                                      'source = "incoming/*.npz"\nstore_path = "kept"'))
    result = run_pipeline(tmp_path / "spec.toml", date="2026-01-01", root=str(tmp_path / "runs"), stream=io.StringIO())
    assert distfact.open(tmp_path / "kept").shape[0] == FIRST_ROWS
    assert not os.path.exists(os.path.join(os.path.dirname(result["run_dir"]), "store.zarr"))
