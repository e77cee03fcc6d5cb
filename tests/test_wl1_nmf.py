"""distfact.WeightedL1NMF on the engine: Algorithm 6.2's iterates against the dense coordinate-descent
oracle, objective and per-group errors against direct recomputation, passes, start, schedulers, resume."""

import logging
import os
import time

import numpy as np
import pytest
import scipy.sparse as sp

import distfact
from conftest import grouped_data
from distfact.datasets import make_false_zeros
from oracles import lad_brute_force, wl1_dense_cd


def sparse_grouped(m=40, n=25, density=0.3, seed=0, n_groups=3):
    X, groups = grouped_data(m=m, n=n, n_groups=n_groups, density=density, seed=seed)
    return sp.csr_matrix(X), groups


def direct_objective(X, W, H, lam):
    """Eq. (5.1) on the dense matrix."""
    WH = W @ H
    nz = X != 0
    return np.abs(X - WH)[nz].sum() + lam * WH[~nz].sum()


def custom_start(m, n, r, seed):
    rng = np.random.default_rng(seed)
    return rng.random((m, r)), rng.random((r, n))


@pytest.mark.parametrize("lam", [0.0, 0.3, 1.0])
def test_iterates_equal_dense_coordinate_descent(lam):
    """Many row blocks and column blocks on the engine = the brute-force dense CD, Algorithm 6.2's order."""
    X, groups = sparse_grouped(seed=1)
    W0, H0 = custom_start(40, 25, 3, 2)
    model = distfact.WeightedL1NMF(3, lam=lam, init="custom", max_iter=5, tol=0, block_rows=6, column_blocks=4)
    W = model.fit_transform(X, groups=groups, W=W0, H=H0)
    W_ref, H_ref, F_ref = wl1_dense_cd(X.toarray(), W0, H0, lam, 5)
    np.testing.assert_allclose(W, W_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(model.components_, H_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(model.loss_history_, F_ref / X.sum(), rtol=1e-12)
    assert np.all(np.diff(model.loss_history_) <= 1e-12)
    assert model.n_iter_ == 5 and model.n_passes_ == 1 + 2 * 5


def test_per_group_errors_and_losses_equal_direct_recomputation():
    X, groups = sparse_grouped(m=60, n=30, seed=3)
    lam = 0.4
    model = distfact.WeightedL1NMF(4, lam=lam, max_iter=6, tol=0, hals_iter=3, random_state=0, block_rows=9)
    W = model.fit_transform(X, groups=groups)
    Xd, H = X.toarray(), model.components_
    for name, loss, error in zip(model.group_names_, model.group_losses_, model.group_errors_):
        rows = groups == name
        total = Xd[rows].sum()
        assert loss == pytest.approx(direct_objective(Xd[rows], W[rows], H, lam) / total, rel=1e-10)
        assert error == pytest.approx(np.abs(Xd[rows] - W[rows] @ H).sum() / total, rel=1e-10)
    assert model.reconstruction_err_ == pytest.approx(np.abs(Xd - W @ H).sum(), rel=1e-10)
    assert model.loss_history_[-1] == pytest.approx(direct_objective(Xd, W, H, lam) / Xd.sum(), rel=1e-10)


def test_hals_start_is_nmf_hals_rescaled_to_equal_l1_norms():
    X, groups = sparse_grouped(m=50, n=20, seed=4)
    model = distfact.WeightedL1NMF(3, hals_iter=5, max_iter=0, random_state=7, block_rows=12)
    W = model.fit_transform(X, groups=groups)
    H = model.components_
    np.testing.assert_allclose(W.sum(axis=0), H.sum(axis=1), rtol=1e-12)  # equal l1 norms
    nmf = distfact.NMF(3, solver="hals", max_iter=5, tol=0, random_state=7, block_rows=12)
    W_hals = nmf.fit_transform(X, groups=groups)
    np.testing.assert_allclose(W @ H, W_hals @ nmf.components_, rtol=1e-12, atol=1e-14)
    assert model.n_passes_ == (5 + 1) + 1  # HALS with its pass 0, then sCD's pass 0


def test_objective_is_non_increasing_from_the_hals_start():
    X, groups = sparse_grouped(m=300, n=120, density=0.05, seed=5)
    model = distfact.WeightedL1NMF(6, lam=0.1, max_iter=15, tol=0, random_state=1)
    model.fit(X, groups=groups)
    F = model.loss_history_
    assert np.all(np.diff(F) <= 1e-12 * F[:-1]) and F[-1] < F[0]


def test_dense_sparse_and_store_inputs_agree(tmp_path):
    X, groups = sparse_grouped(m=70, n=30, seed=6)
    kwargs = dict(lam=0.5, max_iter=4, tol=0, random_state=3, hals_iter=2)
    fits = []
    for data in (X, X.toarray()):
        model = distfact.WeightedL1NMF(3, block_rows=10, column_blocks=3, **kwargs)
        fits.append((model.fit_transform(data, groups=groups), model.components_, model.loss_history_))
    store = distfact.from_arrays(X, groups, tmp_path / "x.zarr", block_rows=10)
    model = distfact.WeightedL1NMF(3, column_blocks=3, **kwargs)
    fits.append((model.fit_transform(str(store.path)), model.components_, model.loss_history_))
    assert distfact.open(store.path).has_column_blocks  # written into the store once
    for other in fits[1:]:
        for ours, theirs in zip(fits[0], other):
            assert np.array_equal(ours, theirs)


@pytest.mark.parametrize("held", [True, False])
def test_one_read_of_each_row_block_and_column_block_per_pass(tmp_path, monkeypatch, held):
    """Each row block once per pass and each column block once per column pass, or each once when the store is
    small enough to be held (``RESIDENT_STORE_BYTES``)."""
    from distfact.engine.executor import inprocess

    if not held:
        monkeypatch.setattr(inprocess, "RESIDENT_STORE_BYTES", 0)
    X, groups = sparse_grouped(m=90, n=40, seed=7)
    store = distfact.from_arrays(X, groups, tmp_path / "x.zarr", block_rows=10, column_blocks=True)
    store = distfact.open(store.path)
    row_reads, column_reads = [], []
    reader, column_reader = store.reader(), store.column_reader()
    store.reader = lambda: (lambda block: row_reads.append(block.index) or reader(block))
    store.column_reader = lambda: (lambda cblock: column_reads.append(cblock.index) or column_reader(cblock))
    model = distfact.WeightedL1NMF(3, init="random", max_iter=4, tol=0, random_state=0, n_threads=2).fit(store)
    assert model.n_passes_ == 1 + 2 * 4
    assert sorted(row_reads) == sorted(list(range(store.n_blocks)) * (1 if held else 1 + 4))
    assert sorted(column_reads) == sorted(list(range(len(store.column_blocks))) * (1 if held else 4))


def test_transform_equals_w_sweeps_with_h_fixed():
    X, groups = sparse_grouped(m=30, n=20, seed=8)
    lam = 0.6
    model = distfact.WeightedL1NMF(3, lam=lam, max_iter=3, tol=0, random_state=2, hals_iter=2).fit(X, groups=groups)
    W = model.transform(X, groups=groups, max_iter=3, tol=0)
    H, Xd = model.components_, X.toarray()
    W_ref = np.full_like(W, np.sqrt(Xd.mean() / 3))
    weight = np.where(Xd != 0, 1.0, lam)
    for _ in range(3):  # the W half of Algorithm 6.2, written on whole rows and solved by brute force
        for i in range(Xd.shape[0]):
            for t in range(3):
                rest = Xd[i] - W_ref[i] @ H + W_ref[i, t] * H[t]
                W_ref[i, t] = lad_brute_force(weight[i] * rest, weight[i] * H[t])
    np.testing.assert_allclose(W, W_ref, rtol=1e-12, atol=1e-12)
    # with a tolerance: sweeps until the objective falls by less than tol (relative), not just one
    W_tol = model.transform(X, groups=groups, max_iter=200, tol=1e-9)
    once = model.transform(X, groups=groups, max_iter=1, tol=0)
    assert direct_objective(Xd, W_tol, H, lam) < direct_objective(Xd, once, H, lam)
    assert direct_objective(Xd, W_tol, H, lam) <= direct_objective(Xd, W, H, lam) * (1 + 1e-12)


def test_time_limit_stops_the_fit():
    X, groups = sparse_grouped(m=200, n=80, seed=9)
    # the limit counts from the call to fit: a fresh process's first fit (first calls, imports) is not what is tested
    distfact.WeightedL1NMF(5, max_iter=2, random_state=0).fit(X, groups=groups)
    model = distfact.WeightedL1NMF(5, max_iter=10**6, tol=0, time_limit=1.0, random_state=0).fit(X, groups=groups)
    assert model.timed_out_ and 0 < model.n_iter_ < 10**6
    # the limit covers the HALS start too
    started = time.perf_counter()
    model = distfact.WeightedL1NMF(5, hals_iter=10**7, tol=0, time_limit=0.5, random_state=0).fit(X, groups=groups)
    assert model.timed_out_ and model.n_iter_ == 0 and time.perf_counter() - started < 30


def test_a_fit_stopped_by_its_time_limit_saves_its_last_iteration(tmp_path, caplog):
    """The loop's last state is saved when a time limit ends it, as at max_iter: checkpoints due far apart, the
    newest on disk is the fit's last iteration, and a resumed fit goes on from it."""
    X, groups = sparse_grouped(m=200, n=80, seed=9)
    distfact.WeightedL1NMF(5, max_iter=2, random_state=0).fit(X, groups=groups)  # first calls, not what is tested
    run_dir = tmp_path / "run"
    params = dict(tol=0, hals_iter=2, random_state=0, checkpoint_dir=run_dir, checkpoint_every=10**6)
    model = distfact.WeightedL1NMF(5, max_iter=10**6, time_limit=1.0, **params).fit(X, groups=groups)
    assert model.timed_out_ and 0 < model.n_iter_ < 10**6
    assert sorted(os.listdir(run_dir / "scd" / "checkpoints"))[-1] == f"iter-{model.n_iter_:06d}"  # the main loop's
    with caplog.at_level(logging.INFO, logger="distfact"):
        resumed = distfact.WeightedL1NMF(5, max_iter=model.n_iter_ + 2, resume=True, **params).fit(X, groups=groups)
    assert f"(iteration {model.n_iter_})" in caplog.text
    assert resumed.n_iter_ == model.n_iter_ + 2 and not resumed.timed_out_


def test_a_bad_rank_writes_nothing_into_the_store(tmp_path):
    X, groups = sparse_grouped(seed=14)
    store = distfact.from_arrays(X, groups, tmp_path / "x.zarr")
    with pytest.raises(ValueError, match="n_components=100 is larger"):
        distfact.WeightedL1NMF(100).fit(store.path)
    assert not distfact.open(store.path).has_column_blocks


def test_resume_gives_the_uninterrupted_result(tmp_path):
    X, groups = sparse_grouped(m=80, n=30, seed=10)
    kwargs = dict(lam=0.2, max_iter=8, tol=0, random_state=4, hals_iter=3, block_rows=15)
    W_ref = distfact.WeightedL1NMF(3, **kwargs).fit_transform(X, groups=groups)

    def crash(info):
        if info.iteration == 5:
            raise KeyboardInterrupt("simulated crash")
    with pytest.raises(KeyboardInterrupt):
        distfact.WeightedL1NMF(3, checkpoint_dir=tmp_path / "run", checkpoint_every=2, callback=crash,
                               **kwargs).fit(X, groups=groups)
    resumed = distfact.WeightedL1NMF(3, checkpoint_dir=tmp_path / "run", checkpoint_every=2, resume=True, **kwargs)
    W = resumed.fit_transform(X, groups=groups)
    assert np.array_equal(W, W_ref) and resumed.n_iter_ == 8


@pytest.mark.cluster
def test_bitwise_identical_on_threads_and_on_a_local_cluster(local_cluster_client, tmp_path):
    X, groups = sparse_grouped(m=300, n=60, density=0.1, seed=11)
    for data in (distfact.from_arrays(X, groups, block_rows=37, column_blocks=True),
                 distfact.from_arrays(X, groups, tmp_path / "x.zarr", block_rows=37, column_blocks=True)):
        kwargs = dict(lam=0.3, max_iter=5, tol=0, random_state=12, hals_iter=3)
        threads = distfact.WeightedL1NMF(4, n_threads=2, **kwargs)
        W_threads = threads.fit_transform(data)
        cluster = distfact.WeightedL1NMF(4, **kwargs)
        W_cluster = cluster.fit_transform(data, client=local_cluster_client)
        assert np.array_equal(W_threads, W_cluster)
        assert np.array_equal(threads.components_, cluster.components_)
        assert np.array_equal(threads.loss_history_, cluster.loss_history_)


@pytest.fixture(scope="module")
def false_zeros_fits():
    """``fit(false_share, seed, **params)``: WeightedL1NMF(20, random_state=seed, **params) fitted on Section 7.3's
    data (half the entries zeroed, ``false_share`` of them false zeros, drawn with ``seed``): (converged_, the
    recovery error ||W* H* - W H||_F / ||W H||_F). A fit of the same parameters (every one, as ``get_params`` gives
    them: a default given by name is the same fit) is made once for the module: the false-zero sweep's seed 0 at
    lambda 0, 0.01 (the default) and 1 are the fits of ``test_defaults_reproduce_the_paper``."""
    done = {}

    def fit(false_share, seed, **params):
        model = distfact.WeightedL1NMF(20, random_state=seed, **params)
        key = (false_share, seed, tuple(sorted(model.get_params().items())))
        if key not in done:
            X, truth = make_false_zeros(0.5, false_share, random_state=seed)
            W = model.fit_transform(X)
            done[key] = model.converged_, np.linalg.norm(W @ model.components_ - truth) / np.linalg.norm(truth)
        return done[key]
    return fit


@pytest.mark.parametrize("false_share", [0.5, 1.0])
def test_with_false_zeros_a_small_lambda_recovers_the_truth_best(false_share, false_zeros_fits):
    """Section 7.3 (Fig. 7.3): half the entries zeroed, a share of them the smallest values (false zeros):
    every lambda in [0.01, 0.1] recovers W H better than L1-NMF (lambda = 1) and than lambda = 0 (3 starts each),
    each run to the paper's stopping rule (tol=1e-6, the default, within the default max_iter)."""
    errors = {}
    for lam in (0.0, 0.01, 0.05, 0.1, 1.0):
        runs = [false_zeros_fits(false_share, seed, lam=lam, tol=1e-6)[1] for seed in range(3)]
        errors[lam] = np.mean(runs)
    for lam in (0.01, 0.05, 0.1):
        assert errors[lam] < min(errors[0.0], errors[1.0]), errors


@pytest.mark.parametrize("false_share", [0.0, 0.5, 1.0])
def test_defaults_reproduce_the_paper(false_share, false_zeros_fits):
    """Section 7.3 with defaults only (WeightedL1NMF(20) and one seed), half the entries zeroed, a share of them false
    zeros: the fit meets the paper's stopping rule (tol=1e-6) and recovers W H better than L1-NMF (lambda = 1) and,
    with false zeros, than low-rank completion (lambda = 0), both run to the same rule (Fig. 7.3's comparison);
    the errors ||W* H* - W H||_F / ||W H||_F recomputed here (``false_zeros_fits``: with false zeros, the fits of
    the false-zero sweep's seed 0, which are these)."""
    errors = {}
    for name, params in [("default", {}), ("L1-NMF", dict(lam=1.0)), ("completion", dict(lam=0.0))]:
        converged, errors[name] = false_zeros_fits(false_share, 0, **params)
        assert converged, name
    assert errors["default"] < errors["L1-NMF"], errors
    if false_share > 0:
        assert errors["default"] < errors["completion"], errors
    else:  # no false zeros: completion is as good (the paper: "small values of lambda perform well even when q2 = 0")
        assert errors["default"] <= 1.05 * errors["completion"], errors


@pytest.mark.parametrize("make, message", [
    (lambda X: -X, "negative"),
    (lambda X: X * 0, "all zeros"),
])
def test_bad_data_is_refused(make, message):
    X, groups = sparse_grouped(seed=12)
    with pytest.raises(ValueError, match=message):
        distfact.WeightedL1NMF(3).fit(make(X.toarray()), groups)


@pytest.mark.parametrize("params, message", [
    (dict(lam=-0.1), "lam must be a number in \\[0, 1\\]"),
    (dict(lam=1.5), "lam must be a number in \\[0, 1\\]"),
    (dict(init="nndsvd"), "init must be one of"),
    (dict(hals_iter=-1), "hals_iter"),
    (dict(time_limit=0), "time_limit"),
    (dict(init="custom"), "needs both W and H"),
])
def test_bad_parameters_are_refused(params, message):
    X, groups = sparse_grouped(seed=13)
    with pytest.raises(ValueError, match=message):
        distfact.WeightedL1NMF(3, **params).fit(X, groups=groups)
