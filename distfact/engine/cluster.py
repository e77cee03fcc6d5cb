"""Choosing where to run: nothing (in-process), a scheduler address, or a LocalCluster."""

from __future__ import annotations

import contextlib
import logging

logger = logging.getLogger("distfact")


@contextlib.contextmanager
def client_for(scheduler: str | None = None, local_cluster: int | None = None):
    """Yield a ``distributed.Client`` for ``scheduler`` (an address or a scheduler file ending
    in .json) or a new ``LocalCluster`` of ``local_cluster`` single-threaded worker
    processes; yield None (the in-process default) when neither is given."""
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
    with connect(scheduler) as client:
        logger.info("connected to %s; dashboard %s", client.scheduler.address, client.dashboard_link)
        yield client


CONNECT_TIMEOUT = "10s"


def connect(scheduler: str):
    """A ``distributed.Client`` for a scheduler address or a scheduler file (``*.json``); an unreachable
    scheduler or a missing file is a ``ValueError`` saying so after at most ``CONNECT_TIMEOUT``, not a hang."""
    import os

    from distributed import Client

    if scheduler.endswith(".json"):
        if not os.path.isfile(scheduler):
            raise ValueError(f"scheduler file {scheduler!r} does not exist (start a cluster with "
                             "cluster/start-local.sh, which writes one)")
        kwargs = {"scheduler_file": scheduler}
    else:
        kwargs = {"address": scheduler}
    try:
        return Client(**kwargs, timeout=CONNECT_TIMEOUT)
    except (OSError, TimeoutError) as exc:
        raise ValueError(f"cannot reach the Dask scheduler at {scheduler!r} within {CONNECT_TIMEOUT} ({exc}); "
                         "is it running and reachable from here?") from exc
