"""Fairer-NMF (Kassab, George, Needell, Geng, Jafar Nia and Li, "Towards a Fairer Non-negative Matrix
Factorization", 2024): E_l estimation (Algorithm 1), the MU scheme (Algorithm 3), the AM scheme (Algorithm 2)."""

import os

import numpy as np
import pytest
import scipy.sparse as sp

import distfact
from conftest import cli_in_process, grouped_data
from distfact.engine import InProcessExecutor, fit, initialise
from distfact.methods.fairer_nmf import GroupErrorEstimate
from oracles import fairer_mu, lee_seung_frobenius


def paper_synthetic(seed=0):
    from distfact.datasets import make_fairer_synthetic

    return make_fairer_synthetic(seed)


@pytest.mark.parametrize("sparse", [False, True])
def test_mu_iterates_equal_a_transcription_of_algorithm_3(sparse):
    X, groups = grouped_data(m=90, n=12, n_groups=3, density=0.6, seed=40)
    kwargs = dict(random_state=3, n_estimates=2, estimate_max_iter=30, tol=0, block_rows=11)
    start = distfact.FairerNMF(3, max_iter=0, **kwargs)
    W0 = start.fit_transform(sp.csr_matrix(X) if sparse else X, groups=groups)
    H0, E = start.components_, start.E_
    model = distfact.FairerNMF(3, max_iter=25, **kwargs)
    W = model.fit_transform(sp.csr_matrix(X) if sparse else X, groups=groups)
    names = model.group_names_
    W_ref, H_ref, c_ref = fairer_mu([X[groups == n] for n in names], [W0[groups == n] for n in names], H0, E, 25)
    np.testing.assert_array_equal(model.E_, E)
    assert np.linalg.norm(model.components_ - H_ref) / np.linalg.norm(H_ref) < 1e-10
    for n, w in zip(names, W_ref):
        assert np.linalg.norm(W[groups == n] - w) / np.linalg.norm(w) < 1e-10
    np.testing.assert_array_equal(model.c_, c_ref)
    # reported losses and errors equal a direct recomputation
    for g, n in enumerate(names):
        err = np.linalg.norm(X[groups == n] - W[groups == n] @ model.components_)
        nrm = np.linalg.norm(X[groups == n])
        assert model.group_errors_[g] == pytest.approx(err / nrm, rel=1e-9)
        assert model.group_losses_[g] == pytest.approx((err - E[g]) / nrm, rel=1e-9)


def test_with_one_group_the_updates_are_plain_mu():
    X, _ = grouped_data(m=50, n=10, seed=41)
    groups = np.zeros(50, dtype=int)
    kwargs = dict(random_state=5, n_estimates=1, estimate_max_iter=5, tol=0)
    start = distfact.FairerNMF(3, max_iter=0, **kwargs)
    W0 = start.fit_transform(X, groups=groups)
    model = distfact.FairerNMF(3, max_iter=30, **kwargs)
    W = model.fit_transform(X, groups=groups)
    W_ref, H_ref = lee_seung_frobenius(X, W0, start.components_, 30)
    assert np.linalg.norm(model.components_ - H_ref) / np.linalg.norm(H_ref) < 1e-10
    assert np.linalg.norm(W - W_ref) / np.linalg.norm(W_ref) < 1e-10


def test_group_error_estimates_are_independent_nmf_runs_sharing_passes():
    """Algorithm 1: T MU runs per group, every (group, run) equal to its own plain-MU loop, all in one
    pass per iteration."""
    X, groups = grouped_data(m=80, n=10, n_groups=2, seed=42)
    data = distfact.from_arrays(X, groups, block_rows=9)
    method = GroupErrorEstimate(2, n_estimates=3, tol=0)
    with InProcessExecutor(data, n_threads=1) as executor:
        start = fit(method, data, executor, max_iter=0, start=lambda: initialise(method, data, executor, 7))
        W0 = [np.concatenate([executor.locals[b.index][t] for b in data.blocks if b.group == g]) for g in (0, 1)
              for t in range(3)]
    H0 = start.global_state["H"]
    with InProcessExecutor(data, n_threads=2) as executor:
        state = fit(method, data, executor, max_iter=20, start=lambda: initialise(method, data, executor, 7))
    assert executor.n_passes == 21  # all 2 x 3 runs advance in the same 20 passes (+ pass 0)
    runs = method.errors(state.global_state, state.stats, data)
    order = data.row_index()
    for g in (0, 1):
        Xg = X[order][data.meta.groups[g].row_start:data.meta.groups[g].row_stop]
        for t in range(3):
            W_ref, H_ref = lee_seung_frobenius(Xg, W0[3 * g + t], H0[g, t], 20)
            assert runs[g, t] == pytest.approx(np.linalg.norm(Xg - W_ref @ H_ref), rel=1e-10)


