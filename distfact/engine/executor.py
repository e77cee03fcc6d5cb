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
  otherwise a pool of threads runs the blocks of a pass in parallel.
- :class:`DistributedExecutor` (``client=``): X blocks and local factors stay
  on the workers as futures, each block on its *home* worker (contiguous runs of
  about equal work, ``contiguous_placement``); only the statistics come back,
  summed here as they arrive in the same fixed tree order. A worker
  lost with results the pass needs raises :class:`WorkerLost`; the estimators
  then run the fit again from its newest checkpoint (``estimators/base.py``).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import functools
import operator
import os
import shutil
import threading
from dataclasses import dataclass

import google_crc32c
import numpy as np
import scipy.sparse as sp
import zarr

from ..kernels.memory import aligned
from ..store.format import Block
from ..store.writing import write_arrays
from .finite import check_block
from .reduce import add, by_group, keyed, merge, split_by_group, tree_reduce, tree_reduce_arrivals


class WorkerLost(RuntimeError):
    """A worker process died holding results the fit needs (blocks of X read there, local factors,
    the broadcast global state): the fit cannot continue from its futures and must roll back.
    ``n_workers``: how many workers the fit had, for the rerun to wait for (a nanny restarts a lost worker)."""

    def __init__(self, message: str, n_workers: int = 0):
        super().__init__(message)
        self.n_workers = n_workers


def run_block(fn, reader, block, X_b, local, args, update, spill=None, generation=0):
    """What one task does: load X_b (and a spilled local factor) if needed, run ``fn``,
    spill the new local factor if asked, key the statistics by group."""
    if X_b is None:
        X_b = reader(block)
    X_b = X_b if sp.issparse(X_b) else aligned(X_b)
    out = fn(X_b, aligned(materialise(local)), block, *aligned(args))
    if update:
        new_local, stats = out
        check_block(block, new_local, stats)
        if spill is not None:
            new_local = spill.store(block, new_local, generation)
        return new_local, keyed(block.group, stats)
    check_block(block, stats=out)
    return keyed(block.group, out)


def run_column_block(fn, reader, column_block, Xc, locals_, args):
    """What one column task does: load the CSC column block if needed, put the local factors of all
    row blocks together (the whole W, stored row order), run ``fn``; returns (piece, statistics)."""
    if Xc is None:
        Xc = reader(column_block)
    parts = [materialise(local) for local in locals_]
    W = parts[0] if len(parts) == 1 else np.concatenate(parts)
    piece, stats = fn(Xc, aligned(W), column_block, *aligned(args))
    check_block(column_block, piece, stats, "its part of the global factor")
    return piece, stats


def map_local_one(fn, block, local, args, spill, generation):
    """``local <- fn(local, block, *args)`` where the local factor lives (no read of X)."""
    new_local = fn(aligned(materialise(local)), block, *aligned(args))
    return new_local if spill is None else spill.store(block, new_local, generation)


CSR_PARTS = ("data", "indices", "indptr")


def save_local(directory: str, block, local) -> dict:
    """Write one block's local factor under ``directory`` (run where the factor lives): one Zarr
    array, or for a local state of several named row-aligned parts (a dict of dense arrays and
    CSR matrices) one Zarr group with an array, or a data/indices/indptr group, per part.

    Returns the block's manifest (what :func:`load_local` checks when given it): for every array written,
    its Zarr path under ``directory`` -> shape, dtype and CRC32C of its bytes; for a CSR part, its path ->
    the matrix's shape."""
    name = f"{block.index:06d}"
    path = os.path.join(directory, name)
    if not isinstance(local, dict):  # an array on its own path: blocks written concurrently share no node
        local = np.asarray(local)
        zarr.open_array(path, mode="w", shape=local.shape, dtype=local.dtype, chunks=local.shape,
                        zarr_format=3)[...] = local
        return {name: _array_manifest(local)}
    node = zarr.open_group(path, mode="w", zarr_format=3)
    manifest = {}
    for part_name, part in local.items():
        if sp.issparse(part):
            part = sp.csr_matrix(part)
            sub = node.create_group(part_name)
            sub.attrs["shape"] = list(part.shape)
            arrays = dict(zip(CSR_PARTS, (part.data, part.indices, part.indptr)))
            write_arrays(sub, **arrays)
            manifest[f"{name}/{part_name}"] = {"csr_shape": list(part.shape)}
            manifest.update({f"{name}/{part_name}/{key}": _array_manifest(array) for key, array in arrays.items()})
        else:
            part = np.asarray(part)
            write_arrays(node, **{part_name: part})
            manifest[f"{name}/{part_name}"] = _array_manifest(part)
    return manifest


def _array_manifest(array: np.ndarray) -> dict:
    return {"shape": list(array.shape), "dtype": array.dtype.str,
            "crc32c": google_crc32c.value(np.ascontiguousarray(array))}


