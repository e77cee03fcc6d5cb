"""Passes on a Dask distributed cluster: X blocks and local factors stay on the workers, each block on its home
worker; only the statistics come back, summed here as they arrive in the fixed tree order.

A pass is one task per thread of each worker over its run of blocks (``run_batch``), not one task per block: each
task costs a round trip through the scheduler (issue 19: 8 empty tasks a pass took 30-43 ms on a 2-worker
LocalCluster, 2 took 21-24 ms). A block's local factor is then a :data:`LocalRef`, (the future of its batch's
results, its position in them), which the next task picks out where the factor lives."""

from __future__ import annotations

import collections
import contextlib
import itertools
import operator
import uuid
from dataclasses import dataclass

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


#: How ``run_batch`` takes an argument: one value per block of the batch, one value for all of them, or the same
#: two holding local factors as :data:`LocalRef` pairs to be picked out.
EACH, SHARED, EACH_LOCAL, SHARED_LOCALS = range(4)


class LocalRefs(list):
    """Per block, the :data:`LocalRef` of its local factor (an argument of ``_per_block`` taken block by block)."""


@dataclass(frozen=True)
class AllLocals:
    """Every block's local factor, the same argument of every task (a column pass's: the whole W)."""

    refs: LocalRefs


#: Where a block's local factor is: (the future of its batch's results, its position in them). A plain tuple, which
#: Dask sends to a task with the future replaced by its value.
LocalRef = tuple


def picked(ref):
    """A local factor from its :data:`LocalRef` as a task receives it: (its batch's results, its position)."""
    results, position = ref
    return results[position]


class PassCancelled(Exception):
    """Raised by a batch whose task was cancelled while it ran (its result is not wanted)."""


def run_batch(fn, kinds: tuple, *args) -> list:
    """What one task does on its worker: ``fn`` over a run of blocks, in order; its results in a list. ``kinds[j]``
    says how ``args[j]`` is taken (:data:`EACH` ...). Dask cannot stop a running task: a batch whose task was
    cancelled (an error elsewhere in the pass, a lost worker) stops before its next block."""
    columns = []
    for kind, arg in zip(kinds, args):
        if kind == EACH:
            columns.append(arg)
        elif kind == EACH_LOCAL:
            columns.append([picked(ref) for ref in arg])
        else:
            columns.append(itertools.repeat(arg if kind == SHARED else [picked(ref) for ref in arg]))
    out = []
    for item in zip(*columns):
        if out and cancelled():
            raise PassCancelled(f"cancelled after {len(out)} of its blocks")
        out.append(fn(*item))
    return out


def cancelled() -> bool:
    """Whether the task running this on a Dask worker was cancelled (its client released it)."""
    from distributed import get_worker
    from distributed.worker import thread_state

    try:
        worker = get_worker()
        task = worker.state.tasks.get(getattr(thread_state, "key", None))  # (the worker's state: not public API)
    except (ValueError, AttributeError):  # not in a worker's task, or a distributed that keeps its state otherwise
        return False
    return task is not None and task.state == "cancelled"


def homes_of(lanes: list) -> list:
    """The worker of each lane (None: none)."""
    return [None if lane is None else lane[0] for lane in lanes]


def distinct_futures(refs: LocalRefs) -> list:
    """The futures of the batches that ``refs`` point into, each once, in order (none for local factors not made)."""
    return list({ref[0].key: ref[0] for ref in refs if ref is not None}.values())