def test_each_group_error_run_stops_on_its_own():
    """Algorithm 1's runs stop one by one, as the reference code's separate NMF calls do: each run's error is
    the one it had, run without a rule, at the first iteration where its relative error moved by less than
    tol * max(itself, 1%); a stopped run moves no more while the others go on, and the phase ends with the
    last."""
    X, groups = grouped_data(m=80, n=10, n_groups=2, seed=42)
    data = distfact.from_arrays(X, groups, block_rows=9)
    free = GroupErrorEstimate(2, n_estimates=3, tol=0)
    with InProcessExecutor(data, n_threads=1) as executor:
        state = fit(free, data, executor, max_iter=400, start=lambda: initialise(free, data, executor, 7))
    history = np.stack(state.group_objectives).reshape(-1, 2, 3)  # relative errors, (iterations + 1, L, T)
    tol = 1e-3
    met = np.abs(np.diff(history, axis=0)) < tol * np.maximum(history[1:], 0.01)
    first = met.argmax(axis=0) + 1  # the iteration at which each run meets its rule
    assert met.any(axis=0).all() and len(np.unique(first)) > 2

    method = GroupErrorEstimate(2, n_estimates=3, tol=tol)
    with InProcessExecutor(data, n_threads=2) as executor:
        state = fit(method, data, executor, max_iter=400, start=lambda: initialise(method, data, executor, 7))
    assert state.converged and state.iteration == first.max()
    relative = method.relative_errors(state.global_state, state.stats, data)
    np.testing.assert_allclose(relative, np.take_along_axis(history, first[None], axis=0)[0], rtol=1e-12)
    assert method.runs_stopped(state.global_state, state.stats, data).all()


def test_the_stopping_rules_floor_the_error_at_one_percent():
    from distfact.methods.fairer_nmf import relative_change_below

    previous = np.array([0.5, 0.5, 0.004, 0.004, 0.3])
    current = np.array([0.49996, 0.4999, 0.0039995, 0.0039985, 0.3])
    # 0.5 -> 0.49996 moves 8e-5 of itself: met at 1e-4, 0.5 -> 0.4999 not; 0.004 -> 0.0039995 moves 5e-7, under
    # 1e-4 * 1% but not under 1e-4 * 0.004 (met thanks to the floor), 0.004 -> 0.0039985 moves 1.5e-6 (not met);
    # an error that does not move meets any positive tol
    np.testing.assert_array_equal(relative_change_below(previous, current, 1e-4), [True, False, True, False, True])
    np.testing.assert_array_equal(relative_change_below(previous, current, 1e-4, floor=0.0),
                                  [True, False, False, False, True])
    assert not relative_change_below(previous, current, 0).any()  # tol 0: run to the cap


def test_passes_are_counted_across_both_phases():
    X, groups = grouped_data(m=60, n=8, seed=43)
    model = distfact.FairerNMF(2, random_state=0, estimate_max_iter=12, max_iter=9, tol=0,
                               estimate_tol=0).fit(X, groups=groups)
    assert model.n_iter_ == 9
    assert model.n_passes_ == (12 + 1) + (9 + 1)
    assert model.loss_history_.shape == (10, 3)


def paper_data(name):
    """The paper's Table 1 data (Section 6.2) or UCI Heart Disease by sex (Section 6.3)."""
    from distfact.datasets import load_heart_disease

    if name == "table1":
        return paper_synthetic()
    X, groups, _ = load_heart_disease()
    assert X.shape == (297, 12) and (groups == "Male").sum() == 201
    return X, groups


