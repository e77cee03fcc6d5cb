"""cluster/start-local.sh and stop-local.sh: a real Dask cluster from the Dask CLI (a scheduler and worker processes
on 127.0.0.1); every method gives bitwise the in-process factors on it; bad addresses fail within seconds."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

import distfact
from conftest import grouped_data

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "cluster")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def cli_cluster(tmp_path_factory):
    directory = tmp_path_factory.mktemp("dask-cluster")
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    started = subprocess.run(["bash", os.path.join(SCRIPTS, "start-local.sh"), "2", "1GiB", str(directory)],
                             capture_output=True, text=True, timeout=180, env=env)
    assert started.returncode == 0, started.stderr
    pids = [int(open(directory / name).read()) for name in ("scheduler.pid", "worker-1.pid", "worker-2.pid")]
    assert all(alive(pid) for pid in pids)
    yield directory / "scheduler.json"
    stopped = subprocess.run(["bash", os.path.join(SCRIPTS, "stop-local.sh"), str(directory)], capture_output=True,
                             text=True, timeout=120, env=env)
    assert stopped.returncode == 0, stopped.stderr
    deadline = time.time() + 30
    while any(alive(pid) for pid in pids) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in pids) and not (directory / "scheduler.json").exists()


def fits(n_components=3):
    return {
        "nmf": lambda: distfact.NMF(n_components, solver="hals", max_iter=8, tol=0, random_state=0),
        "fairer-nmf": lambda: distfact.FairerNMF(n_components, n_estimates=2, max_iter=6, estimate_max_iter=6,
                                                 random_state=0),
        "stratified-nmf": lambda: distfact.StratifiedNMF(n_components, max_iter=6, random_state=0),
        "wl1-nmf": lambda: distfact.WeightedL1NMF(n_components, lam=0.5, max_iter=3, random_state=0),
        "ssnmf": lambda: distfact.SSNMF(n_components, model="DF", max_iter=6, random_state=0),
        "multigroup-svd": lambda: distfact.MultigroupSVD(n_components, center=True, scale=True),
    }


@pytest.mark.parametrize("method", list(fits()))
def test_every_method_is_bitwise_the_same_on_the_cli_cluster(cli_cluster, tmp_path, method):
    from distributed import Client

    X, groups = grouped_data(m=240, n=20, n_groups=3, density=0.4)
    store = distfact.from_arrays(X, groups, tmp_path / "x.zarr", block_rows=40, signed=method == "multigroup-svd")
    labels = None
    if method == "ssnmf":
        labels = np.empty(store.shape[0], dtype=object)
        labels[store.row_index()] = np.repeat(store.group_names, store.group_sizes)
    extra = {"y": labels} if method == "ssnmf" else {}
    here = fits()[method]().fit(store, **extra)
    with Client(scheduler_file=str(cli_cluster)) as client:
        assert len(client.scheduler_info()["workers"]) == 2
        there = fits()[method]().fit(store, client=client, **extra)
    assert there.scheduler_["scheduler"] != "in-process"
    assert np.array_equal(here.components_, there.components_)


def test_an_unreachable_scheduler_is_an_error_within_seconds(tmp_path):
    X, groups = grouped_data(m=40, n=6)
    distfact.from_arrays(X, groups, tmp_path / "x.zarr")
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "distfact.cli", "fit", str(tmp_path / "x.zarr"), "--rank", "2",
                          "--scheduler", "tcp://127.0.0.1:9", "--no-progress"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and "cannot reach the Dask scheduler at 'tcp://127.0.0.1:9'" in out.stderr
    assert time.perf_counter() - started < 25  # 10 s connect timeout plus the interpreter's start
    missing = subprocess.run([sys.executable, "-m", "distfact.cli", "fit", str(tmp_path / "x.zarr"), "--rank", "2",
                              "--scheduler", str(tmp_path / "nowhere.json")], capture_output=True, text=True,
                             timeout=120)
    assert missing.returncode == 2 and "scheduler file" in missing.stderr and "does not exist" in missing.stderr


def test_the_recipes_parse_and_hold_what_they_say():
    import dask
    import yaml

    config = yaml.safe_load(open(os.path.join(SCRIPTS, "dask.yaml")))
    with dask.config.set(config):
        assert dask.config.get("distributed.worker.memory.spill") == 0.7
        assert dask.config.get("distributed.comm.timeouts.connect") == "10s"
    cluster = yaml.safe_load(open(os.path.join(SCRIPTS, "k8s", "daskcluster.yaml")))
    assert (cluster["apiVersion"], cluster["kind"]) == ("kubernetes.dask.org/v1", "DaskCluster")
    assert cluster["spec"]["scheduler"]["service"]["type"] == "ClusterIP"  # the dashboard is not exposed
    worker = cluster["spec"]["worker"]["spec"]["containers"][0]
    assert "--memory-limit" in worker["args"] and worker["resources"]["limits"]["memory"]
    job = yaml.safe_load(open(os.path.join(SCRIPTS, "k8s", "daskjob-pipeline.yaml")))
    assert job["kind"] == "DaskJob" and "distfact run" in job["spec"]["job"]["spec"]["containers"][0]["args"][0]
    compose = yaml.safe_load(open(os.path.join(SCRIPTS, "compose.yaml")))
    assert set(compose["services"]) == {"scheduler", "worker", "runner"}
    assert all(port.startswith("127.0.0.1:") for port in compose["services"]["scheduler"]["ports"])
    dockerfile = open(os.path.join(SCRIPTS, "Dockerfile")).read()
    assert f"ARG DASK_VERSION={dask.__version__}" in dockerfile  # pinned to the Dask this is tested with
