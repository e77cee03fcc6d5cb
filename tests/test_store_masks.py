"""Masks stored beside X (issue 20, "On the engine and the store"): ingest with missing="nan" or a weight mask, the
mask's per-block sparse forms and records, fits of a store with a mask against the in-memory fits with the same
mask (bitwise), reads per iteration, checkpoints, and that a store without a mask is written as before.

The oracle of every fit is a second code path: the same estimator fitted on X in memory with fit(X, mask=...),
whose masked arithmetic tests/test_masks.py checks against numpy transcriptions of weighted MU and HALS."""

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

import distfact
from conftest import cli_here, grouped_data
from distfact import NMF
from distfact.estimators.masks import block_masks, resolve_mask

BLOCK_ROWS = 7
FITS = [dict(solver="mu"), dict(solver="hals"), dict(beta_loss="kullback-leibler")]


def with_holes(layout="dense", seed=0, fraction=0.15, dtype=np.float64):
    """X (scattered groups) with NaN at about ``fraction`` of its entries (of its stored entries when sparse)."""
    X, groups = grouped_data(m=60, n=11, density=0.7 if layout == "csr" else None, seed=seed, dtype=dtype)
    holes = np.random.default_rng(seed + 1).random(X.shape) < fraction
    if layout == "csr":
        X = sp.csr_matrix(X)
        X.data[holes[X.nonzero()]] = np.nan
        return X, groups
    X[holes] = np.nan
    return X, groups


def weights(shape, seed=0):
    """Weights: mostly 1, some 0 (missing), some fractional; rows alternating between few and many observed
    entries, so that both sparse forms occur."""
    rng = np.random.default_rng(seed)
    W = np.where(rng.random(shape) < 0.2, 0.0, 1.0)
    W[rng.random(shape) < 0.1] = 0.5
    W[::4] = np.where(rng.random((len(W[::4]), shape[1])) < 0.8, 0.0, 0.7)  # few observed: the "observed" form
    return W


def fitted(data):
    return NMF(3, random_state=0, max_iter=12, tol=0).fit(data)


def fit_pair(stored, X, groups, mask, params, client=None):
    """The fit of the store and the in-memory fit of X with ``mask``, cut into the same blocks."""
    ours = NMF(3, random_state=0, max_iter=12, tol=0, **params).fit(stored, client=client)
    theirs = NMF(3, random_state=0, max_iter=12, tol=0, block_rows=BLOCK_ROWS, **params).fit(X, groups=groups,
                                                                                            mask=mask)
    return ours, theirs


def assert_same_fit(ours, theirs):
    np.testing.assert_array_equal(ours.components_, theirs.components_)
    np.testing.assert_array_equal(ours.objective_history_, theirs.objective_history_)
    np.testing.assert_array_equal(ours.group_errors_, theirs.group_errors_)


# ------------------------------------------------------------------ fits: the store's mask is fit's mask
@pytest.mark.parametrize("params", FITS, ids=["mu", "hals", "kl"])
@pytest.mark.parametrize("layout", ["dense", "csr"])
def test_missing_nan_ingest_then_fit_is_fit_with_mask_nan(tmp_path, params, layout):
    X, groups = with_holes(layout)
    stored = distfact.from_arrays(X, groups, tmp_path / "x.zarr", block_rows=BLOCK_ROWS, missing="nan")
    assert stored.mask_kind == "nan"
    assert_same_fit(*fit_pair(stored, X, groups, "nan", params))


@pytest.mark.parametrize("params", FITS, ids=["mu", "hals", "kl"])
@pytest.mark.parametrize("sparse_mask", [False, True])
def test_a_weight_mask_ingested_fits_as_fit_with_that_mask(tmp_path, params, sparse_mask):
    X, groups = grouped_data(m=60, n=11, seed=3)
    M = weights(X.shape)
    given = sp.csr_matrix(M) if sparse_mask else M
    stored = distfact.from_arrays(X, groups, tmp_path / "x.zarr", block_rows=BLOCK_ROWS, mask=given)
    forms = {b.mask.form for b in stored.blocks}
    assert stored.mask_kind == "weights" and forms == {"complement", "observed"}, forms
    assert_same_fit(*fit_pair(stored, X, groups, given, params))


@pytest.mark.parametrize("init", ["nndsvda", "custom"])
def test_every_start_reads_the_stored_mask(tmp_path, init):
    """NNDSVDa (its SVD of X zeroed at the missing entries) and a given W, H (each block's W joined to the mask its
    task reads): the in-memory fit's bits."""
    X, groups = with_holes("csr", seed=2)
    stored = distfact.from_arrays(X, groups, tmp_path / "x.zarr", block_rows=BLOCK_ROWS, missing="nan")
    rng = np.random.default_rng(0)
    given = dict(W=rng.random((X.shape[0], 3)), H=rng.random((3, X.shape[1]))) if init == "custom" else {}
    params = dict(init=init, random_state=0, max_iter=8, tol=0)
    ours = NMF(3, **params).fit(stored, **given)
    theirs = NMF(3, block_rows=BLOCK_ROWS, **params).fit(X, groups=groups, mask="nan", **given)
    assert_same_fit(ours, theirs)