def r_losses(X, groups, W, H, names, E):
    """(||X_l - W_l H|| - E_l) / ||X_l|| per group (Definition 4.1), from the factors."""
    return np.array([(np.linalg.norm(X[groups == n] - W[groups == n] @ H) - e) / np.linalg.norm(X[groups == n])
                     for n, e in zip(names, E)])


@pytest.mark.parametrize("dataset", ["table1", "heart"])
def test_defaults_reproduce_the_paper(dataset):
    """Section 6 with defaults only (FairerNMF(r) and NMF(r), one seed), ranks 3 to 10: every E_l run has met
    its rule, the scheme met eq. (10), and the worst group's R-Loss under Fairer-NMF is no larger than under
    standard NMF, with at most half its spread (max - min). Both R-Losses are recomputed here from W, H and
    Fairer-NMF's E_l."""
    X, groups = paper_data(dataset)
    for r in range(3, 11):
        fair = distfact.FairerNMF(r, random_state=0)
        W_fair = fair.fit_transform(X, groups=groups)
        standard = distfact.NMF(r, random_state=0)
        W_standard = standard.fit_transform(X, groups=groups)
        assert fair.E_converged_.all() and fair.converged_, r
        fairer = r_losses(X, groups, W_fair, fair.components_, fair.group_names_, fair.E_)
        std = r_losses(X, groups, W_standard, standard.components_, fair.group_names_, fair.E_)
        np.testing.assert_allclose(fairer, fair.group_losses_, rtol=1e-8, atol=1e-12)
        assert fairer.max() <= std.max(), (r, fairer, std)
        assert np.ptp(fairer) <= 0.5 * np.ptp(std), (r, fairer, std)


def test_bad_input():
    X, groups = grouped_data(m=40, n=8, seed=44)
    small = np.array(["tiny"] * 2 + ["big"] * 38)
    with pytest.raises(ValueError, match="group 'tiny' has 2 rows, fewer than n_components=3"):
        distfact.FairerNMF(3).fit(X, groups=small)
    with pytest.raises(ValueError, match="solver must be one of"):
        distfact.FairerNMF(2, solver="newton").fit(X, groups=groups)
    with pytest.raises(ValueError, match="c_update must be one of"):
        distfact.FairerNMF(2, c_update="sometimes").fit(X, groups=groups)


def test_without_groups_every_row_is_one_group():
    """As scikit-learn calls it, fit(X): one group, whose relative loss is (||X - WH|| - E) / ||X|| (Definition 4.1)."""
    X, _ = grouped_data(m=40, n=8, seed=44)
    model = distfact.FairerNMF(2, n_estimates=2, max_iter=20, random_state=0).fit(X)
    assert model.group_names_ == ["all"]
    error = np.linalg.norm(X - model.fit_transform(X) @ model.components_)
    norm = np.linalg.norm(X)
    np.testing.assert_allclose(model.group_errors_, [error / norm], rtol=1e-10)
    np.testing.assert_allclose(model.group_losses_, [(error - model.E_[0]) / norm], rtol=1e-10)


def test_unconverged_estimates_are_reported():
    from sklearn.exceptions import ConvergenceWarning

    X, groups = grouped_data(m=40, n=8, seed=45)
    with pytest.warns(ConvergenceWarning, match=r"estimating E_l .* of groups \['g0', 'g1', 'g2'\]"):
        model = distfact.FairerNMF(2, random_state=0, estimate_max_iter=2, max_iter=3).fit(X, groups=groups)
    assert not model.E_converged_.any()


# ------------------------------------------------------------------ AM scheme (Algorithm 2)
def test_nnls_kernel_equals_scipy_row_by_row():
    from scipy.optimize import nnls

    from distfact.kernels.nnls import nnls_gram

    rng = np.random.default_rng(46)
    H = rng.random((5, 30))
    X = rng.random((200, 30)) * (rng.random((200, 30)) < 0.5)
    W = nnls_gram(H @ H.T, X @ H.T)
    reference = np.array([nnls(H.T, x)[0] for x in X])
    assert (reference == 0).mean() > 0.1  # the constraints are active somewhere
    np.testing.assert_allclose(W, reference, atol=1e-10)


