"""Products of a block X_b (dense ndarray or CSR) with small dense factors.

Pure numeric code: no Dask. Every function keeps the dtype of its inputs.
The CSR kernels are compiled with numba (``nogil``, so blocks run in parallel
threads) and read each stored entry once.
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


def block_times_ht(X, H: np.ndarray) -> np.ndarray:
    """X_b H^T (rows x r). A dense X_b takes H^T C-contiguous: OpenBLAS's "NN" product of a thin right factor is up to
    3x faster than its "NT" one on a transposed view (400 x 100 by rank 5: 17 against 47 us, issue 19; from a few
    thousand rows on, the two are alike), for a copy of H (r x n). The copy is not aligned (an aligned one costs 6 us
    here): the product's bits do not depend on where its right factor starts (tests/test_nmf.py)."""
    if is_sparse(X):
        return np.asarray(X @ H.T)
    return X @ np.ascontiguousarray(H.T)


def wt_times_block(W: np.ndarray, X) -> np.ndarray:
    """W_b^T X_b (r x n), without densifying a sparse X_b."""
    if sp.issparse(X):
        return np.ascontiguousarray((X.T @ W).T)
    return W.T @ X


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
