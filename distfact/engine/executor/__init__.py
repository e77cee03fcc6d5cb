"""Where the passes run: in this process, or on a Dask distributed cluster.

An executor holds, for every row block, where its X_b is and its local factor,
and runs a *pass*: ``fn(X_b, local_b, block, *global_args)`` for every block,
returning per-group statistics summed by the fixed-order tree of ``reduce.py``.
It knows nothing of any method's mathematics.

A method that also needs X by columns (sCD's H sweep) runs a *column pass*:
``fn(Xc_c, W, column_block, *global_args)`` for every CSC column block of the store, where W is
the whole local factor (every row block's, in stored row order) assembled where the task runs;
it returns the column block's piece of the global factor and statistics as arrays over groups.

- :class:`InProcessExecutor` (the default: nothing to start). One block, or one
  thread, is a plain loop with no task graph (the fast path for small data);
  otherwise a pool of threads runs the blocks of a pass in parallel, a few
  ahead of the sum, which takes each block's statistics as it arrives.
- :class:`DistributedExecutor` (``client=``): X blocks and local factors stay
  on the workers as futures, each block on its *home* worker (contiguous runs of
  about equal work, ``contiguous_placement``); only the statistics come back,
  summed here as they arrive in the same fixed tree order. A worker
  lost with results the pass needs raises :class:`WorkerLost`; the estimators
  then run the fit again from its newest checkpoint (``estimators/base.py``).

``base.py`` holds what both share (the block tasks, the pass counter, :class:`WorkerLost`), ``spill.py`` the
local factors written to Zarr (out of core, checkpoints); :func:`make_executor` picks one.
"""

from __future__ import annotations

import logging

from .distributed import DistributedExecutor
from .inprocess import InProcessExecutor

logger = logging.getLogger("distfact")

#: What a pass on a cluster costs beyond its arithmetic (benchmarks/bench_overhead.py: about 20 ms on 2 workers),
#: and the arithmetic's speed on one worker thread (two products of X with a factor of the rank's width per pass).
CLUSTER_PASS_SECONDS = 0.02
WORKER_FLOPS = 2e9


def pass_arithmetic_seconds(data, rank: int, n_threads: int) -> float:
    """A rough time of one pass's arithmetic spread over ``n_threads`` worker threads: 4 flops per entry (or
    non-zero) of X and column of the rank."""
    entries = data.nnz if data.is_sparse else data.shape[0] * data.shape[1]
    return 4.0 * entries * rank / WORKER_FLOPS / max(n_threads, 1)


def make_executor(data, client=None, n_threads: int | None = None, spill_dir: str | None = None,
                  n_workers: int = 1, local_row_bytes: int | None = None):
    """The executor for ``client``: None -> in-process; a Client or a scheduler address -> distributed.

    ``spill_dir``: keep the local factors in Zarr there instead of in memory (out-of-core).
    ``n_workers``: wait a while for this many workers (a rerun after a lost worker waits for its replacement,
    else it would place all of X on the survivors), going on with fewer if they do not come.
    ``local_row_bytes``: the size of a row of the local factors, if known (small ones come back with a pass's
    statistics on a cluster: ``DistributedExecutor``)."""
    if client is None:
        return InProcessExecutor(data, n_threads, spill_dir)
    owns_client = isinstance(client, str)
    if owns_client:
        from ..cluster import connect

        client = connect(client)
    from ..cluster import check_workers

    try:
        check_workers(client, data.path, n_workers)
        workers = client.scheduler_info().get("workers", {}).values()
        cluster_memory = sum(w.get("memory_limit") or 0 for w in workers)
        # X stays in worker memory when it takes at most half of it; otherwise every pass streams it from the store.
        persist = data.in_memory or not cluster_memory or data.nbytes <= cluster_memory // 2
        if local_row_bytes is not None:
            arithmetic = pass_arithmetic_seconds(data, local_row_bytes // data.dtype.itemsize,
                                                 sum(w.get("nthreads") or 1 for w in workers))
            if arithmetic < CLUSTER_PASS_SECONDS:
                logger.warning("X is small (%d x %d): a pass's arithmetic takes about %.2g ms on this cluster, its "
                               "scheduling about %.0f ms; in-process (no Dask client) would be faster", *data.shape,
                               1e3 * arithmetic, 1e3 * CLUSTER_PASS_SECONDS)
        return DistributedExecutor(data, client, persist_data=persist, spill_dir=spill_dir, owns_client=owns_client,
                                   local_row_bytes=local_row_bytes)
    except BaseException:
        if owns_client:
            client.close()
        raise