def load_local(directory: str, block, expected: dict | None = None):
    """One block's local factor as :func:`save_local` wrote it. Only numeric Zarr v3 arrays are read (bool,
    integers, floats: nothing that decodes into objects). ``expected``: the block's manifest from
    ``save_local``; the arrays read must match it exactly (no array missing or added, the same shapes,
    dtypes and CRC32C: a lost chunk reads as zeros and is caught here), else ValueError naming the array."""
    name = f"{block.index:06d}"
    node = zarr.open(os.path.join(directory, name), mode="r", zarr_format=3)
    if isinstance(node, zarr.Array):
        arrays, shapes = {name: _read_numeric(node, name)}, {}
    else:
        arrays, shapes = {}, {}
        for part_name, part in node.members():
            path = f"{name}/{part_name}"
            if isinstance(part, zarr.Group):
                shapes[path] = part.attrs.get("shape")
                arrays.update({f"{path}/{key}": _read_numeric(array, f"{path}/{key}") for key, array in part.members()})
            else:
                arrays[path] = _read_numeric(part, path)
    if expected is not None:
        found = {**{path: {"csr_shape": shape} for path, shape in shapes.items()},
                 **{path: _array_manifest(array) for path, array in arrays.items()}}
        _check_manifest(directory, expected, found)
    if name in arrays:
        return arrays[name]
    local = {path.removeprefix(f"{name}/"): sp.csr_matrix(tuple(arrays[f"{path}/{key}"] for key in CSR_PARTS),
                                                          shape=tuple(shape))
             for path, shape in shapes.items()}
    local.update({path.removeprefix(f"{name}/"): array for path, array in arrays.items() if path.count("/") == 1})
    return local


def _read_numeric(array: zarr.Array, path: str) -> np.ndarray:
    if array.dtype.kind not in "biuf":
        raise ValueError(f"array {path!r} has dtype {array.dtype}; a local factor holds numbers only")
    return array[...]


def _check_manifest(directory: str, expected: dict, found: dict) -> None:
    """ValueError naming the first array (or CSR part) of a block that differs from what was written."""
    for path in sorted(expected.keys() | found.keys()):
        if path not in found:
            raise ValueError(f"{directory}: {path!r} is missing")
        if path not in expected:
            raise ValueError(f"{directory}: {path!r} was not written by distfact")
        if found[path] != expected[path]:
            differ = [f"{key} {found[path].get(key)!r} (written: {value!r})" for key, value in expected[path].items()
                      if found[path].get(key) != value]
            raise ValueError(f"{directory}: {path!r} has {', '.join(differ) or 'other entries'}")


@dataclass(frozen=True)
class SpilledLocal:
    """A block's local factor kept in Zarr rather than in memory (out-of-core mode)."""

    directory: str
    block: Block

    def load(self):
        return load_local(self.directory, self.block)


@dataclass(frozen=True)
class LocalSpill:
    """Where local factors go when they exceed the memory budget: ``directory/gen0`` and
    ``gen1``, alternately, so a pass never overwrites the factors it reads (a task that
    Dask re-runs still finds its input)."""

    directory: str

    def store(self, block, local, generation: int) -> SpilledLocal:
        where = os.path.join(self.directory, f"gen{generation % 2}")
        save_local(where, block, local)
        return SpilledLocal(where, block)


def materialise(local):
    return local.load() if isinstance(local, SpilledLocal) else local


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


def _init_one(fn, block, args, spill, *own):
    """A block's first local factor: ``fn(block, *args)``, or ``fn(block, *args, own)`` with the
    block's own input (``init_local``'s ``per_block``)."""
    local = fn(block, *aligned(args), *aligned(own))
    return local if spill is None else spill.store(block, local, 0)


def _restore_one(directory, block, spill, expected=None):
    """A block's local factor from a checkpoint, checked against its manifest ``expected``, where it will live."""
    try:
        local = load_local(directory, block, expected)
    except Exception as exc:  # whatever a damaged file makes Zarr or a codec raise: the checkpoint is unusable
        detail = str(exc) if type(exc) is ValueError else f"{type(exc).__name__}: {exc}"
        raise ValueError(f"block {block.index}'s local factor: {detail}") from None
    return local if spill is None else spill.store(block, local, 0)


def _checkpoint_one(directory, block, local) -> dict:
    """Write a block's local factor into a checkpoint (where it lives); returns its manifest."""
    return save_local(directory, block, materialise(local))


