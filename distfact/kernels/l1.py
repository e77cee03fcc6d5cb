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


# -- masks (entry weights m_ij, issue 20) --------------------------------------------------------------------
#
# A line (a row of the CSR being swept) carries, besides its non-zeros, a *base* weight per index (``base``,
# 1 or 0: the line's entries weigh 1 unless adjusted, or 0) and *adjustments*: entries (s, d) of a CSR whose
# weight is base_s + d. The complement form of a mask is base 1 with d = -c_ij (c = 1 - m at the entries
# whose weight is not 1); the observed form is base 0 with d = m_ij at the observed entries. Then, with
# S^b_t = sum_s base_s G_ts and Z(i) the adjustments of line i at zeros of X,
#
#     sum_{s in kappa0(i)} m_is G_ts = S^b_t - sum_{s in nz(i)} base_s G_ts + sum_{e in Z(i)} d_e G_{t,s_e},
#
# O(|nz(i)| + |adjustments of i|) per coordinate: the masked sweep costs O(r (nnz + masked entries)) on top
# of the medians.


@numba.njit(nogil=True, cache=True)
def _line_weights(indices, start, k, adj_indices, adj_start, adj_stop, base, adj_delta, weight, nz_base, at_zero):
    """weight[p] = m at the line's non-zero p (base plus its adjustment, if any), nz_base[p] = base there;
    at_zero: the positions (in the adjustment arrays) of the adjustments at zeros of X. Both index lists are
    sorted (canonical CSR). Returns the number of adjustments at zeros."""
    for p in range(k):
        nz_base[p] = base[indices[start + p]]
        weight[p] = nz_base[p]
    p = 0
    n_zero = 0
    for e in range(adj_start, adj_stop):
        s = adj_indices[e]
        while p < k and indices[start + p] < s:
            p += 1
        if p < k and indices[start + p] == s:
            weight[p] += adj_delta[e]
        else:
            at_zero[n_zero] = e
            n_zero += 1
    return n_zero


@numba.njit(nogil=True, cache=True)
def _add_masked_terms(F, i, Gt, data, indices, start, k, v, weight, nz_base, adj_indices, adj_delta, at_zero,
                      n_zero, group_starts, sums):
    """Add line i's terms to the sums of the groups their indices fall in: sums[0] += m |x - v| and
    sums[2] += m (x - v)^2 - base v^2 over the non-zeros, sums[1] += base v over the non-zeros and
    -d u, sums[2] += d u^2 over the adjustments at zeros (u = (F G) there, O(r) each)."""
    for p in range(k):
        g = np.searchsorted(group_starts, indices[start + p], side="right") - 1
        residual = data[start + p] - v[p]
        sums[0, g] += weight[p] * abs(residual)
        sums[1, g] += nz_base[p] * v[p]
        sums[2, g] += weight[p] * residual * residual - nz_base[p] * v[p] * v[p]
    for q in range(n_zero):
        e = at_zero[q]
        s = adj_indices[e]
        u = 0.0
        for t in range(F.shape[1]):
            u += F[i, t] * Gt[s, t]
        g = np.searchsorted(group_starts, s, side="right") - 1
        sums[1, g] -= adj_delta[e] * u
        sums[2, g] += adj_delta[e] * u * u


@numba.njit(nogil=True, cache=True)
def _masked_sweep(indptr, indices, data, F, Gt, lam, group_starts, base, adj_indptr, adj_indices, adj_delta,
                  longest, longest_adj, update):
    m, r = F.shape
    S = np.zeros(r)
    for j in range(Gt.shape[0]):
        if base[j] != 0.0:
            for t in range(r):
                S[t] += base[j] * Gt[j, t]
    G_nz = np.empty((r, longest))
    G_zero = np.empty((r, longest_adj))
    v = np.empty(longest)
    weight = np.empty(longest)
    nz_base = np.empty(longest)
    at_zero = np.empty(longest_adj, dtype=np.int64)
    a = np.empty(longest + 1)
    b = np.empty(longest + 1)
    sums = np.zeros((3, group_starts.shape[0]))
    for i in range(m):
        start, k = indptr[i], indptr[i + 1] - indptr[i]
        _gather_rows(indices, start, k, Gt, G_nz)
        _row_products(F, i, G_nz, k, v)
        n_zero = _line_weights(indices, start, k, adj_indices, adj_indptr[i], adj_indptr[i + 1], base, adj_delta,
                               weight, nz_base, at_zero)
        if update:
            for q in range(n_zero):
                s = adj_indices[at_zero[q]]
                for t in range(r):
                    G_zero[t, q] = Gt[s, t]
            for t in range(r):
                old = F[i, t]
                g = G_nz[t]
                zero_weight = S[t]  # sum over the line's zeros of m G_t, as in the comment above
                for p in range(k):
                    zero_weight -= nz_base[p] * g[p]
                    a[p] = weight[p] * (data[start + p] - v[p] + g[p] * old)
                    b[p] = weight[p] * g[p]
                for q in range(n_zero):
                    zero_weight += adj_delta[at_zero[q]] * G_zero[t, q]
                a[k] = 0.0
                b[k] = lam * zero_weight
                new = constrained_weighted_median(a[:k + 1], b[:k + 1])
                F[i, t] = new
                if new != old:
                    for p in range(k):
                        v[p] += g[p] * (new - old)
        _add_masked_terms(F, i, Gt, data, indices, start, k, v, weight, nz_base, adj_indices, adj_delta, at_zero,
                          n_zero, group_starts, sums)
    return sums


def masked_sweep_rows(indptr, indices, data, F, Gt, lam, group_starts, base, adjustments, update=True):
    """Algorithm 6.1 with entry weights (see the comment above): update F in place (``update``) for the fixed
    factor Gt, the entry (i, s) weighing base_s plus its adjustment. ``adjustments``: (indptr, indices, delta),
    a CSR of the lines' adjustments with sorted indices; ``base``: one weight per index (length Gt.shape[0]).

    Returns the sums per group of ``group_starts`` as rows of a (3, groups) array, at the final F: over the
    weighted entries, sum_{kappa+} m |x - v| (row 0), sum_{kappa+} base v - sum_{adjustments at zeros} d v
    (row 1; the zeros' term is lambda (sum_{i,s} base_s (F G)_is - row 1)), and sum m (x - v)^2 less
    sum_{i,s} base_s (F G)_is^2 (row 2; add that sum, <F^T F, G diag(base) G^T>, for the squared error)."""
    adj_indptr, adj_indices, adj_delta = adjustments
    return _masked_sweep(indptr, indices, data, F, Gt, float(lam), group_starts, np.asarray(base, dtype=np.float64),
                         adj_indptr, adj_indices, adj_delta, _longest_row(indptr), _longest_row(adj_indptr), update)
