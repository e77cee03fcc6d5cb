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

from .blas_threads import map_on_cores
from .block_forms import block_form
from .memory import empty_aligned
from .nmf import csr_w_update
from .products import floor_eps
from .row_vectors import gather_row

#: The driver's sweeps over r x n and s x n arrays (line 8, line 5, the objective's inner products)
#: run in this many pieces on the cores (``map_on_cores``) from this many entries on (issue 19: half of a sparse
#: fit's iteration was driver work on one core). Every entry's operations are the same whatever the pieces: the
#: same bits on any number of cores.
DRIVER_PIECES = 8
DRIVER_PARALLEL_ENTRIES = 1 << 17


def _on_column_ranges(sweep, n: int, entries: int, blas: bool = False) -> list:
    """``[sweep(lo, hi)]`` over columns 0..n: in one call below ``DRIVER_PARALLEL_ENTRIES`` entries (small fits make it
    every iteration), else in ``DRIVER_PIECES`` ranges on the cores (``blas``: ``sweep`` calls BLAS, held at one
    thread meanwhile)."""
    if entries < DRIVER_PARALLEL_ENTRIES:
        return [sweep(0, n)]
    bounds = np.linspace(0, n, min(DRIVER_PIECES, n) + 1).astype(np.int64).tolist()
    return map_on_cores(lambda span: sweep(*span), list(zip(bounds[:-1], bounds[1:])), blas=blas)


def kept_columns(stored: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(kept, kept_starts) from ``stored`` (strata x n, non-zero where a stratum stores an entry in a column): each
    stratum's columns in order, stratum by stratum."""
    kept, starts = _kept_columns(np.ascontiguousarray(stored))
    return kept.copy(), starts


@numba.njit(nogil=True, cache=True)
def _kept_columns(stored):
    """``np.nonzero``'s columns and where each row's columns begin, without its branch per entry (a stratum stores
    entries in a third of a corpus's columns, at random: 20 x 50,000, 7 ms against 1.5 in ``bench_stratified``)."""
    s, n = stored.shape
    kept = np.empty(s * n, np.int64)
    starts = np.zeros(s + 1, np.int64)
    count = 0
    for i in range(s):
        for j in range(n):
            kept[count] = j
            count += stored[i, j] != 0
        starts[i + 1] = count
    return kept[:count], starts


def kept_of(kept: np.ndarray, kept_starts: np.ndarray, stratum: int) -> np.ndarray:
    """Stratum ``stratum``'s kept columns."""
    return kept[kept_starts[stratum]:kept_starts[stratum + 1]]


def kept_columns_mu_step(A, W, Ht, HHt, shift, kept):
    """Line 7's MU step on a CSR block whose stored columns are all among ``kept`` (its stratum's), and the new
    W's statistic there: returns (W_new, A^T W_new at ``kept``, k x r).

    W_new from the CSR sweep of ``kernels/nmf.py`` (``csr_w_update``: H^T read where it is; issue 19: a copy of its
    kept rows per block took the stratified benchmark's 20 blocks, one after another, from 88 to 125 ms; in bands of
    columns, as NMF's step reads a held block, no faster on its 1,000-row blocks); then each kept column's row of
    A^T W_new summed in registers from the block's entries in that column, rows in order (``_sums_by_column``, over the
    block's kept-column form, :func:`kept_column_form`): the additions of the whole-width sweep's scatter, in its
    order, so W_new and the kept rows of (W^T A)^T are its bits, and each row of the statistic
    is written once, not added into at every entry (the scatter's random read-modify-writes of a k x r array: 20
    blocks of ``bench_stratified`` on 2 threads, 28 -> 18 ms with their forms kept). The other columns' statistic, all
    zeros, is never made."""
    starts, rows, values = kept_column_form(A, kept, Ht.shape[0])
    W = np.ascontiguousarray(W)
    WHHt = W @ HHt
    WHHt += shift
    W_new, AtW = empty_aligned(W.shape, W.dtype), empty_aligned((kept.size, W.shape[1]), W.dtype)
    csr_w_update(A.indptr, A.indices, A.data, W, np.ascontiguousarray(Ht), np.ascontiguousarray(HHt), WHHt, True,
                 floor_eps(W.dtype), W_new)
    _sums_by_column(starts, rows, values, W_new, AtW)
    return W_new, AtW


@numba.njit(nogil=True, cache=True)
def _sums_by_column(starts, rows, values, W, out):
    """Row c of ``out`` = sum over the entries of kept column c (``starts[c]`` to ``starts[c + 1]``) of value times
    row ``rows[p]`` of W."""
    for c in range(starts.shape[0] - 1):
        gather_row(out, c, values, rows, starts[c], starts[c + 1], W)


def kept_column_form(A, kept: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The CSR block A's entries by column, at their places among ``kept`` (sorted, of n columns): (starts, k + 1;
    rows, in order within a column; values). ValueError if A stores a column outside ``kept`` (or beyond n). Kept
    for A while it lives (``kernels/block_forms.py``; 0.5 ms to make for a 1,000-row block of 100,000 entries,
    ``bench_stratified``, so made in every pass beyond ``FORMS_BYTES``)."""
    form = block_form(A, "kept columns", kept, lambda: _by_kept_column(A.indptr, A.indices, A.data, kept, n))
    if form is None:  # the sweeps do not check their indices: refuse before they run
        raise ValueError("a CSR block stores a column outside its stratum's kept columns (the data changed after "
                         "pass 0)")
    return form


@numba.njit(nogil=True, cache=True)
def _by_kept_column(indptr, indices, data, kept, n):
    """(starts, rows, values) of :func:`kept_column_form`, or None if an entry's column is not kept (or not among the
    n): a count of each kept column's entries, then each entry placed, rows in order."""
    places = np.full(n, -1, np.int64)
    for t in range(kept.shape[0]):
        places[kept[t]] = t
    starts = np.zeros(kept.shape[0] + 1, np.int64)
    for p in range(indices.shape[0]):
        index = indices[p]
        if index < 0 or index >= n or places[index] < 0:
            return None
        starts[places[index] + 1] += 1
    for c in range(kept.shape[0]):
        starts[c + 1] += starts[c]
    following = starts[:-1].copy()
    rows, values = np.empty(indices.shape[0], np.int32), np.empty_like(data)
    for i in range(indptr.shape[0] - 1):
        for p in range(indptr[i], indptr[i + 1]):
            c = places[indices[p]]
            rows[following[c]] = i
            values[following[c]] = data[p]
            following[c] += 1
    return starts, rows, values


