"""Products of a block X_b (dense ndarray or CSR) with small dense factors.

Pure numeric code: no Dask. Every function keeps the dtype of its inputs.
The CSR kernels are compiled with numba (``nogil``, so blocks run in parallel
threads) and read each stored entry once; so are the thin products of small
dense blocks, where BLAS's kernels for a factor of a few columns are slow.
"""

from __future__ import annotations

import functools

import numba
import numpy as np
import scipy.sparse as sp

def is_sparse(X) -> bool:
    """``scipy.sparse.issparse``, answered for a numpy array without scipy's abstract-class check (asked in every
    local step of a small fit, issue 19)."""
    return not isinstance(X, np.ndarray) and sp.issparse(X)


@functools.lru_cache(maxsize=None)
def floor_eps(dtype) -> float:
    """The floor applied to every denominator (and to WH in the KL ratio)."""
    return float(np.finfo(dtype).eps)


def block_column_sums(X) -> np.ndarray:
    """X_b^T 1, a float64 n-vector accumulated in float64 for any dtype of X_b (scipy's sparse
    ``sum(axis=0, dtype=np.float64)`` adds a float32 matrix's entries in float32 and casts only the result: 20,000
    entries of 0.1 sum to 1999.66). For CSR, the entries in stored order, as scipy adds them: the same bits for
    float64."""
    if sp.issparse(X):
        X = X.tocsr()
        return np.bincount(X.indices, weights=X.data, minlength=X.shape[1])
    return np.asarray(X.sum(axis=0, dtype=np.float64)).ravel()


#: Thin products of a small float64 block run in the register-blocked loops below, not in BLAS, where every run of
#: ``benchmarks/bench_thin_products.py`` on an AMD EPYC core found the loops faster (400 x 100 by rank 5: X H^T 18-22
#: against 35-36 us, W^T X 22-30 against 29-37; X H^T at ranks 2 to 12 0.30-0.67 of BLAS's time, W^T X at rank 2 0.42,
#: at rank 8 1.05): X H^T at ranks 2 to ``THIN_XHT_RANK``, W^T X at ranks 2 to ``THIN_WT_RANK`` within
#: ``THIN_OUTPUT_BYTES``, over at least ``THIN_COLUMNS`` columns, below ``THIN_WORK`` multiply-adds (OpenBLAS threads a
#: product from 2^18 on; the loops run on one). Left to BLAS, where the runs disagreed or BLAS won: rank 1, blocks of
#: a dozen columns (UCI Heart's), float32 (SGEMM runs at twice DGEMM's rate here).
THIN_XHT_RANK = 12
THIN_WT_RANK = 5
THIN_COLUMNS = 64
THIN_WORK = 1 << 18
#: W^T X's loop adds each group of rows into all of W^T X: kept within L1 (rank x columns x itemsize), or BLAS.
THIN_OUTPUT_BYTES = 16 << 10


def _takes_thin_loops(X, r: int, max_rank: int) -> bool:
    """Whether a product of the dense block X with a factor of rank r (at most ``max_rank``) takes the thin loops:
    a small C-contiguous float64 X of at least ``THIN_COLUMNS`` columns."""
    return (2 <= r <= max_rank and X.ndim == 2 and X.dtype == np.float64 and X.shape[1] >= THIN_COLUMNS
            and X.shape[0] * X.shape[1] * r < THIN_WORK and X.flags.c_contiguous)


def thin_xht(X, H) -> bool:
    """Whether ``block_times_ht(X, H)`` takes :func:`_thin_times_ht` (H of X's dtype and columns)."""
    return H.dtype == X.dtype and H.ndim == 2 and H.shape[1] == X.shape[1] and _takes_thin_loops(X, H.shape[0],
                                                                                                  THIN_XHT_RANK)


def thin_wt(W, X) -> bool:
    """Whether ``wt_times_block(W, X)`` takes :func:`_thin_wt_times` (W of X's dtype and rows, W^T X within
    ``THIN_OUTPUT_BYTES``)."""
    return (W.dtype == X.dtype and W.ndim == 2 and W.shape[0] == X.shape[0] and _takes_thin_loops(X, W.shape[1],
                                                                                                    THIN_WT_RANK)
            and W.shape[1] * X.shape[1] * X.itemsize <= THIN_OUTPUT_BYTES)


