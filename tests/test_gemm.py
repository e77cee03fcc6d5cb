"""kernels/gemm.py's ``gemm_into`` (C = A B + beta C through BLAS) against numpy: every combination of C- and
F-contiguous operands, row ranges of larger arrays (and their transposes) and into a larger C, both dtypes,
beta 0 (C's old values, even NaN, not read), 1 and another; operands numba cannot hand to BLAS are refused."""

import numba
import numpy as np
import pytest

from distfact.kernels.gemm import gemm_into


@numba.njit
def _gemm(A, B, C, beta):
    gemm_into(A, B, C, beta)


@numba.njit
def _sum_in_runs(W, X, out, run):
    """W^T X summed into out, ``run`` rows at a time, as the dense NMF step sums W_t^T X_t."""
    for a in range(0, X.shape[0], run):
        b = min(a + run, X.shape[0])
        gemm_into(W[a:b].T, X[a:b], out, 0.0 if a == 0 else 1.0)


def _operand(rng, shape, dtype, layout):
    """A ``shape`` array of ``layout``: "C", "F" (a transposed C array), or a row range of a larger C array, or the
    transpose of one (whose data do not start at the larger array's)."""
    rows, cols = shape
    if layout == "C":
        return rng.random(shape).astype(dtype)
    if layout == "F":
        return np.ascontiguousarray(rng.random((cols, rows)).astype(dtype)).T
    if layout == "C rows":
        return rng.random((rows + 5, cols)).astype(dtype)[2:2 + rows]
    return rng.random((cols + 4, rows)).astype(dtype)[1:1 + cols].T  # "F rows"


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("layout_a", ["C", "F", "C rows", "F rows"])
@pytest.mark.parametrize("layout_b", ["C", "F", "C rows", "F rows"])
def test_gemm_into_equals_numpy(dtype, layout_a, layout_b):
    rng = np.random.default_rng(5)
    m, k, n = 13, 7, 29
    A, B = _operand(rng, (m, k), dtype, layout_a), _operand(rng, (k, n), dtype, layout_b)
    tolerance = 1e-13 if dtype == np.float64 else 1e-5
    for beta in (0.0, 1.0, -0.5):
        C0 = rng.random((m + 3, n)).astype(dtype)
        C = C0.copy()
        if beta == 0.0:
            C[:m] = np.nan  # beta 0: C's values are not read (BLAS's rule), so NaN does not spread
        _gemm(A, B, C[:m], beta)
        expected = A.astype(np.float64) @ B.astype(np.float64) + (beta * C0[:m] if beta else 0)
        np.testing.assert_allclose(C[:m], expected, rtol=tolerance, atol=tolerance)
        assert np.array_equal(C[m:], C0[m:])  # rows past the view untouched


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_products_summed_in_runs_equal_the_whole_product(dtype):
    rng = np.random.default_rng(6)
    W, X = rng.random((101, 20)).astype(dtype), rng.random((101, 300)).astype(dtype)
    out = np.full((20, 300), np.nan, dtype)
    _sum_in_runs(W, X, out, 25)  # runs of 25, 25, 25, 25 and 1 rows
    np.testing.assert_allclose(out, W.astype(np.float64).T @ X.astype(np.float64),
                               rtol=1e-12 if dtype == np.float64 else 1e-5)


def test_operands_blas_cannot_take_are_refused():
    A, B = np.ones((4, 6)), np.ones((6, 5))
    with pytest.raises(numba.core.errors.TypingError):
        _gemm(A[:, ::2], B[:3], np.zeros((4, 5)), 0.0)  # strided columns: no leading dimension describes them
    with pytest.raises(numba.core.errors.TypingError):
        _gemm(A, B.astype(np.float32), np.zeros((4, 5)), 0.0)  # mixed dtypes
    with pytest.raises(numba.core.errors.TypingError):
        _gemm(A.astype(np.int64), B.astype(np.int64), np.zeros((4, 5), np.int64), 0)  # not a float
    with pytest.raises(numba.core.errors.TypingError):
        _gemm(A, B, np.zeros((5, 4)).T, 0.0)  # C must be C-contiguous