def inner_at_start(A, W, H) -> float:
    """<W^T A, H> = <W, A H^T> of a CSR block, without its r x n statistic."""
    return float(np.vdot(W, A @ np.ascontiguousarray(H.T)))


@numba.njit(nogil=True, cache=True)
def _add_kept_rows(out_T, AtW, kept, lo, hi, first_column):
    """out_T[kept[t] - first_column] += AtW[t] for t in lo..hi (each entry one addition: the sum's order is the
    caller's)."""
    for t in range(lo, hi):
        row = out_T[kept[t] - first_column]
        for q in range(AtW.shape[1]):
            row[q] += AtW[t, q]


@numba.njit(nogil=True, cache=True, fastmath=True)
def kept_inner(AtW, Ht, kept):
    """<W^T A, H> from A^T W at the kept columns and H^T (n x r): sum_t AtW[t] . Ht[kept[t]], in float64."""
    total = 0.0
    for t in range(kept.shape[0]):
        h = Ht[kept[t]]
        for q in range(AtW.shape[1]):
            total += np.float64(AtW[t, q]) * np.float64(h[q])
    return total


def kept_inners(AtW_kept: list, Ht: np.ndarray, kept: np.ndarray, kept_starts: np.ndarray) -> list[float]:
    """Every stratum's ``kept_inner`` (<W(i)^T A(i), H>), strata on the cores."""
    def inner(i):
        return kept_inner(AtW_kept[i], Ht, kept_of(kept, kept_starts, i))

    if kept.size * Ht.shape[1] < DRIVER_PARALLEL_ENTRIES:
        return [inner(i) for i in range(len(AtW_kept))]
    return map_on_cores(inner, list(range(len(AtW_kept))))


@numba.njit(nogil=True, cache=True)
def _v_updates(v, colsum, sizes, HtWt1, eps, n_updates, out, lo, hi):
    for i in range(v.shape[0]):
        for j in range(lo, hi):
            size = sizes[i, j if sizes.shape[1] > 1 else 0]
            value = v[i, j]
            for _ in range(n_updates):
                value = value * colsum[i, j] / (size * value + HtWt1[i, j] + eps)
            out[i, j] = value


def v_updates(v, colsum, sizes, HtWt1, eps: float, n_updates: int) -> np.ndarray:
    """Line 5 ``n_updates`` times, entry by entry: v <- v * colsum / (sizes * v + HtWt1 + eps) (``sizes``: s x 1 or
    s x n), the operations numpy's expression makes, in its order (the same bits), in one sweep of memory, by
    ranges of columns on the cores."""
    out = empty_aligned(v.shape, np.result_type(v, colsum, sizes, HtWt1))
    _on_column_ranges(lambda lo, hi: _v_updates(v, colsum, sizes, HtWt1, eps, n_updates, out, lo, hi), v.shape[1],
                      v.size)
    return out


