"""Weighted L1-NMF by sparse coordinate descent (wl1-nmf-scd.txt, Section 6); pure numeric, no Dask.

Objective (eq. 5.1), for X >= 0 with non-zeros kappa+ and zeros kappa0:

    sum_{(i,j) in kappa+} |X - WH|_ij + lambda sum_{(i,j) in kappa0} (WH)_ij

One scalar subproblem (eq. 6.4, written for an entry F_it of the factor whose rows follow the rows
of a CSR matrix; the other factor G enters as G^T, n x r):

    F_it = argmin_{alpha >= 0} sum_{s in nz(i)} |a_s - b_s alpha| + c alpha,
    a_s = X_is - v_s + G_ts F_it,  b_s = G_ts,  c = lambda (S_t - sum_{s in nz(i)} G_ts),  S_t = sum_s G_ts,

with v_s = (F G)_is kept up to date incrementally (Section 6.1), solved by the constrained weighted
median of Algorithm 2.1 over |nz(i)| + 1 points. A sweep over the rows of CSR X updates F = W for
fixed H; the same sweep over the rows of X^T (CSR of X^T) updates F = H^T for fixed W (Algorithm 6.2).
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
def scd_sweep_rows(indptr, indices, data, F, Gt, lam):
    """Algorithm 6.1 over the rows of a CSR block: update F (rows x r) in place, entry by entry in index
    order (row i, then t = 0..r-1), for the fixed factor Gt (n x r). Returns the block's objective
    (eq. 5.1) at the updated F: sum_nz (|x - v| - lambda v) + lambda (1^T F)(G 1)."""
    m, r = F.shape
    S = np.zeros(r)
    for j in range(Gt.shape[0]):
        for t in range(r):
            S[t] += Gt[j, t]
    longest = 0
    for i in range(m):
        longest = max(longest, indptr[i + 1] - indptr[i])
    v = np.empty(longest)
    a = np.empty(longest + 1)
    b = np.empty(longest + 1)
    objective = 0.0
    for i in range(m):
        start, k = indptr[i], indptr[i + 1] - indptr[i]
        for p in range(k):
            g = Gt[indices[start + p]]
            acc = 0.0
            for t in range(r):
                acc += F[i, t] * g[t]
            v[p] = acc
        for t in range(r):
            old = F[i, t]
            nz_weight = 0.0
            for p in range(k):
                g = Gt[indices[start + p], t]
                nz_weight += g
                a[p] = data[start + p] - v[p] + g * old
                b[p] = g
            a[k] = 0.0
            b[k] = lam * (S[t] - nz_weight)  # the zeros of row i, lumped (c in eq. 6.5)
            new = constrained_weighted_median(a[:k + 1], b[:k + 1])
            F[i, t] = new
            if new != old:
                for p in range(k):
                    v[p] += Gt[indices[start + p], t] * (new - old)
        for p in range(k):
            objective += abs(data[start + p] - v[p]) - lam * v[p]
    for t in range(r):
        column = 0.0
        for i in range(m):
            column += F[i, t]
        objective += lam * column * S[t]
    return objective
