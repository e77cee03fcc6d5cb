"""Masks in NMF (issue 20): fit(X, mask=...), its resolution and per-block forms, the weighted MU updates against a
numpy transcription, the invariances (all-ones mask, values at missing entries), per-group errors over observed
entries, checkpoints, a real LocalCluster, transform and impute with a mask."""

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

import distfact
from distfact import NMF
from distfact.estimators.masks import ComplementMask, block_masks, resolve_mask
from distfact.kernels.masked import COMPLEMENT, OBSERVED
from distfact.store.coerce import as_grouped

EPS = np.finfo(np.float64).eps


# ------------------------------------------------------------------ oracles (numpy, dense M)
def weighted_mu(X, M, W, H, n_iter, kl=False):
    """Weighted Lee-Seung MU, H first then W (the engine's order), written from the update formulas."""
    W, H = W.copy(), H.copy()
    for _ in range(n_iter):
        if kl:
            H = H * (W.T @ (M * X / np.maximum(W @ H, EPS))) / np.maximum(W.T @ M, EPS)
            W = W * ((M * X / np.maximum(W @ H, EPS)) @ H.T) / np.maximum(M @ H.T, EPS)
        else:
            H = H * (W.T @ (M * X)) / np.maximum(W.T @ (M * (W @ H)), EPS)
            W = W * ((M * X) @ H.T) / np.maximum((M * (W @ H)) @ H.T, EPS)
    return W, H


def weighted_hals(X, M, W, H, n_iter):
    """Weighted HALS written out entry by entry: each column of H (then each row of W) with its own Gram
    W^T diag(m_j) W (H diag(m_i) H^T), its r entries swept in order."""
    W, H = W.copy(), H.copy()
    r = W.shape[1]
    for _ in range(n_iter):
        for j in range(H.shape[1]):
            G, b = W.T @ (M[:, j:j + 1] * W), W.T @ (M[:, j] * X[:, j])
            for k in range(r):
                if G[k, k] > 0:
                    H[k, j] = max(0.0, H[k, j] + (b[k] - G[k] @ H[:, j]) / G[k, k])
        for i in range(W.shape[0]):
            G, b = H @ (M[i][:, None] * H.T), H @ (M[i] * X[i])
            for k in range(r):
                if G[k, k] > 0:
                    W[i, k] = max(0.0, W[i, k] + (b[k] - W[i] @ G[:, k]) / G[k, k])
    return W, H


def masked_frobenius(X, M, W, H):
    return float(np.sum(M * (X - W @ H) ** 2))


def masked_kl(X, M, W, H):
    WH = np.maximum(W @ H, EPS)
    pos = (X > 0) & (M > 0)
    return float(np.sum((M * X)[pos] * np.log(X[pos] / WH[pos])) - np.sum(M * X) + np.sum(M * (W @ H)))


# ------------------------------------------------------------------ data
M_ROWS, N_COLS, RANK = 90, 24, 3


def low_rank(seed=0, density=None):
    rng = np.random.default_rng(seed)
    X = rng.random((M_ROWS, RANK)) @ rng.random((RANK, N_COLS)) + 0.05 * rng.random((M_ROWS, N_COLS))
    if density is not None:
        X = X * (rng.random(X.shape) < density)
    groups = rng.choice(["a", "b", "c"], size=M_ROWS)
    return X, groups


