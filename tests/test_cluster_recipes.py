"""cluster/start-local.sh and stop-local.sh: a real Dask cluster from the Dask CLI (a scheduler and worker processes
on 127.0.0.1); every method gives bitwise the in-process factors on it; bad addresses fail within seconds."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

import distfact
from distfact.engine.cluster import TIMEOUTS, timeout
from cluster_fits import METHODS, estimator, fit_inputs, method_store
from conftest import SCRIPTS, cli_here, grouped_data, startup_seconds


@pytest.mark.parametrize("method", METHODS)
def test_every_method_is_bitwise_the_same_on_the_cli_cluster(cli_cluster, tmp_path, method):
    from distributed import Client

    store = method_store(method, tmp_path / "x.zarr")
    here = estimator(method).fit(store, **fit_inputs(method, store))
    with Client(scheduler_file=str(cli_cluster)) as client:
        client.wait_for_workers(2, timeout=60)
        there = estimator(method).fit(store, client=client, **fit_inputs(method, store))
    assert there.scheduler_["scheduler"] != "in-process" and there.scheduler_["workers"] == 2
    assert np.array_equal(here.components_, there.components_)


def test_an_unreachable_scheduler_is_an_error_within_seconds(tmp_path, capsys, short_waits):
    bound = short_waits(connect=3)["connect"]  # Dask's connection retries until the bound: a configured 3 s
    X, groups = grouped_data(m=40, n=6)
    distfact.from_arrays(X, groups, tmp_path / "x.zarr")
    start_up = startup_seconds()
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "distfact.cli", "fit", str(tmp_path / "x.zarr"), "--rank", "2",
                          "--scheduler", "tcp://127.0.0.1:9", "--no-progress"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and "cannot reach a Dask scheduler at 'tcp://127.0.0.1:9'" in out.stderr
    # the connect bound, plus the interpreter's start as long as it takes now (twice: a loaded machine varies)
    assert time.perf_counter() - started < bound + 5 + 2 * start_up
    missing = cli_here(capsys, "fit", tmp_path / "x.zarr", "--rank", 2, "--scheduler", tmp_path / "nowhere.json",
                       cwd=tmp_path)
    assert missing.returncode == 2 and "scheduler file" in missing.stderr and "does not exist" in missing.stderr


def test_the_recipes_parse_and_hold_what_they_say():
    import dask
    import yaml

    config = yaml.safe_load(open(os.path.join(SCRIPTS, "dask.yaml")))
    with dask.config.set(config):
        assert dask.config.get("distributed.worker.memory.spill") == 0.7
        assert dask.config.get("distributed.comm.timeouts.connect") == "10s"
        assert {name: timeout(name) for name in TIMEOUTS} == TIMEOUTS  # the recipe states distfact's defaults
        assert set(config["distfact"]["timeouts"]) == set(TIMEOUTS)
    cluster = yaml.safe_load(open(os.path.join(SCRIPTS, "k8s", "daskcluster.yaml")))
    assert (cluster["apiVersion"], cluster["kind"]) == ("kubernetes.dask.org/v1", "DaskCluster")
    assert cluster["spec"]["scheduler"]["service"]["type"] == "ClusterIP"  # the dashboard is not exposed
    worker = cluster["spec"]["worker"]["spec"]["containers"][0]
    assert "--memory-limit" in worker["args"] and worker["resources"]["limits"]["memory"]
    job = yaml.safe_load(open(os.path.join(SCRIPTS, "k8s", "daskjob-pipeline.yaml")))
    assert job["kind"] == "DaskJob" and "distfact run" in job["spec"]["job"]["spec"]["containers"][0]["args"][0]
    compose = yaml.safe_load(open(os.path.join(SCRIPTS, "compose.yaml")))
    assert set(compose["services"]) == {"certs", "scheduler", "worker", "runner"}
    assert all(port.startswith("127.0.0.1:") for port in compose["services"]["scheduler"]["ports"])
    services = compose["services"]
    assert "tls" in services["scheduler"]["command"] and "tls://scheduler:8786" in services["worker"]["command"]
    assert "--tls-dir" in services["runner"]["command"]
    dockerfile = open(os.path.join(SCRIPTS, "Dockerfile")).read()
    assert f"ARG DASK_VERSION={dask.__version__}" in dockerfile  # pinned to the Dask this is tested with


CRDS = ("operator", "deployment", "helm", "dask-kubernetes-operator", "crds")


@pytest.mark.parametrize("manifest, crd", [("daskcluster.yaml", "daskcluster.yaml"),
                                           ("daskjob-pipeline.yaml", "daskjob.yaml")])
def test_the_kubernetes_manifests_validate_against_the_operators_crd_schemas(manifest, crd):
    import dask_kubernetes
    import jsonschema
    import yaml

    definition = yaml.safe_load(open(os.path.join(os.path.dirname(dask_kubernetes.__file__), *CRDS, crd)))
    document = yaml.safe_load(open(os.path.join(SCRIPTS, "k8s", manifest)))
    group, kind = definition["spec"]["group"], definition["spec"]["names"]["kind"]
    (version,) = [v for v in definition["spec"]["versions"] if f"{group}/{v['name']}" == document["apiVersion"]]
    assert document["kind"] == kind
    schema = version["schema"]["openAPIV3Schema"]
    # every object has these; the API server adds them to a CRD's schema
    schema["properties"].update(apiVersion={"type": "string"}, kind={"type": "string"}, metadata={"type": "object"})
    validator = jsonschema.Draft7Validator(strict(schema))
    assert [error.message for error in validator.iter_errors(document)] == []
    # the schema is strict enough to catch a wrong type and a misspelt key
    broken = yaml.safe_load(open(os.path.join(SCRIPTS, "k8s", manifest)))
    pod = broken["spec"]["worker"]["spec"] if kind == "DaskCluster" else broken["spec"]["job"]["spec"]
    pod["containers"][0]["resources"] = {"limits": "4Gi"}
    pod["containers"][0]["volumeMount"] = pod["containers"][0].pop("volumeMounts")
    messages = [error.message for error in validator.iter_errors(broken)]
    assert any("is not of type 'object'" in m for m in messages)
    assert any("'volumeMount' was unexpected" in m for m in messages)


def strict(schema):
    """``schema`` with unknown keys refused wherever it lists the known ones, as the Kubernetes API server's
    strict field validation does (except where the CRD keeps unknown fields)."""
    if isinstance(schema, dict):
        schema = {key: strict(value) for key, value in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema \
                and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        schema = [strict(item) for item in schema]
    return schema