class _SingleThreadBLAS:
    """A process-wide 'BLAS on one thread' held while any parallel-block executor is open
    (reference-counted: overlapping fits restore the original limits only when the last ends)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._count = 0
        self._limiter = None

    def acquire(self):
        with self._lock:
            if self._count == 0:
                from threadpoolctl import ThreadpoolController

                self._limiter = ThreadpoolController().limit(limits=1, user_api="blas")
            self._count += 1

    def release(self):
        with self._lock:
            self._count -= 1
            if self._count == 0:
                self._limiter.restore_original_limits()
                self._limiter = None


SINGLE_THREAD_BLAS = _SingleThreadBLAS()


class Executor:
    """Common bookkeeping: the pass counter and the spill directory of local factors."""

    def __init__(self, data, spill_dir: str | None = None):
        self.data = data
        self.blocks = data.blocks
        self.n_passes = 0
        self.spill = None if spill_dir is None else LocalSpill(os.path.abspath(os.fspath(spill_dir)))
        self.generation = 0

    def _count_pass(self):
        self.n_passes += 1

    def _column_results(self, results: list) -> tuple[list, list[dict]]:
        """Pieces in column order, and the statistics summed over column blocks in a fixed order."""
        self._count_pass()
        total = tree_reduce([stats for _, stats in results], add)
        return [piece for piece, _ in results], aligned(split_by_group(total, self.data.n_groups))

    def _manifests(self, expected: list | None) -> list:
        """Per block, the manifest its restored local factor must match (None: unchecked)."""
        if expected is None:
            return [None] * len(self.blocks)
        if len(expected) != len(self.blocks):
            raise ValueError(f"local factors of {len(expected)} blocks recorded, the data have {len(self.blocks)}")
        return list(expected)

    def _remove_spill(self):
        if self.spill is not None:
            shutil.rmtree(self.spill.directory, ignore_errors=True)

    def describe(self) -> dict:
        raise NotImplementedError


class InProcessExecutor(Executor):
    """Runs passes in this process: a plain loop, or a pool of threads across blocks."""

    def __init__(self, data, n_threads: int | None = None, spill_dir: str | None = None):
        super().__init__(data, spill_dir)
        self.n_threads = n_threads or os.cpu_count() or 1
        self.reader = data.reader()
        self.locals: list = [None] * data.n_blocks
        self._holds_blas = not self._serial()
        self._pool = None  # threads for the blocks of a pass, made at the first parallel pass
        if self._holds_blas:
            # Blocks run in parallel threads: one BLAS thread each avoids oversubscription, and
            # the driver's small products between passes must not leave BLAS threads spinning
            # on the cores the blocks need. (Workers of a distributed cluster run BLAS single-threaded too.)
            SINGLE_THREAD_BLAS.acquire()

    def describe(self) -> dict:
        mode = "loop" if self._serial() else "threads"
        return {"scheduler": "in-process", "mode": mode, "threads": self.n_threads}

    def _serial(self) -> bool:
        """Blocks run one after the other when there is nothing to overlap: one thread or
        one block, or dense blocks already in memory, whose BLAS products use every core
        (on 2 cores, one 2-thread product beats two 1-thread ones). Blocks read from disk,
        or CSR blocks (single-threaded kernels), run in parallel threads."""
        return (self.n_threads <= 1 or len(self.blocks) == 1
                or (self.data.in_memory and not self.data.is_sparse))

    def _map(self, tasks: list, serial: bool | None = None):
        """The tasks' results in order. In parallel threads, every task ends before the first failure (in task
        order) is raised, so that none is still writing (a checkpoint, W) when the caller cleans up after it."""
        if self._serial() if serial is None else serial:
            return [task() for task in tasks]
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(self.n_threads, thread_name_prefix="distfact-block")
        futures = [self._pool.submit(task) for task in tasks]
        concurrent.futures.wait(futures)
        return [future.result() for future in futures]

    def init_local(self, fn, *args, per_block: list | None = None) -> None:
        """``local_b <- fn(block, *args[, per_block[b]])`` for every block, where it will live."""
        own = [()] * len(self.blocks) if per_block is None else [(item,) for item in per_block]
        self.locals = self._map([functools.partial(_init_one, fn, block, args, self.spill, *own[block.index])
                                 for block in self.blocks])

    def run_pass(self, fn, *args, update: bool) -> list[dict]:
        data_blocks = self.data._blocks
        self.generation += update
        tasks = [functools.partial(run_block, fn, self.reader, block,
                                   None if data_blocks is None else data_blocks[block.index],
                                   self.locals[block.index], args, update, self.spill, self.generation)
                 for block in self.blocks]
        results = self._map(tasks)
        self._count_pass()
        if update:
            self.locals = [r[0] for r in results]
            results = [r[1] for r in results]
        return aligned(by_group(tree_reduce(results, merge), self.data.n_groups))

    def run_column_pass(self, fn, *args) -> tuple[list, list[dict]]:
        """One pass over the CSC column blocks (see the module docstring); column tasks are
        compiled kernels that release the GIL, so they run in parallel threads."""
        W = [np.concatenate(self.local_factors())]  # once for all column blocks of the pass
        reader = self.data.column_reader()
        tasks = [functools.partial(run_column_block, fn, reader, cblock, None, W, args)
                 for cblock in self.data.column_blocks]
        return self._column_results(self._map(tasks, serial=self.n_threads <= 1 or len(tasks) == 1))

    def map_local(self, fn, *args) -> None:
        """``local_b <- fn(local_b, block, *args)`` for every block, where it lives; X is not read."""
        self.generation += 1
        self.locals = self._map([functools.partial(map_local_one, fn, block, local, args, self.spill, self.generation)
                                 for block, local in zip(self.blocks, self.locals)])

    def map_blocks(self, fn, *args) -> list:
        """``fn(X_b, local_b, block, *args)`` per block, results returned in block order (one pass)."""
        data_blocks = self.data._blocks
        tasks = [functools.partial(_map_one, fn, self.reader, block,
                                   None if data_blocks is None else data_blocks[block.index],
                                   self.locals[block.index], args)
                 for block in self.blocks]
        out = self._map(tasks)
        self._count_pass()
        return out

    def local_factors(self) -> list:
        return [materialise(local) for local in self.locals]

    def save_local(self, directory: str) -> list[dict]:
        return self._map([functools.partial(_checkpoint_one, directory, block, local)
                          for block, local in zip(self.blocks, self.locals)])

    def load_local(self, directory: str, expected: list | None = None) -> None:
        expected = self._manifests(expected)
        self.locals = self._map([functools.partial(_restore_one, directory, block, self.spill, expected[block.index])
                                 for block in self.blocks])

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        self._remove_spill()
        if self._holds_blas:
            SINGLE_THREAD_BLAS.release()
            self._holds_blas = False


class DistributedExecutor(Executor):
    """Runs passes on a ``distributed.Client``; X blocks and local factors stay on the workers."""

    def __init__(self, data, client, persist_data: bool = True, spill_dir: str | None = None,
                 owns_client: bool = False):
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
        self.locals = self._per_block(_init_one, fn, self.blocks, args_ref, self.spill, *own, homes=self.home)

    def run_pass(self, fn, *args, update: bool) -> list[dict]:
        args_ref = self._broadcast(args)
        self.generation += update
        outs = self._per_block(run_block, fn, self.reader, self.blocks, self.X_refs, self.locals, args_ref, update,
                               self.spill, self.generation, homes=self.pass_homes)
        if update:  # where run_block ran
            self.locals = self._per_block(operator.getitem, outs, 0)
            outs = self._per_block(operator.getitem, outs, 1)
        with self._lost_workers_raise("a pass"):
            total = tree_reduce_arrivals(len(outs), self._arrivals(outs), merge)
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
        outs = self._per_block(_map_one, fn, self.reader, self.blocks, self.X_refs, self.locals, args_ref,
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

        written = self._per_block(_checkpoint_one, directory, self.blocks, self.locals, homes=self.pass_homes)
        with self._lost_workers_raise("the saving of the local factors"):
            wait(written)  # every block's write has ended, also when one failed: none writes after a cleanup
            return self.client.gather(written)

    def load_local(self, directory: str, expected: list | None = None) -> None:
        from distributed import wait

        restored = self._per_block(_restore_one, directory, self.blocks, self.spill, self._manifests(expected),
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


def _map_one(fn, reader, block, X_b, local, args):
    X_b = reader(block) if X_b is None else X_b
    return fn(X_b if sp.issparse(X_b) else aligned(X_b), aligned(materialise(local)), block, *aligned(args))


def make_executor(data, client=None, n_threads: int | None = None, spill_dir: str | None = None,
                  n_workers: int = 1):
    """The executor for ``client``: None -> in-process; a Client or a scheduler address -> distributed.

    ``spill_dir``: keep the local factors in Zarr there instead of in memory (out-of-core).
    ``n_workers``: wait a while for this many workers (a rerun after a lost worker waits for its replacement,
    else it would place all of X on the survivors), going on with fewer if they do not come."""
    if client is None:
        return InProcessExecutor(data, n_threads, spill_dir)
    owns_client = isinstance(client, str)
    if owns_client:
        from .cluster import connect

        client = connect(client)
    from .cluster import check_workers

    try:
        check_workers(client, data.path, n_workers)
        workers = client.scheduler_info().get("workers", {}).values()
        cluster_memory = sum(w.get("memory_limit") or 0 for w in workers)
        # X stays in worker memory when it takes at most half of it; otherwise every pass streams it from the store.
        persist = data.in_memory or not cluster_memory or data.nbytes <= cluster_memory // 2
        return DistributedExecutor(data, client, persist_data=persist, spill_dir=spill_dir, owns_client=owns_client)
    except BaseException:
        if owns_client:
            client.close()
        raise
