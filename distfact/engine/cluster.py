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
    if tls_dir is not None and not scheduler:
        raise ValueError("--tls-dir (tls_dir) is for connecting to a scheduler: give its address too (a local "
                         "cluster or the in-process scheduler has no network traffic to protect)")
    if not scheduler and not local_cluster:
        yield None
        return
    from distributed import Client, LocalCluster

    if local_cluster:
        import dask

        # distfact places each block's tasks itself; stealing moved whole blocks (as in cluster/dask.yaml).
        # The setting is read when the scheduler starts.
        with dask.config.set({"distributed.scheduler.work-stealing": False}):
            cluster = LocalCluster(n_workers=int(local_cluster), threads_per_worker=1, processes=True,
                                   dashboard_address="127.0.0.1:0", host="127.0.0.1", silence_logs=logging.WARNING)
        with cluster, Client(cluster) as client:
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
    if security is not None and not address.startswith("tls://"):
        raise ValueError(f"the scheduler at {address!r} does not speak TLS, but certificates were given "
                         f"({os.fspath(tls_dir)!r}); start it with TLS (cluster/start-local.sh --tls) or drop them")
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
REJOIN_WAIT = 20  # seconds a rerun after a lost worker waits for the cluster to regain its size
CHECK_TIMEOUT = 10  # seconds every worker has to answer the check before a fit


def worker_facts(store_path: str | None) -> dict:
    """Run on each worker: the distfact version there, and why the store is unreadable there, if it is.
    (Pickled by reference: where distfact is not installed, unpickling this function is what fails.)"""
    from distfact import __version__
    from distfact.store.grouped import unreadable

    return {"version": __version__, "store_error": None if store_path is None else unreadable(store_path)}


def _ask_each_worker(client, function, *args) -> dict:
    """``function(*args)`` on every worker, each given ``CHECK_TIMEOUT`` s: ``{address: result, or the exception
    (a TimeoutError for a worker that did not answer)}``."""
    import asyncio

    addresses = list(client.scheduler_info()["workers"])

    async def ask(address):
        try:
            answer = await asyncio.wait_for(client._run(function, *args, workers=[address], on_error="return"),
                                            CHECK_TIMEOUT)
            return answer.get(address, TimeoutError())
        except OSError as exc:  # TimeoutError included
            return exc

    async def ask_all():
        return await asyncio.gather(*(ask(address) for address in addresses))

    return dict(zip(addresses, client.sync(ask_all)))


def check_workers(client, store_path: str | None, n_workers: int = 1) -> None:
    """Before a fit on a cluster: at least one worker (waiting up to ``WORKER_WAIT`` s; for ``n_workers`` up to
    ``REJOIN_WAIT`` s more, then going on with those there are), every worker answering
    within ``CHECK_TIMEOUT`` s, distfact importable there at this process's version, and the store readable at
    ``store_path``; a ``ValueError`` naming the workers and what is wrong otherwise, rather than tasks failing
    or hanging later. (Workers that join after the check are not checked.)"""
    from distfact import __version__

    try:
        client.wait_for_workers(1, timeout=WORKER_WAIT)
    except TimeoutError as exc:
        raise ValueError(f"no Dask worker joined the scheduler at {client.scheduler.address} within "
                         f"{WORKER_WAIT} s") from exc
    if n_workers > 1:
        try:
            client.wait_for_workers(n_workers, timeout=REJOIN_WAIT)
        except TimeoutError:
            logger.warning("%d of the %d workers are back after %s s; going on with them",
                           len(client.scheduler_info()["workers"]), n_workers, REJOIN_WAIT)
    facts = _ask_each_worker(client, worker_facts, store_path)
    current = client.scheduler_info()["workers"]  # a worker that left meanwhile (lost, restarting) is no concern
    names = {address: info.get("name") for address, info in current.items()}
    facts = {address: fact for address, fact in facts.items() if address in current}
    problems = []
    for address, fact in sorted(facts.items()):
        worker = f"{names.get(address)} ({address})" if names.get(address) not in (None, address) else address
        if isinstance(fact, TimeoutError):
            problems.append(f"{worker}: did not answer within {CHECK_TIMEOUT} s (frozen or overloaded?)")
        elif isinstance(fact, BaseException):
            missing = "No module named 'distfact" in str(fact)
            problems.append(f"{worker}: cannot run distfact ({fact})" + (
                f"; install distfact {__version__} there (cluster/Dockerfile does)" if missing else ""))
        elif fact["version"] != __version__:
            problems.append(f"{worker}: runs distfact {fact['version']}, this process {__version__}; install the "
                            "same version on the workers")
        elif fact["store_error"] is not None:
            problems.append(f"{worker}: cannot read the store {store_path!r} ({fact['store_error']}); the store "
                            "must be on a file system every worker mounts at the same path")
    if problems:
        raise ValueError("the Dask workers cannot run this fit:\n  " + "\n  ".join(problems))
