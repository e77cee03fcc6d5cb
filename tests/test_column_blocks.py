"""The optional CSC copy of X by column blocks: exact against scipy, balanced, committed metadata last."""

import json
import os
import pickle
import shutil
from dataclasses import replace

import numpy as np
import pytest
import scipy.sparse as sp
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st

import distfact
from conftest import grouped_data
from distfact.store import writing
from distfact.store.format import Metadata
from distfact.store.writing import column_ranges


def stored_csc(store, X):
    """The oracle: scipy's CSC of the input X with its rows in stored order (``row_index()``)."""
    ref = sp.csr_matrix(X)[store.row_index()].tocsc().astype(store.dtype)
    ref.eliminate_zeros()
    assert ref.has_canonical_format
    return ref


def concatenated(store):
    """The column blocks, read in order and joined into one CSC ``(data, indices, indptr)``."""
    read = store.column_reader()
    parts = [read(c) for c in store.column_blocks]
    for c, part in zip(store.column_blocks, parts):
        assert isinstance(part, sp.csc_matrix)
        assert part.shape == (store.shape[0], c.n_cols) and part.nnz == c.nnz
        assert part.dtype == store.dtype and (part.data != 0).all()
    offsets = np.cumsum([0] + [p.nnz for p in parts])
    indptr = np.concatenate([[0]] + [p.indptr[1:] + off for p, off in zip(parts, offsets)])
    return np.concatenate([p.data for p in parts]), np.concatenate([p.indices for p in parts]), indptr


def check_column_blocks(store, X):
    """Column blocks tile the columns and, joined, equal the oracle exactly."""
    ref = stored_csc(store, X)
    bounds = [(c.col_start, c.col_stop) for c in store.column_blocks]
    assert bounds[0][0] == 0 and bounds[-1][1] == store.shape[1]
    assert all(a < b for a, b in bounds) and all(b == a2 for (_, b), (a2, _) in zip(bounds, bounds[1:]))
    assert [c.index for c in store.column_blocks] == list(range(len(bounds)))
    data, indices, indptr = concatenated(store)
    np.testing.assert_array_equal(indptr, ref.indptr)
    np.testing.assert_array_equal(indices, ref.indices)
    np.testing.assert_array_equal(data, ref.data)
    assert store.info()["n_column_blocks"] == len(bounds)


def check_disk_dtypes(store):
    root = zarr.open_group(store.path, mode="r")
    for c in store.column_blocks:
        node = root[f"columns/{c.key}"]
        assert node["data"].dtype == store.dtype
        assert node["indices"].dtype == np.int32 and node["indptr"].dtype == np.int64
        assert node["indptr"].shape == (c.n_cols + 1,)


def staging_left(tmp_path):
    return [p for p in os.listdir(tmp_path) if ".columns-partial" in p]


def sample(dtype=np.float64):
    """Several groups, some all-zero rows and columns, so some pieces and ranges are empty."""
    X, groups = grouped_data(m=60, n=40, density=0.3, dtype=dtype)
    X[:, 5:9] = 0
    X[10:14] = 0
    return X, groups


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("layout", ["csr", "dense"])
@pytest.mark.parametrize("on_disk", [False, True])
def test_column_blocks_equal_the_csc_of_the_stored_order(on_disk, layout, dtype, tmp_path):
    X, groups = sample(dtype)
    path = tmp_path / "x.zarr" if on_disk else None
    given_X = sp.csr_matrix(X) if layout == "csr" else X
    store = distfact.from_arrays(given_X, groups, path, block_rows=6)
    assert not store.has_column_blocks and store.info()["n_column_blocks"] == 0
    with pytest.raises(ValueError, match="has no column blocks"):
        store.column_reader()
    # 6 column blocks of either dtype (float64 at 900 bytes: 9, each of the 11 row blocks staged as a piece of each
    # on disk, a third more to write)
    with_columns = store.with_column_blocks(block_bytes=900 if dtype == np.float32 else 1500)
    assert with_columns.layout == layout and with_columns.in_memory == (not on_disk)
    assert with_columns.n_blocks >= 10 and len(with_columns.column_blocks) >= 6
    check_column_blocks(with_columns, X)
    np.testing.assert_array_equal(with_columns.row_index(), store.row_index())
    if on_disk:
        check_disk_dtypes(with_columns)
        assert staging_left(tmp_path) == []
        reader = pickle.loads(pickle.dumps(with_columns.column_reader()))  # what a worker gets
        first = with_columns.column_blocks[0]
        np.testing.assert_array_equal(reader(first).toarray(), stored_csc(store, X)[:, :first.col_stop].toarray())


