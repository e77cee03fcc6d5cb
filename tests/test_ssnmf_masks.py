"""SSNMF's ``mask`` in the three forms every NMF-family method takes (issue 20, docs/masks.md), and a store's own mask.

Oracles: a second code path (the weight array that "nan" and "nonzero" stand for, whose masked updates
tests/test_ssnmf.py checks against the reference package's in both sparse forms of kernels/masked.py: each block's
mask takes the form storing fewer entries, the complement for few missing entries, whether given as "nan", as
weights or stored); for the metrics, a numpy recomputation
over the observed entries from the fitted W and H; for a store's own mask, the in-memory fit with the same mask cut
into the same blocks."""

import tracemalloc

import numpy as np
import pytest
import scipy.sparse as sp

import distfact
from distfact import SSNMF, SSNMFClassifier
from distfact.kernels.masked import COMPLEMENT, KEPT_VALUES, OBSERVED
from distfact.methods.ssnmf import SSNMFMethod
from distfact.store.coerce import as_grouped
from test_store_masks import BLOCK_ROWS, weights, with_holes
from test_store_masks_groups import stored_and_given_once_each

MODELS = ["F", "D", "FF", "FD", "DF", "DD"]


def problem(layout="dense", seed=0):
    """X with NaN holes (scattered groups), the weights they stand for (0 at a NaN), class labels."""
    X, groups = with_holes(layout, seed=seed)
    holes = np.isnan(X.toarray() if sp.issparse(X) else X)
    y = np.random.default_rng(seed).integers(0, 3, X.shape[0])
    return X, groups, np.where(holes, 0.0, 1.0), y


def estimator(model, **params):
    """SSNMF with labels (model 'XY') or plain masked NMF (model 'F' or 'D': model[0] without targets)."""
    return SSNMF(3, model=model if len(model) == 2 else model + "F", lam=0.5, max_iter=6, tol=0, random_state=1,
                 block_rows=BLOCK_ROWS, **params)


def fitted(model, X, groups, y, **fit_args):
    est = estimator(model)
    W = est.fit_transform(X, y=y if len(model) == 2 else None, groups=groups, **fit_args)
    return est, W


def assert_same(ours, theirs):
    (a, W_a), (b, W_b) = ours, theirs
    np.testing.assert_array_equal(W_a, W_b)
    for name in ("components_", "B_", "objective_history_", "loss_history_", "group_loss_parts_", "group_errors_"):
        if getattr(b, name) is None:
            assert getattr(a, name) is None, name
        else:
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    np.testing.assert_array_equal(a.group_metrics_["value"], b.group_metrics_["value"])


def assert_close(ours, theirs, rtol=1e-10):
    """As :func:`assert_same`, to ``rtol`` relative (the same sums, which two code paths may add in another
    order)."""
    (a, W_a), (b, W_b) = ours, theirs
    np.testing.assert_allclose(W_a, W_b, rtol=rtol)
    for name in ("components_", "B_", "objective_history_", "loss_history_", "group_loss_parts_", "group_errors_"):
        if getattr(b, name) is None:
            assert getattr(a, name) is None, name
        else:
            np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=rtol, err_msg=name)
    np.testing.assert_allclose(a.group_metrics_["value"], b.group_metrics_["value"], rtol=rtol)


def with_values_at(X, missing, seed):
    """X (dense or CSR) with random positive values at the ``missing`` entries (NaN there replaced)."""
    values = np.random.default_rng(seed).random(X.shape) + 0.5
    if sp.issparse(X):
        X = sp.csr_matrix(X, copy=True)
        rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
        X.data = np.where(missing[rows, X.indices], values[rows, X.indices], X.data)
        return X
    return np.where(missing, values, X)


