import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest
import scipy.sparse as sp


# the files that keep a test process busiest (worker seconds of a suite run on the standard machine, issue 19),
# longest first: with -n 2 --dist loadfile --no-loadscope-reorder they start first, so that neither process is
# left alone on one of them at the end (xdist's default order, most tests first, started test_nightly.py late)
LONGEST_FILES = ("test_cluster_faults.py", "test_select_rank.py", "test_warmup.py", "test_connections.py",
                 "test_stores.py", "test_nightly.py")


def _blas_libraries():
    """The BLAS libraries loaded now (looked up for each test, about 1 ms: a library a test loads, as a solver's,
    is watched from the next test on)."""
    import scipy.linalg  # noqa: F401  (loads scipy's BLAS, as distfact/kernels/blas_threads.py does before looking)
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController().select(user_api="blas").lib_controllers


@pytest.fixture(autouse=True)
def blas_limits_restored():
    """Every test leaves BLAS's thread limits as it found them. An executor left open, or a hold of BLAS at one thread
    not released, would keep BLAS at one thread for the rest of the test process, and a later test of threads would
    fail far from the cause (CI's run of b946566: a test file's executor never closed). A test that changes them
    fails here, and the limits and distfact's holds are put back for the tests after it."""
    libraries = _blas_libraries()
    before = [library.num_threads for library in libraries]
    yield
    after = [library.num_threads for library in libraries]
    if after != before:  # the later tests of this process start as this one did
        from distfact.kernels import blas_threads as holds

        while holds._holds:  # holds left open: released as their owners would have
            holds.release_one_thread()
        for library, threads in zip(libraries, before):
            library.set_num_threads(threads)
        pytest.fail(f"BLAS's thread limits went from {before} to {after} during this test: an executor not closed, "
                    "or a hold of BLAS at one thread not released")


def pytest_sessionstart(session):
    """The whole suite on a checkout whose kernels have no numba cache yet (a fresh clone, as CI's): compile them first,
    once, in a process per core (``distfact.warmup.main``, in a child process, so that a crash there cannot end the
    session), rather than each test process compiling the same signatures side by side as its tests reach them
    (issue 19: 70 to 130 s of a first run's time). The warm-up runs into an empty cache of its own, copied into the
    checkout's after (``_warm_up_aside``): with 2 processes it is the warm-up ``tests/test_warmup.py`` checks, which
    then need not make another (100 s of a test process's time, and both cores, on the standard machine). Not in a
    test process of pytest-xdist (the controller did it), for a run of chosen tests (paths, ``-k``, ``-m``,
    ``--lf``, ``--deselect``) or of none (``--collect-only``, ``--fixtures``, ``--setup-plan``, ``--setup-only``),
    with NUMBA_CACHE_DIR set (the cache is elsewhere), or where the cache has entries already (a kernel changed
    since compiles on first use, as without this). If it fails, for any reason, the tests compile the kernels as
    they reach them, as without it."""
    config, option = session.config, session.config.option
    if hasattr(config, "workerinput") or config.args_source != pytest.Config.ArgsSource.TESTPATHS \
            or os.environ.get("NUMBA_CACHE_DIR") or any(getattr(option, name, None) for name in (
                "keyword", "markexpr", "lf", "deselect", "collectonly", "showfixtures", "show_fixtures_per_test",
                "setupplan", "setuponly")):
        return
    import glob

    import distfact

    if glob.glob(os.path.join(os.path.dirname(distfact.__file__), "kernels", "__pycache__", "*.nbi")):
        return
    from distfact.warmup import default_processes

    terminal = config.pluginmanager.get_plugin("terminalreporter")
    say = terminal.write_line if terminal is not None else print
    processes = default_processes()
    made = tempfile.mkdtemp(prefix="distfact-tests-warmup-")
    try:
        output = _warm_up_aside(distfact, processes, made)
    except BaseException as exc:  # noqa: BLE001 - best effort: the tests do not need it
        shutil.rmtree(made, ignore_errors=True)
        if not isinstance(exc, Exception):  # an interrupt: the directory goes, the session stops
            raise
        say(f"distfact: the warm-up of numba's cache failed ({type(exc).__name__}: {exc}); the tests compile the "
            "kernels")
        return
    config.stash[_WARMUP_MADE] = made
    if processes == 2:  # the warm-up test_warmup.py checks: its fixture reads this one instead of making its own
        os.environ[SESSION_WARMUP] = made  # read by the test processes, started after this hook
    say(f"distfact, before the tests: {output.strip().splitlines()[-1]}")


