"""The grouped-matrix store: round trips, metadata, and refusal of bad input with nothing written."""

import json
import os
import shutil

import dask.array as da
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import distfact
from conftest import grouped_data


def nothing_written(path):
    parent, name = os.path.split(str(path))
    leftovers = [n for n in os.listdir(parent) if n.startswith(f".{name}.partial")] if os.path.isdir(parent) else []
    return not os.path.exists(path) and not leftovers


def dense_of(block):
    return block.toarray() if sp.issparse(block) else block


def check_round_trip(store, X, groups):
    """Every block lies in one group; rows, per-group constants and column sums match X."""
    X = X.toarray() if sp.issparse(X) else np.asarray(X)
    order = store.row_index()
    assert sorted(order) == list(range(X.shape[0]))
    names = store.group_names
    assert names == sorted(set(map(str, groups)))
    for b in store.blocks:
        rows = order[b.row_start:b.row_stop]
        assert {str(groups[i]) for i in rows} == {names[b.group]}
        np.testing.assert_array_equal(dense_of(store.load_block(b.index)), X[rows])
    for g, name in enumerate(names):
        Xg = X[np.asarray(groups).astype(str) == name]
        meta = store.meta.groups[g]
        assert meta.row_stop - meta.row_start == Xg.shape[0]
        assert meta.sq_norm == pytest.approx(float((Xg ** 2).sum()), rel=1e-12)
        assert meta.total == pytest.approx(float(Xg.sum()), rel=1e-12)
        assert meta.nnz == np.count_nonzero(Xg)
    np.testing.assert_allclose(store.column_sums, X.sum(axis=0), rtol=1e-12)


@pytest.mark.parametrize("kind", ["numpy", "csr", "dask"])
@pytest.mark.parametrize("on_disk", [False, True])
def test_from_arrays_round_trip(kind, on_disk, tmp_path):
    X, groups = grouped_data(m=75, n=9, density=0.4)
    given_X = {"numpy": X, "csr": sp.csr_matrix(X), "dask": da.from_array(X, chunks=(20, 9))}[kind]
    path = tmp_path / "x.zarr" if on_disk else None
    store = distfact.from_arrays(given_X, groups, path, block_rows=8)
    assert store.layout == ("csr" if kind == "csr" else "dense")
    assert store.in_memory == (not on_disk)
    check_round_trip(store, X, groups)
    if on_disk:
        again = distfact.open(path)
        check_round_trip(again, X, groups)
        assert again.info()["groups"][0]["rows"] == int((groups == "g0").sum())


def test_to_dask_gives_numpy_or_sparse_chunks(tmp_path):
    X, groups = grouped_data(m=40, n=6, density=0.5)
    dense = distfact.from_arrays(X, groups, tmp_path / "d.zarr", block_rows=7)
    sparse = distfact.from_arrays(sp.csr_matrix(X), groups, tmp_path / "s.zarr", block_rows=7)
    order = dense.row_index()
    np.testing.assert_array_equal(dense.to_dask().compute(), X[order])
    chunk = sparse.to_dask().blocks[0].compute()
    assert type(chunk).__module__.startswith("sparse")
    np.testing.assert_array_equal(sparse.to_dask().compute().todense(), X[order])
    assert dense.to_dask().chunks[0] == tuple(b.n_rows for b in dense.blocks)


@pytest.mark.cluster
def test_to_dask_computes_on_a_local_cluster(local_cluster_client, tmp_path):
    """The chunks' tasks go to worker processes: what they carry of the store's modules unpickles there (a
    ``LazyModule`` among a shipped function's globals once failed the scheduler's deserialisation)."""
    X, groups = grouped_data(m=40, n=6, density=0.5)
    order = distfact.from_arrays(X, groups, tmp_path / "d.zarr", block_rows=7).row_index()
    sparse = distfact.from_arrays(sp.csr_matrix(X), groups, tmp_path / "s.zarr", block_rows=7)
    computed = local_cluster_client.compute(sparse.to_dask()).result()
    np.testing.assert_array_equal(computed.todense(), X[order])


def test_feature_names_and_dataframe_columns(tmp_path):
    X, groups = grouped_data(m=20, n=3)
    frame = pd.DataFrame(X, columns=["a", "b", "c"])
    store = distfact.from_arrays(frame, groups, tmp_path / "f.zarr")
    assert list(distfact.open(tmp_path / "f.zarr").feature_names) == ["a", "b", "c"]
    assert store.dtype == np.float64


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 40), n=st.integers(1, 6), n_groups=st.integers(1, 5), block_rows=st.integers(1, 12),
       seed=st.integers(0, 2**16))
