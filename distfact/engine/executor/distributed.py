"""Passes on a Dask distributed cluster: X blocks and local factors stay on the workers, each block on its home
worker; only the statistics come back, summed here as they arrive in the fixed tree order."""

from __future__ import annotations

import collections
import contextlib
import operator

import numpy as np
import scipy.sparse as sp

from ...kernels.memory import aligned
from ...store.format import Block
from ..reduce import by_group, merge, tree_reduce_arrivals
from .base import (Executor, WorkerLost, checkpoint_one, init_one, map_local_one, map_one, restore_one, run_block,
                   run_column_block)
from .spill import materialise

#: A pass's global arguments up to this size go inside its tasks; larger ones are scattered once and fetched by
#: the workers (a scatter is a round trip to a worker and the scheduler before the pass can start: about 10 ms).
EMBEDDED_ARGS_BYTES = 1 << 16
#: Local factors of blocks up to this size come back with their statistics (the pass's output as a whole): taking
#: the statistics out of it on the worker is a task of its own, whose scheduling costs about as much as a small
#: pass's arithmetic. Larger local factors never leave their worker.
RETURNED_LOCAL_BYTES = 1 << 16


def block_work(block, data) -> int:
    """What a pass over ``block`` costs, roughly: a row block's entries if X is dense, else its
    non-zeros and rows; a column block (always CSC) its non-zeros and columns."""
    if not isinstance(block, Block):
        return block.nnz + block.n_cols
    return block.n_rows * data.shape[1] if not data.is_sparse else block.nnz + block.n_rows


def contiguous_placement(costs, capacities) -> list[int]:
    """For each item (in order), the index of the worker it goes to: contiguous runs of items,
    worker k's run holding about ``capacities[k] / sum(capacities)`` of the total cost (an item
    goes to the worker whose share holds its cost's midpoint), so that every worker is busy until
    the pass's end."""
    costs = np.asarray(costs, dtype=np.float64)
    shares = np.cumsum(np.asarray(capacities, dtype=np.float64))
    bounds = shares / shares[-1] * costs.sum()
    midpoints = np.cumsum(costs) - costs / 2
    return np.minimum(np.searchsorted(bounds, midpoints), len(shares) - 1).tolist()


def per_home(homes: list, send) -> list:
    """``send(home, indices of the items with that home)`` once per distinct home (it returns one result per
    index given); the results in item order."""
    groups: dict = {}
    for i, home in enumerate(homes):
        groups.setdefault(home, []).append(i)
    out = [None] * len(homes)
    for home, mine in groups.items():
        for i, result in zip(mine, send(home, mine)):
            out[i] = result
    return out