def test_transform_and_fit_many_read_the_stored_mask(tmp_path):
    """transform of the store's rows (W over their observed entries) and a rank sweep in shared passes: each as
    with the mask given in memory."""
    X, groups = with_holes(seed=4)
    stored = distfact.from_arrays(X, groups, tmp_path / "x.zarr", block_rows=BLOCK_ROWS, missing="nan")
    model = NMF(3, random_state=0, max_iter=10, tol=0).fit(stored)
    in_memory = distfact.from_arrays(resolve_mask(X, "nan")[0], groups, block_rows=BLOCK_ROWS)
    np.testing.assert_array_equal(model.transform(stored, max_iter=5),
                                  model.transform(in_memory, mask=resolve_mask(X, "nan")[1], max_iter=5))
    swept = distfact.fit_many(NMF(random_state=0, max_iter=6, tol=0), stored, ranks=[2, 4])
    for rank, fit in zip([2, 4], swept):
        assert_same_fit(fit, NMF(rank, random_state=0, max_iter=6, tol=0, block_rows=BLOCK_ROWS).fit(
            X, groups=groups, mask="nan"))


def test_spilled_local_factors_carry_the_stored_mask(tmp_path):
    """Out of core (W_b spilled to Zarr beside the store): the mask a block's task read is spilled with W_b."""
    X, groups = with_holes(seed=6)
    stored = distfact.from_arrays(X, groups, tmp_path / "x.zarr", block_rows=BLOCK_ROWS, missing="nan")
    ours = NMF(3, random_state=0, max_iter=8, tol=0, local_memory_budget=1, n_threads=2).fit(stored)
    assert_same_fit(ours, NMF(3, random_state=0, max_iter=8, tol=0, block_rows=BLOCK_ROWS).fit(
        X, groups=groups, mask="nan"))
    assert sorted(os.listdir(tmp_path)) == ["x.zarr"]  # the spill directory removed


def test_a_mask_in_memory_grouped_matrix_fits_the_same(tmp_path):
    """from_arrays(..., path=None, missing="nan") keeps the mask in memory beside the blocks: the same fit."""
    X, groups = with_holes()
    on_disk = distfact.from_arrays(X, groups, tmp_path / "x.zarr", block_rows=BLOCK_ROWS, missing="nan")
    in_memory = distfact.from_arrays(X, groups, block_rows=BLOCK_ROWS, missing="nan")
    assert_same_fit(fitted(on_disk), fitted(in_memory))


def test_a_stored_mask_fits_the_same_on_a_local_cluster(tmp_path, local_cluster_client):
    X, groups = with_holes("csr")
    stored = distfact.from_arrays(X, groups, tmp_path / "x.zarr", block_rows=BLOCK_ROWS, missing="nan")
    for params in FITS[:2]:
        ours, theirs = fit_pair(stored, X, groups, "nan", params, client=local_cluster_client)
        assert_same_fit(ours, theirs)
        assert ours.scheduler_["mode"] == "distributed"


def test_a_table_with_holes_ingested_with_missing_nan(tmp_path):
    """The common case: a CSV with empty and NA fields. Groups of whole blocks, so that the table's blocks are
    those of the in-memory fit."""
    rng = np.random.default_rng(5)
    X = rng.random((40, 6))
    X[rng.random(X.shape) < 0.2] = np.nan
    groups = np.repeat(["a", "b"], 20)
    frame = pd.DataFrame(X, columns=[f"c{j}" for j in range(6)]).assign(group=groups)
    text = frame.to_csv(index=False, na_rep="").replace(",,", ",NA,", 3)  # both spellings of a hole
    (tmp_path / "t.csv").write_text(text)
    stored = distfact.from_table(tmp_path / "t.csv", "group", tmp_path / "t.zarr", block_rows=5, missing="nan")
    assert stored.mask_kind == "nan"
    ours = NMF(3, random_state=0, max_iter=12, tol=0).fit(stored)
    theirs = NMF(3, random_state=0, max_iter=12, tol=0, block_rows=5).fit(X, groups=groups, mask="nan")
    assert_same_fit(ours, theirs)
    with pytest.raises(ValueError, match=r"NaN \(a missing value\)"):
        distfact.from_table(tmp_path / "t.csv", "group", tmp_path / "u.zarr")