def test_blocks_tile_rows_group_by_group(m, n, n_groups, block_rows, seed):
    rng = np.random.default_rng(seed)
    X = rng.random((m, n))
    groups = rng.integers(0, n_groups, size=m)
    store = distfact.from_arrays(X, groups, block_rows=block_rows)
    assert all(b.n_rows <= block_rows for b in store.blocks)
    check_round_trip(store, X, groups)


# ------------------------------------------------------------------ bad input
BAD_VALUES = [(-0.5, "negative value"), (np.nan, "NaN"), (np.inf, "infinite value")]


@pytest.mark.parametrize("value,what", BAD_VALUES)
@pytest.mark.parametrize("sparse", [False, True])
def test_bad_values_name_group_row_and_column_and_write_nothing(value, what, sparse, tmp_path):
    X, groups = grouped_data(m=50, n=5)
    X[37, 2] = value
    path = tmp_path / "bad.zarr"
    with pytest.raises(ValueError, match=rf"{what} .* at row 37, column 2 \(group '{groups[37]}'\)"):
        distfact.from_arrays(sp.csr_matrix(X) if sparse else X, groups, path, block_rows=6)
    assert nothing_written(path)


@pytest.mark.parametrize("indices,indptr,what", [
    ([0, 5, 1], [0, 2, 3], "row 0 stores index 5, outside its 3 columns"),
    ([0, 2, -1], [0, 2, 3], "row 1 stores index -1, outside its 3 columns"),
    ([0, 1, 1], [0, 3, 2], "its indptr must rise from 0")])
def test_a_malformed_csr_matrix_is_refused_before_anything_is_written(indices, indptr, what, tmp_path):
    """scipy builds a CSR matrix from (data, indices, indptr) without checking them (its own ``toarray`` then puts
    an entry of column 5 into the next row): an ingest, a fit (also with mask="nonzero", and of its CSC transpose), a
    transform and a sparse mask refuse it, naming the problem, before any conversion reads it."""
    arrays = (np.array([1.0, 2.0, 3.0]), np.array(indices, np.int32), np.array(indptr, np.int32))
    X = sp.csr_matrix(arrays, shape=(2, 3))
    path = tmp_path / "bad.zarr"
    with pytest.raises(ValueError, match=f"X is a malformed CSR matrix: {what}"):
        distfact.from_arrays(X, ["a", "b"], path)
    assert nothing_written(path)
    for fit in (lambda: distfact.NMF(1, max_iter=2).fit(X), lambda: distfact.NMF(1, max_iter=2).fit(X, mask="nonzero"),
                lambda: distfact.NMF(1, max_iter=2).fit(np.ones((2, 3))).transform(X)):
        with pytest.raises(ValueError, match=f"X is a malformed CSR matrix: {what}"):
            fit()
    with pytest.raises(ValueError, match="mask is a malformed CSR matrix"):
        distfact.NMF(1, max_iter=2).fit(np.ones((2, 3)), mask=X)
    with pytest.raises(ValueError, match="X is a malformed CSC matrix: (column 0 stores index 5, outside its 3 rows|"
                                         "column 1 stores index -1|its indptr)"):
        distfact.NMF(1, max_iter=2).fit(sp.csc_matrix(arrays, shape=(3, 2)))


def test_csr_blocks_of_contiguous_rows_are_canonical_copies_and_x_is_untouched():
    """Groups of contiguous rows are taken as ranges of X's stored entries (not scipy's row slices): each block
    holds its rows' entries, duplicates summed and explicit zeros dropped, columns sorted, and the caller's X, read-only
    with unsorted columns and a duplicate, is left as it was."""
    rng = np.random.default_rng(5)
    dense = rng.random((40, 12)) * (rng.random((40, 12)) < 0.4)
    coo = sp.coo_matrix(dense)
    order = rng.permutation(coo.nnz)  # unsorted columns within rows once converted without summing
    rows, cols, vals = coo.row[order], coo.col[order], coo.data[order]
    rows, cols, vals = np.r_[rows, 3, 7], np.r_[cols, cols[rows == 3][:1], 0], np.r_[vals, 0.5, 0.0]
    indptr = np.r_[0, np.cumsum(np.bincount(rows, minlength=40))]
    by_row = np.argsort(rows, kind="stable")
    X = sp.csr_matrix((vals[by_row], cols[by_row], indptr), shape=(40, 12))
    expected = X.toarray()
    before = [a.copy() for a in (X.data, X.indices, X.indptr)]
    for a in (X.data, X.indices, X.indptr):
        a.flags.writeable = False
    groups = np.repeat(["a", "b"], 20)
    store = distfact.from_arrays(X, groups, block_rows=7)
    check_round_trip(store, expected, groups)
    for b in store.blocks:
        block = store.load_block(b.index)
        assert block.has_canonical_format and np.all(block.data != 0)
    assert all(np.array_equal(a, b) for a, b in zip((X.data, X.indices, X.indptr), before))