def block_times_ht(X, H: np.ndarray) -> np.ndarray:
    """X_b H^T (rows x r), X_b's dtype. A thin product (:func:`thin_xht`) in :func:`_thin_times_ht`; other dense ones
    take H^T C-contiguous: OpenBLAS's "NN" product of a thin right factor is faster than its "NT" one on a transposed
    view on some CPUs (400 x 100 by rank 5: 17 against 47 us on a Xeon, issue 19; from a few thousand rows on, the
    two are alike), for a copy of H (r x n). The copy is not aligned (an aligned one costs 6 us there): the product's
    bits do not depend on where its right factor starts (tests/test_nmf.py)."""
    if is_sparse(X):
        return np.asarray(X @ H.T)
    if thin_xht(X, H):
        out = np.empty((X.shape[0], H.shape[0]), X.dtype)
        _thin_times_ht(X, np.ascontiguousarray(H), out)
        return out
    return X @ np.ascontiguousarray(H.T)


def wt_times_block(W: np.ndarray, X) -> np.ndarray:
    """W_b^T X_b (r x n), without densifying a sparse X_b. A thin product (:func:`thin_wt`) in
    :func:`_thin_wt_times`."""
    if is_sparse(X):
        return np.ascontiguousarray((X.T @ W).T)
    if thin_wt(W, X):
        out = np.empty((W.shape[1], X.shape[1]), X.dtype)
        _thin_wt_times(np.ascontiguousarray(W), X, out)
        return out
    return W.T @ X


@numba.njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
def _thin_times_ht(X, H, out):
    """``out`` <- X H^T, four rows of X by two rows of H at a time: eight sums share each load of X and H (BLAS's
    thin kernels reload them). Each entry is one row's dot product with one row of H, its terms summed in the
    vectorised loop's order (``reassoc``) whatever the entry's place in its group: past X's last row (and H's) the
    group repeats it, so within these loops a row's bits do not depend on where its block starts (a block that BLAS
    takes instead gives BLAS's bits: other chunkings agree to rounding, as they do anyway)."""
    m, n = X.shape
    r = H.shape[0]
    zero = out.dtype.type(0)
    for i in range(0, m, 4):
        i1, i2, i3 = min(i + 1, m - 1), min(i + 2, m - 1), min(i + 3, m - 1)
        for k in range(0, r, 2):
            k1 = min(k + 1, r - 1)
            a0, a1, a2, a3, b0, b1, b2, b3 = zero, zero, zero, zero, zero, zero, zero, zero
            for j in range(n):
                h, g = H[k, j], H[k1, j]
                x0, x1, x2, x3 = X[i, j], X[i1, j], X[i2, j], X[i3, j]
                a0 += x0 * h
                a1 += x1 * h
                a2 += x2 * h
                a3 += x3 * h
                b0 += x0 * g
                b1 += x1 * g
                b2 += x2 * g
                b3 += x3 * g
            out[i3, k1], out[i2, k1], out[i1, k1], out[i, k1] = b3, b2, b1, b0
            out[i3, k], out[i2, k], out[i1, k], out[i, k] = a3, a2, a1, a0


@numba.njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
def _thin_wt_times(W, X, out):
    """``out`` <- W^T X, four rows of X at a time: each row of ``out`` is loaded and stored once per four rows of X
    (BLAS's thin kernel, once per row). Past X's last row the group reads that row again with weight 0 (X is finite:
    the terms are 0)."""
    m, n = X.shape
    out[...] = 0
    zero = out.dtype.type(0)
    for i in range(0, m, 4):
        i1, i2, i3 = min(i + 1, m - 1), min(i + 2, m - 1), min(i + 3, m - 1)
        for k in range(W.shape[1]):
            w0 = W[i, k]
            w1 = W[i1, k] if i + 1 < m else zero
            w2 = W[i2, k] if i + 2 < m else zero
            w3 = W[i3, k] if i + 3 < m else zero
            for j in range(n):
                out[k, j] += w0 * X[i, j] + w1 * X[i1, j] + w2 * X[i2, j] + w3 * X[i3, j]


def gram(W: np.ndarray) -> np.ndarray:
    """W^T W (r x r)."""
    return W.T @ W