def make_mask(kind, seed=1):
    """'complement': 15% missing; 'observed': 25% observed, weights in (0, 2]; 'mixed': rows alternate (blocks of
    one group hold both forms)."""
    rng = np.random.default_rng(seed)
    if kind == "complement":
        return (rng.random((M_ROWS, N_COLS)) > 0.15).astype(float)
    if kind == "observed":
        return (rng.random((M_ROWS, N_COLS)) < 0.25) * rng.uniform(0.1, 2.0, (M_ROWS, N_COLS))
    dense_rows = (np.arange(M_ROWS) // 10) % 2 == 0
    return np.where(dense_rows[:, None], rng.random((M_ROWS, N_COLS)) > 0.1, rng.random((M_ROWS, N_COLS)) < 0.2) * 1.0


def start(seed=2):
    rng = np.random.default_rng(seed)
    return rng.random((M_ROWS, RANK)) + 0.1, rng.random((RANK, N_COLS)) + 0.1


def forms(X, groups, mask, block_rows=10):
    values, resolved = resolve_mask(X, mask)
    blocks, _ = block_masks(as_grouped(values, groups, block_rows=block_rows), resolved)
    return {next(iter(b)) for b in blocks}


def case(sparse, kind):
    """Low-rank X (with zeros, for a sparse X), its groups, and a mask of the given kind."""
    return (*low_rank(density=0.6 if sparse else None), make_mask(kind))


LOSSES = pytest.mark.parametrize("loss", ["frobenius", "kullback-leibler"])
LAYOUTS = pytest.mark.parametrize("sparse", [False, True])
KINDS = pytest.mark.parametrize("kind", ["complement", "observed", "mixed"])


# ------------------------------------------------------------------ the updates against the transcription
@LOSSES
@LAYOUTS
@KINDS
def test_masked_mu_matches_numpy_transcription(loss, sparse, kind):
    X, groups, M = case(sparse, kind)
    expected = {"complement": {COMPLEMENT}, "observed": {OBSERVED}, "mixed": {COMPLEMENT, OBSERVED}}[kind]
    assert forms(X, groups, M) == expected
    W0, H0 = start()
    model = NMF(RANK, beta_loss=loss, init="custom", max_iter=6, tol=0, block_rows=10)
    W = model.fit_transform(sp.csr_matrix(X) if sparse else X, groups=groups, mask=M, W=W0, H=H0)
    W_ref, H_ref = weighted_mu(X, M, W0, H0, 6, kl=loss != "frobenius")
    np.testing.assert_allclose(W, W_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(model.components_, H_ref, rtol=1e-10, atol=1e-12)
    # the objective is the loss over observed entries, per group
    loss_fn = masked_kl if loss != "frobenius" else (lambda *a: 0.5 * masked_frobenius(*a))
    for g, name in enumerate(model.group_names_):
        rows = groups == name
        np.testing.assert_allclose(model.group_losses_[g], loss_fn(X[rows], M[rows], W[rows], model.components_),
                                   rtol=1e-9)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_fused_complement_step_on_a_block_of_many_tiles_matches_the_transcription(dtype):
    """A dense block of several tiles and chunks (run on BLAS's threads), 10% missing with values left in X there
    and some weights 1/2: the fused complement step's W_b and statistics (at pass 0 and after the update) equal
    the weighted MU transcription with a dense M."""
    from distfact.kernels.nmf import PARALLEL_WORK, _tile_rows
    from distfact.methods.nmf import NMFMethod
    from distfact.store.masks import block_form

    rng = np.random.default_rng(7)
    m, n, r = 2000, 300, 8
    assert m * n * r >= PARALLEL_WORK and m > 2 * _tile_rows(np.empty((1, n), dtype))
    X = (rng.random((m, r)) @ rng.random((r, n)) + 0.1 * rng.random((m, n))).astype(dtype)
    M = np.where(rng.random((m, n)) < 0.1, 0.0, np.where(rng.random((m, n)) < 0.03, 0.5, 1.0))
    form, P = block_form(M, np.arange(m))
    assert form == COMPLEMENT
    W, H = (rng.random((m, r)) + 0.1).astype(dtype), (rng.random((r, n)) + 0.1).astype(dtype)
    method = NMFMethod(r, tol=0, dtype=np.dtype(dtype).name)
    G = method.with_derived(H, scale=1.0)
    X64, W64, H64 = (A.astype(np.float64) for A in (X, W, H))
    MX = M * np.where(M == 0, 0.0, X64)
    W_ref = W64 * (MX @ H64.T) / np.maximum((M * (W64 @ H64)) @ H64.T, np.finfo(dtype).eps)
    rtol = 1e-10 if dtype == np.float64 else 2e-4
    for stats, W_at in ((method.block_stats(X, {form: P, "W": W}, None, G), W64),
                        (method.local_step(X, {form: P, "W": W}, None, G)[1], W_ref)):
        np.testing.assert_allclose(stats["WtX"], W_at.T @ MX, rtol=rtol)
        np.testing.assert_allclose(stats["WtW"] @ H64 + stats["WtMWH_adj"], W_at.T @ (M * (W_at @ H64)), rtol=rtol)
        np.testing.assert_allclose(stats["Mxx"], np.sum(MX * np.where(M == 0, 0.0, X64)), rtol=1e-10)
        if dtype == np.float32:
            np.testing.assert_allclose(stats["sq_err"], np.sum(M * (np.where(M == 0, 0.0, X64) - W_at @ H64) ** 2),
                                       rtol=rtol)
    local, _ = method.local_step(X, {form: P, "W": W}, None, G)
    np.testing.assert_allclose(local["W"], W_ref, rtol=rtol)
    np.testing.assert_allclose(local["X_sums"], [np.sum(np.where(M == 0, 0.0, X64) ** 2),
                                                 np.sum(np.where(M == 0, 0.0, X64))], rtol=1e-10)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_products_on_a_pattern_are_scipys_bit_for_bit(dtype):
    """``pattern_times_ht`` and ``wt_times_pattern`` (the masked kernels' Z H^T and W^T Z, Z on a mask's pattern,
    without building Z) give the bits of scipy's products of the CSR matrix they stand for: any shape, empty rows,
    unsorted column indices, rank 1 to 24."""
    from distfact.kernels.products import pattern_times_ht, wt_times_pattern

    rng = np.random.default_rng(5)
    for case in range(60):
        m, n, r = rng.integers(1, 120), rng.integers(1, 80), rng.integers(1, 25)
        P = sp.random(m, n, density=rng.uniform(0, 0.5), format="csr", random_state=case, dtype=dtype)
        if case % 3 == 0:
            P = P[:, rng.permutation(n)]  # column indices out of order within rows
        values = rng.random(P.nnz).astype(dtype)
        W, H = rng.random((m, r)).astype(dtype), rng.random((r, n)).astype(dtype)
        Z = sp.csr_matrix((values, P.indices, P.indptr), shape=P.shape)
        for ours, scipys in [(pattern_times_ht(P, values, H), Z @ H.T), (wt_times_pattern(W, P, values), (Z.T @ W).T)]:
            assert ours.dtype == scipys.dtype and np.array_equal(ours, scipys), (case, m, n, r)


def test_sparse_mask_and_its_complement_give_one_fit():
    """The same weights as a dense array, a sparse matrix, and (for 'nan') the complement form agree."""
    X, groups = low_rank()
    M = make_mask("mixed")
    W0, H0 = start()
    fits = [NMF(RANK, init="custom", max_iter=4, tol=0, block_rows=10).fit(X, groups=groups, mask=mask, W=W0, H=H0)
            for mask in (M, sp.csr_matrix(M))]
    np.testing.assert_array_equal(fits[0].components_, fits[1].components_)
    X_nan = np.where(M == 0, np.nan, X)
    by_nan = NMF(RANK, init="custom", max_iter=4, tol=0, block_rows=10).fit(X_nan, groups=groups, mask="nan",
                                                                         W=W0, H=H0)
    np.testing.assert_array_equal(by_nan.components_, fits[0].components_)


# ------------------------------------------------------------------ invariances
@LOSSES
@LAYOUTS
def test_all_ones_mask_is_bitwise_the_unmasked_fit(loss, sparse):
    X, groups = low_rank(density=0.5 if sparse else None)
    X = sp.csr_matrix(X) if sparse else X
    plain = NMF(RANK, beta_loss=loss, max_iter=8, random_state=0, block_rows=20).fit(X, groups=groups)
    for ones in (np.ones(X.shape), sp.csr_matrix(np.ones(X.shape)), np.ones(X.shape, dtype=bool)):
        masked = NMF(RANK, beta_loss=loss, max_iter=8, random_state=0, block_rows=20).fit(X, groups=groups, mask=ones)
        np.testing.assert_array_equal(masked.components_, plain.components_)
        np.testing.assert_array_equal(masked.objective_history_, plain.objective_history_)
        np.testing.assert_array_equal(masked.group_errors_, plain.group_errors_)


@LOSSES
@LAYOUTS
@KINDS
def test_values_at_missing_entries_never_change_the_fit(loss, sparse, kind):
    X, groups, M = case(sparse, kind)
    rng = np.random.default_rng(5)
    noisy = np.where(M == 0, rng.random(X.shape) * 10, X)

    def fit(values, mask):
        values = sp.csr_matrix(values) if sparse else values
        model = NMF(RANK, beta_loss=loss, max_iter=6, tol=0, random_state=3, block_rows=10)
        return model.fit_transform(values, groups=groups, mask=mask), model

    W, model = fit(X, M)
    W_noisy, model_noisy = fit(noisy, M)
    np.testing.assert_array_equal(W, W_noisy)
    np.testing.assert_array_equal(model.components_, model_noisy.components_)
    np.testing.assert_array_equal(model.objective_history_, model_noisy.objective_history_)
    if not sparse:  # NaN at the missing entries, with mask="nan"
        W_nan, model_nan = fit(np.where(M == 0, np.nan, X), "nan")
        if kind == "complement":  # 0/1 weights: the same mask
            np.testing.assert_array_equal(model_nan.components_, model.components_)
        np.testing.assert_array_equal(W_nan, fit(np.where(M == 0, rng.random(X.shape), X), M > 0)[0])


ESTIMATORS_GATHERING = {  # the masked steps that read X_b at the mask's entries (kernels/masked.py: BlockTerms)
    "NMF HALS": lambda k: NMF(RANK, solver="hals", max_iter=k, tol=0, random_state=0, block_rows=10),
    "NMF KL": lambda k: NMF(RANK, beta_loss="kullback-leibler", max_iter=k, tol=0, random_state=0, block_rows=10),
    "NMF MU": lambda k: NMF(RANK, max_iter=k, tol=0, random_state=0, block_rows=10),
    "Stratified-NMF": lambda k: distfact.StratifiedNMF(RANK, max_iter=k, tol=0, random_state=0, block_rows=10),
    "Fairer-NMF": lambda k: distfact.FairerNMF(RANK, max_iter=k, estimate_max_iter=k, n_estimates=2, tol=0,
                                               estimate_tol=0, random_state=0, block_rows=10),
    "SSNMF": lambda k: distfact.SSNMF(RANK, max_iter=k, tol=0, random_state=0, block_rows=10),
}


GATHERING_CASES = [(name, kind) for name in ESTIMATORS_GATHERING for kind in ("complement", "observed")]


@pytest.mark.parametrize("name, kind", GATHERING_CASES)
@LAYOUTS
def test_masked_steps_gather_x_at_the_mask_once_per_block(name, kind, sparse, monkeypatch):
    """X_b's values at its mask's entries are a block's constants: its local state keeps them from its first step
    on (kernels/masked.py: KEPT_VALUES, BlockTerms.constants), so the gathers of a fit do not grow with its
    iterations (they were one per block and pass, a tenth of a masked step, issue 19; NMF's fused MU step on a
    dense complement reads them in its tiles, never here, and must stay so). The results of these fits are checked
    elsewhere (the transcriptions above, test_masks_groups.py, test_ssnmf.py); kept and gathered steps are compared
    bitwise in test_ssnmf_masks.py. Every fit here gathers through ``values_at`` (SSNMF's observed form gathered
    otherwise before, every step, and passed uncounted), at least its blocks' first steps or its start."""
    import distfact.kernels.masked as km

    calls = []
    gather = km.values_at
    monkeypatch.setattr(km, "values_at", lambda P, X: calls.append(P.nnz) or gather(P, X))
    X, groups, M = case(sparse, kind)
    X = sp.csr_matrix(X) if sparse else X
    counts = []
    for iterations in (3, 9):
        calls.clear()
        ESTIMATORS_GATHERING[name](iterations).fit(X, groups=groups, mask=M)
        counts.append(len(calls))
    assert counts[0] == counts[1], counts
    assert counts[0] > 0, "no gather counted: the fit read X_b at the mask some other way, which this cannot see"


def test_kept_values_that_cannot_be_the_blocks_are_refused():
    """Kept values are valid for the X_b they came from only (kernels/masked.py: KEPT_VALUES): values of another
    count than the mask's entries, zeroed entries that a sparse X_b does not store, or positions that are not the
    mask's entries (a dense X_b), raise a ValueError saying the local state is not this block's, never a step that
    zeroes some other entry of X_b."""
    import distfact.kernels.masked as km

    X, _, M = case(True, "complement")
    X, P = sp.csr_matrix(X), sp.csr_matrix(1.0 - M)
    x_name, zeroed_name = km.KEPT_VALUES
    local = {COMPLEMENT: P, x_name: np.zeros(P.nnz - 1), zeroed_name: np.zeros(0, np.int64)}
    with pytest.raises(ValueError, match="number .* its mask's entries .*not this block's"):
        km.kept_constants(local)
    absent = np.flatnonzero(km.positions_at(P, X) < 0)[:1]  # an entry of P where X_b stores nothing
    assert len(absent) == 1
    with pytest.raises(ValueError, match="not stored in its X_b"):
        km.observed_block(X, COMPLEMENT, P, (np.zeros(P.nnz), absent))
    dense = X.toarray()
    for beyond in ([P.nnz], [-1], [0, P.nnz + 5]):  # positions that are not P's entries: nothing is written
        with pytest.raises(ValueError, match="not among its mask's entries: the values are not this block's"):
            km.observed_block(dense, COMPLEMENT, P, (np.zeros(P.nnz), np.array(beyond)))
    assert np.array_equal(dense, X.toarray())


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_dense_blocks_missing_entries_are_zeroed_as_numpys_fancy_assignment_zeroes_them(dtype):
    """``observed_block`` zeroes a dense X_b's kept zeroed entries in a compiled scan of P's rows (issue 19): the
    same array as numpy's assignment at (row, column) of each entry (rows by ``searchsorted``), for entries in
    ascending order as kept and in any order; X_b itself is not written."""
    import distfact.kernels.masked as km

    rng = np.random.default_rng(3)
    for trial in range(40):
        m, n = rng.integers(1, 40), rng.integers(1, 25)
        X = rng.random((m, n)).astype(dtype)
        P = sp.random(m, n, density=rng.uniform(0.05, 0.9), format="csr", random_state=trial)
        if P.nnz == 0:
            continue
        entries = np.flatnonzero(rng.random(P.nnz) < 0.5)
        for order in (entries, rng.permutation(entries)):
            expected = X.copy()
            expected[np.searchsorted(P.indptr, order, side="right") - 1, P.indices[order]] = 0
            before = X.copy()
            zeroed, _ = km.observed_block(X, COMPLEMENT, P, (np.zeros(P.nnz, dtype), order))
            assert zeroed.dtype == X.dtype and np.array_equal(zeroed, expected)
            assert np.array_equal(X, before)


@LOSSES
@LAYOUTS
@pytest.mark.parametrize("init", ["custom", "random"])
def test_a_mask_in_the_kernels_ignores_values_at_missing_entries(loss, sparse, init, tmp_path):
    """X that fit does not zero (a GroupedMatrix, a store on disk; one X serving models of different masks in
    fit_many) reaches the blocks as it is: the kernels zero it (a copy), and a random start's scale is the mean of
    X over the observed entries, so the fit is bitwise the fit on the zeroed X."""
    X, groups, M = case(sparse, "mixed")
    W0, H0 = start()
    fits = []
    for name, values in (("zeroed", np.where(M == 0, 0.0, X)), ("sevens", np.where(M == 0, 7.0, X))):
        values = sp.csr_matrix(values) if sparse else values
        data = as_grouped(values, groups, block_rows=10) if init == "custom" else distfact.from_arrays(
            values, groups, tmp_path / f"{name}.zarr", block_rows=10).path
        fits.append(NMF(RANK, beta_loss=loss, init=init, max_iter=5, tol=0, random_state=0).fit(
            data, mask=M, **({"W": W0, "H": H0} if init == "custom" else {})))
    np.testing.assert_array_equal(fits[0].components_, fits[1].components_)
    np.testing.assert_array_equal(fits[0].objective_history_, fits[1].objective_history_)


# ------------------------------------------------------------------ per-group errors over observed entries
@LOSSES
def test_per_group_errors_over_observed_entries(loss):
    X, groups = low_rank()
    M = make_mask("mixed")
    model = NMF(RANK, beta_loss=loss, max_iter=30, random_state=0, block_rows=16)
    W = model.fit_transform(X, groups=groups, mask=M)
    H = model.components_
    errors = model.group_metrics_.pivot(index="group", columns="metric", values="value")
    for name in model.group_names_:
        rows = groups == name
        expected = np.sqrt(masked_frobenius(X[rows], M[rows], W[rows], H) / np.sum(M[rows] * X[rows] ** 2))
        np.testing.assert_allclose(errors.loc[name, "relative_error"], expected, rtol=1e-9)
    total = masked_kl(X, M, W, H) if loss != "frobenius" else 0.5 * masked_frobenius(X, M, W, H)
    np.testing.assert_allclose(model.objective_history_[-1], total, rtol=1e-9)


def test_float32_errors_over_observed_entries():
    X, groups = low_rank()
    M = make_mask("mixed")
    model = NMF(RANK, max_iter=20, random_state=0, block_rows=16)
    W = model.fit_transform(X.astype(np.float32), groups=groups, mask=M)
    assert W.dtype == np.float32
    for g, name in enumerate(model.group_names_):
        rows = groups == name
        W64, H64 = W[rows].astype(np.float64), model.components_.astype(np.float64)
        expected = np.sqrt(masked_frobenius(X[rows].astype(np.float32).astype(np.float64), M[rows], W64, H64)
                           / np.sum(M[rows] * X[rows].astype(np.float32).astype(np.float64) ** 2))
        np.testing.assert_allclose(model.group_errors_[g], expected, rtol=1e-4)


# ------------------------------------------------------------------ resolution and forms
def test_block_forms_store_the_fewer_entries():
    X, groups = low_rank()
    M = make_mask("mixed")
    data = as_grouped(X, groups, block_rows=10)
    blocks, digest = block_masks(data, M)
    stored = data.row_index()
    for block, local in zip(data.blocks, blocks):
        (form, P), = local.items()
        D = M[stored[block.row_start:block.row_stop]]
        n_observed, n_complement = np.count_nonzero(D), np.count_nonzero(D != 1)
        assert form == (COMPLEMENT if n_complement <= n_observed else OBSERVED)
        np.testing.assert_array_equal(1 - P.toarray() if form == COMPLEMENT else P.toarray(), D)
    assert block_masks(data, sp.csr_matrix(M))[1] == digest  # the digest is the mask's, not its container's
    assert block_masks(data, M * 0.5)[1] != digest


def test_resolution():
    X, _ = low_rank()
    X_nan = X.copy()
    X_nan[3, 4] = np.nan
    values, mask = resolve_mask(X_nan, "nan")
    assert isinstance(mask, ComplementMask) and mask.matrix.nnz == 1 and values[3, 4] == 0 and np.isnan(X_nan[3, 4])
    assert resolve_mask(X, "nan") == (X, None)  # no NaN: no mask
    S = sp.csr_matrix(X * (X > 0.8))
    values, mask = resolve_mask(S, "nonzero")
    assert sp.issparse(values) and (mask != (S != 0)).nnz == 0
    frame = pd.DataFrame(X_nan, columns=[f"f{j}" for j in range(N_COLS)])
    values, mask = resolve_mask(frame, "nan")
    assert list(values.columns) == list(frame.columns) and values.iloc[3, 4] == 0


@pytest.mark.parametrize("X_kind, mask, message", [
    ("dense", np.ones((3, 3)), "has shape"),
    ("dense", -np.ones((M_ROWS, N_COLS)), "negative"),
    ("dense", np.full((M_ROWS, N_COLS), np.nan), "NaN"),
    ("dense", np.full((M_ROWS, N_COLS), np.inf), "infinite"),
    ("dense", "nonzero", "sparse X"),
    ("dense", "zeros", "one of"),
    ("store", "nan", "in memory"),
])
def test_clear_errors(X_kind, mask, message, tmp_path):
    from distfact import from_arrays

    X, groups = low_rank()
    target = X if X_kind == "dense" else from_arrays(X, groups, str(tmp_path / "store"))
    with pytest.raises(ValueError, match=message):
        NMF(RANK, max_iter=2).fit(target, groups=groups if X_kind == "dense" else None, mask=mask)


def test_nan_in_X_is_refused_unless_it_is_missing():
    X, groups = low_rank()
    X[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        NMF(RANK, max_iter=2).fit(X, groups=groups)
    M = np.ones(X.shape)
    M[1, 1] = 0  # a mask that leaves the NaN observed
    with pytest.raises(ValueError, match="NaN"):
        NMF(RANK, max_iter=2).fit(X, groups=groups, mask=M)
    M[0, 0] = 0
    NMF(RANK, max_iter=2).fit(X, groups=groups, mask=M)


@LAYOUTS
@KINDS
def test_masked_hals_matches_a_direct_transcription(sparse, kind):
    X, groups, M = case(sparse, kind)
    W0, H0 = start()
    model = NMF(RANK, solver="hals", init="custom", max_iter=5, tol=0, block_rows=10)
    W = model.fit_transform(sp.csr_matrix(X) if sparse else X, groups=groups, mask=M, W=W0, H=H0)
    W_ref, H_ref = weighted_hals(X, M, W0, H0, 5)
    np.testing.assert_allclose(W, W_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(model.components_, H_ref, rtol=1e-10, atol=1e-12)
    for g, name in enumerate(model.group_names_):
        rows = groups == name
        np.testing.assert_allclose(model.group_losses_[g], 0.5 * masked_frobenius(X[rows], M[rows], W[rows], H_ref),
                                   rtol=1e-9)


# ------------------------------------------------------------------ checkpoints and the cluster
def test_the_mask_is_in_the_checkpoint_configuration(tmp_path):
    X, groups = low_rank()
    M = make_mask("complement")
    directory = str(tmp_path / "run")
    NMF(RANK, max_iter=4, tol=0, random_state=0, checkpoint_dir=directory, checkpoint_every=2).fit(
        X, groups=groups, mask=M)
    full = NMF(RANK, max_iter=6, tol=0, random_state=0).fit(X, groups=groups, mask=M)
    iterations = []
    resumed = NMF(RANK, max_iter=6, tol=0, random_state=0, checkpoint_dir=directory, resume=True,
                  callback=lambda info: iterations.append(info.iteration))
    resumed.fit(X, groups=groups, mask=M)
    assert iterations == [5, 6]  # went on from iteration 4
    np.testing.assert_array_equal(resumed.components_, full.components_)
    other = M.copy()
    other[0, :3] = 1 - other[0, :3]
    with pytest.raises(ValueError, match="checkpoint"):  # checkpoints of another mask are not this fit's
        NMF(RANK, max_iter=6, tol=0, random_state=0, checkpoint_dir=directory, resume=True).fit(
            X, groups=groups, mask=other)


def test_local_cluster_gives_the_in_process_bits(local_cluster_client):
    X, groups = low_rank(density=0.7)
    M = make_mask("mixed")
    for loss in ("frobenius", "kullback-leibler"):
        fits = [NMF(RANK, beta_loss=loss, max_iter=5, tol=0, random_state=0, block_rows=16).fit(
            sp.csr_matrix(X), groups=groups, mask=M, client=client) for client in (None, local_cluster_client)]
        np.testing.assert_array_equal(fits[0].components_, fits[1].components_)
        np.testing.assert_array_equal(fits[0].objective_history_, fits[1].objective_history_)


# ------------------------------------------------------------------ transform and impute
def weighted_w_solve(X, M, H, W, n_iter):
    for _ in range(n_iter):
        W = W * ((M * X) @ H.T) / np.maximum((M * (W @ H)) @ H.T, EPS)
    return W


def test_masked_transform_matches_a_weighted_solve():
    X, groups = low_rank()
    M = make_mask("mixed")
    model = NMF(RANK, max_iter=40, random_state=0, tol=0).fit(X, groups=groups)
    W = model.transform(X, groups=groups, mask=M, max_iter=25)
    scale = np.sqrt(X.sum() / X.size / RANK)  # solve_local's start: the init scale of the new X
    W_ref = weighted_w_solve(np.where(M == 0, 0, X), M, model.components_, np.full((M_ROWS, RANK), scale), 25)
    np.testing.assert_allclose(W, W_ref, rtol=1e-10)


def test_impute_fills_only_missing_entries():
    X, groups = low_rank(seed=4)
    rng = np.random.default_rng(0)
    holes = rng.random(X.shape) < 0.1
    X_holes = np.where(holes, np.nan, X)
    model = NMF(RANK, max_iter=300, random_state=0, tol=1e-8).fit(X_holes, groups=groups, mask="nan")
    filled = model.impute(X_holes, groups=groups)
    assert not np.isnan(filled).any()
    np.testing.assert_array_equal(filled[~holes], X[~holes])  # observed entries untouched, bit for bit
    W = model.transform(X_holes, groups=groups, mask="nan")
    np.testing.assert_allclose(filled[holes], (W @ model.components_)[holes], rtol=1e-12)
    # a usable imputer on low-rank data: far better than the column means
    column_means = np.nanmean(X_holes, axis=0)
    assert np.abs(filled[holes] - X[holes]).mean() < 0.2 * np.abs(column_means[np.nonzero(holes)[1]] - X[holes]).mean()
    # a weight mask: entries of weight 0 are filled
    by_weights = model.impute(np.where(holes, 0.0, X), mask=~holes, groups=groups)
    np.testing.assert_allclose(by_weights, filled, rtol=1e-12)
    with pytest.raises(ValueError, match="dense"):
        model.impute(sp.csr_matrix(X), mask="nonzero", groups=groups)


def test_fit_many_takes_a_mask():
    """fit_many passes fit's mask to every model (issue 19's sweep): each model bitwise its fit alone."""
    from distfact import fit_many

    X, groups = low_rank()
    M = make_mask("mixed")
    models = fit_many(NMF(max_iter=4, tol=0, random_state=0, block_rows=10), np.where(M == 0, 0, X), groups=groups,
                      ranks=[2, 3], mask=M)
    for model in models:
        alone = NMF(model.n_components, max_iter=4, tol=0, random_state=0, block_rows=10).fit(X, groups=groups, mask=M)
        np.testing.assert_array_equal(model.components_, alone.components_)


def test_nndsvda_start_with_a_mask():
    X, groups = low_rank()
    M = make_mask("complement")
    model = NMF(RANK, init="nndsvda", max_iter=50, random_state=0).fit(X, groups=groups, mask=M)
    assert np.all(model.group_errors_ < 0.1)


def test_nonzero_is_the_stored_pattern():
    X, groups = low_rank(density=0.3)
    S = sp.csr_matrix(X)
    fits = [NMF(RANK, beta_loss="kullback-leibler", max_iter=5, tol=0, random_state=0, block_rows=16).fit(
        S, groups=groups, mask=mask) for mask in ("nonzero", (S != 0).astype(float))]
    np.testing.assert_array_equal(fits[0].components_, fits[1].components_)
    W0, H0 = start()
    model = NMF(RANK, init="custom", max_iter=4, tol=0, block_rows=16)
    W = model.fit_transform(S, groups=groups, mask="nonzero", W=W0, H=H0)
    np.testing.assert_allclose(W, weighted_mu(X, (X != 0) * 1.0, W0, H0, 4)[0], rtol=1e-10)