def per_home(homes: list, send) -> list:
    """``send(home, indices of the items with that home)`` once per distinct home (a worker's address, or a lane: a
    thread of one; it returns one result per index given); the results in item order."""
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
        self._closed = False
        self.persist_data = persist_data
        self.reader = None if data.in_memory else data.reader()
        workers = sorted(client.scheduler_info().get("workers", {}).items())
        self.addresses = [address for address, _ in workers]
        self.capacities = [info.get("nthreads") or 1 for _, info in workers]
        self.lanes = self._lanes(data.blocks)
        self.home = homes_of(self.lanes)
        self.X_refs = self._place(data.blocks, data.reader(), self.home)
        # Where a pass's tasks go: to the block's X when the workers keep it; blocks read from the store by every
        # pass can run anywhere (also on workers that joined after this executor was made).
        self.pass_lanes = self.lanes if persist_data or data.in_memory else None
        self.column_reader, self.Xc_refs, self.column_lanes = None, None, None  # placed at the first column pass
        self.locals: list = [None] * len(self.blocks)  # a LocalRefs once made (by init_local or load_local)
        largest = max(block.n_rows for block in self.blocks)
        self.returns_locals = self.spill is not None or (  # (a spilled local factor is a reference to its files)
            local_row_bytes is not None and largest * local_row_bytes <= RETURNED_LOCAL_BYTES)

    def _lanes(self, blocks) -> list[tuple[str, int] | None]:
        """Each block's *lane*: (its home worker, a thread there), from ``contiguous_placement`` over every worker
        thread (so a worker's run of blocks is split between its threads by work too). The scheduler would place
        the first tasks of a fit as workers happen to be free, and one worker holding 5 of 8 blocks makes every pass
        wait for it. A home is a preference (``allow_other_workers``): a task whose home has died runs elsewhere."""
        if not self.addresses:
            return [None] * len(blocks)
        threads = [(address, k) for address, n in zip(self.addresses, self.capacities) for k in range(n)]
        where = contiguous_placement([block_work(block, self.data) for block in blocks], [1] * len(threads))
        return [threads[t] for t in where]

    def _per_block(self, fn, *args, lanes: list | None = None) -> LocalRefs:
        """``fn`` over the blocks: list arguments are per block (a :class:`LocalRefs` of their local factors), an
        :class:`AllLocals` is every local factor, others are the same for all. One task (``run_batch``) per lane
        in ``lanes`` (a worker thread: :meth:`_lanes`) over its run of blocks, preferably on that worker; blocks
        without a lane (none given, or no worker known) a task each, placed by the scheduler. One submission per
        lane, one for all the blocks without (a scheduler update per task cost more than small tasks
        themselves). Returns where each block's result is."""
        from dask.utils import funcname

        lengths = {len(arg) for arg in args if isinstance(arg, list)} | ({len(lanes)} if lanes else set())
        if len(lengths) != 1:
            raise ValueError(f"per-block arguments of different lengths {sorted(lengths)}")
        n = lengths.pop()
        kinds = tuple(EACH_LOCAL if isinstance(arg, LocalRefs) else EACH if isinstance(arg, list)
                      else SHARED_LOCALS if isinstance(arg, AllLocals) else SHARED for arg in args)
        if not {EACH, EACH_LOCAL} & set(kinds):
            raise ValueError("no per-block argument: the blocks are not given")
        args = [list(arg.refs) if isinstance(arg, AllLocals) else arg for arg in args]
        name = funcname(fn)  # the tasks' name (the dashboard's, the task stream's): what they run, not run_batch

        def submit(lane, mine):
            runs = [[i] for i in mine] if lane is None else [mine]
            where = {} if lane is None else {"workers": [lane[0]], "allow_other_workers": True}
            columns = [[arg] * len(runs) if kind in (SHARED, SHARED_LOCALS) else [[arg[i] for i in run] for run in runs]
                       for kind, arg in zip(kinds, args)]
            keys = [f"{name}-{uuid.uuid4().hex}" for _ in runs]
            if len(runs) == 1:  # (``map`` costs more than ``submit`` for one task)
                futures = [self.client.submit(run_batch, fn, kinds, *(column[0] for column in columns), key=keys[0],
                                              **where)]
            else:
                futures = self.client.map(run_batch, [fn] * len(runs), [kinds] * len(runs), *columns, key=keys,
                                          **where)
            return [(future, position) for future, run in zip(futures, runs) for position in range(len(run))]

        return LocalRefs(per_home(lanes or [None] * n, submit))

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
        self.locals = self._per_block(init_one, fn, self.blocks, args_ref, self.spill, *own, lanes=self.lanes)

    def run_pass(self, fn, *args, update: bool, args_aligned: bool = False) -> list[dict]:
        """One pass (the package docstring). ``args_aligned`` changes nothing here: each block's task aligns what it
        receives, which arrives by pickling."""
        from dask.sizeof import sizeof

        args_ref = args if sizeof(args) <= EMBEDDED_ARGS_BYTES else self._broadcast(args)
        self.generation += update
        outs = self._per_block(run_block, fn, self.reader, self.blocks, self.X_refs, self.locals, args_ref, update,
                               self.spill, self.generation, lanes=self.pass_lanes)
        if update:  # the outputs (local factor, statistics) are the new local factors (``materialise``)
            self.locals = outs
            if not self.returns_locals:  # the statistics taken out where run_block ran
                outs = self._per_block(operator.getitem, outs, 1, lanes=self.pass_lanes)
        arrivals = self._arrivals(outs)
        if update and self.returns_locals:
            arrivals = ((i, output.stats) for i, output in arrivals)
        with self._lost_workers_raise("a pass"):
            total = tree_reduce_arrivals(len(outs), arrivals, merge)
        self._count_pass()
        return aligned(by_group(total, self.data.n_groups))

    def _arrivals(self, refs: LocalRefs):
        """``(block index, result)`` of each block as its task completes. The statistics are summed here as they
        arrive (``tree_reduce_arrivals``) rather than by merge tasks on the workers: each merge task cost a
        scheduler round trip, and the last block of a pass waited for a chain of them."""
        from distributed import as_completed
        from distributed.client import FutureCancelledError

        futures = distinct_futures(refs)
        blocks_of = collections.defaultdict(list)
        for i, (future, position) in enumerate(refs):
            blocks_of[future.key].append((i, position))
        waiting = set(blocks_of)
        try:
            # as_completed would track the futures on the *default* client's event loop: with two clients in one
            # process, another thread reading this client's connections at the same time (corrupting them).
            # A task's error is raised by as_completed; a cancelled future (a lost worker) comes as its exception.
            for future, results in as_completed(futures, loop=self.client.loop, with_results=True):
                if isinstance(results, FutureCancelledError):
                    raise results
                waiting.discard(future.key)
                for i, position in blocks_of[future.key]:
                    yield i, results[position]
        finally:  # on an error, the rest of the pass is not wanted any more (as_completed still holds it)
            if waiting:
                self.client.cancel([future for future in futures if future.key in waiting])

    def _gathered(self, refs: LocalRefs) -> list:
        """Each block's result, brought here."""
        futures = distinct_futures(refs)
        results = dict(zip((future.key for future in futures), self.client.gather(futures)))
        return [results[future.key][position] for future, position in refs]

    def run_column_pass(self, fn, *args) -> tuple[list, list[dict]]:
        """One pass over the CSC column blocks; every column task receives the futures of all local
        factors (Dask moves them worker to worker; the driver never holds W)."""
        if self.Xc_refs is None:
            column_reader = self.data.column_reader()
            self.column_lanes = self._lanes(self.data.column_blocks)
            self.Xc_refs = self._place(self.data.column_blocks, column_reader, homes_of(self.column_lanes))
            self.column_reader = None if self.data.in_memory else column_reader
        args_ref = self._broadcast(args)
        outs = self._per_block(run_column_block, fn, self.column_reader, list(self.data.column_blocks), self.Xc_refs,
                               AllLocals(self.locals), args_ref, lanes=self.column_lanes)
        with self._lost_workers_raise("a column pass"):
            results = self._gathered(outs)
        return self._column_results(results)

    def map_local(self, fn, *args) -> None:
        args_ref = self._broadcast(args)
        self.generation += 1
        self.locals = self._per_block(map_local_one, fn, self.blocks, self.locals, args_ref, self.spill,
                                      self.generation, lanes=self.pass_lanes)

    def map_blocks(self, fn, *args) -> list:
        args_ref = self._broadcast(args)
        outs = self._per_block(map_one, fn, self.reader, self.blocks, self.X_refs, self.locals, args_ref,
                               lanes=self.pass_lanes)
        with self._lost_workers_raise("a pass"):
            results = self._gathered(outs)
        self._count_pass()
        return results

    def local_factors(self) -> list:
        with self._lost_workers_raise("the gathering of the local factors"):
            return [materialise(local) for local in self._gathered(self.locals)]

    def save_local(self, directory: str) -> list[dict]:
        from distributed import wait

        written = self._per_block(checkpoint_one, directory, self.blocks, self.locals, lanes=self.pass_lanes)
        with self._lost_workers_raise("the saving of the local factors"):
            wait(distinct_futures(written))  # every write has ended, also when one failed: none after a cleanup
            return self._gathered(written)

    def load_local(self, directory: str, expected: list | None = None) -> None:
        from distributed import wait

        restored = self._per_block(restore_one, directory, self.blocks, self.spill, self._manifests(expected),
                                   lanes=self.lanes)
        with self._lost_workers_raise("the restoring of the local factors"):
            futures = distinct_futures(restored)
            wait(futures)
            for future in futures:
                if future.status == "error":  # a damaged block: raised here, while another checkpoint can be tried
                    future.result()
        self.locals = restored

    def close(self) -> None:
        if self._closed:  # a client closed with the first close cannot cancel anything
            return
        self._closed = True
        futures = [f for f in self.X_refs + (self.Xc_refs or []) + distinct_futures(self.locals) if f is not None]
        self.client.cancel(futures)
        self._remove_spill()
        if self.owns_client:
            self.client.close()