@numba.njit(nogil=True, cache=True)
def _csr_rowdot(indptr, indices, W, Ht):
    """(W H)_ij at the stored entries of a CSR pattern (Ht is H^T, n x r)."""
    out = np.empty(indices.shape[0], dtype=W.dtype)
    r = W.shape[1]
    for i in range(indptr.shape[0] - 1):
        for p in range(indptr[i], indptr[i + 1]):
            j = indices[p]
            acc = 0.0
            for k in range(r):
                acc += W[i, k] * Ht[j, k]
            out[p] = acc
    return out


def wh_at_nonzeros(X: sp.csr_matrix, W: np.ndarray, H: np.ndarray) -> np.ndarray:
    """(W H) at X's stored entries, in X.data's order: O(nnz r), never the dense product."""
    return _csr_rowdot(X.indptr, X.indices, W, np.ascontiguousarray(H.T))


@numba.njit(nogil=True, cache=True)
def _csr_scatter_wt(indptr, indices, data, W, n_cols):
    """(W^T X)^T for CSR X: accumulate x_ij W_i into row j (n x r), one sweep over nnz."""
    r = W.shape[1]
    out = np.zeros((n_cols, r), dtype=W.dtype)
    for i in range(indptr.shape[0] - 1):
        for p in range(indptr[i], indptr[i + 1]):
            j = indices[p]
            x = data[p]
            for k in range(r):
                out[j, k] += x * W[i, k]
    return out


def sparse_wt_times_block(W: np.ndarray, X: sp.csr_matrix) -> np.ndarray:
    """W^T X for CSR X in one sweep of its entries (no transposed copy of X)."""
    return np.ascontiguousarray(_csr_scatter_wt(X.indptr, X.indices, X.data, W, X.shape[1]).T)


@numba.njit(nogil=True, cache=True)
def _csr_times_dense(indptr, indices, data, Ht):
    """X H^T for CSR X (rows x r; Ht is H^T, n x r): each row's entries added in stored order, as scipy's
    ``csr_matvecs`` adds them (the same bits)."""
    r = Ht.shape[1]
    out = np.zeros((indptr.shape[0] - 1, r), dtype=Ht.dtype)
    for i in range(indptr.shape[0] - 1):
        for p in range(indptr[i], indptr[i + 1]):
            j = indices[p]
            x = data[p]
            for k in range(r):
                out[i, k] += x * Ht[j, k]
    return out


def pattern_times_ht(P: sp.csr_matrix, values: np.ndarray, H: np.ndarray) -> np.ndarray:
    """Z H^T for Z with P's pattern holding ``values`` (in P.data's order), without making Z: the bits of scipy's
    ``csr_matrix((values, P.indices, P.indptr)) @ H.T``, whose constructor's checks cost a small fit more than the
    product (issue 19)."""
    dtype = np.result_type(values, H)
    return _csr_times_dense(P.indptr, P.indices, np.asarray(values, dtype=dtype), np.ascontiguousarray(H.T, dtype=dtype))


def wt_times_pattern(W: np.ndarray, P: sp.csr_matrix, values: np.ndarray) -> np.ndarray:
    """W^T Z (r x n) for Z with P's pattern holding ``values``, without making Z (:func:`sparse_wt_times_block`'s
    sweep, in W's dtype: ``values`` are cast to it, as every caller's already are)."""
    return np.ascontiguousarray(_csr_scatter_wt(P.indptr, P.indices, np.asarray(values, dtype=W.dtype), W,
                                                P.shape[1]).T)


@numba.njit(nogil=True, cache=True)
def _weighted_sq_error_at(W, Ht, rows, cols, x, weights):
    total = 0.0
    for e in range(rows.shape[0]):
        i, j = rows[e], cols[e]
        wh = 0.0
        for k in range(W.shape[1]):
            wh += W[i, k] * Ht[j, k]
        d = x[e] - wh
        total += weights[e] * (d * d)
    return total


def weighted_sq_error_at(W: np.ndarray, H: np.ndarray, rows, cols, x, weights) -> float:
    """sum_e weights_e (x_e - (W H)[rows_e, cols_e])^2 over the entries (rows_e, cols_e), float64 factors: one sweep
    of the entries, O(entries x r), never W H nor a gathered copy of W's rows."""
    return float(_weighted_sq_error_at(np.ascontiguousarray(W), np.ascontiguousarray(H.T), rows, cols, x, weights))