@pytest.mark.parametrize("layout", ["dense", "csr"])
@pytest.mark.parametrize("model", MODELS)
def test_nan_is_the_weight_array_with_zeros_at_the_nan_entries(model, layout):
    """"nan" (1 at the NaN entries in the complement form) fits as the weight array with 0 there, whatever X
    holds at those entries."""
    X, groups, M, y = problem(layout, seed=1)
    ours = fitted(model, X, groups, y, mask="nan")
    for seed in (0, 1):  # whatever value stands at a NaN entry
        theirs = fitted(model, with_values_at(X, M == 0, seed), groups, y, mask=M)
        assert_close(ours, theirs)
    assert np.isfinite(ours[1]).all() and np.isfinite(ours[0].group_errors_).all()


def few_weights_not_one(shape, seed):
    """Weights 1 but at about 8% of the entries 0 and 8% 0.5: every block in the complement form."""
    u = np.random.default_rng(seed).random(shape)
    return np.where(u < 0.08, 0.0, np.where(u < 0.16, 0.5, 1.0))


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """The masked stores of test_store_masks_groups.py, each written once for the module."""
    return stored_and_given_once_each(tmp_path_factory)


@pytest.fixture(scope="module")
def few_weights_stores(tmp_path_factory):
    """Per layout, X, its groups and labels, weights 0 and 0.5 at few entries, and the store of X with that mask
    (written once for the module: 0.3-0.6 s a store; the fits only read it)."""
    out = {}
    for layout in ("dense", "csr"):
        X, groups, _, y = problem(layout, seed=9)
        X = sp.csr_matrix(np.nan_to_num(X.toarray())) if layout == "csr" else np.nan_to_num(X)
        M = few_weights_not_one(X.shape, seed=9)
        stored = distfact.from_arrays(X, groups, tmp_path_factory.mktemp(layout) / "x.zarr", block_rows=BLOCK_ROWS,
                                      mask=M)
        assert {b.mask.form for b in stored.blocks} == {"complement"}
        out[layout] = X, groups, y, M, stored.path
    return out


@pytest.mark.parametrize("layout", ["dense", "csr"])
@pytest.mark.parametrize("model", MODELS)
def test_a_stored_mask_of_weights_0_and_one_half_fits_as_the_array(few_weights_stores, model, layout):
    """A store's mask of weights 0 and 0.5 at few entries (its blocks in the complement form, 1 - weight written
    at ingest) fits as the same weights given as an array (1 - weight formed at fit)."""
    X, groups, y, M, path = few_weights_stores[layout]
    stored = distfact.open(path)  # opened afresh, as from_arrays returns it
    est = estimator(model)
    ours = est, est.fit_transform(stored, y=y if len(model) == 2 else None)
    assert_close(ours, fitted(model, X, groups, y, mask=M))


@pytest.mark.parametrize("held_out, form", [(0.1, COMPLEMENT), (0.9, OBSERVED)])
@pytest.mark.parametrize("layout", ["dense", "csr"])
def test_a_given_mask_takes_the_form_storing_fewer_entries(held_out, form, layout):
    """As every method's mask (estimators/masks.py: block_masks): a fold of cross-validation holding out 10% of
    the entries is each block's complement (those 10%), not a CSR matrix of the 90% observed (which the kernels'
    sparse path then swept whole, 9x slower on 2,000 x 300); a mask of few observed entries stays those entries.
    tests/test_ssnmf.py checks both forms' iterates against the paper's updates."""
    X, groups, _, y = problem("dense", seed=3)
    weights = (np.random.default_rng(3).random(X.shape) >= held_out).astype(float)
    data = as_grouped(np.nan_to_num(X), groups, block_rows=BLOCK_ROWS)
    mask = sp.csr_matrix(weights) if layout == "csr" else weights
    inputs = SSNMF(3)._local_inputs(data, None, y, mask, None)[0]
    assert [sorted(entry) for entry in inputs] == [sorted(["Y", form])] * data.n_blocks
    stored = data.row_index()
    for block, entry in zip(data.blocks, inputs):
        block_weights = weights[stored[block.row_start:block.row_stop]]
        P = entry[form]
        np.testing.assert_array_equal(P.toarray(), block_weights if form == OBSERVED else 1.0 - block_weights)
        assert P.nnz == np.count_nonzero(block_weights if form == OBSERVED else block_weights != 1.0)


