"""Masks in the group-aware NMF methods (issue 20): Stratified-NMF and Fairer-NMF take fit(X, groups, mask=...),
their masked iterates against numpy transcriptions of the weighted updates, the invariances (all-ones mask, values
at missing entries), per-group errors over observed entries, checkpoints, a real LocalCluster, fit_many and
select_rank; the multigroup SVD refuses a mask."""

import numpy as np
import pytest
import scipy.sparse as sp

import distfact
from distfact import FairerNMF, MultigroupSVD, StratifiedNMF, fit_many, select_rank
from distfact.engine import InProcessExecutor, fit, initialise
from distfact.estimators.masks import block_masks, observed_group_sums, resolve_mask
from distfact.kernels.masked import COMPLEMENT, OBSERVED
from distfact.methods.fairer_nmf import GroupErrorEstimate
from distfact.store.coerce import as_grouped

EPS = np.finfo(np.float64).eps
M_ROWS, N_COLS, RANK, NAMES = 80, 14, 3, ("a", "b", "c")


# ------------------------------------------------------------------ oracles (numpy, dense M, explicit groups)
def masked_stratified(A, M, groups, W, H, v, n_iter, v_updates=2, eps=1e-9):
    """Algorithm 1 of Stratified-NMF with every product over the observed entries, line by line: line 5
    v <- v * (M o A)^T 1 / ((M^T 1) o v + (M o WH)^T 1 + eps), line 7 W <- W * (M o A) H^T / ((M o (WH + 1 v^T)) H^T
    + eps) (floored at machine epsilon), line 8 H <- H * sum W^T (M o A) / (sum W^T (M o (WH + 1 v^T)) + eps).
    Returns W, H, v and each stratum's sum m (a - v - wh)^2 after every iteration (the first at the start)."""
    W, H, v = W.copy(), H.copy(), v.copy()
    rows = [groups == name for name in NAMES]

    def objective():
        return np.array([np.sum(M[r] * (A[r] - v[i][None, :] - W[r] @ H) ** 2) for i, r in enumerate(rows)])

    history = [objective()]
    for _ in range(n_iter):
        for _ in range(v_updates):
            v = np.array([v[i] * (M[r] * A[r]).sum(0) / (M[r].sum(0) * v[i] + (M[r] * (W[r] @ H)).sum(0) + eps)
                          for i, r in enumerate(rows)])
        for i, r in enumerate(rows):
            W[r] = W[r] * ((M[r] * A[r]) @ H.T) / np.maximum((M[r] * (W[r] @ H + v[i][None, :])) @ H.T + eps, EPS)
        H = H * sum(W[r].T @ (M[r] * A[r]) for r in rows) / (
            sum(W[r].T @ (M[r] * (W[r] @ H + v[i][None, :])) for i, r in enumerate(rows)) + eps)
        history.append(objective())
    return W, H, v, np.array(history)


def masked_fairer_mu(A, M, groups, W, H, E, n_iter):
    """Algorithm 3 of Fairer-NMF (c_update='decaying') over the observed entries: errors ||M_l o (X_l - W_l H)||
    (sqrt(sum m (x - wh)^2)) relative to ||M_l o X_l|| (sqrt(sum m x^2)), line 10 weighted MU for H with
    w_l = (c_l / ||M_l o X_l||)^2, line 11 weighted MU for W."""
    W, H = W.copy(), H.copy()
    rows = [groups == name for name in NAMES]
    norms = [np.sqrt(np.sum(M[r] * A[r] ** 2)) for r in rows]
    c = np.zeros(len(rows))
    for _ in range(n_iter):
        losses = [(np.sqrt(np.sum(M[r] * (A[r] - W[r] @ H) ** 2)) - e) / nrm for r, e, nrm in zip(rows, E, norms)]
        c[int(np.argmax(losses))] += 1.0
        w = [(ci / nrm) ** 2 for ci, nrm in zip(c, norms)]
        H = H * sum(wl * W[r].T @ (M[r] * A[r]) for wl, r in zip(w, rows)) / np.maximum(
            sum(wl * W[r].T @ (M[r] * (W[r] @ H)) for wl, r in zip(w, rows)), EPS)
        W = W * ((M * A) @ H.T) / np.maximum((M * (W @ H)) @ H.T, EPS)
    return W, H, c