def test_bad_value_in_a_later_block_leaves_no_partial_store(tmp_path):
    X, groups = grouped_data(m=200, n=4)
    last_group_row = int(np.flatnonzero(groups == "g2")[-1])
    X[last_group_row, 0] = -1.0  # found only after earlier blocks were written
    path = tmp_path / "bad.zarr"
    with pytest.raises(ValueError, match=f"row {last_group_row}"):
        distfact.from_arrays(X, groups, path, block_rows=5)
    assert nothing_written(path)


def test_failed_overwrite_keeps_the_old_store(tmp_path):
    X, groups = grouped_data(m=30, n=4)
    path = tmp_path / "x.zarr"
    distfact.from_arrays(X, groups, path)
    bad = X.copy()
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        distfact.from_arrays(bad, groups, path, overwrite=True)
    check_round_trip(distfact.open(path), X, groups)
    with pytest.raises(ValueError, match="already exists"):
        distfact.from_arrays(X, groups, path)


def test_label_vector_of_the_wrong_length(tmp_path):
    X, groups = grouped_data(m=30, n=4)
    path = tmp_path / "x.zarr"
    with pytest.raises(ValueError, match="groups has 29 labels but X has 30 rows"):
        distfact.from_arrays(X, groups[:-1], path)
    assert nothing_written(path)


def test_empty_group(tmp_path):
    X, groups = grouped_data(m=30, n=4, n_groups=2)
    path = tmp_path / "x.zarr"
    with pytest.raises(ValueError, match="group 'g9' is empty"):
        distfact.from_arrays(X, groups, path, group_names=["g0", "g1", "g9"])
    assert nothing_written(path)
    with pytest.raises(ValueError, match=r"groups\[\d+\] = 'g1' is not one of group_names"):
        distfact.from_arrays(X, groups, path, group_names=["g0"])
    assert nothing_written(path)


def test_non_numeric_input(tmp_path):
    path = tmp_path / "x.zarr"
    with pytest.raises(ValueError, match="not numeric"):
        distfact.from_arrays(np.array([["a", "b"], ["c", "d"]], dtype=object), None, path)
    frame = pd.DataFrame({"x": [1.0, 2.0], "city": ["Oslo", "Lima"]})
    with pytest.raises(ValueError, match="column 'city' is not numeric"):
        distfact.from_arrays(frame, None, path)
    assert nothing_written(path)


def test_rank_larger_than_the_data():
    X, groups = grouped_data(m=12, n=5)
    with pytest.raises(ValueError, match=r"n_components=6 is larger than min\(n_samples, n_features\) = min\(12, 5\) = 5"):
        distfact.NMF(6).fit(X, groups=groups)