def test_explicit_zeros_and_duplicates_in_the_input_are_not_copied(tmp_path):
    X, groups = sample()
    coo = sp.coo_matrix(X)
    doubled = sp.coo_matrix((np.concatenate([coo.data / 2, coo.data / 2, [0.0]]),
                             (np.concatenate([coo.row, coo.row, [0]]), np.concatenate([coo.col, coo.col, [6]]))),
                            shape=X.shape)  # every entry twice, plus an explicit zero
    store = distfact.from_arrays(doubled.tocsr(), groups, tmp_path / "x.zarr", block_rows=10, column_blocks=True,
                                 block_bytes=1200)
    check_column_blocks(store, X)


def zipf_columns(m=400, n=300, seed=1):
    """Column j has about m / (j + 1)^0.8 non-zeros: a few heavy columns, a long light tail."""
    rng = np.random.default_rng(seed)
    density = np.minimum(1.0, 0.9 / np.arange(1, n + 1) ** 0.8)
    X = rng.random((m, n)) * (rng.random((m, n)) < density)
    return X, rng.choice(["a", "b", "c"], size=m)


@pytest.mark.parametrize("on_disk", [False, True])
def test_n_blocks_balances_the_non_zeros(on_disk, tmp_path):
    X, groups = zipf_columns()
    store = distfact.from_arrays(sp.csr_matrix(X), groups, tmp_path / "z.zarr" if on_disk else None, block_rows=50)
    k = 6
    with_columns = store.with_column_blocks(n_blocks=k)
    check_column_blocks(with_columns, X)
    nnz = np.array([c.nnz for c in with_columns.column_blocks])
    assert len(nnz) == k and nnz.sum() == store.nnz
    heaviest_column = int(np.count_nonzero(X, axis=0).max())
    assert nnz.max() - nnz.min() <= heaviest_column  # a cut is off by at most one column
    assert nnz.max() < 1.25 * nnz.mean()
    equal_widths = [np.count_nonzero(part) for part in np.array_split(X, k, axis=1)]
    assert max(equal_widths) > 2 * nnz.max()  # what equal column counts would give on these data


def test_n_blocks_is_at_most_n_and_must_be_positive():
    X, groups = grouped_data(m=30, n=4, density=0.5)
    store = distfact.from_arrays(X, groups)
    assert [(c.col_start, c.col_stop) for c in store.with_column_blocks(n_blocks=10).column_blocks] == [
        (0, 1), (1, 2), (2, 3), (3, 4)]
    assert len(store.with_column_blocks().column_blocks) == 1  # 128 MiB holds it all
    with pytest.raises(ValueError, match="n_blocks must be a positive integer, got 0"):
        store.with_column_blocks(n_blocks=0)
    with pytest.raises(ValueError, match="block_bytes must be positive"):
        store.with_column_blocks(block_bytes=0)


@settings(max_examples=50, deadline=None)
@given(nnz=st.lists(st.integers(0, 1000), min_size=1, max_size=40), n_blocks=st.integers(1, 50))
def test_column_ranges_tile_the_columns(nnz, n_blocks):
    ranges = column_ranges(np.array(nnz), 8, 100, n_blocks=n_blocks)
    assert len(ranges) == min(n_blocks, len(nnz))
    assert ranges[0][0] == 0 and ranges[-1][1] == len(nnz)
    assert all(a < b for a, b in ranges) and all(b == a2 for (_, b), (a2, _) in zip(ranges, ranges[1:]))


@pytest.fixture(scope="module")
def four_column_blocks(tmp_path_factory):
    """``sample()`` stored dense in blocks of 10 rows, given 4 column blocks (built once for the module: 0.7 s;
    the tests that damage it damage copies): X, groups, the store's path and the store."""
    X, groups = sample()
    path = tmp_path_factory.mktemp("columns") / "x.zarr"
    return X, groups, path, distfact.from_arrays(X, groups, path, block_rows=10).with_column_blocks(n_blocks=4)