@pytest.mark.parametrize("layout", ["dense", "csr"])
@pytest.mark.parametrize("model", MODELS)
def test_values_at_missing_entries_never_change_a_complement_block(model, layout):
    """The complement form reads X_b as 0 at its entries of weight 0, whatever X_b holds there: a block's local
    step (W_b and every statistic) is bitwise the same with random values there."""
    X, _, _, _ = problem(layout, seed=10)
    X = np.nan_to_num(X.toarray() if layout == "csr" else X)
    rng = np.random.default_rng(10)
    M = few_weights_not_one(X.shape, seed=10)
    P = sp.csr_matrix(1.0 - M)
    method = SSNMFMethod(3, model, lam=0.5)
    G = method.initial_global(X, rng, n_targets=2)
    local = {COMPLEMENT: P, "W": rng.random((X.shape[0], 3)), "Y": rng.random((X.shape[0], 2))}
    as_layout = sp.csr_matrix if layout == "csr" else np.asarray
    ours = method.local_step(as_layout(np.where(M == 0, 0.0, X)), local, None, G)
    theirs = method.local_step(as_layout(with_values_at(X, M == 0, 0)), local, None, G)
    for name in ("W", "X_sums"):
        np.testing.assert_array_equal(ours[0][name], theirs[0][name])
    assert ours[1].keys() == theirs[1].keys()
    for name in ours[1]:
        np.testing.assert_array_equal(ours[1][name], theirs[1][name], err_msg=name)


def few_observed(shape, seed):
    """Weights 0 but at about 10% of the entries 1 and 5% 0.5: every block in the observed form."""
    u = np.random.default_rng(seed).random(shape)
    return np.where(u < 0.1, 1.0, np.where(u < 0.15, 0.5, 0.0))


@pytest.mark.parametrize("layout", ["dense", "csr"])
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("form", [COMPLEMENT, OBSERVED])
def test_a_masked_blocks_kept_values_give_the_steps_of_gathering_them(form, model, layout, monkeypatch):
    """From its first step on, a masked block's local state keeps X_b's values at the mask's entries (and, for the
    complement, where X_b reads as 0) (kernels/masked.py: KEPT_VALUES; ``kernels/ssnmf.py: Complement``,
    ``Observed``; gathered again every step before, by every term's kernel for the observed form: issue 19): the next
    step is bitwise the one that gathers them, with X_b holding other values at its missing entries than at the
    first step, and it does not gather. The observed form's values, and M o X_b it forms from them, are numpy's
    gather and scipy's product."""
    import distfact.kernels.masked as km
    import distfact.kernels.ssnmf as ks

    X, _, _, _ = problem(layout, seed=11)
    X = np.nan_to_num(X.toarray() if layout == "csr" else X)
    rng = np.random.default_rng(11)
    M = few_weights_not_one(X.shape, seed=11) if form == COMPLEMENT else few_observed(X.shape, seed=11)
    P = sp.csr_matrix(1.0 - M if form == COMPLEMENT else M)
    method = SSNMFMethod(3, model, lam=0.5)
    G = method.initial_global(X, rng, n_targets=2)
    as_layout = sp.csr_matrix if layout == "csr" else np.asarray
    local = {form: P, "W": rng.random((X.shape[0], 3)), "Y": rng.random((X.shape[0], 2))}
    X_first = as_layout(with_values_at(X, M == 0, 0))
    first, _ = method.local_step(X_first, local, None, G)
    assert set(KEPT_VALUES) <= first.keys() and len(first["x_at_P"]) == P.nnz
    held = X_first.toarray() if layout == "csr" else X_first
    if form == COMPLEMENT:
        assert len(first["zeroed_at_P"]) == np.count_nonzero((M == 0) & (held != 0)) > 0
    else:
        rows = np.repeat(np.arange(P.shape[0]), np.diff(P.indptr))
        np.testing.assert_array_equal(first["x_at_P"], held[rows, P.indices])
        MX, m = ks.block_mask(X_first, first)[1].masked_x()
        expected = sp.csr_matrix(P.multiply(X_first))
        expected.eliminate_zeros()
        for ours, theirs in ((MX.indptr, expected.indptr), (MX.indices, expected.indices), (MX.data, expected.data),
                             (m, np.asarray(P[expected.nonzero()]).ravel())):
            np.testing.assert_array_equal(ours, theirs)
    X_next = as_layout(with_values_at(X, M == 0, 1))
    theirs = method.local_step(X_next, {name: v for name, v in first.items() if name not in KEPT_VALUES}, None, G)

    def no_gather(P, X):
        raise AssertionError("gathered X_b at the mask's entries although the local state keeps them")

    monkeypatch.setattr(km, "values_at", no_gather)
    ours = method.local_step(X_next, first, None, G)
    for name in KEPT_VALUES:
        np.testing.assert_array_equal(ours[0][name], theirs[0][name])
    np.testing.assert_array_equal(ours[0]["W"], theirs[0]["W"])
    assert ours[1].keys() == theirs[1].keys()
    for name in ours[1]:
        np.testing.assert_array_equal(ours[1][name], theirs[1][name], err_msg=name)