@numba.njit(nogil=True, cache=True)
def _mu_ratio(numerator, H, denominator, eps, lo, hi, offset):
    """numerator <- numerator * H / (denominator + eps) at columns lo..hi (denominator's columns from ``offset``)."""
    for q in range(H.shape[0]):
        for j in range(lo, hi):
            numerator[q, j] = numerator[q, j] * H[q, j] / (denominator[q, j - offset] + eps)


@numba.njit(nogil=True, cache=True)
def _mu_ratio_by_columns(numerator_T, H, denominator, eps, lo, out, out_T):
    """out[q, lo + j] = out_T[lo + j, q] = numerator_T[j, q] * H[q, lo + j] / (denominator[q, j] + eps): the
    numerator of columns lo.. as rows (``_add_kept_rows``'), the new H and its transpose."""
    for j in range(numerator_T.shape[0]):
        for q in range(H.shape[0]):
            value = numerator_T[j, q] * H[q, lo + j] / (denominator[q, j] + eps)
            out[q, lo + j] = value
            out_T[lo + j, q] = value


def mu_ratio_in_place(numerator, H, denominator, shift, eps: float) -> np.ndarray:
    """numerator <- numerator * H / (denominator + shift + eps) (line 8), entry by entry in numpy's order, by ranges
    of columns on the cores. ``denominator`` is overwritten (with denominator + shift)."""
    denominator += shift
    _on_column_ranges(lambda lo, hi: _mu_ratio(numerator, H, denominator, eps, lo, hi, 0), H.shape[1], H.size)
    return numerator


def line8(H, v, WtW, Wt1, eps: float, numerator=None, kept_sums=None):
    """Line 8 without a mask: H <- N * H / (WtW H + Wt1^T v + eps), N = sum_i W(i)^T A(i), WtW = sum_i W(i)^T W(i)
    and Wt1 (s x r) the strata's W(i)^T 1 as rows; N given as ``numerator`` (r x n, overwritten with the new H) or as
    ``kept_sums`` (CSR blocks: each stratum's A(i)^T W(i) at its kept columns, kept, kept_starts), then summed range
    by range, stratum by stratum in order (every entry the same sum, in the same order, as adding the strata's r x n
    statistics, zeros elsewhere: the same bits). Returns the new H, its transpose (aligned; with ``kept_sums``,
    whose blocks read it, else None), and what the objective and line 5 take from it: H^T W(i)^T 1 for every stratum
    as rows of Wt1 H (s x n, line 5's), and (W(i)^T 1)^T H v(i) for every stratum (the objective's, at G's v): the
    sum over the columns of v o (Wt1 H).

    By ranges of columns on the cores (from ``DRIVER_PARALLEL_ENTRIES`` entries of H on), each range's sum,
    products (BLAS on one thread; k = r or s, so they keep the cores busy, unlike H H^T's) and sweeps made while the
    range is in cache: neither N nor the denominator exists as r x n. Each range's share of the last sums is added in
    range order: the ranges are fixed by the size, never by the number of cores (issue 19: the driver's products on
    one thread took a sixth of a sparse fit; N made whole, then transposed, then read again, a sixth of what was
    left: 21-27 against 11-13 ms for the stratified benchmark's line 8)."""
    r, n = H.shape
    HtWt1 = empty_aligned((v.shape[0], n), np.result_type(Wt1, H))
    if kept_sums is None:
        H_new, Ht = numerator, None
    else:
        AtW_kept, kept, kept_starts = kept_sums
        H_new, Ht = empty_aligned((r, n), H.dtype), empty_aligned((n, r), H.dtype)
        strata = [kept_of(kept, kept_starts, i) for i in range(len(AtW_kept))]

    def columns(lo, hi):
        denominator = WtW @ H[:, lo:hi]
        denominator += Wt1.T @ v[:, lo:hi]  # the shift, added before eps (numpy's order for (WtW H + Wt1^T v) + eps)
        if Ht is None:
            _mu_ratio(numerator, H, denominator, eps, lo, hi, lo)
        else:
            sums_T = np.zeros((hi - lo, r), AtW_kept[0].dtype)  # each kept column's r entries side by side
            for AtW, columns_i in zip(AtW_kept, strata):
                first, last = np.searchsorted(columns_i, (lo, hi))  # the stratum's kept columns in lo..hi (sorted)
                _add_kept_rows(sums_T, AtW, columns_i, first, last, lo)
            _mu_ratio_by_columns(sums_T, H, denominator, eps, lo, H_new, Ht)
        np.matmul(Wt1, H_new[:, lo:hi], out=HtWt1[:, lo:hi])
        return np.einsum("ij,ij->i", HtWt1[:, lo:hi], v[:, lo:hi])

    parts = _on_column_ranges(columns, n, H.size, blas=True)
    Wt1_Hv = parts[0]
    for part in parts[1:]:
        Wt1_Hv = Wt1_Hv + part
    return H_new, Ht, HtWt1, Wt1_Hv