def test_reopening_keeps_them_and_a_second_call_does_nothing(four_column_blocks):
    X, groups, path, store = four_column_blocks
    stamp = os.stat(path / "zarr.json").st_mtime_ns
    again = distfact.open(path)
    assert again.column_blocks == store.column_blocks and again.has_column_blocks
    check_column_blocks(again, X)
    assert again.with_column_blocks(n_blocks=7) is again
    assert os.stat(path / "zarr.json").st_mtime_ns == stamp
    memory = distfact.from_arrays(X, groups, block_rows=10).with_column_blocks(n_blocks=4)
    assert memory.with_column_blocks() is memory
    # the same ranges in memory and on disk (only a store records its arrays' checksums)
    assert [replace(c, arrays=()) for c in store.column_blocks] == memory.column_blocks


def store_on_disk(tmp_path):
    """``sample()`` stored dense in several row blocks, and its metadata file as written."""
    X, groups = sample()
    path = tmp_path / "x.zarr"
    store = distfact.from_arrays(X, groups, path, block_rows=10)
    return X, groups, path, store, (path / "zarr.json").read_bytes()


def intercept_stacking(monkeypatch, before_call):
    """Run ``before_call(k)`` ahead of the k-th (from 1) stacking of a column block's pieces."""
    real, calls = writing.stack_column_pieces, []

    def stack(*args):
        calls.append(args)
        before_call(len(calls))
        return real(*args)

    monkeypatch.setattr(writing, "stack_column_pieces", stack)


def check_unchanged(path, before, X):
    """The store opens as it was: same metadata, no column blocks, nothing staged beside it."""
    assert (path / "zarr.json").read_bytes() == before
    reopened = distfact.open(path)
    assert not reopened.has_column_blocks
    assert zarr.open_group(path, mode="r").attrs["distfact"]["column_blocks"] == []
    assert staging_left(path.parent) == []
    np.testing.assert_array_equal(np.concatenate([reopened.load_block(b.index) for b in reopened.blocks]),
                                  X[reopened.row_index()])


@pytest.mark.parametrize("lost", ["array", "chunk"])
def test_an_unreadable_row_block_leaves_the_store_as_it_was(lost, tmp_path):
    X, groups = sample()
    path = tmp_path / "x.zarr"
    distfact.from_arrays(sp.csr_matrix(X), groups, path, block_rows=10)
    damaged = distfact.open(path)
    key = damaged.blocks[3].key
    before = (path / "zarr.json").read_bytes()
    if lost == "array":
        shutil.rmtree(path / "blocks" / key / "data")
        error = rf"is corrupt: block 3 \(key '{key}'\), array 'data' is missing"
    else:  # zarr reads a missing chunk back as its fill value: the checksum tells
        next(p for p in (path / "blocks" / key / "data").rglob("*") if p.is_file() and p.name != "zarr.json").unlink()
        error = rf"is corrupt: block 3 \(key '{key}'\), array 'data': its chunk file '.*' is missing"
    with pytest.raises(ValueError, match=error):
        damaged.with_column_blocks(block_bytes=500)
    assert (path / "zarr.json").read_bytes() == before
    assert not distfact.open(path).has_column_blocks
    assert not (path / "columns").exists() and staging_left(tmp_path) == []


def test_a_failure_while_writing_leaves_the_store_as_it_was(tmp_path, monkeypatch):
    X, groups, path, store, before = store_on_disk(tmp_path)

    def disk_full(k):
        if k == 3:  # pieces staged, two column blocks written
            raise OSError("disk full")

    intercept_stacking(monkeypatch, disk_full)
    with pytest.raises(OSError, match="disk full"):
        store.with_column_blocks(n_blocks=5)
    check_unchanged(path, before, X)
    assert not (path / "columns").exists()