#: The environment variable naming the directory of the session's warm-up (``pytest_sessionstart``): its cache
#: (``cache``, numba's layout under NUMBA_CACHE_DIR) and what ``distfact.warmup.main(2)`` printed (``output.txt``).
SESSION_WARMUP = "DISTFACT_TESTS_SESSION_WARMUP"
_WARMUP_MADE = pytest.StashKey[str]()


def numba_cache_env(package, cache) -> dict:
    """This process's environment for a new Python process that imports ``package`` (the distfact copy these tests
    import, wherever it starts) and keeps numba's cache in ``cache`` (NUMBA_CACHE_DIR)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(package.__file__)))
    return {**os.environ, "NUMBA_CACHE_DIR": str(cache),
            "PYTHONPATH": os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))}


def _warm_up_aside(package, processes: int, made: str) -> str:
    """``distfact.warmup.main(processes)`` of ``package`` (the copy the tests import) in a new process, into an
    empty cache of its own (``made/cache``, as ``NUMBA_CACHE_DIR``); its entries then copied into the package's own
    ``__pycache__`` folders, where numba looks for them without NUMBA_CACHE_DIR (each folder's entries under
    NUMBA_CACHE_DIR are in a folder named by numba's ``get_suitable_cache_subpath``): a kernel's data files, then its
    index, for each kernel whose index is not there already (a data file left there without its index is replaced:
    the copied index names its own). The warm-up's errors reach standard error; on the time-out its processes (its
    shares too) are killed. Returns what the warm-up printed (also in ``made/output.txt``)."""
    from numba.core.caching import _CacheLocator

    cache, scratch = os.path.join(made, "cache"), os.path.join(made, "cwd")
    os.mkdir(scratch)
    with subprocess.Popen([sys.executable, "-c", f"from distfact.warmup import main; main({processes})"], cwd=scratch,
                          env=numba_cache_env(package, cache), stdout=subprocess.PIPE, text=True,
                          start_new_session=True) as child:
        try:
            output = child.communicate(timeout=1800)[0]
        except BaseException:
            os.killpg(child.pid, signal.SIGKILL)
            raise
    if child.returncode:
        raise subprocess.CalledProcessError(child.returncode, child.args, output)
    with open(os.path.join(made, "output.txt"), "w") as f:
        f.write(output)
    for folder, _, _ in os.walk(os.path.dirname(os.path.abspath(package.__file__))):
        entries = os.path.join(cache, _CacheLocator.get_suitable_cache_subpath(os.path.join(folder, "_.py")))
        if os.path.basename(folder) == "__pycache__" or not os.path.isdir(entries):
            continue
        target = os.path.join(folder, "__pycache__")
        os.makedirs(target, exist_ok=True)
        names = os.listdir(entries)
        for index in (name for name in names if name.endswith(".nbi")):
            if os.path.exists(os.path.join(target, index)):
                continue
            base = index[:-len(".nbi")]
            for name in (n for n in names if n.startswith(base + ".") and n.endswith(".nbc")):
                shutil.copy2(os.path.join(entries, name), os.path.join(target, name))
            shutil.copy2(os.path.join(entries, index), os.path.join(target, index))
    return output


def pytest_sessionfinish(session):
    """The session's warm-up directory (``pytest_sessionstart``) goes with the session."""
    made = session.config.stash.get(_WARMUP_MADE, None)
    if made is not None:
        shutil.rmtree(made, ignore_errors=True)


def pytest_collection_modifyitems(items):
    """The files of LONGEST_FILES first, in its order; the other files and every file's tests keep their order."""
    def position(item):
        return LONGEST_FILES.index(item.path.name) if item.path.name in LONGEST_FILES else len(LONGEST_FILES)

    items.sort(key=position)


def blas_threads() -> list[int]:
    """BLAS's number of threads now, one entry per loaded BLAS library (``_blas_libraries``)."""
    return [library.num_threads for library in _blas_libraries()]


def skip_unless_blas_threads() -> None:
    """Skip a test of BLAS's threads unless this process has 2 cores or more (as CI's machine has) and BLAS runs on
    more than one thread now (not under OPENBLAS_NUM_THREADS=1; a hold left by an earlier test fails that test:
    ``blas_limits_restored``)."""
    from distfact.kernels.blas_threads import usable_cores

    if usable_cores() < 2:
        pytest.skip("needs 2 cores or more (as CI's machine)")
    if max(blas_threads(), default=1) < 2:
        pytest.skip("needs BLAS on more than one thread (OPENBLAS_NUM_THREADS or another limit is 1)")


