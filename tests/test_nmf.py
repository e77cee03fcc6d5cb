"""distfact.NMF against independent numpy transcriptions of the updates."""

import os

import numpy as np
import pytest
import scipy.sparse as sp

import distfact
from conftest import grouped_data
from oracles import frobenius_half, hals, kl_divergence, lee_seung_frobenius, lee_seung_kl

ORACLES = {("mu", "frobenius"): lee_seung_frobenius, ("hals", "frobenius"): hals,
           ("mu", "kullback-leibler"): lee_seung_kl}
CASES = sorted(ORACLES)


def start_point(X, r, seed=1):
    rng = np.random.default_rng(seed)
    return rng.random((X.shape[0], r)) + 0.1, rng.random((r, X.shape[1])) + 0.1


def relative_diff(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.mark.parametrize("solver", ["mu", "hals"])
def test_csr_fits_in_bands_equal_numpy_transcription(solver, monkeypatch):
    """A CSR fit whose blocks are read in bands of columns (``CSR_BAND_BYTES`` made small: 4 bands of 7 columns;
    the fused sweep in the first pass, the blocks' forms from the second) iterates as the transcription."""
    from distfact.kernels import nmf as k

    monkeypatch.setattr(k, "CSR_BAND_BYTES", 2 * 4 * 8 * 7)
    X, groups = grouped_data(m=90, n=25, density=0.4, seed=3)
    W0, H0 = start_point(X, 4)
    model = distfact.NMF(4, solver=solver, init="custom", max_iter=30, tol=0, block_rows=13)
    W = model.fit_transform(sp.csr_matrix(X), groups=groups, W=W0, H=H0)
    W_ref, H_ref = ORACLES[solver, "frobenius"](X, W0, H0, 30)
    assert relative_diff(model.components_, H_ref) < 1e-10
    assert relative_diff(W, W_ref) < 1e-10


@pytest.mark.parametrize("solver,loss", CASES)
@pytest.mark.parametrize("sparse", [False, True])
def test_iterates_equal_numpy_transcription(solver, loss, sparse):
    X, groups = grouped_data(m=90, n=25, density=0.4, seed=3)
    W0, H0 = start_point(X, 4)
    model = distfact.NMF(4, solver=solver, beta_loss=loss, init="custom", max_iter=30, tol=0, block_rows=13)
    W = model.fit_transform(sp.csr_matrix(X) if sparse else X, groups=groups, W=W0, H=H0)
    W_ref, H_ref = ORACLES[solver, loss](X, W0, H0, 30)
    assert model.n_iter_ == 30
    assert relative_diff(model.components_, H_ref) < 1e-10
    assert relative_diff(W, W_ref) < 1e-10


@pytest.mark.parametrize("solver,loss", CASES)
def test_random_init_then_oracle(solver, loss):
    """The random start (per-block seeds) read back with max_iter=0, then iterated by the oracle."""
    X, groups = grouped_data(m=70, n=20, seed=4)
    kwargs = dict(solver=solver, beta_loss=loss, random_state=7, tol=0, block_rows=11)
    start = distfact.NMF(5, max_iter=0, **kwargs)
    W0 = start.fit_transform(X, groups=groups)
    H0 = start.components_
    assert start.n_passes_ == 1
    model = distfact.NMF(5, max_iter=12, **kwargs)
    W = model.fit_transform(X, groups=groups)
    W_ref, H_ref = ORACLES[solver, loss](X, W0, H0, 12)
    assert relative_diff(model.components_, H_ref) < 1e-10
    assert relative_diff(W, W_ref) < 1e-10


@pytest.mark.parametrize("solver,loss", CASES)
def test_one_block_and_many_blocks_agree(solver, loss):
    X, groups = grouped_data(m=100, n=15, seed=5)
    W0, H0 = start_point(X, 3)
    fits = []
    for block_rows in (1000, 7):
        model = distfact.NMF(3, solver=solver, beta_loss=loss, init="custom", max_iter=25, tol=0,
                             block_rows=block_rows)
        fits.append((model.fit_transform(X, groups=groups, W=W0, H=H0), model.components_))
    assert relative_diff(fits[1][0], fits[0][0]) < 1e-10
    assert relative_diff(fits[1][1], fits[0][1]) < 1e-10


@pytest.mark.parametrize("solver,loss", CASES)
def test_sparse_and_dense_give_the_same_result(solver, loss):
    X, groups = grouped_data(m=80, n=20, density=0.3, seed=6)
    kwargs = dict(solver=solver, beta_loss=loss, random_state=0, max_iter=20, tol=0, block_rows=9)
    dense = distfact.NMF(4, **kwargs)
    W_dense = dense.fit_transform(X, groups=groups)
    sparse = distfact.NMF(4, **kwargs)
    W_sparse = sparse.fit_transform(sp.csr_matrix(X), groups=groups)
    assert relative_diff(sparse.components_, dense.components_) < 1e-10
    assert relative_diff(W_sparse, W_dense) < 1e-10
    np.testing.assert_allclose(sparse.loss_history_, dense.loss_history_, rtol=1e-9)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("rank", [1, 3, 4, 5, 20, 33])
def test_csr_local_step_equals_scipy_products(rank, dtype):
    """The fused CSR sweep against scipy's products at ranks with and without a SIMD tail: the MU step and
    W^T X, and a HALS step against the dense path's sweep given scipy's X H^T."""
    from distfact.kernels import nmf as k

    rng = np.random.default_rng(rank)
    X = sp.random(150, 70, density=0.1, random_state=rank, format="csr", dtype=dtype)
    W, H = rng.random((150, rank)).astype(dtype) + 0.1, rng.random((rank, 70)).astype(dtype) + 0.1
    HHt = H @ H.T
    tolerance = 1e-12 if dtype == np.float64 else 1e-5
    W_mu, WtX, WtW = k.frobenius_local(X, W, H, HHt, "mu")
    expected = W * (X @ H.T) / np.maximum(W @ HHt, np.finfo(dtype).eps)
    assert relative_diff(W_mu, expected) < tolerance
    assert relative_diff(WtX, (X.T @ W_mu).T) < tolerance
    assert relative_diff(WtW, W_mu.T @ W_mu) < tolerance
    W_hals, WtX, _ = k.frobenius_local(X, W, H, HHt, "hals")
    assert relative_diff(W_hals, k.w_update(W, np.asarray(X @ H.T), HHt, "hals")) < tolerance
    assert relative_diff(WtX, (X.T @ W_hals).T) < tolerance


@pytest.mark.parametrize("solver", ["mu", "hals"])
def test_csr_local_step_on_rows_of_every_length(solver):
    """The fused CSR sweep gathers a row's entries in vector registers and prefetches rows some entries ahead: rows
    of 0 to 11 entries (none included), in both orders of length, the longest at the end of the arrays, against
    scipy's products (MU) and the dense path's sweep (HALS)."""
    from distfact.kernels import nmf as k

    rng = np.random.default_rng(7)
    lengths = list(range(12)) + list(range(11, -1, -1)) + [40]
    n, r = 60, 5
    indices = np.concatenate([np.sort(rng.choice(n, size=length, replace=False)) for length in lengths])
    X = sp.csr_matrix((rng.random(indices.size) + 0.1, indices, np.concatenate(([0], np.cumsum(lengths)))),
                      shape=(len(lengths), n))
    W, H = rng.random((X.shape[0], r)) + 0.1, rng.random((r, n)) + 0.1
    HHt = H @ H.T
    W_new, WtX, _ = k.frobenius_local(X, W, H, HHt, solver)
    XHt = np.asarray(X @ H.T)
    if solver == "mu":
        expected = W * XHt / np.maximum(W @ HHt, np.finfo(float).eps)
    else:
        expected = k.w_update(W, XHt, HHt, "hals")
    assert relative_diff(W_new, expected) < 1e-12
    assert relative_diff(WtX, (X.T @ W_new).T) < 1e-12


@pytest.mark.parametrize("rank", [6, 37])
@pytest.mark.parametrize("solver", ["mu", "hals"])
def test_csr_step_in_bands_gives_the_fused_sweeps_bits(solver, rank, monkeypatch):
    """Where H^T and (W^T X)^T exceed ``CSR_BAND_BYTES`` a held block's CSR step reads it in bands of columns (issue
    19): the fused sweep at its first sight, from its second on its entries by band (``_csr_bands``, kept while the
    block lives), each row's x_i H^T gathered band after band onto the last: the fused sweep's bits, and scipy's
    products to rounding (MU; HALS: the dense path's sweep given scipy's X H^T). Rows with no entry in some bands,
    rows with none; ranks of one sweep of the gather's registers and of two. A block whose rows' columns are not
    sorted, or one read anew in every pass (a new object each time), has no form made."""
    import gc

    from distfact.kernels import block_forms as bf
    from distfact.kernels import nmf as k

    rng = np.random.default_rng(11)
    n = 300
    X = sp.random(120, n, density=0.08, random_state=12, format="csr")
    X = sp.vstack([X, sp.csr_matrix((2, n)), sp.csr_matrix(np.where(np.arange(n) < 20, 1.0, 0.0))], format="csr")
    assert X.has_sorted_indices
    W, H = rng.random((X.shape[0], rank)) + 0.1, rng.random((rank, n)) + 0.1
    HHt = H @ H.T
    monkeypatch.setattr(k, "CSR_BAND_BYTES", 2 * rank * 8 * 45)  # bands of 45 columns: 7 bands
    assert k.csr_band_width(n, rank, 8) == 45
    steps = [k.frobenius_local(X, W, H, HHt, solver) for _ in range(3)]  # fused, form made, form kept
    form = bf._forms[id(X), "bands"][5]
    assert form is not None and form[0].size == 7 * X.shape[0] + 1
    for step in steps[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(step, steps[0]))
    XHt = np.asarray(X @ H.T)
    expected = (W * XHt / np.maximum(W @ HHt, np.finfo(float).eps) if solver == "mu"
                else k.w_update(W, XHt, HHt, "hals"))
    W_new, WtX, _ = steps[0]
    assert relative_diff(W_new, expected) < 1e-12
    assert relative_diff(WtX, (X.T @ W_new).T) < 1e-12

    unsorted = X.copy()
    first, last = unsorted.indptr[-2], unsorted.indptr[-1]
    unsorted.indices[first:last] = unsorted.indices[first:last][::-1].copy()
    unsorted.has_sorted_indices = False
    for _ in range(3):
        W_unsorted = k.frobenius_local(unsorted, W, H, HHt, solver)[0]
    assert (id(unsorted), "bands") not in bf._forms
    assert relative_diff(W_unsorted, expected) < 1e-12
    assert k.frobenius_local(X.copy(), W, H, HHt, solver) is not None  # a new block: seen once, no form made
    gc.collect()
    assert not any(key[1] == "bands" and entry[0]() is not X and entry[5] is not None
                   for key, entry in bf._forms.items())


@pytest.mark.parametrize("ranks", [[1, 4, 7], [20, 25, 30]])
@pytest.mark.parametrize("solver", ["mu", "hals", None])
def test_several_models_local_step_equals_each_models_numpy_step(solver, ranks):
    """``frobenius_local_many`` (a sweep's shared products) against each model's step in numpy: the MU or HALS
    update of W_b (HALS: the dense path's sweep given numpy's X H^T), W_b^T X_b and W_b^T W_b; ``solver`` None
    (pass 0): W_b as given and its statistics. X_b is 20 tiles of 65 rows in 7 chunks (6 of 195 rows, one of
    130): at a summed rank of 12, three tiles to a chunk; at 75, one tile a chunk."""
    from distfact.kernels import nmf as k

    rng = np.random.default_rng(5)
    X = rng.random((1_300, 2_000))
    assert (sum(ranks) >= k.WHOLE_CHUNK_RANK) == (ranks[0] == 20)
    assert k.shares_products(X, [np.empty((1_300, r)) for r in ranks], [np.empty((r, 2_000)) for r in ranks])
    Ws = [rng.random((1_300, r)) + 0.1 for r in ranks]
    Hs = [rng.random((r, 2_000)) + 0.1 for r in ranks]
    HHts = [H @ H.T for H in Hs]
    steps = k.frobenius_local_many(X, Ws, Hs, HHts, solver)
    for (W_new, WtX, WtW), W, H, HHt in zip(steps, Ws, Hs, HHts):
        if solver is None:
            assert W_new is W
        elif solver == "mu":
            assert relative_diff(W_new, W * (X @ H.T) / np.maximum(W @ HHt, np.finfo(float).eps)) < 1e-12
        else:
            assert relative_diff(W_new, k.w_update(W, X @ H.T, HHt, "hals")) < 1e-12
        assert relative_diff(WtX, W_new.T @ X) < 1e-12
        assert relative_diff(WtW, W_new.T @ W_new) < 1e-12


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shifted", [False, True])
def test_mu_updates_are_numpys_operations_bit_for_bit(dtype, shifted):
    """The MU updates' compiled sweep (issue 19) does numpy's operations in numpy's order and dtype: the same bits as
    W * XHt / np.maximum(W HH^T + shift, eps), a NaN kept, denominators below eps floored; mixed precisions take
    numpy's operations themselves."""
    from distfact.kernels import nmf as k

    rng = np.random.default_rng(11)
    W, XHt, HHt = (rng.random(shape).astype(dtype) for shape in ((37, 6), (37, 6), (6, 6)))
    W[3] = 0.0  # denominators of 0: floored
    XHt[5, 2] = np.nan
    shift = rng.random(6).astype(dtype) if shifted else None
    eps = np.finfo(dtype).eps
    expected = W * XHt / np.maximum(W @ HHt + (0 if shift is None else shift), eps)
    got = k.mu_w_update(W, XHt, HHt, shift)
    assert got.dtype == dtype and np.array_equal(got, expected, equal_nan=True)
    assert np.isnan(got[5, 2]) and np.isfinite(np.delete(got, 5, axis=0)).all()
    HHt[1, 4] = np.nan  # a NaN denominator (column 4 of every row) is kept, not floored to eps
    assert np.isnan(k.mu_w_update(W, XHt, HHt, shift)[:, 4]).all()
    # mixed precisions and shapes the sweep is not written for take numpy's expression itself
    W32, HHt32, XHt64 = W.astype(np.float32), HHt.astype(np.float32), XHt.astype(np.float64)
    shift64 = None if shift is None else shift.astype(np.float64)

    def denominator():  # the shift added in place: the denominator keeps the product's dtype
        den = W32 @ HHt32
        if shift64 is not None:
            den += shift64
        return den

    eps32 = np.finfo(np.float32).eps
    assert np.array_equal(k.mu_w_update(W32, XHt64, HHt32, shift64), W32 * XHt64 / np.maximum(denominator(), eps32),
                          equal_nan=True)
    if shift is not None:  # a float64 shift with float32 factors
        assert np.array_equal(k.mu_w_update(W32, XHt.astype(np.float32), HHt32, shift64),
                              W32 * XHt.astype(np.float32) / np.maximum(denominator(), eps32), equal_nan=True)
    h, wtx = W[0].copy(), XHt[0].copy()  # a 1-D H: numpy's expression, as before
    assert np.array_equal(k.mu_h_update(h, wtx, HHt), h * wtx / np.maximum(HHt @ h, eps), equal_nan=True)
    H, WtX = W.T.copy(), XHt.T.copy()  # H's update: the same sweep over r x n, no shift
    assert np.array_equal(k.mu_h_update(H, WtX, HHt), H * WtX / np.maximum(HHt @ H, eps), equal_nan=True)


def test_dense_x_times_ht_does_not_depend_on_where_ht_starts():
    """``block_times_ht`` copies H^T unaligned for BLAS (issue 19: BLAS's NN product, without the cost of an aligned
    copy): the product's bits must not depend on the copy's offset from a 64-byte boundary (X aligned, as blocks
    are). The shapes are those BLAS takes (not the thin loops': a dozen columns, a rank above ``THIN_XHT_RANK``, more
    work than ``THIN_WORK``, float32)."""
    from distfact.kernels.memory import aligned_copy
    from distfact.kernels.products import block_times_ht, thin_xht

    rng = np.random.default_rng(12)
    for m, n, r, dtype in [(297, 12, 5, np.float64), (1500, 333, 17, np.float64), (4000, 300, 5, np.float64),
                           (400, 100, 5, np.float32), (2001, 250, 20, np.float32)]:
        X, H = aligned_copy(rng.random((m, n)).astype(dtype)), rng.random((r, n)).astype(dtype)
        assert not thin_xht(X, H)
        expected = block_times_ht(X, H)
        for offset in range(0, 64, np.dtype(dtype).itemsize):
            buffer = np.empty(H.nbytes + 128, np.uint8)
            start = (-buffer.ctypes.data) % 64 + offset
            Ht = buffer[start:start + H.nbytes].view(dtype).reshape(n, r)
            Ht[...] = H.T
            assert np.array_equal(X @ Ht, expected), (m, n, r, dtype, offset)


#: thin products (``kernels/products.py``: ``thin_xht``, ``thin_wt``) with every remainder of the loops' groups of four
#: rows (m = 6: a whole group, then two rows) and two rows of H, and the largest ranks of each loop
THIN_SHAPES = [(m, n, r) for m in (0, 1, 2, 3, 4, 5, 6, 7, 201) for n in (64, 101) for r in (2, 3, 5, 8)] + \
    [(9, 64, 12)]


def test_thin_products_equal_float64_products_and_a_rows_bits_do_not_depend_on_its_block():
    """The thin products of small dense blocks (``kernels/products.py``: ``_thin_times_ht``, ``_thin_wt_times``, not
    BLAS) against numpy's: within the rounding of n (or m) terms, at shapes with every remainder of their groups of
    four rows and two rows of H, and an empty block. A row of X H^T has the same bits whatever rows come before it
    (a block may start anywhere: X[s:] gives rows s: of X's product), and neither product's bits depend on where X
    and H start against a 64-byte boundary (as BLAS's do not) nor on X being read-only (a store's blocks)."""
    from distfact.kernels.products import THIN_WT_RANK, block_times_ht, thin_wt, thin_xht, wt_times_block

    rng = np.random.default_rng(31)
    eps = np.finfo(np.float64).eps
    for m, n, r in THIN_SHAPES:
        X, H, W = (rng.random(shape) for shape in ((m, n), (r, n), (m, r)))
        assert thin_xht(X, H) and thin_wt(W, X) == (r <= THIN_WT_RANK)
        XHt, WtX = block_times_ht(X, H), wt_times_block(W, X)
        assert XHt.dtype == WtX.dtype == np.float64 and XHt.shape == (m, r) and WtX.shape == (r, n)
        scale = max(n, m, 1) * eps * np.abs(X).sum(initial=1.0)
        assert np.abs(XHt - X @ H.T).max(initial=0) <= 2 * n * eps * (X @ H.T).max(initial=0), (m, n, r)
        assert np.abs(WtX - W.T @ X).max(initial=0) <= 2 * m * eps * (W.T @ X).max(initial=0) + (m == 0) * scale
        for s in range(1, min(m, 5)):
            assert np.array_equal(block_times_ht(X[s:], H), XHt[s:]), (m, n, r, s)
        read_only = X.copy()
        read_only.flags.writeable = False
        assert np.array_equal(block_times_ht(read_only, H), XHt) and np.array_equal(wt_times_block(W, read_only), WtX)
        for offset in (0, 8, 24, 40):
            buffer = np.empty(X.nbytes + H.nbytes + 256, np.uint8)
            start = (-buffer.ctypes.data) % 64 + offset
            X_at = buffer[start:start + X.nbytes].view(np.float64).reshape(m, n)
            H_at = buffer[start + X.nbytes + 64:start + X.nbytes + 64 + H.nbytes].view(np.float64).reshape(r, n)
            X_at[...], H_at[...] = X, H
            assert np.array_equal(block_times_ht(X_at, H_at), XHt), (m, n, r, offset)
            assert np.array_equal(wt_times_block(W, X_at), WtX), (m, n, r, offset)


def test_products_outside_the_thin_loops_are_blas():
    """What the thin loops do not take is numpy's product, the same bits (and numpy's ValueError for factors whose
    shapes do not match X's): ranks above ``THIN_XHT_RANK`` (``THIN_WT_RANK`` for W^T X) or of 1, fewer than
    ``THIN_COLUMNS`` columns, more than ``THIN_WORK`` multiply-adds, W^T X beyond ``THIN_OUTPUT_BYTES``, float32,
    big-endian float64, mixed dtypes, a non-contiguous X."""
    from distfact.kernels.products import (THIN_COLUMNS, THIN_OUTPUT_BYTES, THIN_WORK, THIN_WT_RANK, THIN_XHT_RANK,
                                           block_times_ht, wt_times_block)

    rng = np.random.default_rng(32)
    wide = THIN_OUTPUT_BYTES // (8 * 4) + 1  # W^T X of rank 4 over this many columns: beyond THIN_OUTPUT_BYTES
    above_work = rng.random((THIN_WORK // 400 + 1, 100))  # by rank 4: THIN_WORK multiply-adds or more
    both_blas = [(rng.random((50, 80)), THIN_XHT_RANK + 1, np.float64), (rng.random((50, 80)), 1, np.float64),
                 (rng.random((50, THIN_COLUMNS - 1)), 5, np.float64), (above_work, 4, np.float64),
                 (rng.random((50, 80)).astype(np.float32), 5, np.float32), (rng.random((50, 80)), 3, np.float32),
                 (rng.random((50, 80)).astype(">f8"), 3, ">f8"), (rng.random((80, 50)).T, 3, np.float64)]
    wt_blas = [(rng.random((50, 80)), THIN_WT_RANK + 1, np.float64), (rng.random((50, wide)), 4, np.float64)]
    for X, r, dtype in both_blas + wt_blas:
        H, W = rng.random((r, X.shape[1])).astype(dtype), rng.random((X.shape[0], r)).astype(dtype)
        assert np.array_equal(wt_times_block(W, X), W.T @ X)
    for X, r, dtype in both_blas:
        H = rng.random((r, X.shape[1])).astype(dtype)
        assert np.array_equal(block_times_ht(X, H), X @ np.ascontiguousarray(H.T))
    X = rng.random((10, 100))
    with pytest.raises(ValueError):
        wt_times_block(rng.random((3, 5)), X)
    with pytest.raises(ValueError):
        block_times_ht(X, rng.random((5, 80)))


@pytest.mark.parametrize("solver,loss", CASES)
def test_fits_through_the_thin_products_equal_the_transcription(solver, loss):
    """A fit whose blocks take the thin loops (dense float64, rank 4, 80 columns, blocks of 30 rows: every product of
    its local steps, statistics and pass 0) against the numpy transcription of the paper's updates: the same iterates
    to rounding."""
    from distfact.kernels.products import thin_wt, thin_xht

    rng = np.random.default_rng(33)
    X = rng.random((90, 4)) @ rng.random((4, 80)) + 0.01 * rng.random((90, 80))
    W0, H0 = start_point(X, 4)
    assert thin_xht(X[:30], H0) and thin_wt(W0[:30], X[:30])
    model = distfact.NMF(4, solver=solver, beta_loss=loss, init="custom", max_iter=12, tol=0, block_rows=30)
    W = model.fit_transform(X, W=W0, H=H0)
    W_ref, H_ref = ORACLES[solver, loss](X, W0, H0, 12)
    assert relative_diff(W, W_ref) < 1e-10 and relative_diff(model.components_, H_ref) < 1e-10


@pytest.mark.parametrize("solver,loss", CASES)
@pytest.mark.parametrize("sparse", [False, True])
def test_losses_and_group_errors_equal_direct_recomputation(solver, loss, sparse):
    X, groups = grouped_data(m=110, n=18, density=0.5, seed=8)
    model = distfact.NMF(4, solver=solver, beta_loss=loss, random_state=2, max_iter=15, tol=0, block_rows=10)
    W = model.fit_transform(sp.csr_matrix(X) if sparse else X, groups=groups)
    H = model.components_
    names = sorted(set(groups))
    assert model.group_names_ == names
    direct_loss = frobenius_half if loss == "frobenius" else kl_divergence
    for g, name in enumerate(names):
        rows = groups == name
        rel = np.linalg.norm(X[rows] - W[rows] @ H) / np.linalg.norm(X[rows])
        assert model.group_errors_[g] == pytest.approx(rel, rel=1e-9)
        assert model.group_losses_[g] == pytest.approx(direct_loss(X[rows], W[rows], H), rel=1e-9)
    assert model.loss_history_[-1] == pytest.approx(direct_loss(X, W, H), rel=1e-9)
    assert model.reconstruction_err_ == pytest.approx(np.sqrt(2 * model.loss_history_[-1]))


@pytest.mark.parametrize("solver", ["mu", "hals"])
def test_one_read_of_X_per_iteration(solver):
    X, groups = grouped_data(m=60, n=12, seed=9)
    for max_iter, tol in ((17, 0.0), (500, 1e-3)):
        model = distfact.NMF(3, solver=solver, random_state=0, max_iter=max_iter, tol=tol, block_rows=8).fit(
            X, groups=groups)
        assert model.n_passes_ == model.n_iter_ + 1
    assert model.converged_ and model.n_iter_ < 500  # the tol run stopped early


@pytest.mark.parametrize("solver", ["mu", "hals"])
def test_tiled_dense_step_equals_transcription_on_any_number_of_threads(solver):
    """Blocks wide enough to be cut into cache tiles and row chunks (kernels.nmf.TILE_BYTES, MAX_CHUNKS), which run
    on BLAS's threads: the same factors, bit for bit, on one thread as on two (as on a cluster's single-threaded
    workers), the numpy transcription's iterates, and for float32 the losses of a float64 recomputation."""
    from threadpoolctl import threadpool_limits

    from distfact.kernels.nmf import MAX_CHUNKS, PARALLEL_WORK, TILE_BYTES

    rng = np.random.default_rng(23)
    m, n, r = 700, 4096, 5
    assert TILE_BYTES // (n * 8) * MAX_CHUNKS < m // 2 and m // 2 * n * r >= PARALLEL_WORK  # tiled, chunked, threaded
    X = rng.random((m, r)) @ rng.random((r, n)) + 0.01 * rng.random((m, n))
    groups = np.repeat(["a", "b"], m // 2)
    W0, H0 = start_point(X, r)

    def fit(X, W0, H0, threads):
        model = distfact.NMF(r, solver=solver, init="custom", max_iter=8, tol=0)
        with threadpool_limits(threads, user_api="blas"):
            return model.fit_transform(X, groups=groups, W=W0, H=H0), model

    (W1, one), (W2, two) = fit(X, W0, H0, 1), fit(X, W0, H0, 2)
    assert np.array_equal(W1, W2) and np.array_equal(one.components_, two.components_)
    # (the driver's own sums, e.g. the losses' dot products, may follow BLAS's threads: not compared bitwise)
    W_ref, H_ref = ORACLES[solver, "frobenius"](X, W0, H0, 8)
    assert relative_diff(W2, W_ref) < 1e-10 and relative_diff(two.components_, H_ref) < 1e-10

    X32 = X.astype(np.float32)
    W, model = fit(X32, W0.astype(np.float32), H0.astype(np.float32), 2)
    W, H = W.astype(np.float64), model.components_.astype(np.float64)
    for g, name in enumerate(model.group_names_):
        rows = groups == name
        assert model.group_losses_[g] == pytest.approx(frobenius_half(X32[rows].astype(np.float64), W[rows], H),
                                                       rel=1e-4)


def test_a_tiles_products_take_runs_of_rows_where_blas_has_small_kernels(monkeypatch):
    """``_product_rows``: as many rows as n r multiply-adds a row fit in BLAS's small-matrix limit, at most the tile,
    and the whole tile where that is fewer than MIN_SMALL_ROWS or BLAS has no such kernels (limit 0)."""
    from distfact.kernels import nmf as k

    monkeypatch.setattr(k, "small_product_limit", lambda: 1_000_000)
    assert k._product_rows(2000, 20, 65) == 25 and k._product_rows(2000, 5, 65) == 65
    assert k._product_rows(5000, 20, 26) == 10 and k._product_rows(20000, 20, 6) == 6  # 2 rows: whole tiles
    monkeypatch.setattr(k, "small_product_limit", lambda: 0)
    assert k._product_rows(2000, 20, 65) == 65


def test_small_product_limit_follows_scipys_blas(monkeypatch):
    """The limit is set where the BLAS of numba's products (scipy's: the one its wheel bundles) is an OpenBLAS of an
    AVX-512 core type, whatever other BLAS libraries are loaded; where scipy bundles none, where every loaded one is.
    threadpoolctl's controllers stand in for BLAS libraries of each kind (what it reports of this machine's: below)."""
    import os
    import types

    import scipy

    from distfact.kernels import blas_threads

    bundled = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(scipy.__file__))), "scipy.libs")

    def library(directory, api, architecture=None):
        info = {"internal_api": api, **({"architecture": architecture} if architecture else {})}
        return types.SimpleNamespace(filepath=os.path.join(directory, "libblas.so"), info=lambda: info)

    elsewhere = "/opt/other/lib"
    cases = [([library(bundled, "openblas", "SkylakeX"), library(elsewhere, "openblas", "Haswell")], True),
             ([library(bundled, "openblas", "Haswell"), library(elsewhere, "openblas", "SkylakeX")], False),
             ([library(bundled, "openblas", "SapphireRapids")], True), ([library(bundled, "openblas")], False),
             ([library(elsewhere, "openblas", "Cooperlake"), library(elsewhere, "openblas", "SkylakeX")], True),
             ([library(elsewhere, "openblas", "SkylakeX"), library(elsewhere, "mkl")], False),
             ([library(elsewhere, "blis")], False), ([], False)]
    for libraries, kernels in cases:
        monkeypatch.setattr(blas_threads, "_controller", lambda libraries=libraries: types.SimpleNamespace(
            lib_controllers=libraries))
        blas_threads.small_product_limit.cache_clear()
        assert blas_threads.small_product_limit() == (blas_threads.SMALL_PRODUCT if kernels else 0), libraries
    monkeypatch.undo()
    blas_threads.small_product_limit.cache_clear()
    from threadpoolctl import threadpool_info  # this machine's, as threadpoolctl reports it: the keys exist

    scipys = [info for info in threadpool_info() if os.path.dirname(info["filepath"]) == bundled]
    if scipys and scipys[0]["internal_api"] == "openblas":
        expected = scipys[0]["architecture"] in blas_threads.SMALL_KERNEL_CORES
        assert blas_threads.small_product_limit() == (blas_threads.SMALL_PRODUCT if expected else 0)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("solver", ["mu", "hals"])
def test_the_tiled_step_in_runs_of_rows_equals_whole_tiles(monkeypatch, solver, dtype):
    """The dense step's products made on runs of 9 rows of each tile (a limit of 9 n r multiply-adds; tiles of
    32 or 64 rows, so runs with remainders) give the step of whole tiles to rounding, and the numpy transcription's
    W_new, W_new^T X and residual; float32 with its float64 sums (``sums64``): products of runs of 16 rows summed in
    float32 over 128 rows, then in float64."""
    from distfact.kernels import nmf as k

    rng = np.random.default_rng(31)
    m, n, r = 700, 4096, 5
    X = (rng.random((m, r)) @ rng.random((r, n)) + 0.01 * rng.random((m, n))).astype(dtype)
    W, H = (rng.random((m, r)) + 0.1).astype(dtype), (rng.random((r, n)) + 0.1).astype(dtype)
    HHt = H @ H.T
    sums64 = dtype == np.float32
    steps = {}
    for runs, limit in ((9, 9 * n * r), (16, 16 * n * r), (None, 0)):
        monkeypatch.setattr(k, "small_product_limit", lambda limit=limit: limit)
        assert k._product_rows(n, r, k._tile_rows(X)) == (runs or k._tile_rows(X)) and k._tiled(X, W, H)
        steps[runs] = k.frobenius_local(X, W, H, HHt, solver, residual=True, sums64=sums64)
    X64, W64, H64 = (A.astype(np.float64) for A in (X, W, H))
    if solver == "mu":
        W_ref = W64 * (X64 @ H64.T) / np.maximum(W64 @ (H64 @ H64.T), np.finfo(dtype).eps)
    else:
        W_ref = W64.copy()
        G, XHt = H64 @ H64.T, X64 @ H64.T
        for q in range(r):
            W_ref[:, q] = np.maximum(W_ref[:, q] + (XHt[:, q] - W_ref @ G[:, q]) / G[q, q], 0.0)
    rtol = 1e-10 if dtype == np.float64 else 1e-4
    # float32's rounding, which HALS's sweep carries from column to column: relative to W's largest entries
    w_close = {"rtol": 1e-12, "atol": 0} if dtype == np.float64 else {"rtol": 1e-4, "atol": 1e-5 * np.abs(W_ref).max()}
    for runs, (W_new, WtX, WtW, sq_err) in steps.items():
        whole = steps[None]
        np.testing.assert_allclose(W_new, whole[0], **w_close, err_msg=str(runs))
        np.testing.assert_allclose(WtX, whole[1], rtol=1e-12 if dtype == np.float64 else 1e-5)
        np.testing.assert_allclose(W_new, W_ref, rtol=rtol, atol=w_close["atol"])
        W_at = W_new.astype(np.float64)
        np.testing.assert_allclose(WtX, W_at.T @ X64, rtol=rtol)
        np.testing.assert_allclose(WtW, W_at.T @ W_at, rtol=rtol)
        assert sq_err == pytest.approx(np.sum((X64 - W_at @ H64) ** 2), rel=1e-9 if dtype == np.float64 else 1e-3)


def test_monotone_objective_for_mu():
    """Lee & Seung's MU never increases its objective (a property, not a copy of the code)."""
    X, groups = grouped_data(m=80, n=20, seed=10)
    for loss in ("frobenius", "kullback-leibler"):
        model = distfact.NMF(4, beta_loss=loss, random_state=0, max_iter=60, tol=0).fit(X, groups=groups)
        assert np.all(np.diff(model.loss_history_) <= 1e-9 * model.loss_history_[0])


def test_dtype_is_kept():
    X, groups = grouped_data(m=40, n=10, dtype=np.float32)
    model = distfact.NMF(3, random_state=0, max_iter=10).fit(X, groups=groups)
    assert model.components_.dtype == np.float32
    assert model.fit_transform(X, groups=groups).dtype == np.float32


def test_same_seed_same_result_other_seed_other_result(dense_data):
    X, groups = dense_data
    a = distfact.NMF(4, random_state=3, max_iter=10, block_rows=20).fit(X, groups=groups).components_
    b = distfact.NMF(4, random_state=3, max_iter=10, block_rows=20).fit(X, groups=groups).components_
    c = distfact.NMF(4, random_state=4, max_iter=10, block_rows=20).fit(X, groups=groups).components_
    assert np.array_equal(a, b)
    assert not np.allclose(a, c)


def test_transform_hals_meets_the_kkt_conditions():
    X, groups = grouped_data(m=50, n=16, seed=11)
    model = distfact.NMF(3, solver="hals", random_state=0, max_iter=200, tol=1e-8).fit(X, groups=groups)
    H = model.components_
    W = model.transform(X, max_iter=2000)
    # KKT of min_W ||X - WH|| over W >= 0: gradient (W H - X) H^T >= 0, and = 0 where W > 0.
    grad = (W @ H - X) @ H.T
    scale = np.abs(X @ H.T).max()
    assert grad.min() > -1e-6 * scale
    assert np.abs(grad[W > 1e-8]).max() < 1e-6 * scale
    np.testing.assert_allclose(model.inverse_transform(W), W @ H)


@pytest.mark.parametrize("loss", ["frobenius", "kullback-leibler"])
def test_transform_mu_equals_fixed_H_iterations(loss):
    X, groups = grouped_data(m=50, n=16, seed=11)
    model = distfact.NMF(3, beta_loss=loss, random_state=0, max_iter=40, tol=0).fit(X, groups=groups)
    H = model.components_
    W = model.transform(X, max_iter=25)
    eps = np.finfo(X.dtype).eps
    W_ref = np.full((X.shape[0], 3), np.sqrt(X.mean() / 3))
    for _ in range(25):
        if loss == "frobenius":
            W_ref = W_ref * (X @ H.T) / np.maximum(W_ref @ (H @ H.T), eps)
        else:
            W_ref = W_ref * ((X / np.maximum(W_ref @ H, eps)) @ H.T) / np.maximum(H.sum(axis=1), eps)
    assert relative_diff(W, W_ref) < 1e-10


def test_nndsvda_init_is_close_to_scikit_learn():
    from sklearn.decomposition._nmf import _initialize_nmf

    X, groups = grouped_data(m=150, n=30, seed=12)
    W_sk, H_sk = _initialize_nmf(X, 6, init="nndsvda", random_state=0)
    model = distfact.NMF(6, init="nndsvda", max_iter=0, random_state=0, block_rows=40)
    W = model.fit_transform(X, groups=groups)
    ours = frobenius_half(X, W, model.components_)
    assert ours == pytest.approx(model.loss_history_[0], rel=1e-9)
    assert ours == pytest.approx(frobenius_half(X, W_sk, H_sk), rel=0.1)
    assert (W >= 0).all() and (model.components_ >= 0).all()


def test_matches_scikit_learn_final_error():
    """Same problem, same kind of solver: the final errors are close (not the same iterates:
    scikit-learn updates W first)."""
    from sklearn.decomposition import NMF as SkNMF

    X, groups = grouped_data(m=200, n=40, seed=13)
    ours = distfact.NMF(5, solver="hals", init="nndsvda", max_iter=300, tol=1e-6, random_state=0).fit(X)
    theirs = SkNMF(5, solver="cd", init="nndsvda", max_iter=300, tol=1e-6, random_state=0).fit(X)
    assert ours.reconstruction_err_ == pytest.approx(theirs.reconstruction_err_, rel=0.02)


def test_every_input_kind_gives_the_same_fit(tmp_path):
    """numpy, scipy.sparse, dask array, GroupedMatrix and store path: one result."""
    import dask.array as da

    X, groups = grouped_data(m=60, n=10, seed=14)
    store = distfact.from_arrays(X, groups, tmp_path / "x.zarr", block_rows=60)
    kwargs = dict(random_state=0, max_iter=15, tol=0, block_rows=60)
    reference = distfact.NMF(3, **kwargs).fit(X, groups=groups).components_
    for given, g in ((sp.csr_matrix(X), groups), (da.from_array(X, chunks=(25, 10)), groups),
                     (store, None), (str(tmp_path / "x.zarr"), None)):
        np.testing.assert_allclose(distfact.NMF(3, **kwargs).fit(given, groups=g).components_, reference,
                                   rtol=1e-10)
    with pytest.raises(ValueError, match="carries its groups"):
        distfact.NMF(3).fit(store, groups=groups)


def test_convergence_warning_when_max_iter_cuts_the_fit_short():
    from sklearn.exceptions import ConvergenceWarning

    X, groups = grouped_data(m=40, n=10, seed=15)
    with pytest.warns(ConvergenceWarning, match="max_iter=3"):
        distfact.NMF(3, random_state=0, max_iter=3, tol=1e-4).fit(X, groups=groups)
    model = distfact.NMF(3, random_state=0, max_iter=2000, tol=1e-3).fit(X, groups=groups)
    assert model.converged_ and model.n_iter_ < 2000


def test_dataframe_input():
    import pandas as pd

    X, groups = grouped_data(m=30, n=4, seed=16)
    frame = pd.DataFrame(X, columns=list("abcd"))
    a = distfact.NMF(2, random_state=0, max_iter=10, tol=0).fit(frame, groups=groups).components_
    b = distfact.NMF(2, random_state=0, max_iter=10, tol=0).fit(X, groups=groups).components_
    np.testing.assert_allclose(a, b, rtol=1e-12)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("solver,loss", CASES)
def test_float32_errors_are_accurate_at_small_relative_error(sparse, solver, loss):
    """float32 data fitted well (relative error ~1e-3): reported errors match a float64 recomputation."""
    rng = np.random.default_rng(17)
    X = (rng.random((300, 4)) @ rng.random((4, 60)) + 1e-3 * rng.random((300, 60))).astype(np.float32)
    if sparse:
        X[X < np.quantile(X, 0.3)] = 0
    groups = rng.choice(["a", "b"], 300)
    given = sp.csr_matrix(X) if sparse else X
    model = distfact.NMF(4, solver=solver, beta_loss=loss, init="nndsvda", max_iter=300, tol=0, random_state=0)
    W = model.fit_transform(given, groups=groups).astype(np.float64)
    H = model.components_.astype(np.float64)
    X64 = X.astype(np.float64)
    for g, name in enumerate(model.group_names_):
        rows = groups == name
        rel = np.linalg.norm(X64[rows] - W[rows] @ H) / np.linalg.norm(X64[rows])
        assert model.group_errors_[g] == pytest.approx(rel, rel=1e-3)
        direct = frobenius_half if loss == "frobenius" else kl_divergence
        assert model.group_losses_[g] == pytest.approx(direct(X64[rows], W[rows], H), rel=1e-3, abs=1e-6)


@pytest.mark.parametrize("m,n,r,skew", [(3000, 2000, 20, None), (60000, 50, 3, None), (303, 13, 5, None),
                                        (20000, 300, 2, "columns"), (20000, 300, 3, "rows")])
def test_float32_statistics_in_float64_sums_hold_the_formula_within_its_bound(m, n, r, skew):
    """float32 blocks with ``sums64`` (tiled: 1 MiB tiles of 131 to 5,242 rows; and one tile), also with columns of
    Zipf popularity or rows of Zipf norms (a few dominant terms): W_b^T X_b and W_b^T W_b in float64, the same W_b as
    without, and the statistics formula of ||X_b - W_b H||^2 within FLOAT32_FORMULA_ERROR / sqrt(n_eff) ||X_b||^2
    of its float64 recomputation at a relative error of about 0.3."""
    from distfact.kernels import nmf as k
    from distfact.methods.nmf import FLOAT32_FORMULA_ERROR

    rng = np.random.default_rng(5)
    W0, H0 = rng.random((m, r)), rng.random((r, n))
    if skew == "columns":
        H0 /= np.arange(1, n + 1)
    elif skew == "rows":
        W0 /= np.arange(1, m + 1)[:, None]
    X = np.abs(W0 @ H0 * (1 + 0.3 * rng.standard_normal((m, n)))).astype(np.float32)
    W, H = W0.astype(np.float32), H0.astype(np.float32)
    assert k._tiled(X, W, H) == (m > 303)
    W_new, WtX, WtW = k.frobenius_local(X, W, H, H @ H.T, "mu", sums64=True)
    assert WtX.dtype == WtW.dtype == np.float64 and W_new.dtype == np.float32
    assert np.array_equal(W_new, k.frobenius_local(X, W, H, H @ H.T, "mu")[0])
    X64, W64, H64 = X.astype(np.float64), W_new.astype(np.float64), H.astype(np.float64)
    np.testing.assert_allclose(WtX, W64.T @ X64, rtol=1e-5)
    np.testing.assert_allclose(WtW, W64.T @ W64, rtol=1e-12)
    sq_norm, exact = np.vdot(X64, X64), np.sum((X64 - W64 @ H64) ** 2)
    formula = sq_norm - 2 * np.vdot(WtX, H64) + np.vdot(WtW, H64 @ H64.T)
    terms = WtX * H64
    n_eff = terms.sum() ** 2 / np.vdot(terms, terms)
    assert abs(formula - exact) <= FLOAT32_FORMULA_ERROR / np.sqrt(n_eff) * sq_norm


def test_float32_fit_takes_residuals_only_where_the_formula_is_not_precise_enough():
    """float32 dense blocks: pass 0 computes residuals; the passes after it take the errors from the statistics
    (no residual product) while every group's loss is well above the formula's error (not so near an exact fit,
    nor far from it with a few dominant columns), else from the residuals, for the rest of the fit; the losses
    match a float64 recomputation either way (the formula's to 1e-6)."""
    from distfact.methods.nmf import NMFMethod
    from distfact.store.ingest import from_arrays

    rng = np.random.default_rng(8)
    m, n, r = 2000, 600, 4
    W0, H0 = rng.random((m, r)).astype(np.float32), rng.random((r, n)).astype(np.float32)
    method = NMFMethod(r, dtype="float32")
    zipf = (H0 / np.arange(1, n + 1)).astype(np.float32)  # a few dominant columns: few terms to average round-off
    for noise, H0, near in ((1.0, H0, False), (1e-4, H0, True), (1.0, zipf, True)):
        X = np.abs(W0 @ H0 * (1 + noise * rng.standard_normal((m, n)))).astype(np.float32)
        data = from_arrays(X)
        G = method.with_derived(H0, data)
        assert G["residuals"] is False
        stats = method.block_stats(X, W0, None, G)
        assert "sq_err" in stats
        for _ in range(2):
            G = {**method.global_step(G, [stats], data), "H": H0, "HHt": H0 @ H0.T}  # the same H, to compare
            assert G["residuals"] is near
            W_new, stats = method.local_step(X, W0, None, G)
            assert ("sq_err" in stats) is near
            exact = 0.5 * np.sum((X.astype(np.float64) - W_new.astype(np.float64) @ H0.astype(np.float64)) ** 2)
            # the residuals' W H rounds to float32: 6e-8 of wh is 6e-4 of a residual of 1e-4 (random, summed)
            assert method.objective(G, [stats], data)[0] == pytest.approx(exact, rel=1e-5 if near else 1e-6)


def test_a_float32_group_of_zeros_leaves_the_residuals_off():
    """float32: a group whose rows are all zero has no terms in <W_l^T X_l, H> (exactly 0, no round-off), so it does
    not turn the residuals on, and its loss from the statistics is exact."""
    from distfact.methods.nmf import NMFMethod
    from distfact.store.ingest import from_arrays

    rng = np.random.default_rng(9)
    m, n, r = 2000, 600, 4
    W0, H0 = rng.random((m, r)).astype(np.float32), rng.random((r, n)).astype(np.float32)
    X = np.abs(W0 @ H0 * (1 + rng.standard_normal((m, n)))).astype(np.float32)
    X[m // 2:] = 0
    data = from_arrays(X, np.repeat(["a", "zeros"], m // 2))
    method = NMFMethod(r, dtype="float32")
    G = method.with_derived(H0, data)
    halves = (slice(0, m // 2), slice(m // 2, m))
    stats = [method.local_step(X[rows], W0[rows], None, G)[1] for rows in halves]
    assert not method._residuals_needed(G, stats, data)
    W_new = [method.local_step(X[rows], W0[rows], None, G)[0] for rows in halves]
    exact = [0.5 * np.sum((X[rows].astype(np.float64) - W.astype(np.float64) @ H0.astype(np.float64)) ** 2)
             for rows, W in zip(halves, W_new)]
    np.testing.assert_allclose(method.objective(G, stats, data)[1], exact, rtol=1e-6)


def test_a_float32_fit_resumes_from_a_checkpoint_without_the_residuals_flag(tmp_path, monkeypatch):
    """A checkpoint whose global state has no "residuals" (written before float32 fits chose their residuals) resumes:
    its passes compute residuals for the rest of the fit, where the uninterrupted fit takes its losses from the
    statistics, and the factors are the uninterrupted fit's (the residuals change how the losses are computed, not
    the updates)."""
    from distfact.methods import nmf as method_module

    X, groups = grouped_data(m=2000, n=600, seed=31, dtype=np.float32)  # far from exact: no residuals needed
    kwargs = dict(random_state=5, max_iter=12, tol=0, block_rows=500)
    with_derived, kernel = method_module.NMFMethod.with_derived, method_module.k.frobenius_local
    residuals = []

    def recording(*args, **given):
        residuals.append(given["residual"])
        return kernel(*args, **given)

    def earlier_version(self, *args, **given):
        state = with_derived(self, *args, **given)
        state.pop("residuals", None)
        return state

    def crash_at_7(info):
        if info.iteration == 7:
            raise KeyboardInterrupt("simulated crash")

    with monkeypatch.context() as patched:
        patched.setattr(method_module.k, "frobenius_local", recording)
        reference = distfact.NMF(4, **kwargs).fit(X, groups=groups)
    n_blocks = distfact.from_arrays(X, groups, block_rows=500).n_blocks
    assert len(residuals) == 12 * n_blocks and not any(residuals)

    run_dir = tmp_path / "run"
    with monkeypatch.context() as patched:
        patched.setattr(method_module.NMFMethod, "with_derived", earlier_version)
        with pytest.raises(KeyboardInterrupt):
            distfact.NMF(4, checkpoint_dir=run_dir, checkpoint_every=5, callback=crash_at_7, **kwargs).fit(
                X, groups=groups)
    assert sorted(os.listdir(run_dir / "checkpoints")) == ["iter-000005"]

    residuals.clear()
    monkeypatch.setattr(method_module.k, "frobenius_local", recording)
    resumed = distfact.NMF(4, checkpoint_dir=run_dir, checkpoint_every=5, resume=True, **kwargs).fit(X, groups=groups)
    assert resumed.n_iter_ == 12 and len(residuals) == 7 * n_blocks and all(residuals)  # iterations 6 to 12
    assert np.array_equal(resumed.components_, reference.components_)
    np.testing.assert_allclose(resumed.loss_history_, reference.loss_history_, rtol=1e-6)
