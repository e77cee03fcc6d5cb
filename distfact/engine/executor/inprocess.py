"""Passes in this process: a plain loop over the blocks, or a pool of threads across them."""

from __future__ import annotations

import concurrent.futures
import functools
import itertools
import os

import scipy.sparse as sp

from ...kernels.blas_threads import hold_one_thread, release_one_thread
from ...kernels.memory import ReusedBuffers, aligned, aligned_holding
from ..finite import all_finite, check_block
from ..reduce import by_group, merge, tree_reduce_arrivals
from .base import (Executor, checkpoint_one, init_one, map_local_one, map_one, restore_one, run_block, run_column_block,
                   stacked_rows)
from .spill import materialise


#: A store on disk whose X takes at most this many bytes in memory (``GroupedMatrix.nbytes``) is read once, when
#: the executor starts, and its blocks held as X given in memory is (its CSC column blocks too, from the first
#: column pass, for a method that reads them); a larger one is read block by block in every pass (X may be larger
#: than memory). Reading a small store every pass cost far more than its arithmetic (issue
#: 19: a 440 x 30 store, 30 ms a pass through Zarr against well under 1 ms of products), and the pipelines and the
#: CLI fit stores.
RESIDENT_STORE_BYTES = 256 << 20
#: Blocks held in memory (X given in memory, or a store read once) of at most this many bytes each (CSR: its three
#: arrays) run in turn in this process, whatever their layout: on such blocks a task handed to a thread costs more
#: than its arithmetic, and the blocks' Python-level steps contend for the GIL. Issue 19, two cores
#: (``benchmarks/bench_in_turn.py``; BENCHMARKS.md, "Small blocks held in memory run in turn"): in turn, FairerNMF on
#: the UCI Heart store took 0.19 of its time in threads, NMF MU on a held store of 8 dense blocks 0.29 at 125 KiB, 0.44
#: at 250 KiB, 0.58 at 500 KiB; ``select_rank``'s masked sweeps 0.66-0.91 at 125 KiB, 0.85-0.99 at 250 KiB, 1.01-1.05
#: at 500 KiB (3.2 MB blocks: threads faster, ``_serial``).
IN_TURN_BLOCK_BYTES = 256 << 10
#: A pass in threads has at most this many tasks a thread submitted and not yet taken (``_arrivals``)
ARRIVALS_AHEAD = 2