def grouped_data(m=120, n=30, n_groups=3, density=None, seed=0, dtype=np.float64):
    """Non-negative X with scattered group labels (so the store has to reorder rows)."""
    rng = np.random.default_rng(seed)
    X = rng.random((m, n))
    if density is not None:
        X = X * (rng.random((m, n)) < density)
    groups = rng.choice([f"g{i}" for i in range(n_groups)], size=m)
    return X.astype(dtype), groups


@pytest.fixture
def short_waits(monkeypatch):
    """``short_waits(**seconds)`` bounds distfact's waits on other processes (``distfact.engine.cluster.TIMEOUTS``,
    by name with ``_`` for ``-``) in this process (Dask's configuration) and in the commands it starts (as
    ``DASK_DISTFACT__TIMEOUTS__*``): a test of a bound waits for a short one, not the default, and checks that the
    configured bound is the one kept. Returns the bounds as ``timeout`` reads them."""
    import dask

    from distfact.engine.cluster import timeout

    with contextlib.ExitStack() as stack:
        def set_waits(**seconds):
            keys = {name: name.replace("_", "-") for name in seconds}  # TIMEOUTS's names
            for name, value in seconds.items():
                monkeypatch.setenv(f"DASK_DISTFACT__TIMEOUTS__{name.upper()}", str(value))
            stack.enter_context(dask.config.set({f"distfact.timeouts.{keys[name]}": value
                                                 for name, value in seconds.items()}))
            return {name: timeout(key) for name, key in keys.items()}

        yield set_waits


@pytest.fixture
def blocks_in_threads(monkeypatch):
    """Blocks held in memory run in the in-process executor's threads whatever their size (``IN_TURN_BLOCK_BYTES``
    0; small blocks run in turn otherwise): for tests of the passes in threads on small data."""
    from distfact.engine.executor import inprocess

    monkeypatch.setattr(inprocess, "IN_TURN_BLOCK_BYTES", 0)


@pytest.fixture
def dense_data():
    return grouped_data()


@pytest.fixture
def sparse_data():
    X, groups = grouped_data(density=0.3)
    return sp.csr_matrix(X), groups


# Monitoring a test cluster does without: an idle cluster of two workers costs 0.08 CPU seconds a second with Dask's
# defaults (a 20 ms event-loop tick in every process, a 10 ms profiler in each worker, a 100 ms memory check in each
# nanny, a 500 ms system monitor) and 0.011 with these. Each test process's cluster lives from its first test to the
# end of the session: with these (and one more command run in-process), the suite took 813 CPU seconds instead of
# 944 (2026-12-01; BENCHMARKS.md, "The test suite's time").
QUIET_CLUSTER = {"distributed.worker.profile.enabled": False, "distributed.admin.tick.interval": "1s",
                 "distributed.admin.system-monitor.interval": "5s", "distributed.worker.memory.monitor-interval": "1s"}


@pytest.fixture(scope="session")
def local_cluster_client():
    """A real LocalCluster: a scheduler and two single-threaded worker processes on loopback."""
    import dask
    from distributed import Client, LocalCluster

    with dask.config.set(QUIET_CLUSTER):  # read as the cluster starts (the nannies keep it for their workers)
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                               dashboard_address=None)
    with cluster, Client(cluster) as client:
        yield client


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "cluster")
TESTS = os.path.join(ROOT, "tests")


def startup_seconds() -> float:
    """How long a fresh interpreter takes, now, to import what a command that connects to a scheduler imports: the
    part of a timed command's wall time that is the machine's load, not the bound under test."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import distributed, distfact.cli, distfact.estimators"], check=True,
                   timeout=300)
    return time.perf_counter() - started


def cli_in_process(capsys, *args) -> tuple[int, str, str]:
    """``distfact ARGS`` in this process (main() as the console script runs it, in the current directory): its exit
    status, stdout and stderr. Tests run a real process where the process itself (its exit status as a process,
    a kill, a lock held by another process, start-up) is the subject."""
    from distfact.cli import main

    try:
        code = main([str(arg) for arg in args])
    except SystemExit as exit:  # argparse's usage errors and --help: the status the console script exits with
        code = exit.code
    out, err = capsys.readouterr()
    return code, out, err


def cli_here(capsys, *args, cwd=".") -> subprocess.CompletedProcess:
    """:func:`cli_in_process` in ``cwd``, returned as ``subprocess.run`` returns a real process's (exit status,
    stdout, stderr): for a test that runs a command either way, without a new interpreter's two seconds of imports."""
    with contextlib.chdir(cwd):
        code, out, err = cli_in_process(capsys, *args)
    return subprocess.CompletedProcess(["distfact", *map(str, args)], code, out, err)


