"""Progress of long commands (issue 19): a bar on a terminal, periodic lines elsewhere, with rates and an ETA; the
outputs are those of a run without it. The commands run on a pseudo-terminal as real processes, and in this process
with stderr captured (not a terminal, as a pipe)."""

from __future__ import annotations

import io
import logging
import os
import pty
import re
import sys

import numpy as np
import pytest

from conftest import cli_here
from distfact.engine.progress import Progress
from distfact.store import from_arrays

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "PYTHONPATH": ROOT}


@pytest.fixture
def cli(capsys):
    """``cli(*args, cwd=...)``: ``distfact ARGS`` in this process with stderr captured: (exit status, stderr)."""
    def run(*args, cwd):
        done = cli_here(capsys, *args, cwd=cwd)
        return done.returncode, done.stderr
    return run


def cli_on_terminal(*args, cwd):
    """Run ``distfact ARGS`` with stdout and stderr on a pseudo-terminal: (exit status, what it showed)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: its stdio is the terminal
        os.chdir(cwd)
        os.execve(sys.executable, [sys.executable, "-m", "distfact.cli", *map(str, args)], ENV)
    shown = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the terminal closed with the child
            break
        if not chunk:
            break
        shown += chunk
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), shown.decode()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("progress") / "store"
    from_arrays(rng.random((300, 40)), np.repeat(np.arange(3), 100), path, block_rows=50)
    return path


FIT = ("--rank", 3, "--max-iter", 300, "--tol", 0, "--seed", 1)


def test_fit_shows_lines_off_a_terminal_and_a_bar_on_one_with_the_same_outputs(store, tmp_path, cli):
    status, err = cli("fit", store, *FIT, "-o", tmp_path / "pipe", cwd=tmp_path)
    assert status == 0, err
    lines = [line for line in err.splitlines() if line.startswith("iteration ")]
    # one line per tenth of max_iter (and the first), each with its rate and an ETA bounded by max_iter
    assert len(lines) >= 10
    assert re.fullmatch(r"iteration 30/300 \(10%\), [\d.,]+ it/s, objective [\d.e+]+, ETA at most \d+ (s|min)",
                        lines[1]), lines[1]
    assert lines[-1].startswith("iteration 300/300 in ") and "it/s" in lines[-1]
    assert "\r" not in err

    status, shown = cli_on_terminal("fit", store, *FIT, "-o", tmp_path / "tty", cwd=tmp_path)
    assert status == 0, shown
    frames = shown.split("\r")
    bars = [f for f in frames if re.match(r"iteration \|[#.]{24}\| +\d+% \d+/300", f)]
    assert bars and any("it/s" in f and "ETA at most" in f for f in bars), frames[:5]
    assert "100% 300/300" in shown

    status, err = cli("fit", store, *FIT, "--no-progress", "-o", tmp_path / "silent", cwd=tmp_path)
    assert status == 0 and "iteration" not in err
    for name in ("components.npy", "group_metrics.csv"):
        reference = (tmp_path / "silent" / name).read_bytes()
        assert (tmp_path / "pipe" / name).read_bytes() == reference
        assert (tmp_path / "tty" / name).read_bytes() == reference


def test_ingest_of_a_table_counts_the_bytes_read(tmp_path, cli):
    rng = np.random.default_rng(2)
    rows = 40_000
    table = tmp_path / "table.csv"
    values = rng.random((rows, 5)).round(6)
    with open(table, "w") as f:
        f.write("g,a,b,c,d,e\n")
        np.savetxt(f, np.column_stack([rng.integers(0, 3, rows), values]), delimiter=",", fmt="%.6g")
    status, err = cli("ingest", table, tmp_path / "store", "--group-column", "g", cwd=tmp_path)
    assert status == 0, err
    size = os.path.getsize(table) / 1e6
    lines = [line for line in err.splitlines() if line.startswith("read ")]
    assert lines and lines[-1].startswith(f"read {size:.1f} MB/{size:.1f} MB in "), lines
    assert "MB/s" in lines[-1]
    quiet_status, quiet = cli("ingest", table, tmp_path / "quiet", "--group-column", "g", "--no-progress",
                              cwd=tmp_path)
    assert quiet_status == 0 and not any(line.startswith("read ") for line in quiet.splitlines()), quiet


def test_lines_say_rate_and_eta_and_restart_with_a_new_phase():
    out = io.StringIO()  # not a terminal
    progress = Progress(100, "iteration", "it", at_most=True, stream=out)
    for i in range(1, 101):
        progress.update(i, f"objective {1 / i:.3g}")
    lines = out.getvalue().splitlines()
    assert [int(re.match(r"iteration (\d+)/100", line).group(1)) for line in lines] == [1, *range(10, 101, 10)]
    assert all("it/s" in line and "ETA at most" in line for line in lines[1:])
    progress.update(1, total=50)  # a second phase: counted from its own start
    assert out.getvalue().splitlines()[-1].startswith("iteration 1/50 (2%)")
    progress.close("converged")
    assert out.getvalue().splitlines()[-1].startswith("iteration 1/50 in ")
    assert out.getvalue().endswith(", converged\n")


def test_a_small_fit_on_a_cluster_says_in_process_would_be_faster(local_cluster_client, store, caplog):
    from distfact import NMF

    with caplog.at_level(logging.WARNING, logger="distfact"):
        NMF(2, max_iter=2, random_state=0).fit(str(store), client=local_cluster_client)
    assert any("in-process (no Dask client) would be faster" in r.getMessage() for r in caplog.records)
