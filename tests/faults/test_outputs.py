"""Outputs are all or nothing and never someone else's files (issue 17, cases 5, 6 and 11, and the unhelpful
errors of a read-only or full disk and of an --output that is a file): each reproduced through the CLI (and the
API where it applies), with the message asserted and every file of the directories around hashed before and
after."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import distfact
from conftest import cli_here, distfact_in_child, forkserver_child, grouped_data
from damage import assert_refused, cli, small_disk, snapshot

# a complete checkpoint: its staging directory iter-NNNNNN.partial-<hex>/ holds COMMITTED before the rename
COMMITTED_CHECKPOINT = "iter-" + "[0-9]" * 6 + "/COMMITTED"


@pytest.fixture
def store(tmp_path):
    X, groups = grouped_data(m=300, n=12, n_groups=3, seed=3)
    return distfact.from_arrays(X, groups, tmp_path / "x.zarr", block_rows=50).path


def fit_cli(store, output, *extra, cwd, rank=2, iterations=5, capsys=None):
    """``distfact fit``: in this process with ``capsys``, else in a fresh one."""
    args = ("fit", store, "--rank", rank, "--max-iter", iterations, "--tol", 0, "--no-progress", "--output", output,
            *extra)
    return cli_here(capsys, *args, cwd=cwd) if capsys is not None else cli(*args, cwd=cwd)


def test_fit_refuses_a_directory_holding_the_users_files(store, tmp_path, capsys):
    """Case 5: `fit -o DIR` deleted DIR/W/thesis.tex and DIR/group_losses.csv and exited 0."""
    mine = tmp_path / "mine"
    (mine / "W").mkdir(parents=True)
    (mine / "W" / "thesis.tex").write_text("\\chapter{Results}")
    (mine / "group_losses.csv").write_text("my,table\n")
    before = snapshot(tmp_path)
    for extra in ((), ("--overwrite",)):  # not even when asked to replace
        out = fit_cli(store, mine, *extra, cwd=tmp_path, capsys=capsys)
        assert_refused(out, "is not an earlier distfact fit output", str(mine))
        assert snapshot(tmp_path) == before
    report = cli_here(capsys, "report", store, "--stratified", "--rank", 2, "--max-iter", 2, "--output", mine,
                      cwd=tmp_path)
    assert_refused(report, "is not an earlier distfact report output")
    assert snapshot(tmp_path) == before
    with pytest.raises(ValueError, match="W_out .* is not an empty directory"):  # the API's W_out, before the fit
        distfact.NMF(2, max_iter=3).fit(store, W_out=mine / "W")
    assert snapshot(tmp_path) == before


def test_an_earlier_output_with_a_file_added_is_not_replaced(store, tmp_path, capsys):
    assert fit_cli(store, tmp_path / "fit", cwd=tmp_path, capsys=capsys).returncode == 0
    (tmp_path / "fit" / "W" / "thesis.tex").write_text("mine")
    before = snapshot(tmp_path)
    out = fit_cli(store, tmp_path / "fit", "--overwrite", cwd=tmp_path, capsys=capsys)
    assert_refused(out, "'W/thesis.tex'", "which the earlier fit output did not write")
    assert snapshot(tmp_path) == before


def test_an_earlier_output_is_replaced_only_when_asked_and_then_completely(store, tmp_path, capsys):
    first = fit_cli(store, tmp_path / "fit", cwd=tmp_path, rank=2, capsys=capsys)
    assert first.returncode == 0, first.stderr
    manifest = json.loads((tmp_path / "fit" / "distfact-output.json").read_text())
    assert manifest["kind"] == "fit" and "metrics.json" in manifest["files"] and "components.npy" in manifest["files"]
    before = snapshot(tmp_path)
    again = fit_cli(store, tmp_path / "fit", cwd=tmp_path, rank=3, capsys=capsys)
    assert_refused(again, "holds an earlier fit output", "--overwrite")
    assert snapshot(tmp_path) == before
    replaced = fit_cli(store, tmp_path / "fit", "--overwrite", cwd=tmp_path, rank=3, capsys=capsys)
    assert replaced.returncode == 0, replaced.stderr
    assert np.load(tmp_path / "fit" / "components.npy").shape == (3, 12)
    assert json.loads((tmp_path / "fit" / "metrics.json").read_text())["rank"] == 3
    files = sorted(os.path.relpath(os.path.join(top, n), tmp_path / "fit")
                   for top, _, names in os.walk(tmp_path / "fit") for n in names)
    manifest = json.loads((tmp_path / "fit" / "distfact-output.json").read_text())
    assert files == sorted([*manifest["files"], "distfact-output.json"])  # nothing of the rank-2 fit is left
    assert sorted(os.listdir(tmp_path)) == ["fit", "x.zarr"]  # no staging directory, no lock left behind


def test_an_output_that_is_a_file_is_refused_before_the_fit(store, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    before = snapshot(tmp_path)
    out = cli("-v", "fit", store, "--rank", 2, "--no-progress", "--output", tmp_path / "notes.txt", cwd=tmp_path)
    assert_refused(out, "exists and is not a directory")
    assert "pass 0" not in out.stderr  # refused before any work, not after the whole fit
    assert snapshot(tmp_path) == before


def test_a_fit_killed_while_writing_leaves_the_previous_output(tmp_path, capsys):
    """Case 6: a fit killed mid-write left the old metrics.json and H beside a half-written W of the new rank."""
    X, groups = grouped_data(m=200_000, n=40, n_groups=2, seed=1)
    store = distfact.from_arrays(X, groups, tmp_path / "big.zarr").path
    assert fit_cli(store, tmp_path / "fit", cwd=tmp_path, rank=2, iterations=1, capsys=capsys).returncode == 0
    before = snapshot(tmp_path / "fit")
    staging = tmp_path / ".fit.partial"
    process = forkserver_child(distfact_in_child, tmp_path, "fit", store, "--rank", 30, "--max-iter", 1,
                               "--no-progress", "--overwrite", "--output", tmp_path / "fit")
    deadline = time.time() + 300
    while not list(staging.glob("W.partial-*/*")) and process.is_alive() and time.time() < deadline:
        time.sleep(0.001)
    process.kill()  # SIGKILL, while W (48 MB) is being written, aside
    process.join()
    assert process.exitcode == -signal.SIGKILL and list(staging.glob("W.partial-*"))
    assert not (staging / "distfact-output.json").exists()
    assert snapshot(tmp_path / "fit") == before  # the rank-2 output, whole
    rerun = fit_cli(store, tmp_path / "fit", "--overwrite", cwd=tmp_path, rank=3, iterations=1)
    assert rerun.returncode == 0 and "discarding" in rerun.stderr and not staging.exists(), rerun.stderr
    assert np.load(tmp_path / "fit" / "components.npy").shape == (3, 40)


def test_a_full_disk_leaves_the_previous_output_and_nothing_else(store, tmp_path, capsys):
    """Case 6 (full disk) and the unhelpful error of ingest/fit to a full disk."""
    with small_disk(tmp_path / "disk", "512k") as disk:
        assert fit_cli(store, disk / "fit", cwd=tmp_path, rank=1, capsys=capsys).returncode == 0
        X, groups = grouped_data(m=20_000, n=12, n_groups=3, seed=4)
        big = distfact.from_arrays(X, groups, tmp_path / "big.zarr").path  # W of rank 6: 1 MB, more than the disk
        before = snapshot(disk)
        out = fit_cli(big, disk / "fit", "--overwrite", cwd=tmp_path, rank=6, capsys=capsys)
        assert_refused(out, "No space left on device")
        assert snapshot(disk) == before
        np.savez(tmp_path / "big.npz", X=X, groups=groups)
        ingest = cli_here(capsys, "ingest", tmp_path / "big.npz", disk / "big.zarr", cwd=tmp_path)
        assert_refused(ingest, "No space left on device")
        assert snapshot(disk) == before


def test_a_read_only_disk_is_a_clear_error_before_any_work(store, tmp_path, capsys):
    with small_disk(tmp_path / "ro", "1m", read_only=True) as disk:
        before = snapshot(tmp_path / "ro")
        out = cli("-v", "fit", store, "--rank", 2, "--no-progress", "--output", disk / "fit", cwd=tmp_path)
        assert_refused(out, "cannot be written", "Read-only file system")
        assert "pass 0" not in out.stderr
        X, groups = grouped_data(m=30, n=5)
        np.savez(tmp_path / "small.npz", X=X, groups=groups)
        ingest = cli_here(capsys, "ingest", tmp_path / "small.npz", disk / "x.zarr", cwd=tmp_path)
        assert_refused(ingest, "Read-only file system")
        assert snapshot(tmp_path / "ro") == before


def test_a_killed_fit_resumes_from_the_staging_directorys_checkpoints(tmp_path, capsys):
    """`fit --checkpoint-every auto` keeps its checkpoints beside --output until the fit completes; --resume finds
    them; the completed output holds none. (`--checkpoint-every 2`, a count: ``test_no_pickle.py``.)"""
    X, groups = grouped_data(m=30_000, n=40, n_groups=2, seed=1)
    store = distfact.from_arrays(X, groups, tmp_path / "x.zarr").path
    whole = fit_cli(store, tmp_path / "whole", cwd=tmp_path, iterations=300, capsys=capsys)
    assert whole.returncode == 0
    args = ["fit", str(store), "--rank", "2", "--max-iter", "300", "--tol", "0", "--no-progress", "--checkpoint-every",
            "auto", "--output", str(tmp_path / "cut")]
    process = forkserver_child(distfact_in_child, tmp_path, *args)
    checkpoints = tmp_path / ".cut.partial" / "checkpoints"
    deadline = time.time() + 300
    while not list(checkpoints.glob(COMMITTED_CHECKPOINT)) and process.is_alive() and time.time() < deadline:
        time.sleep(0.01)
    process.kill()  # SIGKILL
    process.join()
    assert process.exitcode == -signal.SIGKILL, "the kill must land mid-fit"
    assert not (tmp_path / "cut").exists() and list(checkpoints.glob(COMMITTED_CHECKPOINT))
    resumed = subprocess.run([sys.executable, "-m", "distfact.cli", "-v", *args, "--resume"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0 and "resumed from" in resumed.stderr, resumed.stderr  # not started afresh
    assert np.array_equal(np.load(tmp_path / "cut" / "components.npy"), np.load(tmp_path / "whole" / "components.npy"))
    assert not (tmp_path / ".cut.partial").exists() and "checkpoints" not in os.listdir(tmp_path / "cut")


RUN_SPEC = """
name = "table"
[input]
source = "table.csv"
group_column = "{column}"
[[fit]]
method = "nmf"
rank = 2
max_iter = 10
"""


def test_a_pipeline_rerun_that_fails_leaves_the_committed_run(tmp_path, capsys):
    """Case 11: a rerun failing at ingest (a typo in a source option) wiped the day's fits and report, while LATEST
    and the top-level metrics.json still named that date."""
    X, groups = grouped_data(m=90, n=6, n_groups=3, seed=2)
    lines = ["g," + ",".join(f"f{j}" for j in range(6))] + [f"{g}," + ",".join(map(str, row))
                                                            for g, row in zip(groups, X)]
    (tmp_path / "table.csv").write_text("\n".join(lines) + "\n")
    spec = tmp_path / "spec.toml"
    spec.write_text(RUN_SPEC.format(column="g"))
    first = cli_here(capsys, "run", spec, "--output", tmp_path / "runs", "--date", "2026-11-23", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    runs = tmp_path / "runs" / "table"
    assert (runs / "LATEST").read_text().strip() == "2026-11-23"
    before = snapshot(runs / "2026-11-23")
    spec.write_text(RUN_SPEC.format(column="grup"))  # the typo
    failed = cli_here(capsys, "run", spec, "--output", tmp_path / "runs", "--date", "2026-11-23", cwd=tmp_path)
    assert_refused(failed, "stage 'ingest' failed", "no group column 'grup'", status=1)
    assert snapshot(runs / "2026-11-23") == before  # fits, report, metrics.json: all as they were
    assert (runs / "LATEST").read_text().strip() == "2026-11-23"
    spec.write_text(RUN_SPEC.format(column="g").replace("rank = 2", "rank = 3"))
    killed = subprocess.Popen([sys.executable, "-m", "distfact.cli", "run", str(spec), "--output",
                               str(tmp_path / "runs"), "--date", "2026-11-23"], cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (runs / ".2026-11-23.partial" / "fit.partial").exists() and killed.poll() is None \
            and time.time() < deadline:
        time.sleep(0.001)
    killed.send_signal(signal.SIGKILL)  # mid-fit
    killed.wait()
    assert killed.returncode == -signal.SIGKILL
    assert snapshot(runs / "2026-11-23") == before


# -- the all-or-nothing directory itself (distfact/outputs.py), on real files --------------------------------------

def write_output(dest, kind="fit", overwrite=False, files=("a.txt",), **options):
    from distfact.outputs import OutputDir

    with OutputDir(dest, kind, overwrite=overwrite, **options) as out:
        for name in files:
            os.makedirs(os.path.dirname(os.path.join(out.path, name)), exist_ok=True)
            with open(os.path.join(out.path, name), "w") as f:
                f.write(name)
        out.commit()


def test_a_swap_killed_half_way_is_finished_or_undone_by_the_next_run(tmp_path):
    """What settle() finds after a kill at each step of a replacement: the newer complete output stays."""
    from distfact.outputs import OutputDir, settle, sibling

    write_output(tmp_path / "older", files=("older.txt",))
    write_output(tmp_path / "newer", files=("newer.txt",))  # its manifest's time is later
    dest = str(tmp_path / "out")
    staging, old = sibling(dest, "partial"), sibling(dest, "old")

    def state(at_dest, in_staging=None, aside=None):
        for path in (dest, staging, old):
            shutil.rmtree(path, ignore_errors=True)
        for source, path in ((at_dest, dest), (in_staging, staging), (aside, old)):
            if source is not None:
                shutil.copytree(tmp_path / source, path)

    state("older", in_staging="newer")  # killed after the manifest, before the exchange: the new output wins
    settle(dest, "fit")
    assert "newer.txt" in os.listdir(dest) and not os.path.exists(staging) and not os.path.exists(old)
    state("newer", in_staging="older")  # killed after the exchange: the earlier output is removed
    settle(dest, "fit")
    assert "newer.txt" in os.listdir(dest) and not os.path.exists(staging)
    state(None, aside="older")  # killed between the fallback's two renames, before the new one was ready
    settle(dest, "fit")
    assert "older.txt" in os.listdir(dest) and not os.path.exists(old)
    state("newer", aside="older")  # killed after the fallback's renames, before the removal
    settle(dest, "fit")
    assert "newer.txt" in os.listdir(dest) and not os.path.exists(old)
    state("older", in_staging="newer")
    os.remove(os.path.join(dest, "distfact-output.json"))  # not ours any more: settle takes nothing for granted
    with pytest.raises(ValueError, match="is not an earlier distfact fit output"):
        with OutputDir(dest, "fit", overwrite=True):
            pass
    assert "older.txt" in os.listdir(dest)


def test_a_resumed_attempt_keeps_only_what_it_continues_from(tmp_path):
    from distfact.outputs import OutputDir

    dest = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with OutputDir(dest, "fit", keep=("checkpoints",)) as out:
            os.makedirs(os.path.join(out.path, "checkpoints", "iter-000002"))
            os.makedirs(os.path.join(out.path, "W.partial-0123abcd"))  # a killed write
            raise RuntimeError("killed")
    staging = tmp_path / ".out.partial"
    assert sorted(os.listdir(staging)) == ["checkpoints", "distfact-partial.json"]
    os.makedirs(staging / "W")  # as if killed after W's rename
    with OutputDir(dest, "fit", resume=True, keep=("checkpoints",), scratch=("checkpoints",)) as out:
        assert sorted(os.listdir(out.path)) == ["checkpoints", "distfact-partial.json"]
        out.commit()
    assert os.listdir(dest) == ["distfact-output.json"]


@pytest.mark.parametrize("intruder", ["an empty directory", "a symbolic link"])
def test_a_directory_or_link_added_to_an_earlier_output_is_not_replaced(intruder, tmp_path):
    dest = tmp_path / "out"
    write_output(dest, files=("sub/a.txt",))
    (tmp_path / "mine").mkdir()
    if intruder == "a symbolic link":
        os.symlink(tmp_path / "mine", dest / "sub" / "link")
    else:
        (dest / "sub" / "notes").mkdir()
    before = snapshot(tmp_path)
    with pytest.raises(ValueError, match="which the earlier fit output did not write"):
        write_output(dest, overwrite=True)
    assert snapshot(tmp_path) == before


def test_destinations_a_swap_cannot_replace_are_refused_before_any_work(tmp_path, monkeypatch):
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    with pytest.raises(ValueError, match="is a symbolic link"):
        write_output(tmp_path / "link")
    monkeypatch.chdir(tmp_path / "real")
    with pytest.raises(ValueError, match="is \\(or holds\\) the current directory"):
        write_output(tmp_path / "real")
    assert os.listdir(tmp_path / "real") == []


def test_a_destination_that_changed_during_the_work_keeps_the_complete_output_aside(tmp_path):
    from distfact.outputs import OutputDir

    dest = tmp_path / "out"
    with pytest.raises(ValueError, match="output is complete in .*\\.out\\.partial.* but was not put at"):
        with OutputDir(dest, "fit") as out:
            open(os.path.join(out.path, "components.npy"), "w").write("the result")
            dest.mkdir()
            (dest / "theirs.txt").write_text("another process's file")
            out.commit()
    assert (tmp_path / ".out.partial" / "components.npy").read_text() == "the result"
    assert os.listdir(dest) == ["theirs.txt"]
