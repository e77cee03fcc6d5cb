"""distfact.WeightedL1NMF with a mask (entry weights, issue 20): the masked iterates against the brute-force
coordinate-descent oracle (each coordinate's weighted L1 objective minimised by trying every breakpoint) in
both mask forms and mixed, weighted errors against numpy, the unmasked fit for all-ones weights, invariance
to X's values at masked entries, the checkpoint's mask identity, bad masks."""

import numpy as np
import pytest
import scipy.sparse as sp
import zarr

import distfact
from conftest import grouped_data
from distfact.estimators.masks import block_masks, resolve_mask
from distfact.kernels.masked import COMPLEMENT, OBSERVED
from oracles import wl1_dense_cd

M_ROWS, N_COLS, RANK = 36, 22, 3


def data(seed=0, m=M_ROWS, n=N_COLS, density=0.4):
    X, groups = grouped_data(m=m, n=n, n_groups=3, density=density, seed=seed)
    return sp.csr_matrix(X), groups


def few_masked(shape, seed):
    """Weights mostly 1: a tenth missing, a tenth fractional (the complement form)."""
    rng = np.random.default_rng(seed)
    M = np.ones(shape)
    u = rng.random(shape)
    M[u < 0.1] = 0.0
    fractional = (u >= 0.1) & (u < 0.2)
    M[fractional] = rng.random(int(fractional.sum()))
    return M


def few_observed(shape, seed):
    """Weights mostly 0: a quarter observed, with weights in (0, 2] (the observed form)."""
    rng = np.random.default_rng(seed)
    return np.where(rng.random(shape) < 0.25, rng.uniform(0.1, 2.0, shape), 0.0)


def mixed(shape, seed):
    """Few masked in the first half of the rows, few observed in the second: blocks of both forms, whose rows
    meet in every column of the H sweep."""
    M = few_masked(shape, seed)
    half = shape[0] // 2
    M[half:] = few_observed((shape[0] - half, shape[1]), seed + 1)
    return M


def custom_start(seed, m=M_ROWS, n=N_COLS):
    rng = np.random.default_rng(seed)
    return rng.random((m, RANK)), rng.random((RANK, n))


def forms_of(X, groups, M, block_rows):
    X, weights = resolve_mask(X, M)
    blocks, _ = block_masks(distfact.from_arrays(X, groups, block_rows=block_rows), weights)
    return {form for entry in blocks for form in entry}


@pytest.mark.parametrize("make_mask, forms", [(few_masked, {COMPLEMENT}), (few_observed, {OBSERVED}),
                                              (mixed, {COMPLEMENT, OBSERVED})])
