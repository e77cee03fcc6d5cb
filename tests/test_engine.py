"""The engine: fixed-order reduction, pass counting, determinism across schedulers, checkpoints."""

import collections
import functools
import importlib
import os
import pkgutil
import threading
import time

import numpy as np
import pytest
import scipy.sparse as sp

import distfact
from cluster_fits import ITERATIVE, METHODS, estimator, fit_inputs
from conftest import blas_threads, grouped_data, skip_unless_blas_threads
from distfact.engine import tree_reduce
from distfact.engine.executor.distributed import DistributedExecutor, block_work, contiguous_placement
from distfact.engine.reduce import merge, tree_reduce_arrivals
from distfact.kernels import memory
from distfact.kernels.memory import ReusedBuffers, aligned, aligned_holding, empty_aligned, numpy_allocates_aligned

try:
    from numpy._core.multiarray import get_handler_name
except ImportError:  # numpy 1.x
    from numpy.core.multiarray import get_handler_name

ALIGNED_HANDLER = "distfact_aligned_64"  # kernels/numpy_allocator.py's NAME (importing it compiles the handler)


def test_tree_reduce_pairs_in_a_fixed_order():
    assert tree_reduce(list("abcde"), lambda x, y: f"({x}{y})") == "(((ab)(cd))e)"
    assert tree_reduce(["x"], lambda x, y: x + y) == "x"
    with pytest.raises(ValueError, match="nothing to reduce"):
        tree_reduce([], lambda x, y: x)


def test_items_arriving_in_any_order_are_reduced_as_tree_reduce_pairs_them():
    """The distributed pass sums statistics as they arrive; the pairing (hence the rounding) must be
    tree_reduce's: checked with a combine that records it, for every size up to 40 in random orders."""
    rng = np.random.default_rng(0)
    combine = lambda x, y: f"({x}{y})"  # noqa: E731
    for n in range(1, 41):
        items = [chr(0x100 + i) for i in range(n)]
        for _ in range(10):
            order = rng.permutation(n)
            assert tree_reduce_arrivals(n, ((i, items[i]) for i in order), combine) == tree_reduce(items, combine)
    with pytest.raises(ValueError, match="only some of the 3 items arrived"):
        tree_reduce_arrivals(3, [(0, "a"), (2, "c")], combine)
    with pytest.raises(ValueError, match="nothing to reduce"):
        tree_reduce_arrivals(0, [], combine)


def test_blocks_are_placed_in_contiguous_runs_of_about_equal_work():
    assert contiguous_placement([1] * 8, [1, 1]) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert contiguous_placement([1] * 7, [1, 1, 1]) == [0, 0, 1, 1, 1, 2, 2]
    assert contiguous_placement([1] * 6, [2, 1]) == [0, 0, 0, 0, 1, 1]  # shares follow the threads
    assert contiguous_placement([5, 1, 1, 1, 1, 1], [1, 1]) == [0, 1, 1, 1, 1, 1]
    assert contiguous_placement([1, 1], [1, 1, 1, 1]) == [0, 2]
    # brute force: no split point of 3 to 60 random costs on 2 workers is better by more than the largest block
    rng = np.random.default_rng(1)
    for _ in range(200):
        costs = rng.integers(1, 100, rng.integers(3, 60))
        where = np.array(contiguous_placement(costs, [1, 1]))
        assert np.all(np.diff(where) >= 0)
        imbalance = abs(costs[where == 0].sum() - costs[where == 1].sum())
        best = min(abs(costs[:k].sum() - costs[k:].sum()) for k in range(len(costs) + 1))
        assert imbalance <= best + costs.max()


def test_block_work_counts_entries_or_nonzeros():
    X, groups = grouped_data(m=90, n=10, density=0.3)
    dense = distfact.from_arrays(X, groups, block_rows=20)
    sparse = distfact.from_arrays(sp.csr_matrix(X), groups, block_rows=20).with_column_blocks(n_blocks=2)
    assert [block_work(b, dense) for b in dense.blocks] == [b.n_rows * 10 for b in dense.blocks]
    assert [block_work(b, sparse) for b in sparse.blocks] == [b.nnz + b.n_rows for b in sparse.blocks]
    assert [block_work(c, sparse) for c in sparse.column_blocks] == [c.nnz + c.n_cols for c in sparse.column_blocks]


def _striped_csr(m, n, per_row, rng) -> sp.csr_matrix:
    """An m x n CSR matrix of ``per_row`` uniform entries a row, one in each of ``per_row`` equal stripes of columns
    (sorted, no duplicates): what ``sp.random`` gives of that density, in milliseconds (it took 14 s for 2 million
    entries)."""
    stripe = n // per_row
    indices = (np.arange(per_row) * stripe + rng.integers(0, stripe, (m, per_row))).ravel()
    return sp.csr_matrix((rng.random(m * per_row), indices, np.arange(0, m * per_row + 1, per_row)), shape=(m, n))


