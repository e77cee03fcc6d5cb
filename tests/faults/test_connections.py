"""Every wait on another process is bounded and says what it waited for (issue 17, case 9 and the scheduler-file
error; the worker check times a worker's cold import apart from its answer)."""

import concurrent.futures
import http.server
import os
import signal
import threading
import time

import numpy as np
import psutil
import pytest

import distfact
from distfact.engine.cluster import TIMEOUTS, timeout
from conftest import cli_here, grouped_data, start_cli_cluster, startup_seconds, stop_cli_cluster
from damage import assert_refused, cli, snapshot


@pytest.fixture
def web_server():
    """A plain HTTP server on loopback: something listens at the address, but it is no Dask scheduler."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"tcp://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture
def store(tmp_path):
    X, groups = grouped_data(m=60, n=6, n_groups=2, seed=6)
    return distfact.from_arrays(X, groups, tmp_path / "x.zarr", block_rows=20).path


def test_a_server_that_is_no_scheduler_is_an_error_within_the_bound(web_server, store, tmp_path, short_waits):
    """Case 9: --scheduler at a plain HTTP server hung (killed after 91 s). The command line and the library wait on
    the server at the same time (each timed on its own), so the test waits for the bound once, not twice; the bound is
    a configured 3 s, not the default 10 s."""
    before = snapshot(tmp_path)
    bound = short_waits(connect=3)["connect"]

    def refused_by_the_library() -> float:
        started = time.perf_counter()
        with pytest.raises(ValueError, match="cannot reach a Dask scheduler"):
            distfact.NMF(2, max_iter=2).fit(store, client=web_server)
        return time.perf_counter() - started

    start_up = startup_seconds()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        library = pool.submit(refused_by_the_library)
        started = time.perf_counter()
        out = cli("fit", store, "--rank", 2, "--no-progress", "--scheduler", web_server, "--output",
                  tmp_path / "fit", cwd=tmp_path, timeout=120)
        cli_seconds = time.perf_counter() - started
        library_seconds = library.result()
    assert_refused(out, web_server)
    assert ("(no answer)" in out.stderr and "a Dask scheduler (not another server)" in out.stderr
            or "is not a Dask scheduler" in out.stderr), out.stderr
    assert "within 3 s (no answer)" in out.stderr, out.stderr
    assert cli_seconds < bound + 5 + 2 * start_up  # the bound, plus starting Python as it takes now
    assert bound <= library_seconds < bound + 5
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("value, seconds", [(3, 3), (0.5, 0.5), ("250ms", 0.25), ("2 minutes", 120)])
def test_a_bound_is_what_dask_configuration_says(value, seconds):
    import dask

    with dask.config.set({"distfact.timeouts.worker-import": value}):
        assert timeout("worker-import") == seconds
        assert timeout("worker-check") == TIMEOUTS["worker-check"] == 10
    assert timeout("worker-import") == TIMEOUTS["worker-import"] == 120


@pytest.mark.parametrize("value", [0, -2, "soon", None, float("inf"), [10]])
def test_a_bound_that_is_no_positive_duration_is_refused_naming_its_key(value):
    import dask

    with dask.config.set({"distfact.timeouts.connect": value}), pytest.raises(
            ValueError, match=r"Dask's configuration distfact\.timeouts\.connect = .* is not a positive duration"):
        timeout("connect")


@pytest.mark.parametrize("content", ['{"not": "a scheduler file"}', "[1, 2]", "\u00e9t\u00e9"])
def test_a_json_file_that_is_no_scheduler_file_is_named(content, store, tmp_path, capsys):
    (tmp_path / "scheduler.json").write_text(content, encoding="latin-1")
    out = cli_here(capsys, "fit", store, "--rank", 2, "--scheduler", tmp_path / "scheduler.json", "--output",
                   tmp_path / "fit", cwd=tmp_path)
    assert_refused(out, f"scheduler file '{tmp_path / 'scheduler.json'}' is not a Dask scheduler file")


SLOW_IMPORT = """
# every worker's first import of distfact takes 6 s (a cold start: compiling, a slow shared file system)
import sys
import time


class SlowFirstImport:
    def find_spec(self, name, path=None, target=None):
        if name == "distfact":
            sys.meta_path.remove(self)
            time.sleep(6)
        return None


def dask_setup(worker):
    sys.meta_path.insert(0, SlowFirstImport())
"""


@pytest.mark.cluster
def test_a_slow_first_import_is_not_a_frozen_worker_and_a_frozen_worker_is_named(store, tmp_path, capsys,
                                                                                   short_waits):
    check = short_waits(worker_check=3)["worker_check"]  # the fits here run in this process
    (tmp_path / "preload.py").write_text(SLOW_IMPORT)
    directory = tmp_path / "cluster"
    pids = start_cli_cluster(directory, options=["--preload", str(tmp_path / "preload.py")])
    scheduler = directory / "scheduler.json"
    try:
        slow = cli_here(capsys, "fit", store, "--rank", 2, "--max-iter", 3, "--no-progress", "--scheduler",
                        scheduler, "--output", tmp_path / "fit", cwd=tmp_path)
        assert slow.returncode == 0, slow.stderr  # 6 s to import: more than the check's bound, yet not "frozen"
        here = distfact.NMF(2, max_iter=3, random_state=0).fit(store)
        assert np.array_equal(np.load(tmp_path / "fit" / "components.npy"), here.components_)
        worker = next(child for child in psutil.Process(pids[1]).children()  # the worker process under its nanny
                      if "spawn_main" in " ".join(child.cmdline()))
        worker.send_signal(signal.SIGSTOP)
        try:
            started = time.perf_counter()
            frozen = cli_here(capsys, "fit", store, "--rank", 2, "--no-progress", "--scheduler", scheduler,
                              "--output", tmp_path / "again", cwd=tmp_path)
            assert time.perf_counter() - started < check + 25
        finally:
            worker.send_signal(signal.SIGCONT)
        assert frozen.returncode == 2 and "Traceback" not in frozen.stderr, frozen.stderr
        assert "did not answer within 3 s (frozen or overloaded?)" in frozen.stderr
        assert "worker-1" in frozen.stderr and "worker-2" not in frozen.stderr
        assert not os.path.exists(tmp_path / "again")
    finally:
        stop_cli_cluster(directory, pids)