# The modules a forkserver child starts with: the children the tests kill mid-work (killable_append.py's appends,
# cluster_fits.py's drivers, ``distfact_in_child``'s commands) start in milliseconds instead of a new interpreter's
# 2 s of imports. The forkserver (one per test process, started at its first child) imports them (they start no
# thread, so forking it is safe).
FORKSERVER_PRELOAD = ("killable_append", "cluster_fits", "distfact.cli")


def forkserver_child(target, *args):
    """A real child process running ``target(*args)`` (a module-level function of a ``FORKSERVER_PRELOAD`` module),
    forked from this test process's forkserver."""
    import multiprocessing.forkserver

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(FORKSERVER_PRELOAD))
    # Python 3.11's forkserver ignores the sys.path it is given and skips a preload it cannot import without a word:
    # it finds the tests' modules through PYTHONPATH, set while it starts
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([TESTS, os.path.join(TESTS, "faults"), *filter(None, [path])])
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        if path is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = path
    process = context.Process(target=target, args=args)
    process.start()
    return process


def distfact_in_child(cwd, *args) -> None:
    """``distfact ARGS`` in ``cwd``, as a :func:`forkserver_child`'s work (its output where the forkserver's goes):
    the child's exit status is the command's."""
    from distfact.cli import main

    os.chdir(cwd)
    sys.exit(main([str(arg) for arg in args]))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def start_cli_cluster(directory, n_workers: int = 2, memory: str = "1GiB", options=(), config=None) -> list[int]:
    """cluster/start-local.sh in ``directory``, with Dask's ``config`` on top of the recipe's (as environment
    variables): returns the pids of the scheduler and the workers (nannies)."""
    env = {**script_env(), **{"DASK_" + key.upper().replace(".", "__").replace("-", "_"): str(value)
                              for key, value in (config or {}).items()}}
    started = subprocess.run(["bash", os.path.join(SCRIPTS, "start-local.sh"), *options, str(n_workers), memory,
                              str(directory)], capture_output=True, text=True, timeout=180, env=env)
    assert started.returncode == 0, started.stderr
    names = ["scheduler.pid"] + [f"worker-{i}.pid" for i in range(1, n_workers + 1)]
    pids = [int(open(os.path.join(directory, name)).read()) for name in names]
    assert all(alive(pid) for pid in pids)
    return pids


def stop_cli_cluster(directory, pids) -> None:
    stopped = subprocess.run(["bash", os.path.join(SCRIPTS, "stop-local.sh"), str(directory)], capture_output=True,
                             text=True, timeout=120, env=script_env())
    assert stopped.returncode == 0, stopped.stderr
    deadline = time.time() + 30
    while any(alive(pid) for pid in pids) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in pids) and not os.path.exists(os.path.join(directory, "scheduler.json"))


def script_env() -> dict:
    """The environment for the cluster scripts: this interpreter's ``dask`` first on PATH."""
    return {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}


@pytest.fixture(scope="session")
def cli_cluster(tmp_path_factory):
    """A real cluster from cluster/start-local.sh (a scheduler and two worker processes of 1 GiB on
    127.0.0.1), shared by the test modules, without the monitoring (``QUIET_CLUSTER``: idle, 0.011 CPU seconds a
    second instead of 0.104); yields its scheduler file."""
    directory = tmp_path_factory.mktemp("dask-cluster")
    pids = start_cli_cluster(directory, config=QUIET_CLUSTER)
    yield directory / "scheduler.json"
    kill_cli_cluster(pids)


def kill_cli_cluster(pids) -> None:
    """SIGKILL to a cluster of start-local.sh (its scheduler, nannies and their workers), and wait for them to end: the
    session's cluster ends in a moment, where cluster/stop-local.sh's orderly stop takes 4 s (its workers' own
    close); the tests that start a cluster of their own check that stop (``stop_cli_cluster``)."""
    import psutil

    processes = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            process = psutil.Process(pid)
            processes += [process, *process.children(recursive=True)]
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    _, alive = psutil.wait_procs(processes, timeout=30)
    assert not alive, alive