class InProcessExecutor(Executor):
    """Runs passes in this process: a plain loop, or a pool of threads across blocks."""

    def __init__(self, data, n_threads: int | None = None, spill_dir: str | None = None):
        super().__init__(data, spill_dir)
        self.n_threads = n_threads or os.cpu_count() or 1
        self.reader = data.reader()
        self.locals: list = [None] * data.n_blocks
        self._pool = None  # threads for the blocks of a pass, made at the first parallel pass (or read)
        self._resident = self._held_blocks(data)
        self._columns = None  # a held store's column blocks, once a column pass has read them
        self._in_turn = self._serial()  # asked at every pass: the answer cannot change
        self._holds_blas = not self._in_turn
        self._reused = ReusedBuffers()  # a pass's statistics and new local factors, copied aligned into these
        groups = [block.group for block in self.blocks]
        # blocks in memory, run in turn, one per group: an update pass calls each block's step directly (_direct_pass)
        self._direct = (self._in_turn and self._resident is not None and self.spill is None
                        and sorted(groups) == list(range(data.n_groups)))
        self._block_of_group = sorted(range(len(groups)), key=groups.__getitem__)
        self._aligned_locals = None  # the list of local factors the last direct pass made (aligned: not walked again)
        if self._holds_blas:
            # Blocks run in parallel threads: one BLAS thread each avoids oversubscription, and
            # the driver's small products between passes must not leave BLAS threads spinning
            # on the cores the blocks need. (Workers of a distributed cluster run BLAS single-threaded too.)
            hold_one_thread()

    def _held_blocks(self, data) -> list | None:
        """X's blocks held in memory for the whole fit, each aligned here once (they are read and staged aligned: no
        copy) so that no pass checks them: X given in memory, or a store of at most :data:`RESIDENT_STORE_BYTES`
        read now, in parallel threads as a pass reads it (every block checked as a pass's read checks it; a failure
        raised after every read ended, the first in block order), unless the local factors spill to Zarr (memory
        is short). None: every pass reads the store."""
        if not data.in_memory and (self.spill is not None or data.nbytes > RESIDENT_STORE_BYTES):
            return None
        try:
            blocks = data._blocks if data.in_memory else self._map(
                [functools.partial(self.reader, block) for block in data.blocks],
                serial=self.n_threads <= 1 or data.n_blocks == 1)
            return [block if sp.issparse(block) else aligned(block) for block in blocks]
        except BaseException:  # no executor is made: its threads end here, the reads not yet begun cancelled
            self._end_pool(cancel=True)
            raise

    @property
    def blocks_in_turn_here(self) -> bool:
        """Whether the passes run the blocks one after the other in this process (see ``_serial``)."""
        return self._in_turn

    def describe(self) -> dict:
        mode = "loop" if self._in_turn else "threads"
        return {"scheduler": "in-process", "mode": mode, "threads": self.n_threads}

    def _serial(self) -> bool:
        """Blocks run one after the other when there is nothing to overlap: one thread or
        one block, or dense blocks given in memory, whose BLAS products use every core
        (on 2 cores, one 2-thread product beats two 1-thread ones; a small block's thin products, too small for BLAS
        to thread, run in one thread's loops: ``kernels/products.py``). Blocks of a store (read by every pass, or held),
        or CSR blocks (single-threaded kernels), run in parallel threads: a held store's blocks are cut as the store
        was written, not one a thread, and the masked and sweep kernels of a cross-validation are single-threaded
        (run in turn, ``select_rank`` on a held 6,000 x 400 store took 33 s against 21 s in threads). Blocks held in
        memory of at most :data:`IN_TURN_BLOCK_BYTES` each run in turn whatever their layout. (Decided once, in
        ``__init__``.)"""
        return (self.n_threads <= 1 or len(self.blocks) == 1
                or (self.data.in_memory and not self.data.is_sparse)
                or (self._resident is not None and max(map(_block_bytes, self._resident)) <= IN_TURN_BLOCK_BYTES))

    def _map(self, tasks: list, serial: bool | None = None):
        """The tasks' results in order. In parallel threads, every task ends before the first failure (in task
        order) is raised, so that none is still writing (a checkpoint, W) when the caller cleans up after it."""
        if self._in_turn if serial is None else serial:
            return [task() for task in tasks]
        futures = [self._threads().submit(task) for task in tasks]
        concurrent.futures.wait(futures)
        return [future.result() for future in futures]

    def _arrivals(self, tasks: list):
        """``(index, result)`` of each task as it ends: in turn, or from parallel threads in the order they end, at
        most ``ARRIVALS_AHEAD`` tasks a thread submitted and not yet taken, each result let go here once given (a
        pass's statistics are summed as they arrive, and the threads wait for the sums rather than pile results
        up). In threads, a failure is raised as ``_map`` raises it: once every task started has ended, the first
        failure in task order (the tasks after it not started yet are cancelled); the caller closes the generator
        when it stops early (:meth:`run_pass`), which waits for the tasks started."""
        if self._in_turn:
            for index, task in enumerate(tasks):
                yield index, task()
            return
        pool, index_of, waiting = self._threads(), {}, set()
        upcoming = iter(enumerate(tasks))

        def submit():
            for index, task in itertools.islice(upcoming, ARRIVALS_AHEAD * self.n_threads - len(index_of)):
                future = pool.submit(task)
                index_of[future] = index
                waiting.add(future)

        try:
            submit()
            while waiting:
                done, _ = concurrent.futures.wait(waiting, return_when=concurrent.futures.FIRST_COMPLETED)
                waiting -= done
                batch = sorted(done, key=index_of.get, reverse=True)
                del done
                while batch:
                    future = batch.pop()
                    if future.exception() is not None:
                        first = index_of[future]
                        for later in waiting:
                            if index_of[later] > first:
                                later.cancel()  # a no-op for one already running
                        concurrent.futures.wait(waiting)
                        failed = [(i, f) for f, i in index_of.items() if not f.cancelled() and f.exception()]
                        raise min(failed)[1].exception()
                    index, result = index_of.pop(future), future.result()
                    del future  # the result's last reference here is the one given: it goes once summed
                    yield index, result
                    del result
                submit()
        finally:  # the caller stopped early (an interrupt, an error of its own): no task is left running
            concurrent.futures.wait(waiting)

    def _threads(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(self.n_threads, thread_name_prefix="distfact-block")
        return self._pool

    def init_local(self, fn, *args, per_block: list | None = None) -> None:
        """``local_b <- fn(block, *args[, per_block[b]])`` for every block, where it will live."""
        own = [()] * len(self.blocks) if per_block is None else [(item,) for item in per_block]
        self.locals = self._map([functools.partial(init_one, fn, block, args, self.spill, *own[block.index])
                                 for block in self.blocks])

    def run_pass(self, fn, *args, update: bool, args_aligned: bool = False) -> list[dict]:
        """One pass (the package docstring). ``args_aligned``: the arguments are aligned already (the driver's global
        state), not walked again."""
        self.generation += update
        if not args_aligned:  # once for all blocks; the resident blocks were aligned once when the executor began
            args = aligned(args)
        if update and self._direct:
            return self._direct_pass(fn, args)
        resident = self._resident
        tasks = [functools.partial(run_block, fn, self.reader, block, None if resident is None else resident[block.index],
                                   self.locals[block.index], args, update, self.spill, self.generation,
                                   resident is not None)
                 for block in self.blocks]
        # each block's statistics summed as they arrive (the same pairs in the same order as ``tree_reduce``, so the
        # same bits): only sums waiting for their sibling are held, not every block's (a masked fit's per-column
        # Grams are n r^2 a block: 16 blocks of 20,000 columns at rank 20 held 2.7 GB at once)
        new_locals, arrivals = [None] * len(tasks), self._arrivals(tasks)

        def statistics():
            for index, out in arrivals:
                if update:
                    new_locals[index], out = out
                yield index, out

        try:
            total = tree_reduce_arrivals(len(tasks), statistics(), merge)
        finally:  # a sum that failed (statistics that do not add up, an interrupt) leaves no task running
            arrivals.close()
        self._count_pass()
        if update:  # the new local factors aligned now, the small ones in one allocation, not each at its next use
            self.locals = aligned(new_locals, self._reused)
        return aligned(by_group(total, self.data.n_groups), self._reused)

    def _direct_pass(self, fn, args) -> list[dict]:
        """An update pass as ``run_block`` tasks and the reduction would make it, for blocks in memory run in turn,
        one per group (a small fit, issue 19): each block's step called here, its statistics those of its group
        (the reduction would only gather them), and one finite check over the new local factors and statistics once
        copied into the kept allocations; only when that finds a non-finite value does each block's own check
        name where, in block order, as the tasks would have."""
        locals_ = self.locals if self.locals is self._aligned_locals else [aligned(local) for local in self.locals]
        outputs = [fn(X_b, local, block, *args) for X_b, local, block in zip(self._resident, locals_, self.blocks)]
        n_blocks = len(outputs)  # one flat list: local factors, then statistics by group
        made, holding = aligned_holding([out[0] for out in outputs] + [outputs[b][1] for b in self._block_of_group],
                                        self._reused)
        if not all_finite(holding):
            for block, (local, block_stats) in zip(self.blocks, outputs):
                check_block(block, local, block_stats)
        self.locals = self._aligned_locals = made[:n_blocks]
        self._count_pass()
        return made[n_blocks:]

    def run_column_pass(self, fn, *args) -> tuple[list, list[dict]]:
        """One pass over the CSC column blocks (see the module docstring); column tasks are
        compiled kernels that release the GIL, so they run in parallel threads."""
        W = [stacked_rows(self.local_factors())]  # once for all column blocks of the pass
        reader, held = self.data.column_reader(), self._held_columns()
        tasks = [functools.partial(run_column_block, fn, reader, cblock, None if held is None else held[cblock.index],
                                   W, args)
                 for cblock in self.data.column_blocks]
        return self._column_results(self._map(tasks, serial=self.n_threads <= 1 or len(tasks) == 1))

    def _held_columns(self) -> list | None:
        """The column blocks of a store whose row blocks are held (:meth:`_held_blocks`): read at the first column
        pass, then held. None: every column pass reads them (a larger store), or X is in memory (so are they)."""
        if self._resident is None or self.data.in_memory:
            return None
        if self._columns is None:
            reader = self.data.column_reader()
            self._columns = [reader(cblock) for cblock in self.data.column_blocks]
        return self._columns

    def map_local(self, fn, *args) -> None:
        """``local_b <- fn(local_b, block, *args)`` for every block, where it lives; X is not read."""
        self.generation += 1
        self.locals = self._map([functools.partial(map_local_one, fn, block, local, args, self.spill, self.generation)
                                 for block, local in zip(self.blocks, self.locals)])

    def map_blocks(self, fn, *args) -> list:
        """``fn(X_b, local_b, block, *args)`` per block, results returned in block order (one pass)."""
        resident = self._resident
        tasks = [functools.partial(map_one, fn, self.reader, block, None if resident is None else resident[block.index],
                                   self.locals[block.index], args)
                 for block in self.blocks]
        out = self._map(tasks)
        self._count_pass()
        return out

    def local_factors(self) -> list:
        return [materialise(local) for local in self.locals]

    def save_local(self, directory: str) -> list[dict]:
        return self._map([functools.partial(checkpoint_one, directory, block, local)
                          for block, local in zip(self.blocks, self.locals)])

    def load_local(self, directory: str, expected: list | None = None) -> None:
        expected = self._manifests(expected)
        self.locals = self._map([functools.partial(restore_one, directory, block, self.spill, expected[block.index])
                                 for block in self.blocks])

    def _end_pool(self, cancel: bool = False) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=cancel)
            self._pool = None

    def close(self) -> None:
        self._resident = self._columns = None  # a held store's blocks go with the fit, whoever keeps the executor
        self._end_pool()
        self._remove_spill()
        if self._holds_blas:
            release_one_thread()
            self._holds_blas = False


def _block_bytes(X_b) -> int:
    """The bytes of a block held in memory: a dense block's, or a CSR block's three arrays."""
    if sp.issparse(X_b):
        return X_b.data.nbytes + X_b.indices.nbytes + X_b.indptr.nbytes
    return X_b.nbytes
