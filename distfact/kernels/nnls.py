"""Non-negative least squares for many rows at once (no Python loop over rows).

Each row i solves  min_{w >= 0} ||x_i - H^T w||^2, written on the Gram form
    min_{w >= 0}  1/2 w^T G w - w^T b_i,    G = H H^T (r x r),  b_i = H x_i (row i of X H^T),
by the Lawson-Hanson active-set method, compiled with numba (``nogil``).
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(nogil=True, cache=True)
def _nnls_row(G, b, tol, max_outer):
    r = b.shape[0]
    w = np.zeros(r)
    passive = np.zeros(r, dtype=np.bool_)
    grad = b.copy()
    for _ in range(max_outer):
        best, j = tol, -1
        for k in range(r):
            if not passive[k] and grad[k] > best:
                best, j = grad[k], k
        if j < 0:
            break
        passive[j] = True
        while True:
            idx = np.flatnonzero(passive)
            z_p = np.linalg.solve(G[idx][:, idx], b[idx])
            if np.all(z_p > 0):
                w[:] = 0.0
                w[idx] = z_p
                break
            # step back to the boundary, drop the variables that reach zero
            alpha = 1.0
            for q in range(idx.shape[0]):
                k = idx[q]
                if z_p[q] <= 0:
                    step = w[k] / (w[k] - z_p[q])
                    if step < alpha:
                        alpha = step
            for q in range(idx.shape[0]):
                k = idx[q]
                w[k] += alpha * (z_p[q] - w[k])
                if w[k] <= tol:
                    w[k] = 0.0
                    passive[k] = False
            if not passive.any():
                break
        grad = b - G @ w
    return w


@numba.njit(nogil=True, cache=True)
def _nnls_rows(G, B, tol, max_outer):
    out = np.empty_like(B)
    for i in range(B.shape[0]):
        out[i] = _nnls_row(G, B[i], tol, max_outer)
    return out


def nnls_gram(G: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Rows w_i = argmin_{w >= 0} 1/2 w^T G w - w^T B[i] (G symmetric positive definite).

    Computed in float64 and returned in B's dtype.
    """
    G64 = np.ascontiguousarray(G, dtype=np.float64)
    B64 = np.ascontiguousarray(B, dtype=np.float64)
    tol = 1e-12 * max(float(np.abs(B64).max(initial=0.0)), 1.0) * max(float(np.abs(G64).max(initial=0.0)), 1.0)
    return _nnls_rows(G64, B64, tol, 3 * G64.shape[0] + 10).astype(B.dtype, copy=False)