def test_missing_store(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        distfact.open(tmp_path / "nowhere.zarr")
    with pytest.raises(ValueError, match="does not exist"):
        distfact.NMF(2).fit(str(tmp_path / "nowhere.zarr"))


def damaged_copies(path, tmp_path):
    """Copies of the store at ``path``, each damaged in one way that opening it must refuse, with what the refusal
    says: (path, message pattern)."""
    def copy(name, edit):
        target = tmp_path / name
        shutil.copytree(path, target)
        edit(target)
        return target

    def edit_root(change):
        def edit(target):
            doc = json.loads((target / "zarr.json").read_text())
            change(doc)
            (target / "zarr.json").write_text(json.dumps(doc))
        return edit

    def tamper(doc):
        doc["attributes"]["distfact"]["blocks"][1]["row_start"] += 1

    return [
        (copy("no-block.zarr", lambda t: shutil.rmtree(t / "blocks" / "000002")),
         r"corrupt: block \d+ \(key '000002'\) is missing"),
        (copy("no-column-block.zarr", lambda t: shutil.rmtree(t / "columns" / "000000")),
         r"corrupt: column block 0 \(key '000000'\) is missing"),
        (copy("garbled.zarr", lambda t: (t / "zarr.json").write_text("{ not json")),
         "not a readable Zarr group"),
        (copy("no-root.zarr", lambda t: (t / "zarr.json").unlink()), "not a readable Zarr group"),
        (copy("array.zarr", edit_root(lambda doc: doc.update(node_type="array"))),
         "not a readable Zarr group"),
        (copy("v2.zarr", edit_root(lambda doc: doc.update(zarr_format=2))), "not a readable Zarr group"),
        (copy("extra-key.zarr", edit_root(lambda doc: doc.update(foo=1))), "not a readable Zarr group"),
        (copy("nested.zarr", lambda t: (t / "zarr.json").write_text("[" * 100_000 + "]" * 100_000)),
         "not a readable Zarr group"),
        (copy("unfinished.zarr", edit_root(lambda doc: doc["attributes"].pop("distfact"))),
         "no distfact metadata"),
        (copy("tampered.zarr", edit_root(tamper)), r"corrupt metadata: block 1"),
    ]


@pytest.mark.parametrize("layout", ["dense", "csr"])
def test_info_reads_the_metadata_alone_and_refuses_what_open_refuses(tmp_path, layout):
    """``distfact info`` (``store/describe.py: store_info``) summarises a store from its root ``zarr.json`` without
    zarr: the same summary as the opened store's ``info()`` (dense, CSR with column blocks, a mask, an appended
    version), and every damage that stops ``open`` before a chunk is read stops it with the same message."""
    from distfact.store.describe import store_info

    X, groups = grouped_data(m=30, n=6, density=0.6 if layout == "csr" else 1.0)
    X = sp.csr_matrix(X) if layout == "csr" else X
    path = tmp_path / "x.zarr"
    store = distfact.from_arrays(X, groups, path, block_rows=5, column_blocks=True)
    assert store_info(path) == distfact.open(path).info() == store.info()
    assert store_info(path)["n_column_blocks"] == len(store.column_blocks) > 0
    for damaged, message in damaged_copies(path, tmp_path):
        for reader in (distfact.open, store_info):
            with pytest.raises(ValueError, match=message):
                reader(damaged)
    store.append(X[:7], groups[:7])
    appended = distfact.open(path).info()
    assert store_info(path) == appended and appended["shape"][0] == 37
    # the root's own arrays now live in the version's node, so opening reads no array through the root group: a root
    # document zarr would refuse (at the store's next write) is refused by the reader of that document itself
    extra = tmp_path / "appended-extra-key.zarr"
    shutil.copytree(path, extra)
    doc = json.loads((extra / "zarr.json").read_text())
    (extra / "zarr.json").write_text(json.dumps({**doc, "foo": 1}))
    for reader in (distfact.open, store_info):
        with pytest.raises(ValueError, match="not a readable Zarr group"):
            reader(extra)
    masked = tmp_path / "masked.zarr"
    dense = X.toarray() if layout == "csr" else X.copy()
    dense[0, 0] = np.nan
    distfact.from_arrays(dense, groups, masked, block_rows=5, missing="nan")
    assert store_info(masked) == distfact.open(masked).info() and store_info(masked)["mask"] == "nan"
    shutil.rmtree(masked / "blocks" / "000001" / "mask")
    for reader in (distfact.open, store_info):
        with pytest.raises(ValueError, match=r"corrupt: block 1 \(key '000001'\), its mask is missing"):
            reader(masked)
    (tmp_path / "data.npz").write_bytes(b"not a store")
    for reader in (distfact.open, store_info):
        with pytest.raises(ValueError, match="is a file, not a distfact store"):
            reader(tmp_path / "data.npz")
        with pytest.raises(ValueError, match="does not exist"):
            reader(tmp_path / "nowhere.zarr")


def test_missing_labels_are_named():
    X, _ = grouped_data(m=4, n=2)
    with pytest.raises(ValueError, match="missing label .* at row 1"):
        distfact.from_arrays(X, pd.Series(["a", np.nan, "b", "a"]).to_numpy())
    with pytest.raises(ValueError, match="missing label .* at row 2"):
        distfact.from_arrays(X, np.array([0.0, 1.0, np.nan, 1.0]))


def test_overwrite_replaces_only_a_store(tmp_path):
    X, groups = grouped_data(m=10, n=2)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match="is not a distfact store; not replacing it"):
        distfact.from_arrays(X, groups, tmp_path / "notes", overwrite=True)
    assert (tmp_path / "notes" / "keep.txt").read_text() == "mine"


def test_sparse_input_can_be_stored_dense(tmp_path):
    X, groups = grouped_data(m=20, n=4, density=0.5)
    store = distfact.from_arrays(sp.csr_matrix(X), groups, tmp_path / "x.zarr", layout="dense", block_rows=6)
    assert store.layout == "dense"
    check_round_trip(store, X, groups)


def test_corrupt_chunk_and_a_file_that_is_not_a_store(tmp_path):
    X, groups = grouped_data(m=30, n=4)
    path = tmp_path / "x.zarr"
    distfact.from_arrays(X, groups, path, block_rows=5)
    chunk = next(p for p in (path / "blocks" / "000001" / "X").rglob("*") if p.is_file() and p.name != "zarr.json")
    chunk.write_bytes(os.urandom(64))
    with pytest.raises(ValueError, match=r"is corrupt: block \d+ \(key '000001'\), array 'X': checksum mismatch"):
        distfact.NMF(2, max_iter=2).fit(str(path))
    (tmp_path / "data.npz").write_bytes(b"not a store")
    with pytest.raises(ValueError, match="is a file, not a distfact store"):
        distfact.open(tmp_path / "data.npz")
