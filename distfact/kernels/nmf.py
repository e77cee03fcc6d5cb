"""NMF updates on one row block (Lee & Seung MU, HALS, KL MU); pure numeric, no Dask.

Shapes: X_b (rows x n, dense or CSR), W_b (rows x r), H (r x n). Each local
step updates W_b for a fixed H and returns, for the updated W_b, the block's
statistics for the next global step. Denominators are floored at the dtype's
machine epsilon (``floor_eps``).
"""

from __future__ import annotations

import numba
import numpy as np
import scipy.sparse as sp

from .blas_threads import map_on_blas_threads, small_product_limit
from .block_forms import block_form
from .gemm import gemm_into
from .memory import aligned, aligned_copy, empty_aligned
from .prefetch import PREFETCH_DISTANCE, prefetch_row
from .products import (block_times_ht, floor_eps, gram, is_sparse, sparse_wt_times_block, wh_at_nonzeros,
                       wt_times_block)
from .row_vectors import add_scaled_row, gather_row, gather_row_onto

#: Bytes of X per tile of the dense local step: a tile stays in the core's cache while both products
#: (X_t H^T, then W_t^T X_t) read it, so that a pass reads X from memory once.
TILE_BYTES = 1 << 20
#: A dense block's tiles are grouped into at most this many row chunks, each with its own r x n sum,
#: which run side by side on BLAS's threads (``blas_threads``). The chunks depend on the block's shape
#: only (and the runs of ``_product_rows`` on the kind of BLAS), so the sums are the same on any number of threads and
#: on a cluster's workers of one kind.
MAX_CHUNKS = 8
#: A CSR step whose H^T and (W^T X)^T (n x r each) take more than this together reads a held block in bands of
#: columns (``csr_band_width``, ``csr_frobenius_local``), so that each band's rows of both stay in the core's cache
#: while every row's entries in the band are read (rows of 160 bytes at rank 20, read at random: 6.4 MB at 20,000
#: columns, against 2 MiB of L2 here)
CSR_BAND_BYTES = 1 << 20
#: Blocks with fewer multiply-adds (rows x columns x rank) than this run their chunks in the calling thread.
PARALLEL_WORK = 1 << 22
#: With float64 sums (float32 data, ``frobenius_local``'s ``sums64``), W_t^T X_t is summed in float32 over at most
#: this many rows at a time: the float32 round-off of each sum grows with its length.
SUM64_ROWS = 128
#: Several models' shared step (``frobenius_local_many``) runs each chunk as one tile when their summed rank is at
#: least this (see ``_dense_frobenius_local``); below it, in tiles of ``TILE_BYTES`` as one model's step.
WHOLE_CHUNK_RANK = 64
#: Where BLAS has small-matrix kernels (``blas_threads.small_product_limit``), a tile's products X_t H^T and W_t H
#: are made on runs of the tile's rows small enough for them (``_product_rows``), if that is at least this many rows
#: (fewer: the products of whole tiles, as without such kernels)
MIN_SMALL_ROWS = 8


# --------------------------------------------------------------------- Frobenius
def mu_h_update(H, WtX, WtW):
    """Lee-Seung H update: H <- H * (W^T X) / (W^T W H)."""
    return _mu_update(H, WtX, WtW @ H)


def mu_w_update(W, XHt, HHt, shift=None):
    """Lee-Seung W update: W <- W * (X H^T) / (W H H^T + shift); ``shift`` (an r-vector added to
    every row of the denominator) carries Stratified-NMF's (1 v^T) H^T + eps term."""
    return _mu_update(W, XHt, W @ HHt, shift)


def _mu_update(F, numerator, denominator, shift=None):
    """F * numerator / max(denominator + shift, eps), the multiplicative update of a factor F (``denominator``, a new
    array, is overwritten). One compiled sweep, not four array operations, when the arrays share a dtype and a 2-D
    shape (``shift``: None or an r-vector) (a small fit makes two updates an iteration, issue 19): numpy's operations
    in its order, the same bits (a NaN's sign aside); otherwise numpy's expression itself."""
    if (F.ndim == 2 and F.shape == numerator.shape == denominator.shape and F.dtype == numerator.dtype == denominator.dtype
            and (shift is None or isinstance(shift, np.ndarray) and shift.shape == F.shape[1:] and shift.dtype == F.dtype)):
        _mu_sweep(F, numerator, denominator, shift, denominator.dtype.type(floor_eps(F.dtype)))
        return denominator
    if shift is not None:
        denominator += shift
    return F * numerator / np.maximum(denominator, floor_eps(F.dtype))


@numba.njit(nogil=True, cache=True)
def _mu_sweep(F, numerator, denominator, shift, eps):
    """``denominator`` <- F * numerator / max(denominator + shift, eps), in place, entry by entry in the arrays' dtype
    (``eps`` of it too; ``shift``, added to every row, may be None), a NaN kept as ``np.maximum`` keeps it. Returns
    nothing: returning an argument costs numba a call into Python (1 us of a 3 us sweep)."""
    for i in range(F.shape[0]):
        for q in range(F.shape[1]):
            d = denominator[i, q]
            if shift is not None:
                d += shift[q]
            if d < eps:
                d = eps
            denominator[i, q] = F[i, q] * numerator[i, q] / d


