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

from .products import block_times_ht, floor_eps, gram, sparse_wt_times_block, wh_at_nonzeros, wt_times_block


# --------------------------------------------------------------------- Frobenius
def mu_h_update(H, WtX, WtW):
    """Lee-Seung H update: H <- H * (W^T X) / (W^T W H)."""
    return H * WtX / np.maximum(WtW @ H, floor_eps(H.dtype))


def mu_w_update(W, XHt, HHt, shift=None):
    """Lee-Seung W update: W <- W * (X H^T) / (W H H^T + shift); ``shift`` (an r-vector added to
    every row of the denominator) carries Stratified-NMF's (1 v^T) H^T + eps term."""
    WHHt = W @ HHt
    if shift is not None:
        WHHt += shift
    return W * XHt / np.maximum(WHHt, floor_eps(W.dtype))


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


@numba.njit(nogil=True, cache=True, fastmath=True)
def _csr_frobenius_local(indptr, indices, data, W, Ht, HHt, WHHt, use_mu, eps):
    """Fused CSR local step, one row at a time while its entries are in cache: gather
    x_i H^T, update row i of W (MU from the precomputed W H H^T, or a HALS sweep over
    its r entries), scatter x_ij w_i into (W^T X)^T. Returns (W_new, (W^T X)^T).
    Row views and ``fastmath`` let LLVM vectorise the length-r loops (finite data is validated
    at ingest; reassociation moves results by rounding only)."""
    m, r = W.shape
    W_new = np.empty_like(W)
    WtX_T = np.zeros((Ht.shape[0], r), dtype=W.dtype)
    xh = np.empty(r, dtype=W.dtype)
    for i in range(m):
        xh[:] = 0.0
        for p in range(indptr[i], indptr[i + 1]):
            x = data[p]
            h = Ht[indices[p]]
            for k in range(r):
                xh[k] += x * h[k]
        w = W_new[i]
        w[:] = W[i]
        if use_mu:
            whh = WHHt[i]
            for k in range(r):
                w[k] *= xh[k] / max(whh[k], eps)
        else:
            for k in range(r):
                gkk = HHt[k, k]
                if gkk <= 0.0:
                    continue
                acc = xh[k]
                for q in range(r):
                    acc -= w[q] * HHt[q, k]
                value = w[k] + acc / gkk
                w[k] = value if value > 0.0 else 0.0
        for p in range(indptr[i], indptr[i + 1]):
            x = data[p]
            out = WtX_T[indices[p]]
            for k in range(r):
                out[k] += x * w[k]
    return W_new, WtX_T


def frobenius_local(X, W, H, HHt, solver: str, shift=None):
    """Local step for ||X - WH||_F^2: update W_b by MU or HALS, return (W_b, W_b^T X_b, W_b^T W_b).
    ``shift``: MU only, added to the denominator (see ``mu_w_update``).

    Dense blocks: two BLAS products (X_b H^T before the update, W_b^T X_b after).
    CSR blocks: one fused sweep of the stored entries (``_csr_frobenius_local``).
    """
    if sp.issparse(X):
        W = np.ascontiguousarray(W)
        WHHt = W[:0]
        if solver == "mu":
            WHHt = W @ HHt
            if shift is not None:
                WHHt += shift
        W_new, WtX_T = _csr_frobenius_local(X.indptr, X.indices, X.data, W, np.ascontiguousarray(H.T),
                                            np.ascontiguousarray(HHt), WHHt, solver == "mu", floor_eps(W.dtype))
        return W_new, np.ascontiguousarray(WtX_T.T), gram(W_new)
    W_new = w_update(W, X @ H.T, HHt, solver, shift)
    return W_new, W_new.T @ X, gram(W_new)


def w_update(W, XHt, HHt, solver, shift=None):
    """W's update for the Frobenius loss from X H^T and H H^T (a new array)."""
    if solver == "mu":
        return mu_w_update(W, XHt, HHt, shift)
    W = np.array(W, copy=True)
    hals_sweep(W, np.ascontiguousarray(XHt), np.ascontiguousarray(HHt))
    return W


def residual_sq_norm(X, W, H) -> float:
    """||X_b - W_b H||_F^2 accumulated in float64. For float32 data, where the statistics formula
    ||X||^2 - 2<W^T X, H> + <W^T W, H H^T> cancels to noise once the relative error is below ~1e-3."""
    if sp.issparse(X):
        W64, H64 = W.astype(np.float64), H.astype(np.float64)
        x = X.data.astype(np.float64)
        wh = wh_at_nonzeros(sp.csr_matrix((x, X.indices, X.indptr), shape=X.shape), W64, H64)
        return float(x @ x - 2.0 * (x @ wh) + np.vdot(W64.T @ W64, H64 @ H64.T))
    R = X - W @ H
    return float(np.einsum("ij,ij->", R, R, dtype=np.float64))


def frobenius_stats(X, W):
    """Statistics of a block for given W_b (pass 0): (W_b^T X_b, W_b^T W_b)."""
    WtX = sparse_wt_times_block(W, X) if sp.issparse(X) else wt_times_block(W, X)
    return WtX, gram(W)


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
