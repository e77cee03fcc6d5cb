"""Fault tolerance and bad conditions on a real cluster from cluster/start-local.sh (processes on 127.0.0.1):
a worker process SIGKILLed mid-fit, a driver SIGKILLed mid-fit and resumed, workers without distfact or at another
version, a store the workers cannot read, and TLS (a client without the cluster's certificate is refused)."""

import glob
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import textwrap
import time

import cloudpickle
import numpy as np
import pytest
from distributed import Client
from distributed.diagnostics.plugin import WorkerPlugin

import distfact
from cluster_fits import ITERATIVE, METHODS, estimator, fit_inputs, fit_on_the_cluster, method_store
from conftest import cli_here, forkserver_child, grouped_data, start_cli_cluster, stop_cli_cluster


class KillWorkerOnce(WorkerPlugin):
    """SIGKILLs the worker process named ``worker_name`` as it starts its first block task after the file ``go``
    exists (the driver creates it at a chosen iteration), once per test: ``marker`` records the kill, so the
    worker the nanny restarts is left alone."""

    def __init__(self, directory, worker_name: str = "worker-1"):
        self.go, self.marker = os.path.join(directory, "go"), os.path.join(directory, "killed")
        self.worker_name = worker_name

    def setup(self, worker):
        self.worker = worker

    def transition(self, key, start, finish, **kwargs):
        if (finish == "executing" and self.worker.name == self.worker_name and str(key).startswith("run_block")
                and os.path.exists(self.go) and not os.path.exists(self.marker)):
            open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)


cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this test module


def fit_killing_a_worker(method, store, client, directory, at_iteration=2, **overrides):
    """Fit ``method`` on ``client``; worker-1 is SIGKILLed in the pass after iteration ``at_iteration`` (the
    multigroup SVD: in its only pass). Returns the model and the iterations its callback saw."""
    seen = []

    def callback(info):
        seen.append(info.iteration)
        if info.iteration == at_iteration:
            open(os.path.join(directory, "go"), "w").close()

    if method == "multigroup-svd":
        open(os.path.join(directory, "go"), "w").close()
    else:
        overrides["callback"] = callback
    client.wait_for_workers(2, timeout=60)
    client.register_plugin(KillWorkerOnce(str(directory)), name="kill-worker-once")
    try:
        model = estimator(method, **overrides).fit(store, client=client, **fit_inputs(method, store))
    finally:
        client.unregister_worker_plugin("kill-worker-once")
    assert os.path.exists(os.path.join(directory, "killed"))  # a worker was killed during the fit
    return model, seen


@pytest.mark.parametrize("method", METHODS)
def test_a_worker_killed_mid_fit_gives_the_same_factors(cli_cluster, tmp_path, method):
    store = method_store(method, tmp_path / "x.zarr")
    here = estimator(method).fit(store, **fit_inputs(method, store))
    with Client(scheduler_file=str(cli_cluster)) as client:
        there, _ = fit_killing_a_worker(method, store, client, tmp_path)
    assert np.array_equal(here.components_, there.components_)
    # Dask may recompute what was lost by itself: the multigroup SVD's pass has no local factors (only reads),
    # and wL1-NMF's column pass copies every local factor to the column tasks' workers, so whether anything
    # unrecoverable was lost depends on where the pass's scattered state happened to be
    if method not in ("multigroup-svd", "wl1-nmf"):
        assert there.worker_losses_ >= 1


@pytest.mark.parametrize("method", ["nmf", "fairer-nmf"])
def test_a_worker_killed_mid_fit_with_checkpoints_resumes_from_the_newest(cli_cluster, tmp_path, method):
    store = method_store(method, tmp_path / "x.zarr")
    here = estimator(method).fit(store)
    with Client(scheduler_file=str(cli_cluster)) as client:
        there, seen = fit_killing_a_worker(method, store, client, tmp_path, at_iteration=3,
                                           checkpoint_dir=str(tmp_path / "run"), checkpoint_every=1)
    assert there.worker_losses_ >= 1 and there.resume is False
    assert np.array_equal(here.components_, there.components_)
    # the rerun continued from the checkpoint of the last finished iteration: no iteration seen twice (a restart
    # from the start would have shown the first ones again)
    assert seen == list(range(1, there.max_iter + 1))