@numba.njit(nogil=True, cache=True)
def hals_sweep(F, FtX, G):
    """One HALS sweep, in place, over the columns of F (rows x r) for ||X - F M||:

    ``F[:, k] <- max(0, F[:, k] + (FtX[:, k] - F G[:, k]) / G[k, k])`` for k = 0..r-1,
    each column using the columns already updated (Gauss-Seidel); G = M M^T,
    FtX = X M^T. A column whose G[k, k] is 0 is left as it is.
    """
    m, r = F.shape
    for i in range(m):
        for k in range(r):
            gkk = G[k, k]
            if gkk <= 0.0:
                continue
            acc = FtX[i, k]
            for q in range(r):
                acc -= F[i, q] * G[q, k]
            value = F[i, k] + acc / gkk
            F[i, k] = value if value > 0.0 else 0.0


def hals_h_update(H, WtX, WtW):
    """HALS sweep over the rows of H given W^T X and W^T W (the global step)."""
    Ht = np.ascontiguousarray(H.T)
    hals_sweep(Ht, np.ascontiguousarray(WtX.T), np.ascontiguousarray(WtW))
    return np.ascontiguousarray(Ht.T)


def csr_band_width(n: int, r: int, itemsize: int) -> int:
    """Columns of a band of a held block's CSR step (``csr_frobenius_local``): n (one band) while H^T and (W^T X)^T
    (n x r each) fit in ``CSR_BAND_BYTES`` together."""
    width = max(1, CSR_BAND_BYTES // (2 * r * itemsize))
    return width if width < n else n


@numba.njit(nogil=True, cache=True, fastmath=True)
def _csr_frobenius_local(indptr, indices, data, W, Ht, HHt, WHHt, use_mu, eps, W_new, WtX_T):
    """Fused CSR local step, one row at a time while its entries are in cache: gather
    x_i H^T, update row i of W (MU from the precomputed W H H^T, or a HALS sweep over
    its r entries: ``_csr_w_row``), scatter x_ij w_i into (W^T X)^T. Writes W_new (W's shape) and (W^T X)^T
    (``WtX_T``, zeroed here), the caller's (64-byte aligned: the pass would copy numba's own, at 32 bytes, again).
    Entry p reads row ``indices[p]`` of H^T and adds into row ``indices[p]`` of (W^T X)^T.
    The gather and the scatter are vector code of their own (``kernels/row_vectors.py``: the row's sum in
    registers, no run-time overlap checks or scalar tails), the rows of H^T and (W^T X)^T an entry reads prefetched a
    few entries ahead (``kernels/prefetch.py``). ``fastmath`` lets LLVM vectorise the length-r loops of the update
    (finite data is validated at ingest; reassociation moves results by rounding only)."""
    m, r = W.shape
    WtX_T[:, :] = 0
    xh_row = np.empty((1, r), dtype=W.dtype)
    ahead = indices.shape[0] - PREFETCH_DISTANCE
    for i in range(m):
        start, stop = indptr[i], indptr[i + 1]
        _csr_w_row(i, start, stop, data, indices, W, Ht, HHt, WHHt, use_mu, eps, W_new, xh_row)
        for p in range(start, stop):
            if p < ahead:
                prefetch_row(WtX_T, indices[p + PREFETCH_DISTANCE])
            add_scaled_row(WtX_T, indices[p], data[p], W_new, i)


@numba.njit(nogil=True, cache=True, fastmath=True)
def csr_w_update(indptr, indices, data, W, Ht, HHt, WHHt, use_mu, eps, W_new):
    """The W half of ``_csr_frobenius_local`` alone (the same bits): W_new's rows, the statistic left to the caller
    (Stratified-NMF sums it column by column, ``kernels/stratified.py``)."""
    xh_row = np.empty((1, W.shape[1]), dtype=W.dtype)
    for i in range(W.shape[0]):
        _csr_w_row(i, indptr[i], indptr[i + 1], data, indices, W, Ht, HHt, WHHt, use_mu, eps, W_new, xh_row)


@numba.njit(nogil=True, cache=True, fastmath=True)
def _csr_w_row(i, start, stop, data, indices, W, Ht, HHt, WHHt, use_mu, eps, W_new, xh_row):
    """Row i of W_new from x_i H^T (gathered into ``xh_row``): MU from W H H^T, or a HALS sweep over its r entries."""
    gather_row(xh_row, 0, data, indices, start, stop, Ht)
    _w_row_update(i, W, xh_row[0], HHt, WHHt, use_mu, eps, W_new)


@numba.njit(nogil=True, cache=True, fastmath=True)
def _w_row_update(i, W, xh, HHt, WHHt, use_mu, eps, W_new):
    """Row i of W_new from row i of X H^T (``xh``, not W_new's row): MU from W H H^T, or a HALS sweep."""
    w, r = W_new[i], W.shape[1]
    if use_mu:
        for k in range(r):
            w[k] = W[i, k] * xh[k] / max(WHHt[i, k], eps)
    else:
        w[:] = W[i]
        for k in range(r):
            gkk = HHt[k, k]
            if gkk <= 0.0:
                continue
            acc = xh[k]
            for q in range(r):
                acc -= w[q] * HHt[q, k]
            value = w[k] + acc / gkk
            w[k] = value if value > 0.0 else 0.0


@numba.njit(nogil=True, cache=True)
def _csr_bands(indptr, indices, data, width, n):
    """The CSR block's entries band by band of ``width`` columns (n columns), each band's rows in order, a row's
    entries in their order: (starts, bands x rows + 1: band b's row i from ``starts[b * rows + i]``; indices;
    values). A row's entries of band b are its run of columns below the band's end, after the earlier bands' runs (an
    entry at or past the end moves the row on to the next band: with its columns sorted, those in the band)."""
    m = indptr.shape[0] - 1
    bands = (n + width - 1) // width
    starts = np.zeros(bands * m + 1, np.int64)
    for i in range(m):  # each row's count in each band
        b, end = 0, width
        for p in range(indptr[i], indptr[i + 1]):
            while indices[p] >= end:
                b, end = b + 1, end + width
            starts[b * m + i + 1] += 1
    for q in range(bands * m):
        starts[q + 1] += starts[q]
    following = starts[:-1].copy()
    band_indices, band_data = np.empty_like(indices), np.empty_like(data)
    for i in range(m):
        b, end = 0, width
        for p in range(indptr[i], indptr[i + 1]):
            while indices[p] >= end:
                b, end = b + 1, end + width
            place = following[b * m + i]
            band_indices[place], band_data[place] = indices[p], data[p]
            following[b * m + i] = place + 1
    return starts, band_indices, band_data


@numba.njit(nogil=True, cache=True, fastmath=True)
def _csr_banded_local(starts, indices, data, W, Ht, HHt, WHHt, use_mu, eps, W_new, WtX_T):
    """``_csr_frobenius_local`` over the block's entries band by band (``_csr_bands``; rows' columns sorted): X H^T
    gathered into W_new's rows band after band (each band's rows of H^T in cache for all of the block's rows), each
    band's run onto the last (``gather_row_onto``: the fused sweep's sums, in its order, so the same bits), then the
    rows' updates, then (W^T X)^T band after band (each band's rows of it in cache; a column's additions in row order,
    as the fused sweep's). Issue 19: 2 blocks of the sparse MU benchmark (50,000 x 20,000 at 0.5%, rank 20, 7 bands)
    on 2 threads 74 -> 52 ms."""
    m, r = W.shape
    bands = (starts.shape[0] - 1) // m
    xh = np.empty(r, dtype=W.dtype)
    W_new[:, :] = 0
    for b in range(bands):
        for i in range(m):
            gather_row_onto(W_new, i, data, indices, starts[b * m + i], starts[b * m + i + 1], Ht)
    for i in range(m):
        xh[:] = W_new[i]
        _w_row_update(i, W, xh, HHt, WHHt, use_mu, eps, W_new)
    WtX_T[:, :] = 0
    ahead = indices.shape[0] - PREFETCH_DISTANCE
    for b in range(bands):
        for i in range(m):
            for p in range(starts[b * m + i], starts[b * m + i + 1]):
                if p < ahead:
                    prefetch_row(WtX_T, indices[p + PREFETCH_DISTANCE])
                add_scaled_row(WtX_T, indices[p], data[p], W_new, i)


def csr_frobenius_local(X, W, Ht, HHt, WHHt, use_mu: bool, eps: float, W_new, WtX_T) -> None:
    """The CSR step into W_new and WtX_T: the fused sweep, or for a block held in memory whose rows' columns are
    sorted (ingest sorts them), from its second pass on, the same sums band by band of ``csr_band_width`` columns
    (``_csr_banded_local`` over ``_csr_bands``, kept while the block lives: ``kernels/block_forms.py``): the same bits
    either way."""
    n, r = Ht.shape
    width = csr_band_width(n, r, W.dtype.itemsize)
    form = None
    if width < n and X.has_sorted_indices:
        form = block_form(X, "bands", width, lambda: _csr_bands(X.indptr, X.indices, X.data, width, n),
                          second_sight=True)
    if form is None:
        _csr_frobenius_local(X.indptr, X.indices, X.data, W, Ht, HHt, WHHt, use_mu, eps, W_new, WtX_T)
    else:
        _csr_banded_local(*form, W, Ht, HHt, WHHt, use_mu, eps, W_new, WtX_T)


@numba.njit(nogil=True, cache=True)
def _dense_frobenius_rows(X, W, H, Ht, HHt, shift, update, eps, lo, hi, tile, run, W_new, WtX, WtX64, product, XHt, WH,
                          mask_indptr, mask_indices, mask_p, X_masked, corrections, WtPx_T, WtPwh_T, block_sums,
                          segments):
    """Rows lo:hi of the dense local step, ``tile`` rows at a time (while they are in cache, but for several
    models' chunks taken whole, ``_dense_frobenius_local``): X_t H^T,
    W_t's update (``update`` 1: MU from W_t H H^T + shift, 2: a HALS sweep, 0: none, W_new = W) into W_new,
    and W_t^T X_t added into WtX (r x n) in tile order, ``run`` rows at a time (``_sum_products``), or with ``WtX64``
    (float64, r x n; else no rows) into WtX64: summed in float32 over at most ``SUM64_ROWS`` rows (in runs of at
    most ``run`` rows), each such sum added in float64 (WtX is then not written).
    X_t H^T and W_new_t H are made ``run`` rows at a time (``_product_rows``: BLAS's small-matrix kernels).
    Scratch: ``product`` (r x n for float64 sums, else no rows), ``XHt`` (tile x r), ``WH`` (tile x n, or no rows). With ``WH``, returns
    ||X - W_new H||^2 over the rows accumulated in float64 (else 0).

    Several models at once (``frobenius_local_many``): W's columns (and H's rows) are the models' side by
    side, model s at columns ``segments[s]:segments[s + 1]``, HHt their H H^T's block-diagonal matrix; each
    product of a tile is then one product for every model. MU's update is column by column (the zero
    blocks of HHt add exact zeros to the denominators); HALS sweeps each model's columns with its own block.
    One model: ``segments`` (0, r).

    With a mask in the complement form (``mask_indptr``: X's rows + 1 entries, else none; update 0 or 1): P's
    entries (``mask_indices``, weights ``mask_p``) are applied tile by tile (``_zeroed_tile``, ``_mask_corrections``, ``_mask_scatter``): the tile is
    copied into ``X_masked`` (tile x n) with 0 at its entries of weight 0, the MU step takes
    ((M o X) H^T, (M o W H) H^T) as X_t H^T and W_t H H^T less P's terms (``corrections``: tile x 2r scratch),
    and the scattered W_new^T P_x, W_new^T P_wh are added into ``WtPx_T``, ``WtPwh_T`` (n x r). Returns
    (the squared error above over the masked X, sum p x^2 over P, sum p (x - wh)^2 over P, and with
    ``block_sums`` the masked X's sum x^2 and sum x, else 0), float64."""
    sq_err = 0.0
    sums = np.zeros(4)
    masked = mask_indptr.shape[0] > 0
    piece = min(run, SUM64_ROWS)  # float32 sums: products of runs, each float32 sum of at most SUM64_ROWS rows
    sum_rows = SUM64_ROWS // piece * piece
    for start in range(lo, hi, tile):
        stop = min(start + tile, hi)
        X_t = X[start:stop]
        if masked:
            X_t = _zeroed_tile(X_t, mask_indptr[start:stop + 1], mask_indices, mask_p, X_masked[:stop - start])
            if block_sums:
                sums[2:] += _sums_of(X_t)
        xh = XHt[:stop - start]
        if update:
            _dot_in_runs(X_t, Ht, xh, run)
        w = W_new[start:stop]
        if update == 1:
            np.dot(W[start:stop], HHt, w)  # the denominator, then the update in place
            if masked:
                _mask_corrections(X_t, W[start:stop], Ht, mask_indptr[start:stop + 1], mask_indices, mask_p,
                                  corrections, xh, w)
            for i in range(stop - start):
                for q in range(w.shape[1]):
                    w[i, q] = W[start + i, q] * xh[i, q] / max(w[i, q] + shift[q], eps)
        else:
            w[:] = W[start:stop]
            if update == 2:
                for s in range(segments.shape[0] - 1):
                    a, b = segments[s], segments[s + 1]
                    hals_sweep(w[:, a:b], xh[:, a:b], HHt[a:b, a:b])
        if WtX64.shape[0] > 0:
            for a in range(0, stop - start, sum_rows):
                b = min(a + sum_rows, stop - start)
                _sum_products(w[a:b], X_t[a:b], product, piece, 0.0)
                WtX64 += product
        else:
            _sum_products(w, X_t, WtX, run, 0.0 if start == lo else 1.0)
        if masked:
            sums[:2] += _mask_scatter(X_t, w, Ht, mask_indptr[start:stop + 1], mask_indices, mask_p, WtPx_T, WtPwh_T)
        if WH.shape[0] > 0:
            wh = WH[:stop - start]
            _dot_in_runs(w, H, wh, run)
            sq_err += _sq_diff_sum(X_t, wh)
    return sq_err, sums[0], sums[1], sums[2], sums[3]


@numba.njit(nogil=True, cache=True)
def _sum_products(A, B, out, run, beta):
    """out = A^T B + beta out, ``run`` rows of A and B at a time, each run's product added where BLAS makes it
    (``gemm_into``): no scratch product to add, and runs small enough for BLAS's small-matrix kernels
    (``_product_rows``). At 2,000 columns and rank 20, one thread, OpenBLAS's SkylakeX kernels: a 65-row float64
    tile's W_t^T X_t added into an r x n sum 62.5 us against 72.2 as one product then added, a 131-row float32 tile
    70.9 against 129.8 us; the float64 MU step of 20,000 x 2,000 on two threads 33.1 against 41.4 ms (BENCHMARKS.md)."""
    for a in range(0, A.shape[0], run):
        b = min(a + run, A.shape[0])
        gemm_into(A[a:b].T, B[a:b], out, beta if a == 0 else 1.0)


@numba.njit(nogil=True, cache=True)
def _dot_in_runs(A, B, out, run):
    """out = A B, ``run`` rows of A at a time (``_product_rows``: products small enough for BLAS's small-matrix
    kernels)."""
    for a in range(0, A.shape[0], run):
        b = min(a + run, A.shape[0])
        np.dot(A[a:b], B, out[a:b])


@numba.njit(nogil=True, cache=True)
def _zeroed_tile(X_t, indptr, indices, p, out):
    """X_t copied into ``out`` with 0 at P's entries of weight 0 (p = 1): always a copy, so that the products
    see the same array (and alignment) whatever X holds at its missing entries."""
    out[:] = X_t
    for i in range(X_t.shape[0]):
        for q in range(indptr[i], indptr[i + 1]):
            if p[q] == 1.0:
                out[i, indices[q]] = 0.0
    return out


@numba.njit(nogil=True, cache=True, fastmath={"reassoc"})
def _sums_of(A):
    """(sum a^2, sum a) accumulated in float64."""
    out = np.zeros(2)
    for i in range(A.shape[0]):
        for j in range(A.shape[1]):
            a = np.float64(A[i, j])
            out[0] += a * a
            out[1] += a
    return out


@numba.njit(nogil=True, cache=True, fastmath=True)
def _mask_corrections(X_t, W_t, Ht, indptr, indices, p, corrections, xh, den):
    """The complement form's terms of a tile's MU step, in place: ``xh`` (X_t H^T) less P_x H^T and ``den``
    (W_t H H^T) less P_wh H^T, each row's terms summed over its entries in order (wh: W_t H at the entry).
    Indices, not row views, in the loops over entries (a view costs a reference count)."""
    r = W_t.shape[1]
    for i in range(X_t.shape[0]):
        for k in range(2 * r):
            corrections[i, k] = 0.0
        for q in range(indptr[i], indptr[i + 1]):
            j = indices[q]
            wh = 0.0
            for k in range(r):
                wh += W_t[i, k] * Ht[j, k]
            pwh = p[q] * wh
            for k in range(r):
                corrections[i, r + k] += pwh * Ht[j, k]
            px = p[q] * X_t[i, j]
            if px != 0.0:  # a 0/1 mask's entries are all missing: X_t is 0 there
                for k in range(r):
                    corrections[i, k] += px * Ht[j, k]
        for k in range(r):
            xh[i, k] -= corrections[i, k]
            den[i, k] -= corrections[i, r + k]


@numba.njit(nogil=True, cache=True, fastmath=True)
def _mask_scatter(X_t, W_t, Ht, indptr, indices, p, WtPx_T, WtPwh_T):
    """Adds a tile's p x w_i and p wh w_i into rows j of ``WtPx_T`` and ``WtPwh_T`` (wh: W_t H at entry (i, j));
    returns (sum p x^2, sum p (x - wh)^2) over the tile's entries of P, in float64."""
    r = W_t.shape[1]
    Pxx, P_sq_err = 0.0, 0.0
    for i in range(X_t.shape[0]):
        for q in range(indptr[i], indptr[i + 1]):
            j = indices[q]
            wh = 0.0
            for k in range(r):
                wh += W_t[i, k] * Ht[j, k]
            x = X_t[i, j]
            pwh = p[q] * wh
            for k in range(r):
                WtPwh_T[j, k] += pwh * W_t[i, k]
            px = p[q] * x
            if px != 0.0:
                for k in range(r):
                    WtPx_T[j, k] += px * W_t[i, k]
            d = np.float64(x) - np.float64(wh)
            Pxx += np.float64(p[q]) * (np.float64(x) * np.float64(x))
            P_sq_err += np.float64(p[q]) * d * d
    return np.array((Pxx, P_sq_err))


@numba.njit(nogil=True, cache=True, fastmath={"reassoc"})
def _sq_diff_sum(A, B):
    """sum (A - B)^2 accumulated in float64 (``reassoc`` lets LLVM vectorise the sum)."""
    total = 0.0
    for i in range(A.shape[0]):
        for j in range(A.shape[1]):
            d = np.float64(A[i, j]) - np.float64(B[i, j])
            total += d * d
    return total


def _tile_rows(X) -> int:
    return _rows_a_tile(X.shape[1], X.dtype)


def _rows_a_tile(n: int, dtype) -> int:
    return max(1, TILE_BYTES // (n * np.dtype(dtype).itemsize))


def _product_rows(n: int, r: int, tile: int) -> int:
    """How many of a tile's rows each of its products X_t H^T, W_t H (and float32 data's W_t^T X_t sums) takes: as
    many as BLAS's small-matrix kernels take (``blas_threads.small_product_limit``: n r rows' multiply-adds within
    it) where that is at least ``MIN_SMALL_ROWS``, else the whole tile. OpenBLAS's SkylakeX kernels, 2 threads,
    20,000 x 2,000 at rank 20: the MU local step in runs of 25 rows 0.75 times the time of whole tiles in float64
    (65 rows), 0.63 in float32 (131 rows); 0.72 to 0.88 at 500 to 5,000 columns and ranks 20 and 50
    (BENCHMARKS.md, "Small-matrix kernels")."""
    rows = small_product_limit() // (n * r)
    return min(rows, tile) if rows >= MIN_SMALL_ROWS else tile


def steps_in_pieces(rows: int, n: int, r: int, dtype) -> bool:
    """Whether the Frobenius local step of a dense block of ``rows`` x ``n`` at rank r (factors in the block's dtype)
    runs in pieces on BLAS's threads (``_dense_frobenius_local``): more than one tile, and enough work to split."""
    return rows > _rows_a_tile(n, dtype) and rows * n * r >= PARALLEL_WORK


def shares_products(X, Ws, Hs) -> bool:
    """Whether ``frobenius_local_many`` takes these models' local steps on the dense block X: each of them goes
    through the tiled step alone (``_tiled``). On a block of one tile the models' products are small (``products.py``:
    BLAS's on the whole block, or the thin loops'): shared, they were measured no faster (400 x 100, 10 models)."""
    # the block's size first: a sweep of small blocks asks for every block of every pass
    return isinstance(X, np.ndarray) and X.shape[0] > _tile_rows(X) and all(_tiled(X, W, H) for W, H in zip(Ws, Hs))


def _tiled(X, *factors) -> bool:
    """Whether a dense block goes through ``_dense_frobenius_local``: more than one tile, and one precision (mixed
    precisions take numpy's products in the wider type; one tile is ``block_times_ht`` and ``wt_times_block`` on the
    whole block)."""
    return X.shape[0] > _tile_rows(X) and np.result_type(X, *factors) == X.dtype


def _dense_frobenius_local(X, W, H, HHt, solver, shift, residual, mask=None, block_sums=False, segments=None,
                           sums64=False):
    """The dense local step in cache-sized row tiles (``_dense_frobenius_rows``), its chunks on BLAS's threads.
    ``solver`` None: W is not updated (HHt is not used, nor H without a mask), only W^T X is summed. Returns (W_new,
    W_new^T X, W_new^T W_new, the residual or 0). ``segments``: several models' factors side by side (see
    ``_dense_frobenius_rows``; no mask, no residual, and W_new^T W_new is then not formed: None). ``sums64``: W_new^T X
    summed in float64 over products of at most ``SUM64_ROWS`` rows, W_new^T W_new formed in float64 (float32 data; see
    ``frobenius_local``).

    Several models whose summed rank R is at least ``WHOLE_CHUNK_RANK`` take each chunk as one tile, read twice
    (from cache or memory) rather than once: a 1 MiB tile adds its W_t^T X_t into an R x n sum for every 65 rows
    of 2,000 (1.76 MB at R = 110), and products as wide as R run faster with a chunk's rows as their inner
    dimension (a 650 x 2,000 chunk on one thread at R = 110: 29 GF/s as one tile, 23 as 65-row tiles). One
    5,000 x 2,000 block, MU, two threads, three runs' medians of 9 (``/tmp`` script): ranks 2, 4, ..., 20 (R =
    110) 153-183 ms in 1 MiB tiles, 122-132 ms one tile a chunk; at R = 6 and 20 one tile a chunk was 6-29%
    slower; at R = 28 to 60 the runs disagreed (R = 40: 10% faster, 32: 15% slower by their medians).

    ``mask``: (indptr, indices, p) of a complement-form mask P (p in X's dtype; ``solver`` "mu" or None): the
    weighted MU step over X with 0 at P's entries of weight 0 (``kernels/masked.py``), which then also returns
    (W_new^T P_x, W_new^T P_wh, sum p x^2 over P, sum p (x - wh)^2 over P, and with ``block_sums`` the masked
    X's (sum x^2, sum x), else zeros), each chunk's sums added in chunk order."""
    (m, n), r, dtype = X.shape, W.shape[1], X.dtype
    tile = min(_tile_rows(X), m)
    n_tiles = -(-m // tile)
    chunk = tile * -(-n_tiles // MAX_CHUNKS)
    many = segments is not None
    if many and segments[-1] >= WHOLE_CHUNK_RANK:
        tile = chunk
    run = _product_rows(n, r, tile)
    if solver is None:  # H is used by a mask's terms only
        HHt = np.empty((0, 0), dtype)
        H = HHt if mask is None else H
    W, H, HHt = aligned(np.ascontiguousarray(W)), aligned(np.ascontiguousarray(H)), aligned(np.ascontiguousarray(HHt))
    Ht = aligned(np.ascontiguousarray(H.T))
    update = {None: 0, "mu": 1, "hals": 2}[solver]
    shift = np.zeros(r, dtype) if shift is None else np.asarray(shift, dtype)
    W_new = empty_aligned((m, r), dtype)
    # no mask: empty index arrays of the dtypes of a scipy mask's (int32), so that both take one compiled signature
    indptr, indices, p = (np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, dtype)) if mask is None else mask
    masked_rows = min(tile, m) if mask is not None else 0
    segments = np.array((0, r), np.int64) if segments is None else np.asarray(segments, np.int64)

    def rows(lo):
        hi = min(lo + chunk, m)
        WtX = empty_aligned((0 if sums64 else r, n), dtype)
        WtX64 = np.zeros((r, n) if sums64 else (0, 0))
        product = empty_aligned((r if sums64 else 0, n), dtype)
        WH = empty_aligned((min(tile, hi - lo) if residual else 0, n), dtype)
        WtP = np.zeros((2, n if mask is not None else 0, r), dtype)
        sums = _dense_frobenius_rows(X, W, H, Ht, HHt, shift, update, floor_eps(dtype), lo, hi, tile, run, W_new, WtX,
                                     WtX64, product, empty_aligned((min(tile, hi - lo), r), dtype), WH, indptr,
                                     indices, p, empty_aligned((masked_rows, n), dtype),
                                     np.empty((masked_rows, 2 * r), dtype), WtP[0], WtP[1], block_sums, segments)
        return WtX64 if sums64 else WtX, WtP, np.array(sums)

    starts = list(range(0, m, chunk))
    parts = (map_on_blas_threads(rows, starts) if steps_in_pieces(m, n, r, dtype)
             else [rows(lo) for lo in starts])
    WtX, WtP, sums = parts[0]
    for WtX_part, WtP_part, sums_part in parts[1:]:  # in chunk order, whatever ran them
        WtX += WtX_part
        WtP += WtP_part
        sums += sums_part
    out = (W_new, WtX, None if many else gram(W_new.astype(np.float64) if sums64 else W_new), sums[0])
    if mask is None:
        return out
    return (*out, np.ascontiguousarray(WtP[0].T), np.ascontiguousarray(WtP[1].T), sums[1], sums[2], sums[3:])


def frobenius_local(X, W, H, HHt, solver: str, shift=None, residual: bool = False, sums64: bool = False):
    """Local step for ||X - WH||_F^2: update W_b by MU or HALS, return (W_b, W_b^T X_b, W_b^T W_b), and
    with ``residual`` also ||X_b - W_b H||^2 accumulated in float64 (see ``residual_sq_norm``).
    ``shift``: MU only, added to the denominator (see ``mu_w_update``).

    ``sums64`` (dense float32 blocks): W_b^T X_b and W_b^T W_b in float64, the first summed in float64 over
    products of at most ``SUM64_ROWS`` rows in float32 (a block of one tile: in float64), so that the statistics formula
    of the error (``residual_sq_norm``) holds without the residual's third product, to the bound of
    ``methods/nmf.py: FLOAT32_FORMULA_ERROR``.

    Dense blocks: both products tile by tile while the tile is in cache, so X_b is read from memory
    once (``_dense_frobenius_local``); the residual is a third product on the same tiles.
    CSR blocks: one fused sweep of the stored entries, or its bands (``csr_frobenius_local``).
    """
    sq_err = None
    if is_sparse(X):
        W = np.ascontiguousarray(W)
        WHHt = W[:0]
        if solver == "mu":
            WHHt = W @ HHt
            if shift is not None:
                WHHt += shift
        W_new, WtX_T = empty_aligned(W.shape, W.dtype), empty_aligned((H.shape[1], W.shape[1]), W.dtype)
        csr_frobenius_local(X, W, np.ascontiguousarray(H.T), np.ascontiguousarray(HHt), WHHt, solver == "mu",
                            floor_eps(W.dtype), W_new, WtX_T)
        WtX = aligned_copy(WtX_T.T)  # aligned already: the pass need not copy it again
        WtW = gram(W_new)
    elif not _tiled(X, W, H, HHt):
        W_new = w_update(W, block_times_ht(X, H), HHt, solver, shift)
        if sums64:  # a block of one tile, of up to 2^18 / n rows: summed in float64 as a whole
            W64 = W_new.astype(np.float64)
            WtX, WtW = W64.T @ X, gram(W64)
        else:
            WtX, WtW = wt_times_block(W_new, X), gram(W_new)
    else:
        W_new, WtX, WtW, sq_err = _dense_frobenius_local(X, W, H, HHt, solver, shift, residual, sums64=sums64)
    if not residual:
        return W_new, WtX, WtW
    return W_new, WtX, WtW, residual_sq_norm(X, W_new, H) if sq_err is None else sq_err


def frobenius_local_many(X, Ws, Hs, HHts, solver: str | None):
    """``frobenius_local`` (no shift, no residual) of several models on one dense block of more than one tile
    (``shares_products``), with one product per tile for all of them: X_t [H_1; ...; H_k]^T and
    [W_1 ... W_k]_t^T X_t (``_dense_frobenius_local`` on the models' factors side by side; a tile is a chunk from
    a summed rank of ``WHOLE_CHUNK_RANK`` on), each model's update of W_t on its columns in between. The products
    are as wide as the models' ranks together. ``solver`` None: no update (pass 0's statistics,
    ``frobenius_stats``; Hs and HHts are not read). Each model's results equal its ``frobenius_local``'s (or
    ``frobenius_stats``'s) to rounding (the products' sums are grouped otherwise), not bitwise. Returns, per model,
    (W_b, W_b^T X_b, W_b^T W_b), each array its own (C-contiguous, aligned; W_b is the model's own array when not
    updated)."""
    segments = np.concatenate(([0], np.cumsum([W.shape[1] for W in Ws])))
    H = HHt = None
    if solver is not None:
        H = np.vstack(Hs)
        HHt = np.zeros((segments[-1], segments[-1]), X.dtype)
        for a, b, HHt_i in zip(segments[:-1], segments[1:], HHts):
            HHt[a:b, a:b] = HHt_i
    W_new, WtX = _dense_frobenius_local(X, np.hstack(Ws), H, HHt, solver, None, False, segments=segments)[:2]
    out = []
    for s, (a, b) in enumerate(zip(segments[:-1], segments[1:])):
        if solver is None:
            W_i = Ws[s]
        else:
            W_i = empty_aligned((X.shape[0], b - a), X.dtype)
            W_i[...] = W_new[:, a:b]
        WtX_i = empty_aligned((b - a, X.shape[1]), X.dtype)
        WtX_i[...] = WtX[a:b]
        out.append((W_i, WtX_i, gram(W_i)))
    return out


def w_update(W, XHt, HHt, solver, shift=None):
    """W's update for the Frobenius loss from X H^T and H H^T (a new array)."""
    if solver == "mu":
        return mu_w_update(W, XHt, HHt, shift)
    W = np.array(W, copy=True)
    hals_sweep(W, np.ascontiguousarray(XHt), np.ascontiguousarray(HHt))
    return W


def residual_sq_norm(X, W, H) -> float:
    """||X_b - W_b H||_F^2 accumulated in float64. For float32 data, where the statistics formula
    ||X||^2 - 2<W^T X, H> + <W^T W, H H^T> cancels to noise once the relative error is below ~1e-3 (from sums in
    float32), or, with ``frobenius_local``'s ``sums64``, where it is not small against the loss
    (``methods/nmf.py: FLOAT32_FORMULA_ERROR``)."""
    if sp.issparse(X):
        W64, H64 = W.astype(np.float64), H.astype(np.float64)
        x = X.data.astype(np.float64)
        wh = wh_at_nonzeros(sp.csr_matrix((x, X.indices, X.indptr), shape=X.shape), W64, H64)
        return float(x @ x - 2.0 * (x @ wh) + np.vdot(W64.T @ W64, H64 @ H64.T))
    R = X - W @ H
    return float(np.einsum("ij,ij->", R, R, dtype=np.float64))


def frobenius_stats(X, W):
    """Statistics of a block for given W_b (pass 0): (W_b^T X_b, W_b^T W_b); a dense W_b^T X_b summed over
    the same tiles and chunks as in the local step (the same bits on any number of BLAS threads)."""
    if sp.issparse(X):
        return sparse_wt_times_block(W, X), gram(W)
    if not _tiled(X, W):
        return wt_times_block(W, X), gram(W)
    return _dense_frobenius_local(X, W, None, None, None, None, False)[1:3]


def frobenius_solve_w(X, W, H, solver: str, n_iter: int, tol: float, shift=None):
    """W_b for fixed H (transform): X_b H^T is formed once, then W iterates without X."""
    XHt = np.ascontiguousarray(block_times_ht(X, H))
    HHt = np.ascontiguousarray(H @ H.T)
    for _ in range(n_iter):
        previous = W
        W = w_update(W, XHt, HHt, solver, shift)
        if np.linalg.norm(W - previous) <= tol * max(np.linalg.norm(W), floor_eps(W.dtype)):
            break
    return W


# --------------------------------------------------------- Kullback-Leibler
def kl_ratio(X, W, H):
    """R = X / (W H) where X is non-zero (R has X's sparsity), with W H floored at eps.

    Returns (R, WH at X's non-zeros) — the latter for the objective.
    """
    eps = floor_eps(W.dtype)
    if sp.issparse(X):
        wh = np.maximum(wh_at_nonzeros(X, W, H), eps)
        R = sp.csr_matrix((X.data / wh, X.indices, X.indptr), shape=X.shape)
        return R, wh
    WH = np.maximum(W @ H, eps)
    return X / WH, WH


def kl_h_update(H, WtR, W_colsum):
    """KL MU for H: H <- H * (W^T (X / WH)) / (W^T 1)."""
    return H * WtR / np.maximum(W_colsum, floor_eps(H.dtype))[:, None]


def kl_w_update(X, W, H):
    """KL MU for W: W <- W * ((X / WH) H^T) / (1 H^T)."""
    R, _ = kl_ratio(X, W, H)
    return W * block_times_ht(R, H) / np.maximum(H.sum(axis=1), floor_eps(W.dtype))[None, :]


def kl_stats(X, W, H):
    """Block statistics for KL given (W_b, H): W^T (X / WH), column sums of W, and
    sum over X's non-zeros of x log(x / wh) (the data-dependent part of D_KL)."""
    R, wh = kl_ratio(X, W, H)
    WtR = sparse_wt_times_block(W, R) if sp.issparse(R) else W.T @ R
    if sp.issparse(X):
        x = X.data
    else:
        nz = X > 0
        x, wh = X[nz], wh[nz]
    # The objective's sums are taken in float64 (they cancel against each other).
    xlogx = np.dot(x.astype(np.float64), np.log(x / wh).astype(np.float64))
    return WtR, W.sum(axis=0, dtype=np.float64), np.float64(xlogx)


def kl_local(X, W, H):
    """Local step for D_KL(X || WH): W_b by MU, then its statistics for the same H."""
    W_new = kl_w_update(X, W, H)
    return (W_new, *kl_stats(X, W_new, H))


def kl_solve_w(X, W, H, n_iter: int, tol: float):
    """W_b for fixed H under D_KL (transform)."""
    W = np.array(W, copy=True)
    for _ in range(n_iter):
        previous = W
        W = kl_w_update(X, W, H)
        if np.linalg.norm(W - previous) <= tol * max(np.linalg.norm(W), floor_eps(W.dtype)):
            break
    return W