def test_a_nan_mask_on_a_sparse_x_allocates_nothing_of_x_shape():
    """A sparse 10,000 x 10,000 X (an m x n float64 array: 800 MB) with 20,000 stored entries, 5 of them NaN:
    fitting it with mask="nan" allocates (tracemalloc's peak) far less than the m x n array."""
    m = n = 10_000
    # drawn with a Generator: with a seed (numpy's legacy RandomState), scipy draws the 20,000 positions by
    # permuting all m * n = 10^8 of them (7 s, and 800 MB)
    X = sp.random(m, n, density=2e-4, random_state=np.random.default_rng(11), format="csr")
    X.data[np.random.default_rng(11).choice(X.nnz, 5, replace=False)] = np.nan
    for model, y in (("F", None), ("DF", np.arange(m) % 3)):
        est = SSNMF(3, model=model if y is not None else "FF", max_iter=2, tol=0, random_state=0)
        tracemalloc.start()
        try:
            est.fit(X, y=y, mask="nan")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < m * n * 8 / 20, f"{model}: peak {peak / 1e6:.0f} MB"
        assert np.isfinite(est.components_).all()


@pytest.mark.parametrize("model", MODELS)
def test_nonzero_is_the_weights_of_the_sparse_pattern(model):
    X, groups, _, y = problem("csr", seed=2)
    X = sp.csr_matrix(np.nan_to_num(X.toarray()))
    X.data[::5] = 0.0  # explicit zeros are stored entries: observed
    pattern = sp.csr_matrix((np.ones(X.nnz), X.indices, X.indptr), shape=X.shape)
    ours = fitted(model, X, groups, y, mask="nonzero")
    assert_same(ours, fitted(model, X, groups, y, mask=pattern))
    assert_same(ours, fitted(model, X, groups, y, mask=pattern.toarray()))  # dense weights: the same mask


@pytest.mark.parametrize("layout", ["dense", "csr"])
@pytest.mark.parametrize("model", ["D", "F", "DF", "FD"])
def test_values_at_missing_entries_never_change_the_factors(model, layout):
    X, groups, _, y = problem(layout, seed=3)
    X = np.nan_to_num(X.toarray()) if layout == "csr" else np.nan_to_num(X)
    M = weights(X.shape, seed=3)  # 0, 0.5, 0.7 and 1
    as_layout = sp.csr_matrix if layout == "csr" else np.asarray
    ours = fitted(model, as_layout(X), groups, y, mask=M)
    for seed in (0, 1):
        assert_same(ours, fitted(model, as_layout(with_values_at(X, M == 0, seed)), groups, y, mask=M))
    assert_same(ours, fitted(model, as_layout(X), groups, y, mask=sp.csr_matrix(M)))  # a sparse weight matrix


@pytest.mark.parametrize("model", ["F", "DF"])
def test_all_weights_one_is_the_unmasked_fit(model):
    X, groups, _, y = problem("dense", seed=4)
    X = np.nan_to_num(X)
    assert_same(fitted(model, X, groups, y, mask=np.ones(X.shape)), fitted(model, X, groups, y))