def test_a_rerun_after_a_lost_worker_resumes_and_restores_the_resume_parameter(tmp_path):
    """The rerun logic without a cluster: a callback that raises WorkerLost once, at iteration 5."""
    from distfact.engine import WorkerLost

    X, groups = grouped_data(m=90, n=12)
    undisturbed = distfact.NMF(3, max_iter=12, tol=0, random_state=0).fit(X, groups=groups)
    seen = []

    def lose_a_worker_once(info):
        seen.append(info.iteration)
        if info.iteration == 5 and seen.count(5) == 1:
            raise WorkerLost("a Dask worker was lost during a pass (simulated)")

    for checkpoint_dir, restart in ((None, 1), (str(tmp_path / "run"), 5)):
        seen.clear()
        model = distfact.NMF(3, max_iter=12, tol=0, random_state=0, checkpoint_dir=checkpoint_dir,
                             checkpoint_every=2, callback=lose_a_worker_once).fit(X, groups=groups)
        assert seen[:6] == [1, 2, 3, 4, 5, restart] and model.worker_losses_ == 1 and model.resume is False
        assert np.array_equal(model.components_, undisturbed.components_)


def test_a_rerun_waits_for_the_workers_the_fit_had(cli_cluster, tmp_path, short_waits, caplog):
    """A rerun first waits for the cluster to regain its size (a nanny restarts a lost worker in seconds), else X
    would all go to the survivors: here the lost attempt claims 3 workers on a 2-worker cluster, so the rerun waits
    the rejoin bound (configured: 1 s) and goes on with 2."""
    import logging

    from distfact.engine import WorkerLost

    short_waits(rejoin=1)
    X, groups = grouped_data(m=90, n=12)
    undisturbed = distfact.NMF(3, max_iter=6, tol=0, random_state=0).fit(X, groups=groups)
    lost = []

    def lose_a_worker_once(info):
        if info.iteration == 2 and not lost:
            lost.append(info.iteration)
            raise WorkerLost("a Dask worker was lost during a pass (simulated)", n_workers=3)

    with caplog.at_level(logging.WARNING, logger="distfact"):
        model = distfact.NMF(3, max_iter=6, tol=0, random_state=0, callback=lose_a_worker_once).fit(
            X, groups=groups, client=str(cli_cluster))
    assert model.worker_losses_ == 1 and not hasattr(model, "_workers_before_loss")
    assert "2 of the 3 workers are back after 1 s; going on with them" in caplog.text
    assert np.array_equal(model.components_, undisturbed.components_)


def committed_checkpoints(directory) -> list[str]:
    """Checkpoints renamed into place (iter-NNNNNN/), not one killed between its COMMITTED and its rename
    (iter-NNNNNN.partial-<hex>/, which the engine does not count either)."""
    return sorted(glob.glob(os.path.join(directory, "**", "iter-" + "[0-9]" * 6, "COMMITTED"), recursive=True))


@pytest.mark.parametrize("method", ITERATIVE)
def test_a_driver_killed_mid_fit_resumes_to_the_same_factors(cli_cluster, tmp_path, method):
    store = method_store(method, tmp_path / "x.zarr")
    iterations = {"max_iter": 40} if method != "fairer-nmf" else {"max_iter": 30, "estimate_max_iter": 10}
    params = {**iterations, "checkpoint_dir": str(tmp_path / "run"), "checkpoint_every": 1}
    if method == "nmf":
        params["solver"] = "mu"  # (HALS: the loop is fast enough to finish before the kill lands)
    here = estimator(method, **{**params, "checkpoint_dir": None}).fit(store, **fit_inputs(method, store))
    driver = forkserver_child(fit_on_the_cluster, method, params, str(store.path), str(cli_cluster))
    deadline = time.time() + 120
    while len(committed_checkpoints(tmp_path / "run")) < 2 and driver.is_alive() and time.time() < deadline:
        time.sleep(0.02)
    driver.kill()
    driver.join(30)
    assert driver.exitcode == -signal.SIGKILL  # killed, not finished (its traceback, if it failed, is on stderr)
    newest = committed_checkpoints(tmp_path / "run")[-1]
    assert int(os.path.basename(os.path.dirname(newest))[5:]) < params["max_iter"]  # mid-fit
    with Client(scheduler_file=str(cli_cluster)) as client:
        client.wait_for_workers(2, timeout=60)
        resumed = estimator(method, **params, resume=True).fit(store, client=client, **fit_inputs(method, store))
    assert np.array_equal(here.components_, resumed.components_)
    assert resumed.n_iter_ == here.n_iter_


PRELOAD = textwrap.dedent("""
    # worker-1 behaves as if distfact were not installed; worker-2 as if another version were
    import sys

    def dask_setup(worker):
        if worker.name == "worker-1":
            class NoDistfact:
                def find_spec(self, name, path=None, target=None):
                    if name == "distfact" or name.startswith("distfact."):
                        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            for module in [m for m in sys.modules if m == "distfact" or m.startswith("distfact.")]:
                del sys.modules[module]
            sys.meta_path.insert(0, NoDistfact())
        else:
            import distfact._version
            distfact._version.__version__ = "0.0.1"
""")


