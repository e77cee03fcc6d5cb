"""Choosing where to run: nothing (in-process), a scheduler address, or a LocalCluster."""

from __future__ import annotations

import contextlib
import logging
import os

logger = logging.getLogger("distfact")


@contextlib.contextmanager
def client_for(scheduler: str | None = None, local_cluster: int | None = None, tls_dir=None):
    """Yield a ``distributed.Client`` for ``scheduler`` (an address or a scheduler file ending
    in .json; over TLS with the certificates in ``tls_dir``, see ``engine/tls.py``) or a new
    ``LocalCluster`` of ``local_cluster`` single-threaded worker processes; yield None (the
    in-process default) when neither is given."""
    if scheduler and local_cluster:
        raise ValueError("give either a scheduler address or --local-cluster, not both")
    if not scheduler and not local_cluster:
        yield None
        return
    from distributed import Client, LocalCluster

    if local_cluster:
        with LocalCluster(n_workers=int(local_cluster), threads_per_worker=1, processes=True,
                          dashboard_address="127.0.0.1:0", host="127.0.0.1",
                          silence_logs=logging.WARNING) as cluster, Client(cluster) as client:
            logger.info("LocalCluster with %d workers; dashboard %s", local_cluster, client.dashboard_link)
            yield client
        return
    with connect(scheduler, tls_dir) as client:
        logger.info("connected to %s; dashboard %s", client.scheduler.address, client.dashboard_link)
        yield client


CONNECT_TIMEOUT = "10s"


def connect(scheduler: str, tls_dir=None):
    """A ``distributed.Client`` for a scheduler address or a scheduler file (``*.json``), over TLS with the
    certificates in ``tls_dir`` (else with the Dask configuration's ``distributed.comm.tls`` settings, if any).
    An unreachable scheduler, a missing file, or a TLS scheduler without certificates is a ``ValueError`` saying
    so after at most ``CONNECT_TIMEOUT``, not a hang."""
    import json

    import dask
    from distributed import Client

    from .tls import security_from_dir

    if scheduler.endswith(".json"):
        if not os.path.isfile(scheduler):
            raise ValueError(f"scheduler file {scheduler!r} does not exist (start a cluster with "
                             "cluster/start-local.sh, which writes one)")
        kwargs = {"scheduler_file": scheduler}
        with open(scheduler) as f:
            address = json.load(f).get("address", "")
    else:
        kwargs, address = {"address": scheduler}, scheduler
    security = None if tls_dir is None else security_from_dir(tls_dir)
    configured = dask.config.get("distributed.comm.tls.ca-file", None)
    if address.startswith("tls://") and security is None and not configured:
        raise ValueError(f"the scheduler at {address!r} speaks TLS: give its certificate directory (--tls-dir DIR, "
                         "or tls_dir in a pipeline's [cluster]) or set distributed.comm.tls in the Dask configuration")
    try:
        return Client(**kwargs, timeout=CONNECT_TIMEOUT, security=security)
    except (OSError, TimeoutError) as exc:
        hint = (" (over TLS: do the scheduler and this client use certificates of the same authority?)"
                if address.startswith("tls://") else "")
        raise ValueError(f"cannot reach the Dask scheduler at {scheduler!r} within {CONNECT_TIMEOUT} ({exc}){hint}; "
                         "is it running and reachable from here?") from exc

WORKER_WAIT = 30  # seconds a fit waits for a first worker to join before it gives up


def worker_facts(store_path: str | None) -> dict:
    """Run on each worker: the distfact version there, and whether the store is readable there. (Pickled by
    reference: where distfact is not installed, unpickling this function is what fails.)"""
    from distfact import __version__

    facts = {"version": __version__}
    if store_path is not None:
        try:
            with open(os.path.join(store_path, "zarr.json"), "rb") as f:
                f.read(1)
        except OSError as exc:
            facts["store_error"] = f"{type(exc).__name__}: {exc.strerror or exc}"
    return facts


def check_workers(client, store_path: str | None) -> None:
    """Before a fit on a cluster: at least one worker (waiting up to ``WORKER_WAIT`` s), distfact importable on
    every worker at this process's version, and the store readable at ``store_path`` from every worker; a
    ``ValueError`` naming the workers and what is wrong otherwise, rather than tasks failing later."""
    from distfact import __version__

    try:
        client.wait_for_workers(1, timeout=WORKER_WAIT)
    except TimeoutError as exc:
        raise ValueError(f"no Dask worker joined the scheduler at {client.scheduler.address} within "
                         f"{WORKER_WAIT} s") from exc
    facts = client.run(worker_facts, store_path, on_error="return")
    names = {address: info.get("name") for address, info in client.scheduler_info()["workers"].items()}
    problems = []
    for address, fact in sorted(facts.items()):
        worker = f"{names.get(address)} ({address})" if names.get(address) not in (None, address) else address
        if isinstance(fact, BaseException):
            problems.append(f"{worker}: cannot run distfact ({fact}); install distfact "
                            f"{__version__} there (cluster/Dockerfile does)")
        elif fact["version"] != __version__:
            problems.append(f"{worker}: runs distfact {fact['version']}, this process {__version__}; install the "
                            "same version on the workers")
        elif "store_error" in fact:
            problems.append(f"{worker}: cannot read the store {store_path!r} ({fact['store_error']}); the store "
                            "must be on a file system every worker mounts at the same path")
    if problems:
        raise ValueError("the Dask workers cannot run this fit:\n  " + "\n  ".join(problems))