@pytest.mark.parametrize("model", ["F", "D", "FD", "DF"])
def test_metrics_are_over_the_observed_entries(model):
    """relative_error sqrt(sum m (x - wh)^2 / sum m x^2) per group (docs/metrics.md); group_errors_ the data term
    R_l relative to M o X_l (F: sqrt(R_l) / ||M o X_l||_F, D: R_l / sum(M o X_l)); recomputed with numpy."""
    X, groups, _, y = problem("dense", seed=5)
    M = weights(X.shape, seed=5)
    est, W = fitted(model, X, groups, y, mask=np.where(np.isnan(X), 0.0, M))
    M = np.where(np.isnan(X), 0.0, M)
    X = np.nan_to_num(X)
    WH = W @ est.components_
    metrics = est.group_metrics_.pivot(index="group", columns="metric", values="value")
    for name in est.group_names_:
        rows = groups == name
        m, x, wh = M[rows], X[rows], WH[rows]
        np.testing.assert_allclose(metrics.loc[name, "relative_error"],
                                   np.sqrt(np.sum(m * (x - wh) ** 2) / np.sum(m * x ** 2)), rtol=1e-10)
        term = metrics.loc[name, "reconstruction_term"]
        if model[0] == "F":
            np.testing.assert_allclose(term, np.sum((m * x - m * wh) ** 2), rtol=1e-8)
            expected = np.sqrt(term / np.sum((m * x) ** 2))
        else:
            mx, mwh = m * x, m * wh
            np.testing.assert_allclose(term, np.sum(mx * np.log((mx + 1e-10) / (mwh + 1e-10)) - mx + mwh), rtol=1e-8)
            expected = term / np.sum(mx)
            np.testing.assert_allclose(metrics.loc[name, "relative_i_divergence"], expected, rtol=1e-10)
        np.testing.assert_allclose(est.group_errors_[list(est.group_names_).index(name)], expected, rtol=1e-10)


def test_transform_takes_the_three_forms():
    X, groups, M, _ = problem("csr", seed=6)
    est = estimator("D").fit(X, groups=groups, mask="nan")
    W = est.transform(X, mask="nan", groups=groups)
    np.testing.assert_allclose(W, est.transform(with_values_at(X, M == 0, 0), mask=M, groups=groups), rtol=1e-10)
    X0 = sp.csr_matrix(np.nan_to_num(X.toarray()))
    pattern = sp.csr_matrix((np.ones(X0.nnz), X0.indices, X0.indptr), shape=X0.shape)
    np.testing.assert_array_equal(est.transform(X0, mask="nonzero", groups=groups),
                                  est.transform(X0, mask=pattern, groups=groups))


@pytest.mark.parametrize("mask, X_kind, message", [
    ("nonzero", "dense", "mask='nonzero' needs a sparse X"),
    ("zeros", "dense", "mask must be None, a weight array or sparse matrix of X's shape, or one of"),
    ("nan", "store", "mask='nan' needs X in memory"),
])
def test_bad_masks_are_refused_naming_what_to_do(tmp_path, mask, X_kind, message):
    X, groups, _, _ = problem("dense", seed=7)
    X = np.nan_to_num(X)
    data = distfact.from_arrays(X, groups, tmp_path / "x.zarr") if X_kind == "store" else X
    with pytest.raises(ValueError, match=message):
        estimator("F").fit(data, mask=mask, groups=None if X_kind == "store" else groups)
    with pytest.raises(ValueError, match="X has NaN"):  # NaN in X only with mask="nan"
        estimator("F").fit(problem("dense", seed=7)[0], groups=groups)