def test_workers_without_distfact_or_at_another_version_are_named_within_seconds(tmp_path, capsys):
    (tmp_path / "preload.py").write_text(PRELOAD)
    directory = tmp_path / "cluster"
    pids = start_cli_cluster(directory, options=["--preload", str(tmp_path / "preload.py")])
    try:
        store = method_store("nmf", tmp_path / "x.zarr")
        started = time.perf_counter()
        out = cli_here(capsys, "fit", store.path, "--rank", 2, "--scheduler", directory / "scheduler.json",
                       "--no-progress", cwd=tmp_path)
        assert out.returncode == 2, out.stderr
        assert time.perf_counter() - started < 30
        assert "worker-1 (tcp://127.0.0.1:" in out.stderr and "No module named 'distfact'" in out.stderr
        assert "worker-2 (tcp://127.0.0.1:" in out.stderr
        assert f"runs distfact 0.0.1, this process {distfact.__version__}" in out.stderr
    finally:
        stop_cli_cluster(directory, pids)


def test_a_store_the_workers_cannot_read_is_an_error_naming_it(cli_cluster, tmp_path):
    store = method_store("nmf", tmp_path / "x.zarr")
    os.rename(tmp_path / "x.zarr", tmp_path / "moved.zarr")  # opened here; gone where the workers look
    with Client(scheduler_file=str(cli_cluster)) as client:
        client.wait_for_workers(2, timeout=60)
        started = time.perf_counter()
        with pytest.raises(ValueError, match=r"cannot read the store .*x\.zarr.*FileNotFoundError") as caught:
            estimator("nmf").fit(store, client=client)
        assert time.perf_counter() - started < 10
    assert str(caught.value).count("cannot read the store") == 2  # both workers named


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory):
    """A TLS cluster from start-local.sh --tls, with certificates made by `distfact make-certs`."""
    root = tmp_path_factory.mktemp("tls")
    made = subprocess.run([sys.executable, "-m", "distfact.cli", "make-certs", str(root / "certs")],
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    assert all(os.stat(root / "certs" / name).st_mode & 0o077 == 0 for name in ("ca.pem", "cert.pem", "key.pem"))
    pids = start_cli_cluster(root / "cluster", options=["--tls", str(root / "certs")])
    yield root
    stop_cli_cluster(root / "cluster", pids)


def test_tls_cluster_fits_with_the_certificate_and_refuses_clients_without(tls_cluster, tmp_path, capsys):
    from distfact.engine.cluster import client_for, connect
    from distfact.engine.tls import make_certificates

    with pytest.raises(FileExistsError, match="ca.pem"):  # certificates are never overwritten
        make_certificates(tls_cluster / "certs")
    scheduler = str(tls_cluster / "cluster" / "scheduler.json")
    address = json.load(open(scheduler))["address"]
    assert address.startswith("tls://127.0.0.1:")
    store = method_store("nmf", tmp_path / "x.zarr")
    ok = cli_here(capsys, "fit", store.path, "--rank", 2, "--scheduler", scheduler, "--tls-dir", tls_cluster / "certs",
                  "--no-progress", "--max-iter", 5, "--output", tmp_path / "out", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    here = distfact.NMF(2, max_iter=5, random_state=0).fit(store)
    assert np.array_equal(np.load(tmp_path / "out" / "components.npy"), here.components_)

    # a TLS client presenting no certificate: the scheduler ends the handshake
    host, port = address.removeprefix("tls://").rsplit(":", 1)
    context = ssl.create_default_context(cafile=str(tls_cluster / "certs" / "ca.pem"))
    context.check_hostname = False
    with pytest.raises((ssl.SSLError, ConnectionError)):
        with socket.create_connection((host, int(port)), timeout=10) as raw:
            with context.wrap_socket(raw) as tls:
                tls.sendall(b"\0" * 8)
                assert tls.recv(1) != b""  # TLS 1.3: the refusal arrives on the first read
    # certificates of another authority: refused, and said so within the connect timeout
    assert cli_here(capsys, "make-certs", tmp_path / "other", cwd=tmp_path).returncode == 0
    with pytest.raises(ValueError, match="same authority"):
        connect(scheduler, tls_dir=tmp_path / "other")
    # certificates for a plain-TCP scheduler, or without any scheduler: said so
    with pytest.raises(ValueError, match="does not speak TLS"):
        connect("tcp://127.0.0.1:9", tls_dir=tls_cluster / "certs")
    with pytest.raises(ValueError, match="give its address too"):
        with client_for(None, 2, tls_dir=tls_cluster / "certs"):
            pass
    # plain TCP to the TLS port: no connection
    with pytest.raises(OSError):
        Client(f"tcp://{host}:{port}", timeout="5s")
    # the CLI without --tls-dir: told that the scheduler speaks TLS
    out = cli_here(capsys, "fit", store.path, "--rank", 2, "--scheduler", scheduler, "--no-progress", cwd=tmp_path)
    assert out.returncode == 2 and "speaks TLS" in out.stderr