@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_arrays_in_memory_are_cut_into_a_block_per_thread(n_threads):
    """A pass's blocks run side by side on the threads: X of one group in as many blocks as threads, or one for a
    small X (1 MiB a block for sparse X; 16 MiB for dense X, whose blocks in memory run in turn in-process). (A byte
    target rounded down to whole rows used to make three blocks of a CSR X on two threads, the third alone.) Groups
    are cut apart: each in blocks of at most ceil(m / threads) rows."""
    from distfact.store.coerce import as_grouped

    rng = np.random.default_rng(0)
    sparse = _striped_csr(100_001, 2_000, 20, rng)  # 24 MB stored
    dense = rng.random((60_001, 100))  # 48 MB
    for X in (sparse, dense):
        data = as_grouped(X, n_threads=n_threads)
        assert data.n_blocks == n_threads
        sizes = [block.n_rows for block in data.blocks]
        assert sum(sizes) == X.shape[0] and max(sizes) - min(sizes) <= 1
    assert as_grouped(rng.random((400, 100)), n_threads=n_threads).n_blocks == 1  # 320 KB
    assert as_grouped(rng.random((20_001, 100)), n_threads=n_threads).n_blocks == 1  # 16 MB dense: one block
    small_sparse = _striped_csr(20_000, 2_000, 10, rng)  # 2.4 MB stored
    assert as_grouped(small_sparse, n_threads=n_threads).n_blocks == min(n_threads, 3)
    assert as_grouped(dense, n_threads=n_threads, block_rows=20_000).n_blocks == 4  # the caller's choice
    groups = np.repeat(["a", "b"], [36_001, 24_000])
    per_group = [block.n_rows for block in as_grouped(dense, groups, n_threads=n_threads).blocks]
    assert max(per_group) <= -(-dense.shape[0] // n_threads) and sum(per_group) == dense.shape[0]
    assert len(per_group) == sum(-(-size // -(-dense.shape[0] // n_threads)) for size in (36_001, 24_000))


def test_dense_blocks_are_aligned_once_where_they_are_read_or_staged(tmp_path):
    """A pass must not copy X_b to align it (it did: 50 MB per block per pass)."""
    X, groups = grouped_data(m=300, n=37)
    for store in (distfact.from_arrays(X, groups, block_rows=50),
                  distfact.from_arrays(X, groups, tmp_path / "x.zarr", block_rows=50),
                  distfact.from_arrays(X.astype(np.float32), groups, block_rows=50)):
        reader = store.reader()
        for block in store.blocks:
            X_b = reader(block)
            assert X_b.ctypes.data % 64 == 0 and X_b.flags.c_contiguous
            assert aligned(X_b) is X_b


def test_reused_aligned_copies_never_overwrite_an_array_still_held():
    """``aligned(value, reused)`` copies into kept allocations (issue 19): every array it hands out holds its own
    values at a 64-byte boundary, whoever still holds an earlier one (or a view of it), and an allocation is
    reused once nothing refers to it."""
    rng = np.random.default_rng(0)
    reused = ReusedBuffers()
    held, snapshots = [], []
    for step in range(12):
        # new arrays at an offset of 8 bytes: never aligned, so always copied
        source = {"H": np.empty(5 * 7 + 1)[1:].reshape(5, 7), "c": np.empty(4)[1:], "scale": 0.5}
        source["H"][...] = rng.random((5, 7))
        source["c"][...] = rng.random(3)
        out = aligned(source, reused)
        assert out is not source and out["scale"] == 0.5
        for name in ("H", "c"):
            assert out[name].ctypes.data % 64 == 0 and out[name].flags.c_contiguous
            assert np.array_equal(out[name], source[name])
        if step % 3 == 0:  # kept whole, kept only through a view, or dropped
            held.append(out["H"] if step % 2 else out["c"][1:])
            snapshots.append(held[-1].copy())
        del out
    for array, snapshot in zip(held, snapshots):
        assert np.array_equal(array, snapshot)
    # with nothing held, a container of the same layout goes into an allocation already made
    reused = ReusedBuffers()
    addresses = set()
    for _ in range(5):
        out = aligned([np.empty(11)[1:]], reused)
        addresses.add(out[0].ctypes.data)
        del out
    assert len(addresses) == 1


def _walked(value):
    """What ``aligned_holding`` gives for ``value`` by the generic walk (fresh buffers: no layout learnt)."""
    return aligned_holding(value, ReusedBuffers())


def test_a_container_of_the_last_layout_is_aligned_as_the_walk_aligns_it():
    """``aligned_holding`` repeats the layout of the last container it aligned with the same buffers (issue 19): the
    same leaves copied (the same values, at 64-byte boundaries), the same ones kept as they are (the very objects),
    the same holding list; a container whose leaves the walk would treat otherwise (an array made aligned, another
    shape, a key more, a nested container) goes the generic way and gives what the walk gives."""
    rng = np.random.default_rng(1)
    reused = ReusedBuffers()
    made = empty_aligned((3, 4), np.float64)
    made[...] = 1.0
    big = empty_aligned((200, 100), np.float64)  # 160 kB, aligned: kept as it is
    big[...] = 2.0

    def fresh(shape=(5, 7)):
        return {"H": rng.random(shape), "c": rng.random(3), "scale": 0.5, "big": big}

    def pass_like(W=None):
        return [rng.random((9, 2)) if W is None else W, {"WtX": rng.random((2, 7)), "WtW": rng.random((2, 2))}]

    def models(frozen):  # a sweep's global state: one dict per model, a stopped model's made here (not copied)
        return {"0": fresh(), "1": {"H": made, "scale": 0.5} if frozen else fresh()}

    variants = [fresh(), fresh(), {**fresh(), "H": made}, fresh((4, 7)), {**fresh(), "more": 1.0},
                {**fresh(), "c": [rng.random(2)]}, fresh(), pass_like(), pass_like(), pass_like(made), pass_like(),
                tuple(pass_like()), tuple(pass_like()), models(False), models(True), models(True), models(False)]
    held = []
    for value in variants:
        expected, expected_holding = _walked(value)
        out, holding = aligned_holding(value, reused)
        held.append(out)  # kept alive: later copies must go elsewhere
        assert type(out) is type(value) and len(out) == len(value)
        pairs = list(zip(out.values(), expected.values(), value.values())) if isinstance(value, dict) else \
            list(zip(out, expected, value))
        for new, walked, old in pairs:
            for a, b, c in (zip(new.values(), walked.values(), old.values()) if isinstance(old, dict) else
                            [(new, walked, old)]):
                if isinstance(c, np.ndarray) and b is not c:  # copied by the walk: copied here too
                    assert a is not c and a.ctypes.data % 64 == 0 and a.flags.c_contiguous
                    assert a.dtype == c.dtype and np.array_equal(a, c)
                elif isinstance(c, list):  # nested deeper: rebuilt around its copies by the walk
                    assert type(a) is list and all(np.array_equal(x, y) and x is not y for x, y in zip(a, c))
                elif isinstance(c, dict) and b is c:  # nothing in it copied: the very dict
                    assert a is c
                else:
                    assert a is c
        assert len(holding) == len(expected_holding)
        for a, b in zip(holding, expected_holding):
            assert type(a) is type(b) and (a is b or np.array_equal(a, b))
    # every array handed out still holds its own values
    for out, value in zip(held, variants):
        leaves = (lambda v: [x for item in (v.values() if isinstance(v, dict) else v)
                             for x in (item.values() if isinstance(item, dict) else [item])])
        for a, b in zip(leaves(out), leaves(value)):
            if isinstance(b, np.ndarray):
                assert np.array_equal(a, b)


def _aligned_handler_or_skip():
    if memory._made_allocator() is None:
        pytest.skip("numpy's aligned handler cannot be made here (kernels/numpy_allocator.py: Linux with glibc)")


def test_numpy_allocates_at_64_byte_boundaries_within_the_context_only():
    """kernels/numpy_allocator.py: within ``numpy_allocates_aligned()`` every allocation numpy makes in this thread
    starts at a 64-byte boundary and is known aligned without a copy (np.empty's malloc, np.zeros's calloc, a
    resize's realloc, its contents kept); a view into such memory is judged by its address; nested contexts
    restore each other; another thread meanwhile, and this one after, allocate with numpy's own handler."""
    _aligned_handler_or_skip()
    from distfact.kernels.numpy_allocator import NAME
    assert NAME == ALIGNED_HANDLER
    default, rng, elsewhere = get_handler_name(), np.random.default_rng(3), []
    with numpy_allocates_aligned():
        made = ([np.empty(n) for n in range(300)] + [np.zeros((7, n), np.float32) for n in range(1, 40)]
                + [rng.random((9, n)) @ rng.random((n, 5)) for n in range(1, 30)])
        assert all(get_handler_name(a) == ALIGNED_HANDLER and a.ctypes.data % 64 == 0 for a in made)
        # known aligned by the handler: a small array in a container is kept (one numpy made elsewhere is copied)
        assert all(aligned([a])[0] is a for a in made)
        assert not np.zeros(10_000).any()
        grown = np.arange(10.0)
        grown.resize(100_000, refcheck=False)
        assert grown.ctypes.data % 64 == 0 and np.array_equal(grown[:10], np.arange(10.0)) and not grown[10:].any()
        view = made[100][1:]  # 8 bytes into an aligned allocation: copied (np.empty's bytes, NaN among them maybe)
        assert aligned(view) is not view and aligned(view).tobytes() == view.tobytes()
        with numpy_allocates_aligned():
            assert get_handler_name(np.empty(3)) == ALIGNED_HANDLER
        assert get_handler_name() == ALIGNED_HANDLER
        thread = threading.Thread(target=lambda: elsewhere.append(get_handler_name(np.empty(5))))
        thread.start()
        thread.join()
    assert elsewhere == [default] and get_handler_name() == default and get_handler_name(np.empty(3)) == default
    small = np.empty(5)
    assert small.ctypes.data % 64 == 0 or aligned([small])[0] is not small
    assert aligned([small])[0] is not small  # not made by the handler: copied, whatever its address


def _fitted_arrays(model) -> dict:
    return {name: value for name, value in vars(model).items()
            if name.endswith("_") and isinstance(value, np.ndarray) and value.dtype != object}


def _wrap_method_steps(monkeypatch, names: tuple, wrapper) -> int:
    """Every method class's own ``names`` (``global_step``, ``local_step``) replaced by ``wrapper(step)``; how many."""
    from distfact import methods

    wrapped = 0
    for module_info in pkgutil.walk_packages(methods.__path__, "distfact.methods."):
        module = importlib.import_module(module_info.name)
        for cls in vars(module).values():
            if isinstance(cls, type) and cls.__module__ == module.__name__:
                for name in names:
                    if name in vars(cls) and not isinstance(vars(cls)[name], staticmethod):
                        monkeypatch.setattr(cls, name, wrapper(vars(cls)[name]))
                        wrapped += 1
    return wrapped


def _arrays_in(value):
    if isinstance(value, np.ndarray):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _arrays_in(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _arrays_in(item)


@pytest.mark.parametrize("method", [*METHODS, "nmf-kl", "nmf-masked"])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_fits_are_the_same_bits_with_numpy_allocating_aligned_or_not(method, n_threads, monkeypatch):
    """Arrays numpy allocates aligned need no copy (kernels/numpy_allocator.py), arrays that do not start at a 64-byte
    boundary (numba's, a view) are copied, and the copies give the same products: every array a global or local step
    is given starts at a 64-byte boundary either way, and every method's fit, on one thread (a small fit's direct
    passes) and on two (blocks in threads), gives the same bits either way."""
    _aligned_handler_or_skip()
    misaligned, from_handler = [], collections.Counter()

    def checked(step):
        def run(self, *args):
            for a in _arrays_in(args):
                if a.ctypes.data % 64 or not a.flags.c_contiguous:
                    misaligned.append(f"{type(self).__name__}.{step.__name__}: {a.shape}")
                from_handler[memory.USE_NUMPY_ALLOCATOR] += get_handler_name(a) == ALIGNED_HANDLER
            return step(self, *args)
        return run

    assert _wrap_method_steps(monkeypatch, ("global_step", "local_step"), checked) >= 12
    X, groups = grouped_data(m=240, n=20, n_groups=3, density=0.4, seed=4)
    name, _, variant = method.partition("-") if method.startswith("nmf-") else (method, "", "")
    model = lambda: estimator(name, n_threads=n_threads, block_rows=40, **(  # noqa: E731
        {"solver": "mu", "beta_loss": "kullback-leibler"} if variant == "kl" else {"solver": "mu"} if variant else {}))
    store = distfact.from_arrays(X, groups, block_rows=40, signed=name == "multigroup-svd")
    inputs = {**fit_inputs(name, store), **({"mask": np.random.default_rng(5).random(X.shape) > 0.1}
                                            if variant == "masked" else {})}
    data = X if variant == "masked" else store
    fits = []
    for use in (False, True):
        monkeypatch.setattr(memory, "USE_NUMPY_ALLOCATOR", use)
        fits.append(_fitted_arrays(model().fit(data, **({"groups": groups} if data is X else {}), **inputs)))
    assert not misaligned, misaligned[:5]
    if name in ITERATIVE:  # the loop's steps took the handler's arrays, as they were (the SVD runs no loop)
        assert from_handler[True] > 0 and from_handler[False] == 0
    assert fits[0].keys() == fits[1].keys() and "components_" in fits[0]
    for key, value in fits[0].items():
        assert value.tobytes() == fits[1][key].tobytes(), key


def test_block_tasks_in_threads_allocate_aligned(tmp_path, monkeypatch, blocks_in_threads):
    """Blocks of a store run in the executor's threads (``run_block``): what a block's step makes there comes from
    the aligned handler too, and its next step takes it as it is (not a copy)."""
    _aligned_handler_or_skip()
    seen = []

    def recorded(step):
        def local_step(self, X_b, W_b, block, G):
            seen.append((threading.current_thread().name, get_handler_name(W_b)))
            return step(self, X_b, W_b, block, G)
        return local_step

    _wrap_method_steps(monkeypatch, ("local_step",), recorded)
    X, groups = grouped_data(m=240, n=20, seed=9)
    path = tmp_path / "x.zarr"
    distfact.from_arrays(X, groups, path, block_rows=40)
    distfact.NMF(3, solver="mu", max_iter=4, tol=0, random_state=0, n_threads=2).fit(str(path))
    later = seen[len(seen) // 4:]  # after the first pass: the local factors the tasks made
    assert {name.startswith("distfact-block") for name, _ in later} == {True}
    assert {handler for _, handler in later} == {ALIGNED_HANDLER}


def test_small_held_blocks_run_in_turn_and_give_the_bits_of_threads(tmp_path, monkeypatch):
    """Blocks held in memory (a held store's, CSR in memory) of at most ``IN_TURN_BLOCK_BYTES`` each run in turn in
    this process (issue 19: a task handed to a thread cost more than a small block's arithmetic), one byte more in
    the executor's threads; a fit gives the same bits either way (the same steps, the statistics summed in the same
    fixed order)."""
    from distfact.engine.executor import inprocess
    from distfact.engine.executor.inprocess import InProcessExecutor

    X, groups = grouped_data(m=240, n=20, seed=9)
    path = tmp_path / "x.zarr"
    distfact.from_arrays(X, groups, path, block_rows=40)  # dense blocks of 40 x 20 float64: 6,400 bytes
    csr = distfact.from_arrays(sp.csr_matrix(np.where(X > 0.5, X, 0.0)), groups, block_rows=40)
    csr_bytes = max(inprocess._block_bytes(block) for block in csr._blocks)
    assert csr_bytes == max(b.data.nbytes + b.indices.nbytes + b.indptr.nbytes for b in csr._blocks) < 6_400
    for data, largest in ((distfact.open(path), 6_400), (csr, csr_bytes)):
        for threshold, in_turn in ((largest, True), (largest - 1, False)):
            monkeypatch.setattr(inprocess, "IN_TURN_BLOCK_BYTES", threshold)
            with InProcessExecutor(data, n_threads=2) as executor:
                assert executor._in_turn is in_turn
                assert executor.describe()["mode"] == ("loop" if in_turn else "threads")
    ran_in = []

    def recorded(step):
        def local_step(self, X_b, W_b, block, G):
            ran_in.append(threading.current_thread().name.startswith("distfact-block"))
            return step(self, X_b, W_b, block, G)
        return local_step

    _wrap_method_steps(monkeypatch, ("local_step",), recorded)
    fits = {}
    for threshold, name in ((6_400, "in turn"), (0, "threads")):
        monkeypatch.setattr(inprocess, "IN_TURN_BLOCK_BYTES", threshold)
        ran_in.clear()
        model = distfact.NMF(3, solver="mu", max_iter=5, tol=0, random_state=0, n_threads=2)
        fits[name] = model.fit_transform(str(path)), model.components_, model.loss_history_
        assert set(ran_in) == {name == "threads"}, name
    for ours, theirs in zip(fits["in turn"], fits["threads"]):
        assert np.array_equal(ours, theirs)


@pytest.mark.parametrize("fit", ["nmf-mu", "nmf-hals", "nmf-kl", "nmf-masked-mu", "nmf-masked-hals", "nmf-masked-kl",
                                 "ssnmf-FF", "ssnmf-DF", "ssnmf-masked"])
def test_global_steps_write_into_no_statistic(fit, monkeypatch):
    """``group_sums`` gives one group's statistics themselves, not copies (issue 19): a global step must only read
    them. Every method's global step is run with the statistics' arrays read-only, on one group."""
    def read_only_statistics(step):
        def global_step(self, G, stats, data):
            arrays = [a for a in _arrays_in(stats) if a.flags.writeable]
            for a in arrays:
                a.flags.writeable = False
            try:
                return step(self, G, stats, data)
            finally:
                for a in arrays:
                    a.flags.writeable = True
        return global_step

    assert _wrap_method_steps(monkeypatch, ("global_step",), read_only_statistics) >= 7
    X, _ = grouped_data(m=60, n=12, seed=6)
    groups = np.array(["g"] * 60)
    name, *options = fit.split("-")
    mask = {"mask": np.random.default_rng(7).random(X.shape) > 0.2} if "masked" in options else {}
    if name == "nmf":
        solver, loss = {"mu": ("mu", "frobenius"), "hals": ("hals", "frobenius"),
                        "kl": ("mu", "kullback-leibler")}[options[-1]]
        model = distfact.NMF(3, solver=solver, beta_loss=loss, max_iter=5, tol=0, random_state=0)
        model.fit(X, groups=groups, **mask)
    else:
        y = np.random.default_rng(8).integers(0, 3, 60)
        model = distfact.SSNMF(3, model="FF" if options == ["masked"] else options[0], max_iter=5, random_state=0)
        model.fit(X, y=y, groups=groups, **mask)
    assert np.isfinite(model.components_).all()


@pytest.mark.cluster
@pytest.mark.parametrize("where", ["store", "memory"])
def test_blocks_live_on_their_home_workers_and_passes_sum_the_same(where, local_cluster_client, tmp_path):
    """X's blocks split 4/4 over the two workers in contiguous runs (the scheduler, left to itself, put 5 and 3),
    the local factors with them; a pass is one task per worker thread over its run of blocks (not one per block);
    its statistics equal the in-process executor's bitwise."""
    from dask.utils import key_split
    from distributed import get_task_stream

    from distfact.engine import InProcessExecutor
    from distfact.methods.nmf import NMFMethod

    X, _ = grouped_data(m=400, n=30, seed=3)
    store = distfact.from_arrays(X, np.repeat(["a", "b"], 200), tmp_path / "x.zarr" if where == "store" else None,
                                 block_rows=50)
    assert store.n_blocks == 8
    executor = DistributedExecutor(store, local_cluster_client)
    try:
        homes = [executor.addresses[0]] * 4 + [executor.addresses[1]] * 4
        assert holders(local_cluster_client, executor.X_refs) == homes
        with get_task_stream(client=local_cluster_client) as stream:
            ours = run_two_passes(executor, store, NMFMethod,
                                  lambda: holders(local_cluster_client, [future for future, _ in executor.locals]))
        assert ours[0] == homes  # the first local factors too (later ones go where the scheduler puts run_block)
        assert [ref[1] for ref in executor.locals] == [0, 1, 2, 3] * 2
        tasks = collections.Counter(key_split(task["key"]) for task in stream.data)
        # two for each of: the first local factors, pass 0, the local step, and the statistics taken out of the
        # local step's outputs (local factors of unknown size stay where they are made)
        assert tasks == {"init_one": 2, "run_block": 4, "getitem": 2}, tasks
    finally:
        executor.close()
    threads = InProcessExecutor(store, n_threads=2)
    try:
        theirs = run_two_passes(threads, store, NMFMethod, lambda: None)
    finally:
        threads.close()
    for a, b in zip(ours[1], theirs[1]):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _slow_on(address, seconds, item):
    """A stand-in for a block read that is slow on one worker (still importing, a cold disk)."""
    from distributed import get_worker

    if get_worker().address == address:
        time.sleep(seconds)
    return item


@pytest.mark.cluster
def test_blocks_stay_home_when_one_worker_is_slow(local_cluster_client, tmp_path):
    """Work stealing moves a task queued on a busy worker to an idle one: with every read sent at once, the fast
    worker took blocks of the slow one's (seen in CI). Sent one per thread, each lands on its home."""
    X, groups = grouped_data(m=400, n=30, seed=3)
    store = distfact.from_arrays(X, groups, tmp_path / "x.zarr", block_rows=50)
    executor = DistributedExecutor(store, local_cluster_client, persist_data=False)
    try:
        homes = [executor.addresses[0]] * 4 + [executor.addresses[1]] * 4
        slow = functools.partial(_slow_on, executor.addresses[0], 0.5)
        placed = executor._on_homes(slow, list(range(8)), homes)
        assert holders(local_cluster_client, placed) == homes
        assert local_cluster_client.gather(placed) == list(range(8))
        local_cluster_client.cancel(placed)
    finally:
        executor.close()


@pytest.mark.cluster
@pytest.mark.timeout(240)  # it hung before the fix
def test_a_fit_on_a_client_that_is_not_the_default_one(local_cluster_client, tmp_path):
    """With two clients in one process, distributed's as_completed tracked our futures on the *default* client's
    event loop, another thread: the two threads read one connection at once and corrupted it (the cluster
    benchmark's 1- and 2-worker comparison died with a 4 EiB allocation). The fit must use its own client's loop."""
    from distributed import Client, LocalCluster

    X, _ = grouped_data(m=960, n=40, seed=5)
    store = distfact.from_arrays(X, np.repeat(["a", "b", "c"], 320), tmp_path / "x.zarr", block_rows=30)
    model = distfact.NMF(4, solver="mu", random_state=0, max_iter=15, tol=0)
    expected = model.fit_transform(store)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address="127.0.0.1:0",
                      worker_dashboard_address=None) as other, \
            Client(other) as newer:
        from distributed.client import default_client

        assert default_client() is newer and newer.loop is not local_cluster_client.loop
        for _ in range(2):
            assert np.array_equal(model.fit_transform(store, client=local_cluster_client), expected)


@pytest.mark.cluster
def test_a_worker_with_two_threads_gets_a_task_per_thread_and_the_same_factors():
    """One worker of two threads: a pass over its 8 blocks is two tasks of 4 contiguous blocks (one would leave a
    thread idle), and the fit's factors are the in-process fit's bitwise."""
    from dask.utils import key_split
    from distributed import Client, LocalCluster, get_task_stream

    X, _ = grouped_data(m=400, n=30, seed=3)
    data = distfact.from_arrays(X, np.repeat(["a", "b"], 200), block_rows=50)
    assert data.n_blocks == 8
    model = distfact.NMF(3, solver="mu", max_iter=4, tol=0, random_state=0)
    expected = model.fit(data).components_
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client, get_task_stream(client=client) as stream:
        fitted = model.fit(data, client=client).components_
    passes = [task for task in stream.data if key_split(task["key"]) == "run_block"]
    assert len(passes) == 2 * model.n_passes_, [key_split(task["key"]) for task in stream.data]
    assert np.array_equal(fitted, expected)


@pytest.mark.cluster
def test_a_task_error_in_a_pass_is_raised_as_itself_and_the_rest_cancelled(local_cluster_client, tmp_path):
    """Only a lost worker becomes WorkerLost (and a rerun); a block's own error is the fit's error, raised as soon as
    it comes, and the rest of the pass stops: the other worker's task is cancelled and, as Dask cannot stop a
    running task, its run of blocks stops before its next block."""
    X, _ = grouped_data(m=400, n=30, seed=3)
    store = distfact.from_arrays(X, np.repeat(["a", "b"], 200), tmp_path / "x.zarr", block_rows=50)
    ran = tmp_path / "ran"
    ran.mkdir()
    executor = DistributedExecutor(store, local_cluster_client)
    try:
        executor.init_local(lambda block: np.zeros((block.n_rows, 2)))

        def stats(X_b, local, block):
            import time

            if block.index == 0:  # once the other worker's run has begun
                for _ in range(600):
                    if (ran / "4").exists():
                        break
                    time.sleep(0.05)
                raise ArithmeticError(f"block {block.index} is bad")
            (ran / str(block.index)).touch()
            time.sleep(0.5)
            return {"s": X_b.sum(axis=0)}

        outs = []
        executor._arrivals = (lambda arrivals: lambda futures: outs.extend(futures) or arrivals(futures))(
            executor._arrivals)
        with pytest.raises(ArithmeticError, match="block 0 is bad"):
            executor.run_pass(stats, update=False)
        batches = list({future.key: future for future, _ in outs}.values())
        assert len(batches) == 2  # blocks 0-3 on one worker, 4-7 (half a second each) on the other
        assert batches[1].status == "cancelled", [future.status for future in batches]  # not waited for
        time.sleep(2.5)  # as long as blocks 4-7 would take
        # block 4, and 5 or 6 when the cancel comes late (a loaded machine); not all four
        assert sorted(os.listdir(ran)) in (["4"], ["4", "5"], ["4", "5", "6"]), sorted(os.listdir(ran))
    finally:
        executor.close()


def holders(client, futures) -> list[str]:
    from distributed import wait

    wait(futures)
    return [next(iter(client.who_has([future])[future.key])) for future in futures]


def run_two_passes(executor, store, method_class, after_initialising):
    """(what ``after_initialising()`` returns, the statistics of a pass 0 and one local step)."""
    from distfact.engine.driver import initialise, shipped

    method = method_class(3)
    state = initialise(method, store, executor, 0)
    seen = after_initialising()
    executor.run_pass(method.block_stats, shipped(method, state), update=False)
    return seen, executor.run_pass(method.local_step, shipped(method, state), update=True)


def test_merge_keeps_groups_apart():
    a = {0: {"s": np.array([1.0])}}
    b = {0: {"s": np.array([2.0])}, 1: {"s": np.array([5.0])}}
    out = merge(a, b)
    assert list(out) == [0, 1] and out[0]["s"][0] == 3.0 and out[1]["s"][0] == 5.0


@pytest.mark.parametrize("solver", ["mu", "hals"])
def test_a_small_store_is_read_once_a_larger_one_once_per_pass(tmp_path, monkeypatch, solver):
    """A store of at most ``RESIDENT_STORE_BYTES`` is read once, when the fit starts, and held; a larger one (the
    limit lowered below this store's size), or any store while the local factors spill to Zarr, is read block by
    block in every pass. The fits are the same, bit for bit."""
    from distfact.engine.executor import inprocess

    X, groups = grouped_data(m=90, n=10)
    path = tmp_path / "x.zarr"
    distfact.from_arrays(X, groups, path, block_rows=10)
    fits = {}
    for case, limit, budget in [("held", inprocess.RESIDENT_STORE_BYTES, None), ("read", 90 * 10 * 8 - 1, None),
                                ("spilled", inprocess.RESIDENT_STORE_BYTES, 8)]:
        monkeypatch.setattr(inprocess, "RESIDENT_STORE_BYTES", limit)
        store, reads, threads = distfact.open(path), [], set()
        reader = store.reader()
        store.reader = lambda: (lambda block: reads.append(block.index) or threads.add(
            threading.current_thread().name.startswith("distfact-block")) or reader(block))
        model = distfact.NMF(3, solver=solver, random_state=0, max_iter=6, tol=0, n_threads=2,
                             local_memory_budget=budget)
        fits[case] = model.fit_transform(store), model.components_, model.loss_history_
        assert model.n_passes_ == 7
        assert sorted(reads) == sorted(list(range(store.n_blocks)) * (1 if case == "held" else 7)), case
        assert threads == {True}, case  # the blocks read in the pool's threads, also the held store's one read
    for case in ("read", "spilled"):
        for held, other in zip(fits["held"], fits[case]):
            assert np.array_equal(held, other), case


def test_a_held_store_with_damaged_blocks_names_the_first_and_leaves_no_thread(tmp_path):
    """A held store's blocks are read in parallel threads when the fit starts; with two blocks damaged the fit
    stops naming the first in block order (as every pass's read does), after every read ended, and no thread of
    the executor is left (its pool shut down, which joins them)."""
    X, groups = grouped_data(m=90, n=10)
    path = tmp_path / "x.zarr"
    distfact.from_arrays(X, groups, path, block_rows=10)
    for key in ("000005", "000002"):
        chunk = next(p for p in (path / "blocks" / key / "X").rglob("*") if p.is_file() and p.name != "zarr.json")
        chunk.write_bytes(b"damaged")
    before = {thread for thread in threading.enumerate() if thread.name.startswith("distfact-block")}
    with pytest.raises(ValueError, match=r"block \d+ \(key '000002'\), array 'X': checksum mismatch"):
        distfact.NMF(3, max_iter=2, n_threads=2).fit(str(path))
    assert not {thread for thread in threading.enumerate() if thread.name.startswith("distfact-block")} - before


def _block_statistic(X_b, local, block, size, failing=()):
    """A pass's block function: a statistic of ``size`` float64 (8 MB at a million) from the block's index, or an
    error for a block of ``failing``."""
    if block.index in failing:
        raise ValueError(f"block {block.index} fails")
    return {"s": np.full(size, 1.0 + block.index / 7)}


def test_a_pass_in_threads_sums_the_statistics_as_they_arrive_and_raises_the_first_failure(tmp_path, blocks_in_threads):
    """The in-process pass in threads sums the blocks' statistics as they arrive: the same bits as tree_reduce over
    all of them, holding a few blocks' worth at a time, not all 32 (a masked fit's per-column Grams are n r^2 a block:
    16 blocks of 20,000 columns at rank 20 held 2.7 GB at once; BENCHMARKS.md). With two blocks failing, the first in
    block order is raised, after every task started has ended; so is a failure of the sum itself."""
    import tracemalloc

    from distfact.engine.executor.inprocess import InProcessExecutor

    X, groups = grouped_data(m=64, n=6, density=0.5)
    data = distfact.from_arrays(sp.csr_matrix(X), np.zeros(64, dtype=int), block_rows=2)  # CSR: blocks in threads
    size = 1 << 20
    with InProcessExecutor(data, n_threads=2) as executor:
        assert data.n_blocks == 32 and not executor._in_turn
        tracemalloc.start()
        try:
            (total,) = executor.run_pass(_block_statistic, size, update=False)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        expected = tree_reduce([np.full(size, 1.0 + b / 7) for b in range(32)], np.add)
        assert np.array_equal(total["s"], expected)
        assert peak < 16 * 8 * size  # 32 blocks' statistics held at once would be 32 * 8 MB
        before = {thread for thread in threading.enumerate() if thread.name.startswith("distfact-block")}
        with pytest.raises(ValueError, match="block 9 fails"):
            executor.run_pass(_block_statistic, 8, (17, 9), update=False)
        started, ended = [], []

        def mismatched(X_b, local, block):  # blocks 0 and 1 at once, their sum failing while later blocks run
            started.append(block.index)
            time.sleep(0.0 if block.index < 2 else 0.2)
            ended.append(block.index)
            return {"s": np.ones(3 if block.index == 0 else 4)}

        try:
            executor.run_pass(mismatched, update=False)
        except ValueError as exc:  # checked here, while the failed pass's frames are still referenced
            assert "broadcast" in str(exc)
            assert len(started) > 2 and sorted(ended) == sorted(started)  # no task left running once it raised
        else:
            pytest.fail("statistics of different shapes were summed")
    assert not {thread for thread in threading.enumerate() if thread.name.startswith("distfact-block")} - before


def _fit_all(X, groups, client, rank):
    out = {}
    for solver, loss in (("mu", "frobenius"), ("hals", "frobenius"), ("mu", "kullback-leibler")):
        model = distfact.NMF(rank, solver=solver, beta_loss=loss, random_state=11, max_iter=15, tol=0, n_threads=2)
        W = model.fit_transform(X, groups=groups, client=client)
        out[solver, loss] = (W, model.components_, model.loss_history_)
    return out


@pytest.mark.cluster
@pytest.mark.parametrize("kind,rank", [("dense", 4), ("dense", 5), ("dense", 7), ("sparse", 5), ("store", 5)])
def test_bitwise_identical_on_threads_and_on_a_local_cluster(kind, rank, local_cluster_client, tmp_path,
                                                             blocks_in_threads):
    """Ranks 5 and 7 failed before inputs were aligned (BLAS paths depend on alignment)."""
    X, groups = grouped_data(m=400, n=60, density=0.2 if kind == "sparse" else None, seed=21)
    if kind == "sparse":
        X = sp.csr_matrix(X)
    if kind == "store":  # X on Zarr: the workers read their blocks from disk
        X, groups = distfact.from_arrays(X, groups, tmp_path / "x.zarr", block_rows=37), None
    else:
        X = distfact.from_arrays(X, groups, block_rows=37)
        groups = None
    threads = _fit_all(X, groups, None, rank)
    cluster = _fit_all(X, groups, local_cluster_client, rank)
    for key in threads:
        for ours, theirs in zip(threads[key], cluster[key]):
            assert np.array_equal(ours, theirs), key


def _interrupt_at(iteration):
    def callback(info):
        if info.iteration == iteration:
            raise KeyboardInterrupt("simulated crash")
    return callback


@pytest.mark.parametrize("solver,loss", [("mu", "frobenius"), ("hals", "frobenius"), ("mu", "kullback-leibler")])
def test_resume_gives_the_uninterrupted_result(solver, loss, tmp_path):
    X, groups = grouped_data(m=150, n=20, seed=22)
    kwargs = dict(solver=solver, beta_loss=loss, random_state=5, max_iter=20, tol=0, block_rows=16)
    reference = distfact.NMF(4, **kwargs)
    W_ref = reference.fit_transform(X, groups=groups)

    run_dir = tmp_path / "run"
    crashing = distfact.NMF(4, checkpoint_dir=run_dir, checkpoint_every=5, callback=_interrupt_at(13), **kwargs)
    with pytest.raises(KeyboardInterrupt):
        crashing.fit(X, groups=groups)
    committed = sorted(os.listdir(run_dir / "checkpoints"))
    assert committed == ["iter-000005", "iter-000010"]

    resumed = distfact.NMF(4, checkpoint_dir=run_dir, checkpoint_every=5, resume=True, **kwargs)
    W = resumed.fit_transform(X, groups=groups)
    assert np.array_equal(W, W_ref)
    assert np.array_equal(resumed.components_, reference.components_)
    assert np.array_equal(resumed.loss_history_, reference.loss_history_)
    assert resumed.n_iter_ == 20
    assert resumed.n_passes_ == 21  # the count is checkpointed: n_iter_ + 1 as for an uninterrupted run


def _saves_of(monkeypatch, fit):
    """The (iteration, seconds) of each checkpoint ``fit()`` writes, and the seconds ``fit()`` took."""
    from distfact.engine.checkpoint import Checkpointer

    saves, save = [], Checkpointer.save

    def timed_save(self, iteration, state, executor):
        started = time.perf_counter()
        path = save(self, iteration, state, executor)
        saves.append((iteration, time.perf_counter() - started))
        return path

    with monkeypatch.context() as patch:  # undone on return: a second call counts its own saves only
        patch.setattr(Checkpointer, "save", timed_save)
        started = time.perf_counter()
        fit()
    return saves, time.perf_counter() - started


def test_auto_checkpoints_take_a_tenth_of_a_fit_of_cheap_iterations(tmp_path, monkeypatch):
    """``checkpoint_every="auto"`` (the default): every 10 iterations while checkpoints take at most a tenth of the
    fit's time, the first one due and the final iteration's state always; an int: every so many iterations, whatever
    they cost."""
    X, groups = grouped_data(m=400, n=100, seed=3)
    kwargs = dict(random_state=0, max_iter=300, tol=0, block_rows=100)
    counted, _ = _saves_of(monkeypatch, lambda: distfact.NMF(
        5, checkpoint_dir=tmp_path / "counted", checkpoint_every=10, **kwargs).fit(X, groups=groups))
    assert [iteration for iteration, _ in counted] == list(range(10, 301, 10))
    auto, seconds = _saves_of(monkeypatch, lambda: distfact.NMF(
        5, checkpoint_dir=tmp_path / "auto", **kwargs).fit(X, groups=groups))
    iterations, durations = [iteration for iteration, _ in auto], [duration for _, duration in auto]
    assert iterations[0] == 10 and iterations[-1] == 300 and all(i % 10 == 0 for i in iterations)
    # each save after the first began with the saves before it within a tenth of the time since the loop began
    # (within the whole fit's): all but the last within a tenth of the fit, give or take the one that crossed it
    assert sum(durations[:-1]) <= 0.1 * seconds + max(durations[:-1])
    assert len(auto) < 30  # a save takes milliseconds here, an iteration a tenth of one
    seen = []
    distfact.NMF(5, checkpoint_dir=tmp_path / "auto", resume=True, callback=lambda info: seen.append(info.iteration),
                 **{**kwargs, "max_iter": 310}).fit(X, groups=groups)
    assert seen == list(range(301, 311))  # resumed from the last state, saved whatever the time


def test_uncommitted_checkpoint_is_ignored_and_foreign_one_refused(tmp_path):
    X, groups = grouped_data(m=60, n=10, seed=23)
    run_dir = tmp_path / "run"
    distfact.NMF(3, random_state=0, max_iter=4, tol=0, checkpoint_dir=run_dir, checkpoint_every=2).fit(X, groups=groups)
    os.remove(run_dir / "checkpoints" / "iter-000004" / "COMMITTED")  # as if the save had died half-way
    resumed = distfact.NMF(3, random_state=0, max_iter=4, tol=0, checkpoint_dir=run_dir, checkpoint_every=2,
                           resume=True).fit(X, groups=groups)
    assert resumed.n_passes_ == 5 and resumed.n_iter_ == 4  # continued from iteration 2
    with pytest.raises(ValueError, match="another configuration"):
        distfact.NMF(3, random_state=1, max_iter=4, checkpoint_dir=run_dir, resume=True).fit(X, groups=groups)


@pytest.mark.cluster
def test_resume_on_a_cluster_from_a_threaded_checkpoint(local_cluster_client, tmp_path):
    X, groups = grouped_data(m=200, n=20, seed=24)
    data = distfact.from_arrays(X, groups, tmp_path / "x.zarr", block_rows=30)
    kwargs = dict(random_state=5, max_iter=12, tol=0, n_threads=2)
    W_ref = distfact.NMF(3, **kwargs).fit_transform(data)
    run_dir = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        distfact.NMF(3, checkpoint_dir=run_dir, checkpoint_every=4, callback=_interrupt_at(6), **kwargs).fit(data)
    W = distfact.NMF(3, checkpoint_dir=run_dir, checkpoint_every=4, resume=True, **kwargs).fit_transform(
        data, client=local_cluster_client)
    assert np.array_equal(W, W_ref)


@pytest.mark.parametrize("sparse_input", [False, True])
def test_local_factors_spilled_to_zarr_give_the_same_result(sparse_input, tmp_path):
    """Out of core: X streamed from the store, W over a (tiny) budget lives in Zarr beside X."""
    X, groups = grouped_data(m=120, n=15, density=0.4 if sparse_input else None, seed=31)
    store = distfact.from_arrays(sp.csr_matrix(X) if sparse_input else X, groups, tmp_path / "x.zarr",
                                 block_rows=17)
    kwargs = dict(solver="hals", random_state=3, max_iter=8, tol=0, n_threads=2)
    in_memory = distfact.NMF(4, **kwargs)
    W_mem = in_memory.fit_transform(store)
    seen = []

    def look(info):
        spill_dirs = [n for n in os.listdir(tmp_path) if ".locals-" in n]
        seen.append((spill_dirs, sorted(os.listdir(tmp_path / spill_dirs[0]))))

    spilled = distfact.NMF(4, local_memory_budget=100, callback=look, **kwargs)
    W_spill = spilled.fit_transform(store)
    # the spill directory sat beside X during the fit, with its two generations of W blocks
    assert all(dirs == seen[0][0] and len(dirs) == 1 and gens == ["gen0", "gen1"] for dirs, gens in seen)
    assert not [n for n in os.listdir(tmp_path) if ".locals-" in n]  # and is gone afterwards
    assert np.array_equal(W_spill, W_mem)
    assert np.array_equal(spilled.components_, in_memory.components_)
    assert spilled.n_passes_ == in_memory.n_passes_ == 9


@pytest.mark.parametrize("array", [np.random.default_rng(5).random((100, 5)), np.arange(7, dtype=np.float32),
                                   np.arange(5, dtype=np.int32), np.zeros((0, 3)), np.array([True, False]),
                                   np.random.default_rng(6).random((3, 4)).astype(">f8"), np.float64(2.5),
                                   np.zeros((2, 3)), np.array([False, False]), np.arange(4, dtype=np.uint8)],
                         ids=["float64", "float32", "int32", "no rows", "bool", "big-endian", "0-d", "zeros",
                              "all False", "uint8"])
def test_a_local_factor_written_as_files_is_what_zarr_writes(array, tmp_path):
    """``spill.write_one_chunk_array`` (local factors of spills, checkpoints and ``W_out``, written as files)
    against the call it replaced, zarr-python's ``open_array(mode="w")`` with zarr's default codecs, given a
    store's chunk shape (no dimension below 1) and ``write_empty_chunks``: the same files, bytes and metadata, and
    zarr reads them back; written over an array of another shape, nothing of the old one is left; a dtype that is
    not numeric is refused before anything at the path is replaced."""
    import json
    import zarr

    from distfact.engine.executor.spill import write_one_chunk_array

    array = np.asarray(array)
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    write_one_chunk_array(str(mine), np.ones((2, 3, 4)))  # replaced below
    write_one_chunk_array(str(mine), array)
    zarr.open_array(str(theirs), mode="w", shape=array.shape, dtype=array.dtype,
                    chunks=tuple(max(size, 1) for size in array.shape), zarr_format=3,
                    config={"write_empty_chunks": True})[...] = array

    def files(root):
        return {str(path.relative_to(root)): path.read_bytes() for path in root.rglob("*") if path.is_file()}

    mine_files, their_files = files(mine), files(theirs)
    assert mine_files.keys() == their_files.keys()
    assert json.loads(mine_files.pop("zarr.json")) == json.loads(their_files.pop("zarr.json"))
    assert mine_files == their_files
    read = zarr.open(str(mine), mode="r")
    assert read.shape == array.shape and read.dtype == array.dtype.newbyteorder("=")
    assert np.array_equal(read[...], array)
    with pytest.raises(TypeError, match="dtype complex128"):
        write_one_chunk_array(str(mine), array.astype(complex))
    assert files(mine).keys() == mine_files.keys() | {"zarr.json"}


@pytest.mark.cluster
def test_spilled_local_factors_on_a_cluster(local_cluster_client, tmp_path):
    X, groups = grouped_data(m=150, n=12, seed=32)
    store = distfact.from_arrays(X, groups, tmp_path / "x.zarr", block_rows=20)
    kwargs = dict(random_state=4, max_iter=6, tol=0, n_threads=2)
    W_ref = distfact.NMF(3, **kwargs).fit_transform(store)
    W = distfact.NMF(3, local_memory_budget=100, **kwargs).fit_transform(store, client=local_cluster_client)
    assert np.array_equal(W, W_ref)
    assert not [n for n in os.listdir(tmp_path) if ".locals-" in n]


def test_a_fresh_run_refuses_a_directory_with_checkpoints(tmp_path):
    X, groups = grouped_data(m=60, n=10, seed=25)
    run_dir = tmp_path / "run"
    distfact.NMF(3, random_state=0, max_iter=4, tol=0, checkpoint_dir=run_dir, checkpoint_every=2).fit(X, groups=groups)
    with pytest.raises(ValueError, match="already holds checkpoints of an earlier run"):
        distfact.NMF(3, random_state=1, max_iter=4, checkpoint_dir=run_dir).fit(X, groups=groups)
    assert sorted(os.listdir(run_dir / "checkpoints")) == ["iter-000002", "iter-000004"]


def test_blas_limit_is_restored_after_overlapping_fits(blocks_in_threads):
    from distfact.engine import InProcessExecutor

    before = blas_threads()
    X, groups = grouped_data(m=60, n=10, density=0.5, seed=26)
    data = distfact.from_arrays(sp.csr_matrix(X), groups, block_rows=10)
    first, second = InProcessExecutor(data, n_threads=2), InProcessExecutor(data, n_threads=2)
    assert set(blas_threads()) == {1}
    first.close()
    assert set(blas_threads()) == {1}  # the second executor still runs
    second.close()
    assert blas_threads() == before


def test_map_on_cores_with_blas_holds_it_at_one_thread_in_its_pieces():
    """The driver's pieces that call BLAS (``map_on_cores(..., blas=True)``, Stratified-NMF's line 8) run with BLAS at
    one thread (two pieces each on BLAS's threads would oversubscribe the cores), BLAS's limit restored after; pieces
    without BLAS leave it as it is."""
    from distfact.kernels.blas_threads import map_on_cores

    skip_unless_blas_threads()
    before = blas_threads()
    assert map_on_cores(lambda i: (i, max(blas_threads())), [0, 1, 2, 3], blas=True) == [(i, 1) for i in range(4)]
    assert blas_threads() == before
    assert map_on_cores(lambda i: max(blas_threads()), [0, 1]) == [max(before)] * 2


def test_an_executor_as_a_context_manager_closes_on_error_and_twice_is_harmless(blocks_in_threads):
    """``with`` an executor releases what it holds (here BLAS at one thread, for parallel blocks) when the body
    raises; a second close changes nothing (one hold, released once)."""
    from distfact.engine import InProcessExecutor

    skip_unless_blas_threads()
    before = blas_threads()
    X, groups = grouped_data(m=60, n=10, density=0.5, seed=27)
    data = distfact.from_arrays(sp.csr_matrix(X), groups, block_rows=10)  # CSR blocks: in parallel threads
    with pytest.raises(KeyError):
        with InProcessExecutor(data, n_threads=2) as executor:
            assert set(blas_threads()) == {1}
            raise KeyError("in the body")
    assert blas_threads() == before
    with InProcessExecutor(data, n_threads=2) as other:
        executor.close()  # closed already: must not release the other executor's hold
        assert set(blas_threads()) == {1}
    other.close()
    assert blas_threads() == before


@pytest.mark.cluster
def test_an_executor_that_owns_its_client_closes_it_once(local_cluster_client, tmp_path):
    """An executor made from a scheduler's address connects its own client and closes it with itself; closing again
    (a ``close()`` inside ``with``) does nothing, where cancelling on the closed client would raise."""
    from distfact.engine import make_executor

    X, groups = grouped_data(m=60, n=10, seed=29)
    store = distfact.from_arrays(X, groups, tmp_path / "x.zarr", block_rows=20)
    with make_executor(store, local_cluster_client.scheduler.address) as executor:
        assert executor.owns_client and executor.client is not local_cluster_client
        executor.close()
        assert executor.client.status == "closed"
    assert local_cluster_client.status == "running"


def test_pieces_on_cores_hold_blas_at_one_thread_and_run_this_threads_pieces_on_blas_threads():
    """Within ``pieces_on_cores``: BLAS at one thread; ``map_on_blas_threads``' pieces called from this thread on as
    many threads as BLAS had, in order; from another thread, in turn (BLAS is at one thread). The holds are counted
    with the executors' (``hold_one_thread``): BLAS's limits come back when the last ends, in any order. Under the
    user's limit of one thread it does nothing: the pieces run in turn."""
    import threading
    import time

    from threadpoolctl import threadpool_limits

    from distfact.kernels.blas_threads import hold_one_thread, map_on_blas_threads, pieces_on_cores, release_one_thread

    skip_unless_blas_threads()

    def piece(i):
        time.sleep(0.05)  # long enough for every thread of the pool to take one
        return i, threading.get_ident()

    def threads_of(results):
        assert [i for i, _ in results] == list(range(6))
        return len({thread for _, thread in results})

    before = blas_threads()
    held = pieces_on_cores()
    held.__enter__()
    assert set(blas_threads()) == {1}
    assert threads_of(map_on_blas_threads(piece, list(range(6)))) == min(max(before), 6)
    elsewhere = []
    other = threading.Thread(target=lambda: elsewhere.append(map_on_blas_threads(piece, list(range(6)))))
    other.start()
    other.join()
    assert threads_of(elsewhere[0]) == 1
    hold_one_thread()  # an executor of parallel blocks opens, and outlasts the fit's loop
    held.__exit__(None, None, None)
    assert set(blas_threads()) == {1}
    release_one_thread()
    assert blas_threads() == before
    with threadpool_limits(1, user_api="blas"), pieces_on_cores():
        assert threads_of(map_on_blas_threads(piece, list(range(6)))) == 1
    assert blas_threads() == before


@pytest.mark.parametrize("estimator,seed,not_held", [
    ("NMF", 31, {"kl": ({"beta_loss": "kullback-leibler"}, False), "masked": ({}, True)}),
    ("StratifiedNMF", 41, {"masked": ({}, True)}),
])
def test_a_fit_in_pieces_holds_blas_at_one_thread_for_its_loop_with_the_same_factors(estimator, seed, not_held):
    """A dense float64 fit whose local steps run in pieces (Frobenius NMF, Stratified-NMF's line 7; blocks in memory
    run in turn) holds BLAS at one thread while it iterates (``passes_on_cores``), and its factors are those of the
    fit under the user's limit of one BLAS thread (no hold, pieces in turn), bitwise; a KL fit and a masked fit
    (whole-block BLAS products) do not hold it."""
    from threadpoolctl import threadpool_limits

    skip_unless_blas_threads()

    rng = np.random.default_rng(seed)
    X = rng.random((3000, 2000))
    groups = np.repeat(["a", "b"], 1500)
    before, seen = blas_threads(), {}

    def fit(name, masked=False, **params):
        model = getattr(distfact, estimator)(2, random_state=0, max_iter=3, tol=0, block_rows=1500,
                                             callback=lambda info: seen.setdefault(name, set()).update(blas_threads()),
                                             **params)
        given = {"mask": rng.random(X.shape) > 0.1} if masked else {}
        return model.fit_transform(X, groups=groups, **given), model.components_

    W, H = fit("held")
    assert seen["held"] == {1} and blas_threads() == before
    with threadpool_limits(1, user_api="blas"):
        W1, H1 = fit("one thread")
    assert np.array_equal(W, W1) and np.array_equal(H, H1)
    for name, (params, masked) in not_held.items():
        fit(name, masked, **params)
        assert seen[name] == set(before)


def test_random_start_does_not_depend_on_the_chunking():
    X, groups = grouped_data(m=9000, n=6, seed=27)  # more rows than one random tile
    fits = [distfact.NMF(2, random_state=3, max_iter=5, tol=0, block_rows=rows).fit_transform(X, groups=groups)
            for rows in (100000, 1000, 77)]
    for other in fits[1:]:
        assert np.linalg.norm(other - fits[0]) / np.linalg.norm(fits[0]) < 1e-10


def test_relative_store_path_is_made_absolute(tmp_path, monkeypatch):
    X, groups = grouped_data(m=20, n=4, seed=28)
    monkeypatch.chdir(tmp_path)
    distfact.from_arrays(X, groups, "x.zarr")
    store = distfact.open("x.zarr/")
    assert store.path == str(tmp_path / "x.zarr")


def test_the_deadline_is_an_instant_that_a_start_and_the_loop_share():
    """``driver.fit``'s deadline is a ``time.perf_counter()`` instant, not a duration counted from the call: a start
    that runs past it (as a start phase's own loop does, inside ``start``, up to the same deadline) leaves the loop
    no iteration, however long the call took to get to its loop. Before it, the loop iterates; without one, it runs
    ``max_iter``. (The window counted from the call once let WeightedL1NMF's fit run an iteration after its HALS
    start had timed out.)"""
    from distfact.engine import InProcessExecutor, fit as run_loop, initialise
    from distfact.methods.nmf import NMFMethod

    X, groups = grouped_data(m=60, n=10, seed=28)
    data = distfact.from_arrays(X, groups, block_rows=20)
    method = NMFMethod(2)

    def fit(deadline, start_seconds=0.0):
        executor = InProcessExecutor(data, n_threads=1)

        def start():
            global_state = initialise(method, data, executor, 0)
            time.sleep(start_seconds)
            return global_state

        try:
            return run_loop(method, data, executor, max_iter=50, start=start, deadline=deadline)
        finally:
            executor.close()

    state = fit(time.perf_counter() + 0.05, start_seconds=0.1)  # the start ends past the deadline
    assert state.timed_out and state.iteration == 0
    state = fit(time.perf_counter() - 1.0)  # a deadline already passed when the loop is called
    assert state.timed_out and state.iteration == 0
    state = fit(None)
    assert not state.timed_out and state.iteration == 50
    state = fit(time.perf_counter() + 60.0)
    assert not state.timed_out and state.iteration == 50