# ------------------------------------------------------------------ a store's own mask
@pytest.mark.parametrize("kind", ["nan", "weights"])
@pytest.mark.parametrize("layout", ["dense", "csr"])
@pytest.mark.parametrize("model", ["D", "FF", "DF"])
def test_a_stored_mask_fits_as_the_in_memory_mask(stores, model, layout, kind):
    """Bitwise for "nan" (the same complement blocks); weights: the store's blocks and the array's take the same
    forms (whichever stores fewer entries, blocks of both forms adding up), compared to 1e-10."""
    stored, X, groups, mask = stores(layout, kind)
    y = np.random.default_rng(0).integers(0, 3, X.shape[0])
    theirs = fitted(model, X, groups, y, mask=mask)
    for data in (stored, str(stored.path)):  # the store, and the store opened from its path
        est = estimator(model)
        ours = est, est.fit_transform(data, y=y if len(model) == 2 else None)
        (assert_same if kind == "nan" else assert_close)(ours, theirs)


def test_a_stored_mask_on_a_local_cluster_and_in_transform(stores, local_cluster_client):
    stored, X, groups, _ = stores("csr", "nan", seed=2)
    est = estimator("D")
    ours = est, est.fit_transform(stored, client=local_cluster_client)
    assert est.scheduler_["mode"] == "distributed"
    assert_same(ours, fitted("D", X, groups, None, mask="nan"))
    np.testing.assert_array_equal(est.transform(stored), est.transform(X, mask="nan", groups=groups))
    np.testing.assert_array_equal(est.transform(stored, client=local_cluster_client), est.transform(stored))


def test_fit_many_and_checkpoints_read_the_stored_mask(stores, tmp_path):
    stored, *_ = stores("csr", "weights", seed=7)
    for rank, model in zip([2, 3], distfact.fit_many(estimator("D"), stored, ranks=[2, 3])):
        alone = estimator("D").set_params(n_components=rank).fit(stored)
        np.testing.assert_array_equal(model.components_, alone.components_)
        np.testing.assert_array_equal(model.objective_history_, alone.objective_history_)
    whole = estimator("D").fit(stored)
    # a checkpoint at iteration 4 only (a save writes every block's local factors: tenths of a second)
    params = dict(checkpoint_dir=tmp_path / "run", checkpoint_every=4)
    SSNMF(3, model="DF", lam=0.5, max_iter=4, tol=0, random_state=1, **params).fit(stored)
    iterations = []
    resumed = SSNMF(3, model="DF", lam=0.5, max_iter=6, tol=0, random_state=1, resume=True,
                    callback=lambda info: iterations.append(info.iteration), **params).fit(stored)
    assert iterations == [5, 6]  # from the checkpoint of iteration 4
    np.testing.assert_array_equal(resumed.components_, whole.components_)


def test_another_mask_on_a_store_with_its_own_is_refused(stores):
    stored, X, *_ = stores("dense", "nan")
    with pytest.raises(ValueError, match=r"has its own mask \(kind 'nan'.*cannot take another"):
        estimator("D").fit(stored, mask=np.ones(X.shape) * 0.5)
    with pytest.raises(ValueError, match=r"has its own mask \(kind 'nan'.*cannot take another"):
        estimator("D").fit(stored, mask="nan")


# ------------------------------------------------------------------ the classifier
def test_the_classifier_fits_predicts_and_scores_with_a_mask():
    X, groups, M, y = problem("dense", seed=8)
    params = dict(model="DF", lam=0.5, max_iter=6, tol=0, random_state=1)
    ours = SSNMFClassifier(3, **params).fit(X, y, mask="nan")
    theirs = SSNMFClassifier(3, **params).fit(with_values_at(X, M == 0, 0), y, mask=M)
    np.testing.assert_allclose(ours.ssnmf_.B_, theirs.ssnmf_.B_, rtol=1e-10)  # "nan", and 0 weights there
    np.testing.assert_allclose(ours.predict_proba(X, mask="nan"), theirs.predict_proba(np.nan_to_num(X), mask=M),
                               rtol=1e-10)
    predicted = ours.predict(X, mask="nan")
    assert ours.score(X, y, mask="nan") == np.mean(predicted == y)
    np.testing.assert_array_equal(ours.fit_transform(X, y, mask="nan"), ours.transform(X, mask="nan"))
    with pytest.raises(ValueError, match="X has NaN"):
        ours.predict(X)