def test_am_h_step_on_statistics_equals_the_socp_on_raw_matrices():
    import cvxpy as cp

    from distfact.methods.fairer_nmf import fair_h_socp

    rng = np.random.default_rng(47)
    r, n = 3, 8
    Xs = [rng.random((m, n)) for m in (40, 25, 12)]
    Ws = [rng.random((m, r)) for m in (40, 25, 12)]
    Ws[2][:, 2] = Ws[2][:, 1]  # a rank-deficient W_l^T W_l (the eigen-decomposition path)
    E = [0.5, 0.3, 0.2]
    stats = [{"WtX": W.T @ X, "WtW": W.T @ W} for X, W in zip(Xs, Ws)]
    sq_norms = np.array([np.linalg.norm(X) ** 2 for X in Xs])
    H, t, solver = fair_h_socp(stats, E, sq_norms, (r, n), ("CLARABEL",))

    H_raw, t_raw = cp.Variable((r, n), nonneg=True), cp.Variable()
    cons = [cp.norm(X - W @ H_raw, "fro") <= t_raw * np.linalg.norm(X) + e for X, W, e in zip(Xs, Ws, E)]
    cp.Problem(cp.Minimize(t_raw), cons).solve(solver="CLARABEL")
    assert solver == "CLARABEL"
    assert t == pytest.approx(t_raw.value, abs=1e-6)
    worst = max((np.linalg.norm(X - W @ H) - e) / np.linalg.norm(X) for X, W, e in zip(Xs, Ws, E))
    assert worst == pytest.approx(t_raw.value, abs=1e-6)


def test_am_falls_back_to_the_next_conic_solver():
    from distfact.methods.fairer_nmf import fair_h_socp

    rng = np.random.default_rng(48)
    X, W = rng.random((20, 6)), rng.random((20, 2))
    stats = [{"WtX": W.T @ X, "WtW": W.T @ W}]
    _, _, solver = fair_h_socp(stats, [0.1], np.array([np.linalg.norm(X) ** 2]), (2, 6), ("OSQP", "SCS"))
    assert solver == "SCS"  # OSQP cannot take a second-order cone


@pytest.mark.parametrize("sparse", [False, True])
def test_am_objective_is_non_increasing_with_one_read_per_iteration(sparse):
    X, groups = paper_synthetic(seed=1)
    X = X[::5]
    groups = groups[::5]
    if sparse:
        X = sp.csr_matrix(X * (X > np.quantile(X, 0.2)))
    model = distfact.FairerNMF(4, solver="am", random_state=0, max_iter=15, tol=0, estimate_max_iter=50,
                               estimate_tol=0).fit(X, groups=groups, )
    f = model.loss_history_.max(axis=1)  # eq. (7) at every iteration
    assert np.all(np.diff(f) <= 1e-6)
    assert f[-1] < f[0]
    assert model.n_passes_ == (50 + 1) + (15 + 1)
    assert model.conic_solver_ == "CLARABEL"


def test_am_without_a_conic_solver_is_a_clear_error(monkeypatch):
    import cvxpy

    X, groups = grouped_data(m=30, n=6, seed=49)
    monkeypatch.setattr(cvxpy, "installed_solvers", lambda: ["OSQP", "SCIPY"])
    with pytest.raises(ValueError, match="solver='am' needs a conic solver"):
        distfact.FairerNMF(2, solver="am").fit(X, groups=groups)


