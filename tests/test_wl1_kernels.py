"""Weighted L1-NMF kernels (Seraghiti et al., 2026): the constrained weighted median (Algorithm 2.1) and the
sparse coordinate-descent sweep (Algorithms 6.1-6.2) against brute force and a dense CD oracle."""

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from distfact.kernels.l1 import constrained_weighted_median, nonzero_terms, scd_sweep_rows, wl1_objective
from oracles import lad_brute_force, wl1_dense_cd

values = st.floats(-50, 50, allow_nan=False, allow_infinity=False, width=64)
weights = st.one_of(st.just(0.0), st.floats(1e-3, 50), st.floats(-50, -1e-3))  # factor entries, not subnormals


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(values, weights), min_size=1, max_size=25))
def test_weighted_median_equals_brute_force(pairs):
    x = np.array([p[0] for p in pairs])
    y = np.array([p[1] for p in pairs])
    got = constrained_weighted_median(x, y)
    want = lad_brute_force(x, y)

    def f(alpha):
        return np.abs(x - alpha * y).sum()
    assert got >= 0
    # the same minimiser, or (at ties of the objective from rounding) one as good
    assert got == pytest.approx(want, rel=1e-12, abs=1e-12) or f(got) <= f(want) * (1 + 1e-12) + 1e-12


def scd(X, W, H, lam, n_iter):
    """Algorithm 6.2: W sweep on CSR X, then H sweep on CSR X^T; objective after each iteration."""
    Xc, Xt = sp.csr_matrix(X), sp.csr_matrix(X.T)
    W, Ht = W.copy(), np.ascontiguousarray(H.T)
    one_group = np.zeros(1, dtype=np.int64)
    history = []
    for _ in range(n_iter):
        scd_sweep_rows(Xc.indptr, Xc.indices, Xc.data, W, Ht, lam, one_group)
        abs_residual, fitted = scd_sweep_rows(Xt.indptr, Xt.indices, Xt.data, Ht, W, lam, one_group)
        history.append(wl1_objective(abs_residual[0], fitted[0], lam, W.sum(axis=0), Ht.sum(axis=0)))
    return W, np.ascontiguousarray(Ht.T), np.array(history)


def random_sparse(m, n, density, seed):
    rng = np.random.default_rng(seed)
    return rng.random((m, n)) * (rng.random((m, n)) < density)


@pytest.mark.parametrize("lam", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_scd_iterates_equal_dense_coordinate_descent(lam, seed):
    X = random_sparse(18, 14, 0.35, seed)
    rng = np.random.default_rng(seed + 10)
    W0, H0 = rng.random((18, 3)), rng.random((3, 14))
    W, H, F = scd(X, W0, H0, lam, 6)
    W_ref, H_ref, F_ref = wl1_dense_cd(X, W0, H0, lam, 6)
    np.testing.assert_allclose(W, W_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(H, H_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(F, F_ref[1:], rtol=1e-12)  # the objective accumulated inside the sweep
    assert np.all(np.diff(F_ref) <= 1e-12 * F_ref[:-1])  # non-increasing


def direct_objective(X, W, H, lam):
    WH = W @ H
    return np.abs(X - WH)[X != 0].sum() + lam * WH[X == 0].sum()


@pytest.mark.parametrize("lam, density", [(0.05, 0.05), (1.0, 0.4)])
def test_scd_objective_is_non_increasing_on_a_larger_matrix(lam, density):
    X = random_sparse(300, 200, density, 3)
    rng = np.random.default_rng(4)
    W0, H0 = rng.random((300, 8)), rng.random((8, 200))
    W, H, F = scd(X, W0, H0, lam, 15)
    F = np.concatenate([[direct_objective(X, W0, H0, lam)], F])
    assert np.all(np.diff(F) <= 1e-12 * F[:-1]) and F[-1] < 0.9 * F[0]
    assert F[-1] == pytest.approx(direct_objective(X, W, H, lam), rel=1e-10)


def test_binary_data_with_binary_factors_stays_binary():
    """Section 6.4: for binary X and binary starting factors, the sCD iterates stay binary."""
    rng = np.random.default_rng(5)
    W0 = (rng.random((40, 3)) < 0.3).astype(float)
    H0 = (rng.random((3, 30)) < 0.3).astype(float)
    X = np.minimum(W0 @ H0 + (rng.random((40, 30)) < 0.05), 1.0)
    W, H, _ = scd(X, W0, H0, 1.0, 5)
    assert set(np.unique(W)) <= {0.0, 1.0} and set(np.unique(H)) <= {0.0, 1.0}
    assert W.sum() > 0 and H.sum() > 0  # not binary by collapsing to zero


def test_nonzero_terms_per_group_equal_a_direct_sum():
    """The per-group split used for the row groups of the H sweep (groups = ranges of X's rows)."""
    X = random_sparse(30, 12, 0.4, 6)
    rng = np.random.default_rng(7)
    W, H = rng.random((30, 4)), rng.random((4, 12))
    starts = np.array([0, 7, 19])
    Xt = sp.csr_matrix(X.T)
    abs_residual, fitted = nonzero_terms(Xt.indptr, Xt.indices, Xt.data, np.ascontiguousarray(H.T), W, starts)
    WH = W @ H
    for g, (lo, hi) in enumerate(zip(starts, [7, 19, 30])):
        nz = X[lo:hi] != 0
        assert abs_residual[g] == pytest.approx(np.abs(X[lo:hi] - WH[lo:hi])[nz].sum(), rel=1e-12)
        assert fitted[g] == pytest.approx(WH[lo:hi][nz].sum(), rel=1e-12)