class DistributedExecutor(Executor):
    """Runs passes on a ``distributed.Client``; X blocks and local factors stay on the workers."""

    def __init__(self, data, client, persist_data: bool = True, spill_dir: str | None = None,
                 owns_client: bool = False, local_row_bytes: int | None = None):
        """``local_row_bytes``: the size of a row of the local factors (None: unknown, taken as large)."""
        super().__init__(data, spill_dir)
        self.client = client
        self.owns_client = owns_client
        self.persist_data = persist_data
        self.reader = None if data.in_memory else data.reader()
        workers = sorted(client.scheduler_info().get("workers", {}).items())
        self.addresses = [address for address, _ in workers]
        self.capacities = [info.get("nthreads") or 1 for _, info in workers]
        self.home = self._homes(data.blocks)
        self.X_refs = self._place(data.blocks, data.reader(), self.home)
        # Where a pass's tasks go: to the block's X when the workers keep it; blocks read from the store by every
        # pass can run anywhere (also on workers that joined after this executor was made).
        self.pass_homes = self.home if persist_data or data.in_memory else None
        self.column_reader, self.Xc_refs, self.column_homes = None, None, None  # placed at the first column pass
        self.locals: list = [None] * len(self.blocks)
        largest = max(block.n_rows for block in self.blocks)
        self.returns_locals = self.spill is not None or (  # (a spilled local factor is a reference to its files)
            local_row_bytes is not None and largest * local_row_bytes <= RETURNED_LOCAL_BYTES)

    def _homes(self, blocks) -> list[str | None]:
        """The worker each block's tasks go to (``contiguous_placement``): the scheduler would place the first
        tasks of a fit as workers happen to be free, and one worker holding 5 of 8 blocks makes every pass wait
        for it. A home is a preference (``allow_other_workers``): a task whose home has died runs elsewhere."""
        if not self.addresses:
            return [None] * len(blocks)
        where = contiguous_placement([block_work(block, self.data) for block in blocks], self.capacities)
        return [self.addresses[k] for k in where]

    def _per_block(self, fn, *args, homes: list | None = None) -> list:
        """Futures of ``fn`` over the blocks (list arguments are per block, others the same for all), each task
        preferably on its block's worker in ``homes``. One submission per worker (a scheduler update per task
        cost more than the small tasks themselves)."""
        lengths = {len(arg) for arg in args if isinstance(arg, list)} | ({len(homes)} if homes else set())
        if len(lengths) != 1:
            raise ValueError(f"per-block arguments of different lengths {sorted(lengths)}")
        n = lengths.pop()
        args = [arg if isinstance(arg, list) else [arg] * n for arg in args]

        def submit(home, mine):
            where = {} if home is None else {"workers": [home], "allow_other_workers": True}
            return self.client.map(fn, *([arg[i] for i in mine] for arg in args), pure=False, **where)

        return per_home(homes or [None] * n, submit)

    def _scatter(self, items: list, homes: list) -> list:
        """Futures of ``items`` sent from here, each to its home worker (one call per worker)."""
        def send(home, mine):
            try:
                return self.client.scatter([items[i] for i in mine], workers=None if home is None else [home],
                                           hash=False)
            except (KeyError, TimeoutError):  # the home left (KeyError) or is paused: any worker will do
                return self.client.scatter([items[i] for i in mine], hash=False)

        with self._lost_workers_raise("a scatter", scatter=True):
            return per_home(homes, send)

    def _place(self, blocks, reader, homes: list) -> list:
        """Blocks of X on the workers (each on its home): scattered from memory, loaded there from the store, or
        (over half the cluster's memory) None: read from the store by every pass."""
        if self.data.in_memory:
            items = [reader(block) for block in blocks]
            scattered = self._scatter(items, homes)
            if sp.issparse(items[0]):
                return scattered
            # Arrays arrive at arbitrary offsets: aligned once on their worker, not by every pass.
            return self._on_homes(aligned, scattered, homes)
        if self.persist_data:
            return self._on_homes(reader, list(blocks), homes)
        return [None] * len(blocks)

    def _on_homes(self, fn, items: list, homes: list) -> list:
        """Futures of ``fn(item)`` run on each item's home, with no more tasks sent to a worker than it has
        threads (the next when one of its own ends): a task waiting in a busy worker's queue is what work
        stealing moves to an idle one (a worker slower to start lost a block to the other, in CI), and the block
        of X it loads would then live away from its home for the whole fit. Returns once every task has ended;
        a task's error is raised where its future is used."""
        from distributed import as_completed

        capacity = dict(zip(self.addresses, self.capacities))
        queues: dict = {}
        for i, home in enumerate(homes):
            queues.setdefault(home, collections.deque()).append(i)
        futures, home_of = [None] * len(items), {}
        running = as_completed(loop=self.client.loop)

        def send(home):
            i = queues[home].popleft()
            where = {} if home is None else {"workers": [home], "allow_other_workers": True}
            futures[i] = self.client.submit(fn, items[i], pure=False, **where)
            home_of[futures[i].key] = home
            running.add(futures[i])

        for home, queue in queues.items():
            for _ in range(min(len(queue), capacity.get(home, len(queue)))):
                send(home)
        for done in running:
            if queues[home_of[done.key]]:
                send(home_of[done.key])
        return futures

    def describe(self) -> dict:
        info = self.client.scheduler_info()
        return {"scheduler": info.get("address"), "mode": "distributed",
                "workers": len(info.get("workers", {})),
                "dashboard": getattr(self.client, "dashboard_link", None)}

    def _broadcast(self, args):
        # One copy, which workers fetch as their tasks need it: distributed's broadcast=True
        # replication hangs when a worker dies during it.
        with self._lost_workers_raise("a scatter", scatter=True):
            return self.client.scatter([args], hash=False)[0]

    @contextlib.contextmanager
    def _lost_workers_raise(self, what: str, scatter: bool = False):
        """Futures cancelled under us, or a ``scatter`` that cannot reach a worker, mean a worker died with data
        the fit needs (Dask recomputes what it can by itself; scattered data and the history of the local
        factors it cannot). Only cancellations count for passes (an OSError there is a task's own error);
        with the scheduler gone the error is left as it is: nothing to retry on."""
        from distributed.client import FutureCancelledError

        lost = (FutureCancelledError, OSError) if scatter else (FutureCancelledError,)  # (TimeoutError is an OSError)
        try:
            yield
        except lost as exc:
            if self.client.status != "running":
                raise
            # Dask keeps the exception in the cancelled futures' state: its traceback would keep this fit's
            # frames (the executor, X) alive for as long as the client lives
            exc.__traceback__ = None
            raise WorkerLost(f"a Dask worker was lost during {what} ({type(exc).__name__}: {exc})",
                             n_workers=len(self.addresses)) from None

    def init_local(self, fn, *args, per_block: list | None = None) -> None:
        args_ref = self._broadcast(args)
        own = [] if per_block is None else [self._scatter(list(per_block), self.home)]
        self.locals = self._per_block(init_one, fn, self.blocks, args_ref, self.spill, *own, homes=self.home)

    def run_pass(self, fn, *args, update: bool, args_aligned: bool = False) -> list[dict]:
        """One pass (the package docstring). ``args_aligned`` changes nothing here: each block's task aligns what it
        receives, which arrives by pickling."""
        from dask.sizeof import sizeof

        args_ref = args if sizeof(args) <= EMBEDDED_ARGS_BYTES else self._broadcast(args)
        self.generation += update
        outs = self._per_block(run_block, fn, self.reader, self.blocks, self.X_refs, self.locals, args_ref, update,
                               self.spill, self.generation, homes=self.pass_homes)
        if update:  # the outputs (local factor, statistics) are the new local factors (``materialise``)
            self.locals = outs
            if not self.returns_locals:  # the statistics taken out where run_block ran
                outs = self._per_block(operator.getitem, outs, 1, homes=self.pass_homes)
        arrivals = self._arrivals(outs)
        if update and self.returns_locals:
            arrivals = ((i, output.stats) for i, output in arrivals)
        with self._lost_workers_raise("a pass"):
            total = tree_reduce_arrivals(len(outs), arrivals, merge)
        self._count_pass()
        return aligned(by_group(total, self.data.n_groups))

    def _arrivals(self, futures):
        """``(index, result)`` of each future as it completes. The statistics are summed here as they arrive
        (``tree_reduce_arrivals``) rather than by merge tasks on the workers: each merge task cost a scheduler
        round trip, and the last block of a pass waited for a chain of them."""
        from distributed import as_completed
        from distributed.client import FutureCancelledError

        index = {future.key: i for i, future in enumerate(futures)}
        waiting = set(index)
        try:
            # as_completed would track the futures on the *default* client's event loop: with two clients in one
            # process, another thread reading this client's connections at the same time (corrupting them).
            # A task's error is raised by as_completed; a cancelled future (a lost worker) comes as its exception.
            for future, result in as_completed(futures, loop=self.client.loop, with_results=True):
                if isinstance(result, FutureCancelledError):
                    raise result
                waiting.discard(future.key)
                yield index[future.key], result
        finally:  # on an error, the rest of the pass is not wanted any more (as_completed still holds it)
            if waiting:
                self.client.cancel([future for future in futures if future.key in waiting])

    def run_column_pass(self, fn, *args) -> tuple[list, list[dict]]:
        """One pass over the CSC column blocks; every column task receives the futures of all local
        factors (Dask moves them worker to worker; the driver never holds W)."""
        if self.Xc_refs is None:
            column_reader = self.data.column_reader()
            self.column_homes = self._homes(self.data.column_blocks)
            self.Xc_refs = self._place(self.data.column_blocks, column_reader, self.column_homes)
            self.column_reader = None if self.data.in_memory else column_reader
        args_ref = self._broadcast(args)
        outs = self._per_block(run_column_block, fn, self.column_reader, list(self.data.column_blocks), self.Xc_refs,
                               [self.locals] * len(self.Xc_refs), args_ref, homes=self.column_homes)
        with self._lost_workers_raise("a column pass"):
            results = self.client.gather(outs)
        return self._column_results(results)

    def map_local(self, fn, *args) -> None:
        args_ref = self._broadcast(args)
        self.generation += 1
        self.locals = self._per_block(map_local_one, fn, self.blocks, self.locals, args_ref, self.spill,
                                      self.generation, homes=self.pass_homes)

    def map_blocks(self, fn, *args) -> list:
        args_ref = self._broadcast(args)
        outs = self._per_block(map_one, fn, self.reader, self.blocks, self.X_refs, self.locals, args_ref,
                               homes=self.pass_homes)
        with self._lost_workers_raise("a pass"):
            results = self.client.gather(outs)
        self._count_pass()
        return results

    def local_factors(self) -> list:
        with self._lost_workers_raise("the gathering of the local factors"):
            return [materialise(local) for local in self.client.gather(self.locals)]

    def save_local(self, directory: str) -> list[dict]:
        from distributed import wait

        written = self._per_block(checkpoint_one, directory, self.blocks, self.locals, homes=self.pass_homes)
        with self._lost_workers_raise("the saving of the local factors"):
            wait(written)  # every block's write has ended, also when one failed: none writes after a cleanup
            return self.client.gather(written)

    def load_local(self, directory: str, expected: list | None = None) -> None:
        from distributed import wait

        restored = self._per_block(restore_one, directory, self.blocks, self.spill, self._manifests(expected),
                                   homes=self.home)
        with self._lost_workers_raise("the restoring of the local factors"):
            wait(restored)
            for future in restored:
                if future.status == "error":  # a damaged block: raised here, while another checkpoint can be tried
                    future.result()
        self.locals = restored

    def close(self) -> None:
        futures = [f for f in self.X_refs + (self.Xc_refs or []) + self.locals if f is not None]
        self.client.cancel(futures)
        self._remove_spill()
        if self.owns_client:
            self.client.close()
