"""Stratified-NMF's statistics of CSR blocks on their stratum's stored columns; pure numeric, no Dask.

A stratum of a sparse corpus stores entries in a fraction of the n columns (a 1,000-document stratum of a
50,000-term corpus at 0.2%: about 19,000). Its W(i)^T A(i) is zero in every other column, so it is made, reduced and
read as ``A(i)^T W(i)`` at the stratum's *kept columns* (the columns where any of its blocks stores an entry, sorted):
k_i x r instead of r x n. The kept columns of every stratum travel as one array, ``kept``, cut by ``kept_starts``
(stratum i's are ``kept[kept_starts[i]:kept_starts[i + 1]]``).
"""

from __future__ import annotations

import numba
import numpy as np

from .memory import aligned, aligned_copy, empty_aligned
from .nmf import _csr_frobenius_local
from .products import floor_eps


def kept_columns(stored: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(kept, kept_starts) from ``stored`` (strata x n, non-zero where a stratum stores an entry in a column)."""
    rows, columns = np.nonzero(stored)  # row-major: stratum by stratum, columns sorted
    starts = np.searchsorted(rows, np.arange(stored.shape[0] + 1))
    return columns.astype(np.int64), starts.astype(np.int64)


def kept_of(kept: np.ndarray, kept_starts: np.ndarray, stratum: int) -> np.ndarray:
    """Stratum ``stratum``'s kept columns."""
    return kept[kept_starts[stratum]:kept_starts[stratum + 1]]


def kept_columns_mu_step(A, W, Ht, HHt, shift, kept):
    """Line 7's MU step on a CSR block whose stored columns are all among ``kept`` (its stratum's), and the new
    W's statistic there: returns (W_new, A^T W_new at ``kept``, k x r).

    The fused CSR sweep of ``kernels/nmf.py`` on the block with its column indices renumbered into ``kept`` and H^T's
    rows gathered likewise: the same products in the same order as on the whole width, so W_new and the kept rows
    of (W^T A)^T are the same bits; the other columns' statistic, all zeros, is never made."""
    positions = np.full(Ht.shape[0], -1, dtype=A.indices.dtype)
    positions[kept] = np.arange(kept.size, dtype=positions.dtype)
    columns = positions[A.indices]
    if columns.size and columns.min() < 0:  # the sweep does not check its indices: refuse before it runs
        raise ValueError("a CSR block stores a column outside its stratum's kept columns (the data changed after "
                         "pass 0)")
    W = np.ascontiguousarray(W)
    WHHt = W @ HHt
    WHHt += shift
    W_new, AtW = _csr_frobenius_local(A.indptr, columns, A.data, W, Ht[kept], np.ascontiguousarray(HHt),
                                      WHHt, True, floor_eps(W.dtype))
    return aligned(W_new), aligned(AtW)  # here, in the block's thread (the pass would copy them in the driver's)


def inner_at_start(A, W, H) -> float:
    """<W^T A, H> = <W, A H^T> of a CSR block, without its r x n statistic."""
    return float(np.vdot(W, A @ np.ascontiguousarray(H.T)))


@numba.njit(nogil=True, cache=True)
def _add_kept_rows(out_T, AtW, kept):
    """out_T[kept[t]] += AtW[t] (each entry one addition: the sum's order is the caller's)."""
    for t in range(kept.shape[0]):
        row = out_T[kept[t]]
        for q in range(AtW.shape[1]):
            row[q] += AtW[t, q]


def sum_over_strata(AtW_kept: list, kept: np.ndarray, kept_starts: np.ndarray, n: int) -> np.ndarray:
    """sum_i W(i)^T A(i) (r x n) from each stratum's A(i)^T W(i) at its kept columns, added stratum by stratum in
    order: every entry the same sum, in the same order, as adding the strata's r x n statistics (zeros elsewhere).
    Summed as n x r (each kept column's r entries side by side), then transposed."""
    out_T = np.zeros((n, AtW_kept[0].shape[1]), dtype=AtW_kept[0].dtype)
    for i, AtW in enumerate(AtW_kept):
        _add_kept_rows(out_T, AtW, kept_of(kept, kept_starts, i))
    return aligned_copy(out_T.T)  # aligned: the engine need not copy it again


@numba.njit(nogil=True, cache=True, fastmath=True)
def kept_inner(AtW, Ht, kept):
    """<W^T A, H> from A^T W at the kept columns and H^T (n x r): sum_t AtW[t] . Ht[kept[t]], in float64."""
    total = 0.0
    for t in range(kept.shape[0]):
        h = Ht[kept[t]]
        for q in range(AtW.shape[1]):
            total += np.float64(AtW[t, q]) * np.float64(h[q])
    return total


@numba.njit(nogil=True, cache=True)
def _v_updates(v, colsum, sizes, HtWt1, eps, n_updates, out):
    for i in range(v.shape[0]):
        for j in range(v.shape[1]):
            size = sizes[i, j if sizes.shape[1] > 1 else 0]
            value = v[i, j]
            for _ in range(n_updates):
                value = value * colsum[i, j] / (size * value + HtWt1[i, j] + eps)
            out[i, j] = value


def v_updates(v, colsum, sizes, HtWt1, eps: float, n_updates: int) -> np.ndarray:
    """Line 5 ``n_updates`` times, entry by entry: v <- v * colsum / (sizes * v + HtWt1 + eps) (``sizes``: s x 1 or
    s x n), the operations numpy's expression makes, in its order (the same bits), in one sweep of memory."""
    out = empty_aligned(v.shape, np.result_type(v, colsum, sizes, HtWt1))
    _v_updates(v, colsum, sizes, HtWt1, eps, n_updates, out)
    return out


@numba.njit(nogil=True, cache=True)
def _mu_ratio(numerator, H, denominator, shift, eps):
    for q in range(H.shape[0]):
        for j in range(H.shape[1]):
            numerator[q, j] = numerator[q, j] * H[q, j] / (denominator[q, j] + shift[q, j] + eps)


def mu_ratio_in_place(numerator, H, denominator, shift, eps: float) -> np.ndarray:
    """numerator <- numerator * H / (denominator + shift + eps) (line 8), entry by entry in numpy's order."""
    _mu_ratio(numerator, H, denominator, shift, eps)
    return numerator