# ------------------------------------------------------------------ the stored mask itself
def test_the_stored_mask_reads_back_as_the_in_memory_forms(tmp_path):
    X, groups = grouped_data(m=60, n=11, seed=3)
    M = weights(X.shape)
    stored = distfact.from_arrays(X, groups, tmp_path / "x.zarr", block_rows=BLOCK_ROWS, mask=M)
    in_memory = distfact.from_arrays(resolve_mask(X, M)[0], groups, block_rows=BLOCK_ROWS)
    expected, _ = block_masks(in_memory, M)
    reader = distfact.open(tmp_path / "x.zarr").mask_reader()
    for block, forms in zip(stored.blocks, expected):
        got = reader(block)
        assert got.keys() == forms.keys()
        (P,), (Q,) = got.values(), forms.values()
        for part in ("data", "indices", "indptr"):
            np.testing.assert_array_equal(getattr(P, part), getattr(Q, part))
            assert getattr(P, part).dtype == getattr(Q, part).dtype
    # X is stored with 0 at the entries of weight 0, and the groups' statistics are over the observed entries
    stored_X = np.vstack([stored.load_block(b.index) for b in stored.blocks])
    observed = np.where(M == 0, 0.0, X)[stored.row_index()]
    np.testing.assert_array_equal(stored_X, observed)
    for g, group in enumerate(stored.meta.groups):
        rows = observed[group.row_start:group.row_stop]
        assert group.sq_norm == pytest.approx(float((rows ** 2).sum()), rel=1e-12)
        assert group.nnz == np.count_nonzero(rows)


def test_the_metadata_names_the_mask_and_its_arrays(tmp_path):
    X, groups = with_holes()
    stored = distfact.from_arrays(X, groups, tmp_path / "x.zarr", block_rows=BLOCK_ROWS, missing="nan")
    doc = json.loads((tmp_path / "x.zarr" / "zarr.json").read_text())["attributes"]["distfact"]
    assert doc["format_version"] == 4 and doc["mask"] == {"kind": "nan"}
    for block, record in zip(stored.blocks, doc["blocks"]):
        mask = record["mask"]
        assert mask["form"] == "complement" and set(mask["arrays"]) == {"data", "indices", "indptr"}
        assert mask["nnz"] == int(np.isnan(X[stored.row_index()[block.row_start:block.row_stop]]).sum())
        assert (tmp_path / "x.zarr" / "blocks" / block.key / "mask" / "indptr" / "zarr.json").is_file()
    assert distfact.open(tmp_path / "x.zarr").info()["mask"] == "nan"


def tree(path: Path) -> dict:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("layout", ["dense", "csr"])
def test_a_store_without_a_mask_is_written_as_before(tmp_path, layout):
    """No NaN with missing="nan", or weights all 1: the very files of a store ingested without a mask (format
    version 3, no field "mask": existing stores and their checksums keep working)."""
    X, groups = grouped_data(m=40, n=9, density=0.6, seed=2)
    X = sp.csr_matrix(X) if layout == "csr" else X
    plain = distfact.from_arrays(X, groups, tmp_path / "plain.zarr", block_rows=BLOCK_ROWS)
    distfact.from_arrays(X, groups, tmp_path / "nan.zarr", block_rows=BLOCK_ROWS, missing="nan")
    distfact.from_arrays(X, groups, tmp_path / "ones.zarr", block_rows=BLOCK_ROWS, mask=np.ones(X.shape))
    assert tree(tmp_path / "nan.zarr") == tree(tmp_path / "plain.zarr") == tree(tmp_path / "ones.zarr")
    doc = plain.meta.to_json()
    assert doc["format_version"] == 3 and "mask" not in doc and all("mask" not in b for b in doc["blocks"])
    assert plain.mask_kind is None


# ------------------------------------------------------------------ what a fit refuses, reads and records
def test_a_mask_given_to_fit_on_a_store_with_its_own_is_refused(tmp_path):
    X, groups = with_holes()
    path = tmp_path / "x.zarr"
    stored = distfact.from_arrays(X, groups, path, block_rows=BLOCK_ROWS, missing="nan")
    for given in (weights(X.shape), "nan"):
        for data in (stored, str(path)):
            if isinstance(given, str) and isinstance(data, str):
                continue  # a path with a string mask: refused as needing X in memory (tests/test_masks.py)
            with pytest.raises(ValueError, match=r"has its own mask \(kind 'nan': X's NaN entries at ingest\)"):
                NMF(3, max_iter=2).fit(data, mask=given)
    with pytest.raises(ValueError, match=r"has a mask \(kind 'nan', written at ingest\), which WeightedL1NMF does "
                                         r"not read from a store yet"):
        distfact.WeightedL1NMF(3, max_iter=2).fit(stored)