def weighted_mu(A, M, W, H, n_iter):
    """Weighted Lee-Seung MU (Frobenius), H first then W."""
    for _ in range(n_iter):
        H = H * (W.T @ (M * A)) / np.maximum(W.T @ (M * (W @ H)), EPS)
        W = W * ((M * A) @ H.T) / np.maximum((M * (W @ H)) @ H.T, EPS)
    return W, H


# ------------------------------------------------------------------ data
def data(seed=0, sparse=False, shift=True):
    """Low-rank X plus a shift per group (Stratified-NMF's model), rows of the groups interleaved."""
    rng = np.random.default_rng(seed)
    groups = rng.choice(list(NAMES), size=M_ROWS)
    X = rng.random((M_ROWS, RANK)) @ rng.random((RANK, N_COLS)) + 0.05 * rng.random((M_ROWS, N_COLS))
    if shift:
        X += np.stack([rng.random(N_COLS) for _ in NAMES])[np.searchsorted(NAMES, groups)]
    if sparse:
        X = X * (rng.random(X.shape) < 0.6)
    return X, groups


def make_mask(kind, seed=1):
    """'complement': 15% missing; 'observed': 25% observed, weights in (0.1, 2); 'mixed': alternate runs of 10
    rows of each (the blocks of one group hold both forms)."""
    rng = np.random.default_rng(seed)
    few_missing = (rng.random((M_ROWS, N_COLS)) > 0.15) * 1.0
    few_observed = (rng.random((M_ROWS, N_COLS)) < 0.25) * rng.uniform(0.1, 2.0, (M_ROWS, N_COLS))
    if kind == "complement":
        return few_missing
    if kind == "observed":
        return few_observed
    return np.where(((np.arange(M_ROWS) // 10) % 2 == 0)[:, None], few_missing, few_observed)


def forms(X, groups, mask, block_rows):
    values, resolved = resolve_mask(X, mask)
    blocks, _ = block_masks(as_grouped(values, groups, block_rows=block_rows), resolved)
    return {next(iter(b)) for b in blocks}


def given(X, sparse):
    return sp.csr_matrix(X) if sparse else X


FORMS = {"complement": {COMPLEMENT}, "observed": {OBSERVED}, "mixed": {COMPLEMENT, OBSERVED}}
LAYOUTS = pytest.mark.parametrize("sparse", [False, True])
KINDS = pytest.mark.parametrize("kind", list(FORMS))


def stratified(**params):
    return StratifiedNMF(RANK, **{"tol": None, "block_rows": 10, **params})


def fairer(**params):
    return FairerNMF(RANK, **{"n_estimates": 2, "estimate_max_iter": 15, "tol": 0, "block_rows": 10, "random_state": 3,
                              **params})


# ------------------------------------------------------------------ Stratified-NMF
@LAYOUTS
@KINDS
def test_masked_stratified_matches_a_transcription_of_the_weighted_algorithm_1(sparse, kind):
    X, groups = data(sparse=sparse)
    M = make_mask(kind)
    assert forms(X, groups, M, 10) == FORMS[kind]
    rng = np.random.default_rng(2)
    W0, H0, v0 = rng.random((M_ROWS, RANK)), rng.random((RANK, N_COLS)), rng.random((len(NAMES), N_COLS))
    model = stratified(init="custom", max_iter=6)
    W = model.fit_transform(given(X, sparse), groups=groups, mask=M, W=W0, H=H0, v=v0)
    W_ref, H_ref, v_ref, history = masked_stratified(np.where(M == 0, 0, X), M, groups, W0, H0, v0, 6)
    np.testing.assert_allclose(W, W_ref, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(model.components_, H_ref, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(model.strata_features_, v_ref, rtol=1e-10, atol=1e-13)
    # the objective (eq. 2 over observed entries) per stratum after every iteration, from the statistics
    np.testing.assert_allclose(model.group_loss_history_, history, rtol=1e-9)
    np.testing.assert_allclose(model.objective_history_, history.sum(axis=1), rtol=1e-9)


@LAYOUTS
def test_stratified_errors_over_observed_entries(sparse):
    X, groups = data(sparse=sparse)
    M = make_mask("mixed")
    model = stratified(max_iter=40, random_state=0)
    W = model.fit_transform(given(X, sparse), groups=groups, mask=M)
    H, v = model.components_, model.strata_features_
    observed = []
    for i, name in enumerate(model.strata_names_):
        r = groups == name
        sq = np.sum(M[r] * (X[r] - v[i][None, :] - W[r] @ H) ** 2)
        observed.append(np.sum(M[r] * X[r] ** 2))
        np.testing.assert_allclose(model.group_losses_[i], sq, rtol=1e-9)
        np.testing.assert_allclose(model.group_errors_[i], np.sqrt(sq / observed[-1]), rtol=1e-9)
    np.testing.assert_allclose(model.loss_history_[-1, 1], np.sqrt(model.group_losses_.sum() / sum(observed)),
                               rtol=1e-9)
    assert np.all(np.diff(model.objective_history_) <= 1e-12 * model.objective_history_[:-1])  # Theorem 2, weighted


# ------------------------------------------------------------------ Fairer-NMF
@LAYOUTS
@KINDS
def test_masked_fairer_mu_matches_a_transcription_of_the_weighted_algorithm_3(sparse, kind):
    X, groups = data(sparse=sparse, shift=False)
    M = make_mask(kind)
    assert forms(X, groups, M, 10) == FORMS[kind]
    start = fairer(max_iter=0)
    W0 = start.fit_transform(given(X, sparse), groups=groups, mask=M)
    model = fairer(max_iter=8)
    W = model.fit_transform(given(X, sparse), groups=groups, mask=M)
    np.testing.assert_array_equal(model.E_, start.E_)
    W_ref, H_ref, c_ref = masked_fairer_mu(np.where(M == 0, 0, X), M, groups, W0, start.components_, start.E_, 8)
    np.testing.assert_allclose(W, W_ref, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(model.components_, H_ref, rtol=1e-10, atol=1e-13)
    np.testing.assert_array_equal(model.c_, c_ref)
    # per-group errors over the observed entries, recomputed
    for g, name in enumerate(model.group_names_):
        r = groups == name
        norm = np.sqrt(np.sum(M[r] * X[r] ** 2))
        error = np.sqrt(np.sum(M[r] * (X[r] - W[r] @ model.components_) ** 2))
        np.testing.assert_allclose(model.group_errors_[g], error / norm, rtol=1e-9)
        np.testing.assert_allclose(model.group_losses_[g], (error - model.E_[g]) / norm, rtol=1e-9, atol=1e-12)
    metrics = model.group_metrics_.pivot(index="group", columns="metric", values="value")
    np.testing.assert_allclose(metrics.loc[list(model.group_names_), "relative_error"], model.group_errors_)


@LAYOUTS
def test_masked_group_error_runs_are_weighted_mu(sparse):
    """Algorithm 1 with a mask: every (group, run) is weighted MU on the group's rows from its own start, and its
    error is ||M_l o (X_l - W H)||."""
    X, groups = data(sparse=sparse, shift=False)
    M = make_mask("mixed")
    grouped = distfact.from_arrays(given(X, sparse), groups, block_rows=10)
    blocks, _ = block_masks(grouped, M)
    totals, sq_norms = observed_group_sums(grouped, blocks)
    method = GroupErrorEstimate(2, n_estimates=2, tol=0, group_totals=tuple(totals), group_sq_norms=tuple(sq_norms))
    with InProcessExecutor(grouped, n_threads=1) as executor:
        start = fit(method, grouped, executor, max_iter=0,
                    start=lambda: initialise(method, grouped, executor, 7, blocks))
        W0 = {(g, t): np.concatenate([executor.locals[b.index]["W"][t] for b in grouped.blocks if b.group == g])
              for g in range(3) for t in range(2)}
    H0 = start.global_state["H"]
    with InProcessExecutor(grouped, n_threads=2) as executor:
        state = fit(method, grouped, executor, max_iter=12,
                    start=lambda: initialise(method, grouped, executor, 7, blocks))
    runs = method.errors(state.global_state, state.stats, grouped)
    order = grouped.row_index()
    for g in range(3):
        rows = order[grouped.meta.groups[g].row_start:grouped.meta.groups[g].row_stop]
        Xg, Mg = np.where(M == 0, 0, X)[rows], M[rows]
        np.testing.assert_allclose(sq_norms[g], np.sum(Mg * Xg ** 2), rtol=1e-12)
        for t in range(2):
            W_ref, H_ref = weighted_mu(Xg, Mg, W0[g, t], H0[g, t], 12)
            assert runs[g, t] == pytest.approx(np.sqrt(np.sum(Mg * (Xg - W_ref @ H_ref) ** 2)), rel=1e-10)


def test_fairer_am_and_all_zero_observed_groups_refuse_a_mask():
    X, groups = data(shift=False)
    M = make_mask("complement")
    with pytest.raises(ValueError, match=r"solver='am'\) takes no mask"):
        fairer(solver="am", max_iter=2).fit(X, groups=groups, mask=M)
    M[groups == "b"] = 0.0
    with pytest.raises(ValueError, match="'b' is all zeros at its observed entries"):
        fairer(max_iter=2).fit(X, groups=groups, mask=M)


# ------------------------------------------------------------------ invariances (both estimators)
ESTIMATORS = pytest.mark.parametrize("make", [lambda: stratified(max_iter=6, random_state=0),
                                              lambda: fairer(max_iter=6)], ids=["stratified", "fairer"])


def assert_same_fit(a, b):
    np.testing.assert_array_equal(a.components_, b.components_)
    np.testing.assert_array_equal(a.objective_history_, b.objective_history_)
    np.testing.assert_array_equal(a.group_errors_, b.group_errors_)


@ESTIMATORS
@LAYOUTS
def test_all_ones_mask_is_bitwise_the_unmasked_fit(make, sparse):
    X, groups = data(sparse=sparse)
    X = given(X, sparse)
    plain = make().fit(X, groups=groups)
    for ones in (np.ones(X.shape), sp.csr_matrix(np.ones(X.shape)), np.ones(X.shape, dtype=bool)):
        assert_same_fit(make().fit(X, groups=groups, mask=ones), plain)


@ESTIMATORS
@LAYOUTS
@KINDS
def test_values_at_missing_entries_never_change_the_fit(make, sparse, kind):
    X, groups = data(sparse=sparse)
    M = make_mask(kind)
    noisy = np.where(M == 0, np.random.default_rng(5).random(X.shape) * 10, X)
    fits = [make() for _ in range(2)]
    Ws = [model.fit_transform(given(values, sparse), groups=groups, mask=M) for model, values in zip(fits, (X, noisy))]
    np.testing.assert_array_equal(Ws[0], Ws[1])
    assert_same_fit(*fits)
    if not sparse and kind == "complement":  # NaN at the missing entries with mask="nan": the same 0/1 mask
        by_nan = make()
        np.testing.assert_array_equal(by_nan.fit_transform(np.where(M == 0, np.nan, X), groups=groups, mask="nan"),
                                      Ws[0])
        assert_same_fit(by_nan, fits[0])


@ESTIMATORS
def test_unzeroed_X_in_a_store_gives_the_zeroed_fit(make, tmp_path):
    """A store is not zeroed by fit: the kernels zero its blocks, and the random starts' scales are taken over the
    observed entries, so the fit is bitwise the one on X zeroed at its missing entries."""
    X, groups = data()
    M = make_mask("mixed")
    fits = [make().fit(distfact.from_arrays(values, groups, tmp_path / f"{k}.zarr", block_rows=10).path, mask=M)
            for k, values in enumerate((np.where(M == 0, 0.0, X), np.where(M == 0, 7.0, X)))]
    assert_same_fit(*fits)


# ------------------------------------------------------------------ checkpoints, the cluster
@pytest.mark.parametrize("make, phases", [(lambda **p: stratified(max_iter=6, random_state=0, **p), [""]),
                                          (lambda **p: fairer(max_iter=6, **p), ["estimate", "scheme"])],
                         ids=["stratified", "fairer"])
def test_the_mask_digest_is_in_the_checkpoint_configuration(make, phases, tmp_path):
    import json

    X, groups = data()
    M = make_mask("complement")
    directory = tmp_path / "run"
    full = make().fit(X, groups=groups, mask=M)
    make(checkpoint_dir=str(directory), checkpoint_every=2).fit(X, groups=groups, mask=M)
    digest = block_masks(as_grouped(X, groups, block_rows=10), resolve_mask(X, M)[1])[1]
    for phase in phases:
        newest = sorted((directory / phase / "checkpoints").glob("iter-*"))[-1]
        assert json.loads((newest / "config.json").read_text())["config"]["mask"] == digest
    resumed = make(checkpoint_dir=str(directory), resume=True).fit(X, groups=groups, mask=M)
    assert_same_fit(resumed, full)
    other = M.copy()
    other[0, :3] = 1 - other[0, :3]
    with pytest.raises(ValueError, match="checkpoint"):  # checkpoints of another mask are not this fit's
        make(checkpoint_dir=str(directory), resume=True).fit(X, groups=groups, mask=other)


def test_local_cluster_gives_the_in_process_bits(local_cluster_client):
    X, groups = data(sparse=True)
    M = make_mask("mixed")
    for make in (lambda: stratified(max_iter=5, random_state=0, block_rows=16),
                 lambda: fairer(max_iter=5, block_rows=16)):
        fits = [make().fit(sp.csr_matrix(X), groups=groups, mask=M, client=client)
                for client in (None, local_cluster_client)]
        assert_same_fit(*fits)


# ------------------------------------------------------------------ fit_many, select_rank
@ESTIMATORS
def test_fit_many_with_a_mask_per_model(make):
    """Each model's mask reaches it alone (fit_many(masks=...)): every model bitwise its fit alone, on one X
    that is not zeroed at any model's missing entries."""
    X, groups = data()
    masks = [make_mask("complement", seed=1), make_mask("mixed", seed=4)]
    template = make()
    models = fit_many(template, X, groups=groups, ranks=[2, 3], masks=masks)
    for k, model in enumerate(models):
        alone = type(template)(**{**template.get_params(), "n_components": model.n_components}).fit(
            X, groups=groups, mask=masks[k // 2])
        assert_same_fit(model, alone)


def test_select_rank_with_fairer_nmf():
    X, groups = data(shift=False)
    result = select_rank(fairer(max_iter=5), X, groups=groups, ranks=[1, 2, 3], n_splits=2, holdout=0.1,
                         random_state=0)
    assert sorted(result.table["rank"].unique()) == [1, 2, 3] and result.rank_ in (1, 2, 3)
    assert np.isfinite(result.table["heldout_error"]).all()


# ------------------------------------------------------------------ the multigroup SVD refuses a mask
def test_multigroup_svd_refuses_a_mask():
    X, groups = data()
    M = make_mask("complement")
    for call in (lambda: MultigroupSVD(2).fit(X, groups=groups, mask=M),
                 lambda: MultigroupSVD(2).fit_transform(X, groups=groups, mask=M),
                 lambda: MultigroupSVD(2).fit(np.where(M == 0, np.nan, X), groups=groups, mask="nan"),
                 lambda: select_rank(MultigroupSVD(2), X, groups=groups, ranks=[1, 2], random_state=0)):
        with pytest.raises(ValueError, match="multigroup SVD takes no mask"):
            call()
    with pytest.raises(ValueError, match="shared passes"):
        fit_many(MultigroupSVD(2), X, groups=groups, ranks=[1, 2], masks=[M])
    MultigroupSVD(2).fit(X, groups=groups, mask=None)  # None is no mask