def test_fairness_report_table_files_and_cli(tmp_path, capsys):
    import json

    from distfact.reports.fairness import fairness_table, write_fairness_report

    X, groups = grouped_data(m=60, n=8, n_groups=2, seed=50)
    rows = fairness_table(X, groups, ranks=[1, 2], max_iter=50, estimate_max_iter=40)
    assert [(row["rank"], row["group"]) for row in rows] == [(1, "g0"), (1, "g1"), (2, "g0"), (2, "g1")]
    fair = distfact.FairerNMF(2, max_iter=50, estimate_max_iter=40, random_state=0).fit(X, groups=groups)
    standard = distfact.NMF(2, max_iter=50, random_state=0).fit(X, groups=groups)
    for g, row in enumerate(rows[2:]):
        norm = np.linalg.norm(X[groups == row["group"]])
        assert row["r_loss_fairer"] == pytest.approx(fair.group_losses_[g])
        assert row["r_error_standard_all"] == pytest.approx(standard.group_errors_[g])
        assert row["r_error_standard_alone"] == pytest.approx(fair.E_[g] / norm)
        assert row["r_loss_standard"] == pytest.approx(standard.group_errors_[g] - fair.E_[g] / norm)
        assert row["r_error_fairer"] == pytest.approx(fair.group_errors_[g])  # fractions, as the R-Losses
    paths = write_fairness_report(rows, tmp_path / "report")
    assert json.loads(open(paths["json"]).read()) == rows
    assert open(paths["html"]).read().count("data:image/png;base64,") == 3

    distfact.from_arrays(X, groups, tmp_path / "x.zarr")
    code, _, err = cli_in_process(capsys, "report", tmp_path / "x.zarr", "--fairness", "--ranks", "1:2", "--max-iter",
                                  "30", "--output", tmp_path / "cli")
    assert code == 0, err
    assert sorted(os.listdir(tmp_path / "cli")) == sorted(["fairness.csv", "fairness.json", "fairness.html",
                                                           "fig2_r_error_standard.png", "fig3_r_loss_standard.png",
                                                           "fig5_r_loss_fairer.png", "distfact-output.json"])
    code, _, err = cli_in_process(capsys, "report", tmp_path / "x.zarr", "--fairness", "--ranks", "3-1")
    assert code == 2 and "--ranks must be FIRST:LAST" in err


def test_checkpoint_resume_equals_an_uninterrupted_run(tmp_path, monkeypatch):
    """Stopped in the scheme (at 10 of 25 iterations) or killed inside the E_l runs (at iteration 7,
    last checkpoint 4): resuming gives bitwise the uninterrupted fit."""
    X, groups = grouped_data(m=120, n=15, n_groups=3, seed=60)
    kwargs = dict(random_state=4, n_estimates=2, estimate_max_iter=15, tol=0)
    full = distfact.FairerNMF(3, max_iter=25, **kwargs)
    W_full = full.fit_transform(X, groups=groups)
    distfact.FairerNMF(3, max_iter=10, checkpoint_dir=tmp_path / "a", checkpoint_every=4, **kwargs).fit(X, groups=groups)
    assert sorted(os.listdir(tmp_path / "a")) == ["estimate", "scheme"]

    with monkeypatch.context() as patch:
        rule = GroupErrorEstimate.converged

        def killed_at_iteration_7(self, objectives, group_objectives):
            if len(objectives) > 7:
                raise KeyboardInterrupt
            return rule(self, objectives, group_objectives)
        patch.setattr(GroupErrorEstimate, "converged", killed_at_iteration_7)
        with pytest.raises(KeyboardInterrupt):
            distfact.FairerNMF(3, max_iter=25, checkpoint_dir=tmp_path / "b", checkpoint_every=4,
                               **kwargs).fit(X, groups=groups)
    assert not (tmp_path / "b" / "scheme").exists()
    for run_dir in ("a", "b"):
        resumed = distfact.FairerNMF(3, max_iter=25, checkpoint_dir=tmp_path / run_dir, checkpoint_every=4,
                                     resume=True, **kwargs)
        W = resumed.fit_transform(X, groups=groups)
        np.testing.assert_array_equal(resumed.E_, full.E_)
        np.testing.assert_array_equal(resumed.components_, full.components_)
        np.testing.assert_array_equal(W, W_full)
        np.testing.assert_array_equal(resumed.loss_history_, full.loss_history_)
        assert resumed.n_passes_ == full.n_passes_
    with pytest.raises(ValueError, match="already holds checkpoints"):
        distfact.FairerNMF(3, max_iter=25, checkpoint_dir=tmp_path / "a", **kwargs).fit(X, groups=groups)
