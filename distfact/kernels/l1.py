"""Weighted L1-NMF by sparse coordinate descent (Seraghiti et al., 2026, Section 6); pure numeric, no Dask.

Objective (eq. 5.1), for X >= 0 with non-zeros kappa+ and zeros kappa0:

    sum_{(i,j) in kappa+} |X - WH|_ij + lambda sum_{(i,j) in kappa0} (WH)_ij
  = sum_{kappa+} (|X - WH| - lambda WH) + lambda (1^T W)(H 1)          (Section 6.2: O(nnz r))

The kernels return the two sums over the non-zeros, sum |x - wh| and sum wh, per group of the
*index* space (columns of the CSR given; for the H sweep on CSC X these are the rows of X, so the
sums come out per row group); the caller adds lambda (1^T W)(H 1).

One scalar subproblem (eq. 6.4, written for an entry F_it of the factor whose rows follow the rows
of a CSR matrix; the other factor G enters as G^T, n x r):

    F_it = argmin_{alpha >= 0} sum_{s in nz(i)} |a_s - b_s alpha| + c alpha,
    a_s = X_is - v_s + G_ts F_it,  b_s = G_ts,  c = lambda (S_t - sum_{s in nz(i)} G_ts),  S_t = sum_s G_ts,

with v_s = (F G)_is kept up to date incrementally (Section 6.1), solved by the constrained weighted
median of Algorithm 2.1 over |nz(i)| + 1 points. A sweep over the rows of CSR X updates F = W for
fixed H; the same sweep over the rows of X^T (the CSC arrays of X) updates F = H^T for fixed W
(Algorithm 6.2).
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(nogil=True, cache=True)
def constrained_weighted_median(x, y):
    """Algorithm 2.1: argmin_{alpha >= 0} sum_s |x_s - y_s alpha|, in O(k log k).

    Points x_s / y_s with weights |y_s| (terms with y_s = 0 are constant and dropped); the result is
    the smallest point whose cumulative weight reaches half the total (the left end of the set of
    minimisers), clipped at 0. No term with y_s != 0: 0.
    """
    k = 0
    for s in range(y.shape[0]):
        if y[s] != 0.0:
            k += 1
    if k == 0:
        return 0.0
    points = np.empty(k)
    weights = np.empty(k)
    k = 0
    total = 0.0
    for s in range(y.shape[0]):
        if y[s] != 0.0:
            points[k] = x[s] / y[s]
            weights[k] = abs(y[s])
            total += weights[k]
            k += 1
    order = np.argsort(points, kind="mergesort")
    half = 0.5 * total
    cumulative = 0.0
    for q in range(k):
        cumulative += weights[order[q]]
        if cumulative >= half:
            return max(0.0, points[order[q]])
    return max(0.0, points[order[k - 1]])


@numba.njit(nogil=True, cache=True)
def _gather_rows(indices, start, k, Gt, G_nz):
    """G_nz[t, p] = G_{t, s_p} for the non-zeros s_p of the row: the other factor's entries the row's
    subproblems read, gathered once into a contiguous buffer (r strided gathers avoided)."""
    r = Gt.shape[1]
    for p in range(k):
        g = Gt[indices[start + p]]
        for t in range(r):
            G_nz[t, p] = g[t]


@numba.njit(nogil=True, cache=True)
def _row_products(F, i, G_nz, k, v):
    """v[p] = (F G)_{i, s_p} for the non-zeros s_p of row i (from the gathered G_nz)."""
    for p in range(k):
        v[p] = 0.0
    for t in range(F.shape[1]):
        f = F[i, t]
        for p in range(k):
            v[p] += f * G_nz[t, p]


@numba.njit(nogil=True, cache=True)
def _add_nonzero_terms(data, indices, start, k, v, group_starts, abs_residual, fitted):
    """Add |x - v| and v over row i's non-zeros to the sums of the groups their indices fall in
    (``group_starts``: the first index of every group, increasing)."""
    for p in range(k):
        g = np.searchsorted(group_starts, indices[start + p], side="right") - 1
        abs_residual[g] += abs(data[start + p] - v[p])
        fitted[g] += v[p]


def _longest_row(indptr):
    return int(np.diff(indptr).max(initial=0))


@numba.njit(nogil=True, cache=True)
def _scd_sweep_rows(indptr, indices, data, F, Gt, lam, group_starts, longest):
    m, r = F.shape
    S = np.zeros(r)
    for j in range(Gt.shape[0]):
        for t in range(r):
            S[t] += Gt[j, t]
    G_nz = np.empty((r, longest))
    v = np.empty(longest)
    a = np.empty(longest + 1)
    b = np.empty(longest + 1)
    abs_residual = np.zeros(group_starts.shape[0])
    fitted = np.zeros(group_starts.shape[0])
    for i in range(m):
        start, k = indptr[i], indptr[i + 1] - indptr[i]
        _gather_rows(indices, start, k, Gt, G_nz)
        _row_products(F, i, G_nz, k, v)
        for t in range(r):
            old = F[i, t]
            g = G_nz[t]
            nz_weight = 0.0
            for p in range(k):
                nz_weight += g[p]
                a[p] = data[start + p] - v[p] + g[p] * old
                b[p] = g[p]
            a[k] = 0.0
            b[k] = lam * (S[t] - nz_weight)  # the zeros of row i, lumped (c in eq. 6.5)
            new = constrained_weighted_median(a[:k + 1], b[:k + 1])
            F[i, t] = new
            if new != old:
                for p in range(k):
                    v[p] += g[p] * (new - old)
        _add_nonzero_terms(data, indices, start, k, v, group_starts, abs_residual, fitted)
    return abs_residual, fitted


def scd_sweep_rows(indptr, indices, data, F, Gt, lam, group_starts):
    """Algorithm 6.1 over the rows of a CSR block: update F (rows x r) in place, entry by entry in index
    order (row i, then t = 0..r-1), for the fixed factor Gt (n x r).

    Returns ``(abs_residual, fitted)``, per group of ``group_starts``: the sums over the non-zeros of
    |x - v| and v at the updated F (line 15 of Algorithm 6.1, split so that any lambda applies)."""
    return _scd_sweep_rows(indptr, indices, data, F, Gt, float(lam), group_starts, _longest_row(indptr))


@numba.njit(nogil=True, cache=True)
def _nonzero_terms(indptr, indices, data, F, Gt, group_starts, longest):
    G_nz = np.empty((F.shape[1], longest))
    v = np.empty(longest)
    abs_residual = np.zeros(group_starts.shape[0])
    fitted = np.zeros(group_starts.shape[0])
    for i in range(F.shape[0]):
        start, k = indptr[i], indptr[i + 1] - indptr[i]
        _gather_rows(indices, start, k, Gt, G_nz)
        _row_products(F, i, G_nz, k, v)
        _add_nonzero_terms(data, indices, start, k, v, group_starts, abs_residual, fitted)
    return abs_residual, fitted


def nonzero_terms(indptr, indices, data, F, Gt, group_starts):
    """The sums of |x - v| and v over the non-zeros, v = (F G) there, per group of ``group_starts``,
    without updating anything (the objective of given factors in O(nnz r))."""
    return _nonzero_terms(indptr, indices, data, F, Gt, group_starts, _longest_row(indptr))


def wl1_objective(abs_residual, fitted, lam, W_colsum, H_rowsum):
    """Eq. (5.1) from the sums over the non-zeros: sum (|x - wh| - lambda wh) + lambda (1^T W)(H 1)."""
    return abs_residual - lam * fitted + lam * (W_colsum @ H_rowsum)