def test_a_failed_metadata_write_is_no_commit_and_the_next_attempt_succeeds(tmp_path, monkeypatch):
    X, groups, path, store, before = store_on_disk(tmp_path)

    def refuse(self):
        raise OSError("metadata not written")

    with monkeypatch.context() as patched:
        patched.setattr(Metadata, "to_json", refuse)
        with pytest.raises(OSError, match="metadata not written"):
            store.with_column_blocks(n_blocks=3)
    assert (path / "columns").exists()  # moved in, but not listed: not column blocks
    check_unchanged(path, before, X)
    done = distfact.open(path).with_column_blocks(n_blocks=5)  # replaces the stray directory
    assert len(done.column_blocks) == 5
    check_column_blocks(done, X)
    assert sorted(os.listdir(path / "columns")) == ["000000", "000001", "000002", "000003", "000004", "zarr.json"]


def test_a_store_replaced_during_the_build_is_not_given_column_blocks(tmp_path, monkeypatch):
    X, groups, path, stale, _ = store_on_disk(tmp_path)
    replaced = []

    def replace_the_store(k):
        if k == 1:  # another ingest overwrites the store meanwhile
            distfact.from_arrays(2 * X, groups, path, block_rows=10, overwrite=True)
            replaced.append((path / "zarr.json").read_bytes())

    intercept_stacking(monkeypatch, replace_the_store)
    with pytest.raises(ValueError, match="was replaced while its column blocks were being built"):
        stale.with_column_blocks(n_blocks=3)
    check_unchanged(path, replaced[0], 2 * X)


def test_missing_or_inconsistent_column_blocks_are_refused_on_open(four_column_blocks, tmp_path):
    path = four_column_blocks[2]  # (copied before each change)

    missing = tmp_path / "missing.zarr"
    shutil.copytree(path, missing)
    shutil.rmtree(missing / "columns" / "000002")
    with pytest.raises(ValueError, match=r"corrupt: column block 2 \(key '000002'\) is missing"):
        distfact.open(missing)

    def tampered(name, change):
        copy = tmp_path / name
        shutil.copytree(path, copy)
        doc = json.loads((copy / "zarr.json").read_text())
        change(doc["attributes"]["distfact"])
        (copy / "zarr.json").write_text(json.dumps(doc))
        return copy

    shifted = tampered("shifted.zarr", lambda meta: meta["column_blocks"][1].update(col_start=0))
    with pytest.raises(ValueError, match=r"corrupt metadata: column block 1 \(columns 0:"):
        distfact.open(shifted)
    short = tampered("short.zarr", lambda meta: meta["column_blocks"].pop())
    with pytest.raises(ValueError, match=r"corrupt metadata: column block 2 \(columns \d+:\d+\)"):
        distfact.open(short)
    counted = tampered("counted.zarr", lambda meta: meta["column_blocks"][0].update(nnz=0))
    with pytest.raises(ValueError, match=r"column blocks hold \d+ non-zeros, groups hold \d+"):
        distfact.open(counted)
    unlisted = tampered("unlisted.zarr", lambda meta: meta.pop("column_blocks"))
    with pytest.raises(ValueError, match=r"corrupt metadata: field 'column_blocks' is missing"):
        distfact.open(unlisted)


def test_a_corrupt_column_chunk_is_named(four_column_blocks, tmp_path):
    path = tmp_path / "x.zarr"
    shutil.copytree(four_column_blocks[2], path)
    store = distfact.open(path)
    chunk = next(p for p in (path / "columns" / "000001" / "data").rglob("*") if p.is_file() and p.name != "zarr.json")
    chunk.write_bytes(os.urandom(64))
    with pytest.raises(ValueError, match=r"is corrupt: column block 1 \(key '000001'\), "
                                         r"array 'data': checksum mismatch"):
        store.column_reader()(store.column_blocks[1])


@pytest.mark.parametrize("on_disk", [False, True])
def test_from_arrays_with_column_blocks(on_disk, tmp_path):
    X, groups = sample(np.float32)
    path = tmp_path / "x.zarr" if on_disk else None
    store = distfact.from_arrays(sp.csr_matrix(X), groups, path, block_rows=6, block_bytes=800, column_blocks=True)
    assert store.has_column_blocks and store.in_memory == (not on_disk)
    assert len(store.column_blocks) > 1
    check_column_blocks(store, X)
    if on_disk:
        check_disk_dtypes(store)
        check_column_blocks(distfact.open(path), X)
        assert staging_left(tmp_path) == []