@pytest.mark.parametrize("held", [True, False])
def test_one_read_of_X_per_pass_and_the_mask_once(tmp_path, monkeypatch, held):
    """X is read once per pass (as without a mask), or once when the store is small enough to be held
    (``RESIDENT_STORE_BYTES``); each block's mask once, by the block's first task, where it then stays beside W_b
    (so every later pass reads no mask at all)."""
    from distfact.engine.executor import inprocess

    if not held:
        monkeypatch.setattr(inprocess, "RESIDENT_STORE_BYTES", 0)
    X, groups = with_holes()
    store = distfact.from_arrays(X, groups, tmp_path / "x.zarr", block_rows=BLOCK_ROWS, missing="nan")
    x_reads, mask_reads = [], []
    reader, mask_reader = store.reader(), store.mask_reader()
    store.reader = lambda: (lambda block: x_reads.append(block.index) or reader(block))
    store.mask_reader = lambda: (lambda block: mask_reads.append(block.index) or mask_reader(block))
    model = NMF(3, random_state=0, max_iter=6, tol=0, n_threads=2).fit(store)
    assert model.n_passes_ == 7
    assert sorted(x_reads) == sorted(list(range(store.n_blocks)) * (1 if held else 7))
    assert sorted(mask_reads) == list(range(store.n_blocks))


def test_checkpoints_record_the_stored_mask_and_resume_bitwise(tmp_path):
    X, groups = with_holes()
    store = distfact.from_arrays(X, groups, tmp_path / "x.zarr", block_rows=BLOCK_ROWS, missing="nan")
    whole = NMF(3, random_state=0, max_iter=10, tol=0).fit(store)
    params = dict(random_state=0, tol=0, checkpoint_dir=tmp_path / "run", checkpoint_every=2)
    NMF(3, max_iter=4, **params).fit(store)
    config = json.loads(next((tmp_path / "run").rglob("iter-*/config.json")).read_text())
    assert json.dumps(config).count(f"stored:{store.mask_identity()}") == 1
    resumed = NMF(3, max_iter=10, resume=True, **params).fit(store)
    np.testing.assert_array_equal(resumed.components_, whole.components_)
    # another mask, the same X: its identity differs
    X2 = X.copy()
    X2[0, np.flatnonzero(~np.isnan(X2[0]))[0]] = np.nan
    other = distfact.from_arrays(X2, groups, tmp_path / "y.zarr", block_rows=BLOCK_ROWS, missing="nan")
    assert other.mask_identity() != store.mask_identity()


# ------------------------------------------------------------------ the command line
def test_cli_ingest_missing_nan_and_mask_file(tmp_path, capsys):
    def run_cli(*args):
        return cli_here(capsys, *args)

    X, groups = grouped_data(m=40, n=9, seed=4)
    M = weights(X.shape)
    Xn = np.where(M == 0, np.nan, X)
    np.savez(tmp_path / "x.npz", X=Xn, groups=groups)
    np.savez(tmp_path / "plain.npz", X=X, groups=groups)
    sp.save_npz(tmp_path / "mask.npz", sp.csr_matrix(M))
    np.save(tmp_path / "short.npy", M[:-1])
    out = run_cli("ingest", tmp_path / "x.npz", tmp_path / "nan.zarr", "--missing", "nan", "--block-rows", 7)
    assert out.returncode == 0, out.stderr
    assert distfact.open(tmp_path / "nan.zarr").mask_kind == "nan"
    out = run_cli("ingest", tmp_path / "plain.npz", tmp_path / "w.zarr", "--mask", tmp_path / "mask.npz",
                  "--block-rows", 7)
    assert out.returncode == 0, out.stderr
    stored = distfact.open(tmp_path / "w.zarr")
    assert stored.mask_kind == "weights"
    assert_same_fit(fitted(stored), NMF(3, random_state=0, max_iter=12, tol=0, block_rows=7).fit(
        X, groups=groups, mask=M))
    out = run_cli("ingest", tmp_path / "plain.npz", tmp_path / "bad.zarr", "--mask", tmp_path / "short.npy")
    assert out.returncode == 2 and "mask has shape (39, 9), X has shape (40, 9)" in out.stderr, out.stderr
    out = run_cli("ingest", tmp_path / "plain.npz", tmp_path / "bad.zarr", "--mask", tmp_path / "x.npz")
    assert out.returncode == 2 and "mask file" in out.stderr and "neither an array 'mask'" in out.stderr, out.stderr
    assert not (tmp_path / "bad.zarr").exists()
    out = run_cli("info", tmp_path / "nan.zarr", "--json")
    assert json.loads(out.stdout)["mask"] == "nan"