@pytest.mark.parametrize("lam", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("dense", [False, True])
def test_masked_iterates_equal_brute_force_coordinate_descent(make_mask, forms, lam, dense):
    """Row blocks and column blocks on the engine = the brute-force weighted CD, Algorithm 6.2's order; X's
    values at weight-0 entries are random (the oracle weighs them 0 too)."""
    X, groups = data(seed=1)
    M = make_mask(X.shape, seed=2)
    Xd = X.toarray()
    Xd[M == 0] = np.random.default_rng(3).random(int((M == 0).sum())) * 5  # values that must not matter
    W0, H0 = custom_start(4)
    X_in = Xd if dense else sp.csr_matrix(Xd)
    assert forms_of(X_in, groups, M, 6) == forms
    model = distfact.WeightedL1NMF(RANK, lam=lam, init="custom", max_iter=4, tol=0, block_rows=6, column_blocks=4)
    W = model.fit_transform(X_in, groups=groups, mask=M, W=W0, H=H0)
    W_ref, H_ref, F_ref = wl1_dense_cd(Xd, W0, H0, lam, 4, M=M)
    np.testing.assert_allclose(W, W_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(model.components_, H_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(model.objective_history_, F_ref, rtol=1e-10)
    np.testing.assert_allclose(model.loss_history_, F_ref / (M * Xd).sum(), rtol=1e-10)
    assert model.n_passes_ == 1 + 2 * 4


def test_nonzero_and_nan_masks_equal_brute_force():
    """mask='nonzero': only X's stored entries count (the zeros' term vanishes, whatever lam); mask='nan':
    X's NaN entries weigh 0."""
    X, groups = data(seed=5)
    W0, H0 = custom_start(6)
    kwargs = dict(init="custom", max_iter=3, tol=0, block_rows=8, column_blocks=3)
    model = distfact.WeightedL1NMF(RANK, lam=0.5, **kwargs)
    W = model.fit_transform(X, groups=groups, mask="nonzero", W=W0, H=H0)
    W_ref, H_ref, F_ref = wl1_dense_cd(X.toarray(), W0, H0, 0.5, 3, M=(X.toarray() != 0).astype(float))
    np.testing.assert_allclose(W, W_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(model.components_, H_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(model.objective_history_, F_ref, rtol=1e-10)

    Xn = X.toarray()
    Xn[np.random.default_rng(7).random(Xn.shape) < 0.15] = np.nan
    for X_in in (Xn, sp.csr_matrix(Xn)):
        model = distfact.WeightedL1NMF(RANK, lam=0.2, **kwargs)
        W = model.fit_transform(X_in, groups=groups, mask="nan", W=W0, H=H0)
        M = (~np.isnan(Xn)).astype(float)
        W_ref, H_ref, _ = wl1_dense_cd(np.nan_to_num(Xn), W0, H0, 0.2, 3, M=M)
        np.testing.assert_allclose(W, W_ref, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(model.components_, H_ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dense", [False, True])
def test_all_ones_mask_is_bitwise_the_unmasked_fit(dense):
    X, groups = data(seed=8)
    X_in = X.toarray() if dense else X
    kwargs = dict(lam=0.2, max_iter=5, tol=0, random_state=3, hals_iter=3, block_rows=9)
    plain = distfact.WeightedL1NMF(RANK, **kwargs)
    W = plain.fit_transform(X_in, groups=groups)
    for mask in (np.ones(X.shape), sp.csr_matrix(np.ones(X.shape))):
        masked = distfact.WeightedL1NMF(RANK, **kwargs)
        assert np.array_equal(masked.fit_transform(X_in, groups=groups, mask=mask), W)
        assert np.array_equal(masked.components_, plain.components_)
        assert np.array_equal(masked.loss_history_, plain.loss_history_)
        assert masked.group_metrics_.equals(plain.group_metrics_)


@pytest.mark.parametrize("make_mask", [few_masked, few_observed, mixed])
@pytest.mark.parametrize("init", ["hals", "random"])
def test_values_at_masked_entries_never_change_the_factors(make_mask, init):
    X, groups = data(seed=9)
    M = make_mask(X.shape, seed=10)
    kwargs = dict(lam=0.1, init=init, max_iter=4, tol=0, random_state=5, hals_iter=2, block_rows=7, column_blocks=2)
    fits = []
    for seed in (11, 12):
        Xd = X.toarray()
        Xd[M == 0] = np.random.default_rng(seed).random(int((M == 0).sum())) * 10
        for X_in in (Xd, sp.csr_matrix(Xd)):
            model = distfact.WeightedL1NMF(RANK, **kwargs)
            fits.append((model.fit_transform(X_in, groups=groups, mask=M), model.components_, model.loss_history_))
    for other in fits[1:]:
        for ours, theirs in zip(fits[0], other):
            assert np.array_equal(ours, theirs)


@pytest.mark.parametrize("make_mask", [few_masked, few_observed, mixed])
def test_per_group_weighted_errors_equal_numpy(make_mask):
    X, groups = data(seed=13, m=60, n=30)
    M = make_mask(X.shape, seed=14)
    lam = 0.4
    model = distfact.WeightedL1NMF(4, lam=lam, max_iter=5, tol=0, hals_iter=2, random_state=0, block_rows=9)
    W = model.fit_transform(X, groups=groups, mask=M)
    Xd, H = X.toarray(), model.components_
    metrics = model.group_metrics_.set_index(["group", "metric"])["value"]
    for name, loss, error in zip(model.group_names_, model.group_losses_, model.group_errors_):
        rows = groups == name
        Xl, Ml, R = Xd[rows], M[rows], Xd[rows] - W[rows] @ H
        nz = Xl != 0
        objective = (Ml * np.abs(R))[nz].sum() + lam * (Ml * (W[rows] @ H))[~nz].sum()
        total = (Ml * Xl).sum()
        assert metrics[name, "objective"] == pytest.approx(objective, rel=1e-10)
        assert loss == pytest.approx(objective / total, rel=1e-10)
        assert error == pytest.approx((Ml * np.abs(R)).sum() / total, rel=1e-10)
        assert metrics[name, "relative_l1_error"] == error
        assert metrics[name, "relative_error"] == pytest.approx(
            np.sqrt((Ml * R ** 2).sum() / (Ml * Xl ** 2).sum()), rel=1e-9)
    assert model.reconstruction_err_ == pytest.approx((M * np.abs(Xd - W @ H)).sum(), rel=1e-10)


def test_checkpoints_carry_the_mask(tmp_path):
    """A resumed masked fit gives the uninterrupted result; another mask does not resume its checkpoints."""
    X, groups = data(seed=15, m=60)
    M = mixed(X.shape, seed=16)
    kwargs = dict(lam=0.2, max_iter=6, tol=0, random_state=4, hals_iter=2, block_rows=15)
    W_ref = distfact.WeightedL1NMF(RANK, **kwargs).fit_transform(X, groups=groups, mask=M)

    def crash(info):
        if info.iteration == 4:
            raise KeyboardInterrupt("simulated crash")
    run = dict(checkpoint_dir=tmp_path / "run", checkpoint_every=2)
    with pytest.raises(KeyboardInterrupt):
        distfact.WeightedL1NMF(RANK, callback=crash, **run, **kwargs).fit(X, groups=groups, mask=M)
    resumed = distfact.WeightedL1NMF(RANK, resume=True, **run, **kwargs)
    assert np.array_equal(resumed.fit_transform(X, groups=groups, mask=M), W_ref) and resumed.n_iter_ == 6
    other = M.copy()
    other[0, 0] = 0.5 if other[0, 0] != 0.5 else 0.25
    with pytest.raises(ValueError, match="another configuration"):
        distfact.WeightedL1NMF(RANK, resume=True, **run, **kwargs).fit(X, groups=groups, mask=other)


def test_w_out_holds_w_alone(tmp_path):
    X, groups = data(seed=17)
    model = distfact.WeightedL1NMF(RANK, max_iter=2, tol=0, random_state=0, block_rows=10)
    W = model.fit_transform(X, groups=groups, mask="nonzero")
    distfact.WeightedL1NMF(RANK, max_iter=2, tol=0, random_state=0, block_rows=10).fit(
        X, groups=groups, mask="nonzero", W_out=tmp_path / "W")
    stored = np.concatenate([zarr.open_array(tmp_path / "W" / name)[...]
                             for name in sorted(p.name for p in (tmp_path / "W").iterdir() if p.is_dir())])
    store_order = distfact.from_arrays(X, groups, block_rows=10).row_index()
    assert np.array_equal(stored, W[store_order])


def test_a_masked_model_saves_and_transforms(tmp_path):
    X, groups = data(seed=22)
    model = distfact.WeightedL1NMF(RANK, max_iter=2, tol=0, random_state=0).fit(X, groups=groups, mask="nonzero")
    model.save(tmp_path / "model.npz")
    loaded = distfact.load(tmp_path / "model.npz")
    assert np.array_equal(loaded.transform(X, max_iter=3), model.transform(X, max_iter=3))
    assert loaded.group_metrics_.equals(model.group_metrics_)


@pytest.mark.parametrize("mask, message", [
    (np.ones((3, 3)), "mask has shape"),
    ("zeros", "mask must be None, a weight array"),
    (-np.ones((M_ROWS, N_COLS)), "negative weights"),
    (np.full((M_ROWS, N_COLS), np.nan), "mask holds NaN"),
    (np.zeros((M_ROWS, N_COLS)), "no positive entry of positive weight"),
    (np.full((M_ROWS, N_COLS), "a"), "give numbers"),
])
def test_bad_masks_are_refused(mask, message):
    X, groups = data(seed=18)
    with pytest.raises(ValueError, match=message):
        distfact.WeightedL1NMF(RANK).fit(X, groups=groups, mask=mask)


def test_masks_it_cannot_take_are_refused(tmp_path):
    X, groups = data(seed=19)
    with pytest.raises(ValueError, match="needs a sparse X"):
        distfact.WeightedL1NMF(RANK).fit(X.toarray(), groups=groups, mask="nonzero")
    store = distfact.from_arrays(X, groups, tmp_path / "x.zarr")
    with pytest.raises(ValueError, match="needs X in memory"):
        distfact.WeightedL1NMF(RANK).fit(store.path, mask="nonzero")
    with pytest.raises(ValueError, match="only with X in memory"):
        distfact.WeightedL1NMF(RANK).fit(store.path, mask=X.toarray() > 0)
    Xn = X.toarray()
    Xn[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):  # NaN without mask='nan' stays an error
        distfact.WeightedL1NMF(RANK).fit(Xn, groups=groups)


@pytest.mark.cluster
def test_masked_fit_bitwise_on_threads_and_on_a_local_cluster(local_cluster_client):
    X, groups = data(seed=20, m=120, n=40)
    M = mixed(X.shape, seed=21)
    kwargs = dict(lam=0.3, max_iter=3, tol=0, random_state=12, hals_iter=2, block_rows=25, column_blocks=3)
    threads = distfact.WeightedL1NMF(RANK, n_threads=2, **kwargs)
    W_threads = threads.fit_transform(X, groups=groups, mask=M)
    cluster = distfact.WeightedL1NMF(RANK, **kwargs)
    W_cluster = cluster.fit_transform(X, groups=groups, mask=M, client=local_cluster_client)
    assert np.array_equal(W_threads, W_cluster)
    assert np.array_equal(threads.components_, cluster.components_)
    assert np.array_equal(threads.loss_history_, cluster.loss_history_)


def test_a_mask_on_unzeroed_X_is_refused():
    """The HALS start reads X unmasked, so X must be 0 at the missing entries: fit zeroes it; fit_many's folds
    share one X between masks and are refused rather than let held-out values into the start."""
    X, groups = data(seed=23)
    M = few_masked(X.shape, seed=24)
    with pytest.raises(ValueError, match="do not support WeightedL1NMF yet"):
        distfact.fit_many(distfact.WeightedL1NMF(RANK, max_iter=2), X, groups=groups, masks=[M, M])
    with pytest.raises(ValueError, match="select_rank cannot use WeightedL1NMF: its HALS start reads X unmasked"):
        distfact.select_rank(distfact.WeightedL1NMF(RANK, max_iter=2), X, groups=groups, ranks=[1, 2],
                             random_state=0)
