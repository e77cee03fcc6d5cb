"""Semi-supervised NMF on one row block (Haddock et al., 2020); pure numeric, no Dask.

distfact's orientation, rows are samples: X_b (m_b x n) ~ W_b H, Y_b (m_b x k) ~ W_b B, with W_b >= 0
(m_b x r, local; the paper's S^T), H >= 0 (r x n, global; the paper's A^T), B >= 0 (r x k, global;
the paper's B^T). Weights: M_b (m_b x n, the paper's data mask W^T; a CSR matrix, or None for all
ones, which is never built) and L_b (m_b x k, the paper's label mask; dense, or None for all ones).

Each loss term, reconstruction R(X, W H; M) or supervision S(Y, W B; L), is Frobenius ("F",
||M o (X - W H)||_F^2) or I-divergence ("D", D(M o X || M o W H)). For the multiplicative update of W
every term gives a numerator and a denominator (m_b x r):

    F:  num = (M o X) H^T                         den = (M o W H) H^T
    D:  num = [(M o X) / (eps + M o W H) o M] H^T  den = M H^T

and for the update of its global factor (H or B) the statistics W^T (M o X) and W^T (M o W H) (F), or
W^T [(M o X) / (eps + M o W H) o M] and W^T M (D), summed over blocks. ``eps`` sits where the
reference implementation (PyPI ``ssnmf`` 1.0.3) puts it: in every denominator, and inside the
I-divergence's log as log((x + eps) / (wh + eps)). A sparse X, or a sparse mask, is only touched at
its non-zeros (the zeros of X enter the I-divergence through sum(W H) = (1^T W)(H 1)).

A mask given in either sparse form of ``kernels/masked.py`` (a store's own, or X's NaN entries) becomes M by
``mask_weights``; ``observed_sums`` gives the sums over M's entries that the metrics are relative to.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .masked import COMPLEMENT
from .products import wh_at_nonzeros

LOSSES = ("F", "D")


def _dense_path(X, mask) -> bool:
    return not sp.issparse(X) and (mask is None or not sp.issparse(mask))


def _on_support(S: sp.csr_matrix, values) -> sp.csr_matrix:
    """A CSR matrix with S's sparsity pattern and the given values."""
    out = S.copy()
    out.data = np.asarray(values, dtype=np.float64)
    return out


def _mask_values(X, W, H, mask):
    """On the mask's stored entries (a CSR matrix), in its data order: its values m, x there, and W H there."""
    mask = sp.csr_matrix(mask)
    rows = np.repeat(np.arange(mask.shape[0]), np.diff(mask.indptr))  # aligned with mask.data, zeros included
    x = np.asarray(X[rows, mask.indices]).ravel()
    return mask, mask.data, x, wh_at_nonzeros(mask, W, H)


def _mask_terms(X, W, H, mask):
    """As :func:`_mask_values`, with m * (W H) in place of W H."""
    mask, m, x, wh = _mask_values(X, W, H, mask)
    return mask, m, x, m * wh


def mask_weights(form: str, P) -> sp.csr_matrix:
    """M for a block's mask in the ``form`` of ``kernels/masked.py``: the weights of its observed entries as a CSR
    matrix without explicit zeros (the kernels here take no other form). "observed": P itself; "complement"
    (1 - weight at the entries whose weight is not 1): 1 - P, which stores every entry of weight above 0, so a
    mask with few missing entries costs O(m_b n) here (exact for the weights 0 and 1 of a NaN mask)."""
    M = sp.csr_matrix(1.0 - P.toarray()) if form == COMPLEMENT else sp.csr_matrix(P, dtype=np.float64, copy=True)
    M.eliminate_zeros()
    M.sort_indices()
    return M


def observed_sums(X, W, H, mask) -> dict:
    """Over M's entries (the observed ones; ``mask`` a CSR matrix) at (W, H): sum m (x - wh)^2 and sum m x^2 (the
    metric ``relative_error`` over the observed entries, weighted as docs/metrics.md defines it), and
    ||M o X||_F^2 and sum(M o X) (what a group's data term is relative to: ``group_errors_``)."""
    _, m, x, wh = _mask_values(X, W, H, mask)
    mx = m * x
    return {"M_sq_error": np.float64(np.sum(m * (x - wh) ** 2)),
            "M_sq_norm": np.float64(np.sum(mx * x)), "MX_sq_norm": np.float64(np.sum(mx * mx)),
            "MX_total": np.float64(np.sum(mx))}


def _masked_x(X, mask):
    """M o X as a CSR matrix with explicit zeros removed (X itself when M is all ones)."""
    if mask is None:
        return X
    MX = sp.csr_matrix(sp.csr_matrix(mask).multiply(X))
    MX.eliminate_zeros()
    return MX


def ratio(X, W, H, mask, eps: float):
    """Q = (M o X) / (eps + M o W H) o M: dense on the dense path, else on the support of M o X."""
    if _dense_path(X, mask):
        if mask is None:
            return X / (eps + W @ H)
        return mask * X / (eps + mask * (W @ H)) * mask
    MX = _masked_x(X, mask)
    wh = wh_at_nonzeros(MX, W, H)
    if mask is None:
        return _on_support(MX, MX.data / (eps + wh))
    m = np.asarray(sp.csr_matrix(mask)[MX.nonzero()]).ravel()
    return _on_support(MX, MX.data / (eps + m * wh) * m)


def term_update_parts(X, W, H, mask, loss: str, eps: float, HHt=None):
    """``(num, den)`` of one loss term for the W update (m_b x r), at the current W and H. ``HHt``: H H^T, when
    the caller has it (an unmasked Frobenius term)."""
    if loss == "D":
        Q = ratio(X, W, H, mask, eps)
        den = np.broadcast_to(H.sum(axis=1), W.shape) if mask is None else np.asarray(mask @ H.T)
        return np.asarray(Q @ H.T), den
    if mask is None:
        return np.asarray(X @ H.T), W @ (H @ H.T if HHt is None else HHt)
    if _dense_path(X, mask):
        return (mask * X) @ H.T, (mask * (W @ H)) @ H.T
    mask, _, _, mwh = _mask_terms(X, W, H, mask)
    return np.asarray(_masked_x(X, mask) @ H.T), np.asarray(_on_support(mask, mwh) @ H.T)


def _wt(W, Z):
    """W^T Z for dense or CSR Z (as a dense array)."""
    return np.asarray((Z.T @ W).T) if sp.issparse(Z) else W.T @ Z


def term_stats(X, W, H, mask, loss: str, eps: float, prefix: str) -> dict:
    """Statistics of one loss term for the update of its global factor, at (W, H)."""
    if loss == "D":
        den = W.sum(axis=0) if mask is None else _wt(W, mask)  # W^T 1 broadcasts over the columns
        return {f"{prefix}_num": _wt(W, ratio(X, W, H, mask, eps)), f"{prefix}_den": den}
    if mask is None:  # W^T (W H) = (W^T W) H, formed on the driver
        return {f"{prefix}_num": _wt(W, X), f"{prefix}_WtW": W.T @ W}
    if _dense_path(X, mask):
        return {f"{prefix}_num": W.T @ (mask * X), f"{prefix}_den": W.T @ (mask * (W @ H))}
    mask, _, _, mwh = _mask_terms(X, W, H, mask)
    return {f"{prefix}_num": _wt(W, _masked_x(X, mask)), f"{prefix}_den": _wt(W, _on_support(mask, mwh))}


def global_update(F, stats: dict, loss: str, eps: float, prefix: str):
    """The multiplicative update of a global factor (H for the data, B for the labels), from the
    statistics summed over blocks: F: F / (eps + W^T (M o W F)) o W^T (M o Z); D: F / (eps + W^T M) o W^T Q."""
    num = stats[f"{prefix}_num"]
    if f"{prefix}_WtW" in stats:
        den = stats[f"{prefix}_WtW"] @ F
    else:
        den = stats[f"{prefix}_den"]
        den = den[:, None] if den.ndim == 1 else den
    return F / (eps + den) * num


def sq_norm(X) -> float:
    """||X||_F^2 of a dense or CSR block."""
    return float(X.multiply(X).sum()) if sp.issparse(X) else float(np.vdot(X, X))


def term_loss(X, W, H, mask, loss: str, eps: float, stats: dict | None = None, prefix: str = "",
              HHt=None, X_sq_norm: float | None = None) -> float:
    """The term's value at (W, H): ||M o (X - W H)||_F^2 or D(M o X || M o W H), with the package's
    x log((x + eps) / (wh + eps)); a sparse X is only read at its non-zeros. Without a mask, a Frobenius
    term comes from the term's statistics at (W, H) (``term_stats``), never forming W H:
    ||X - W H||^2 = ||X||^2 - 2 <W^T X, H> + <W^T W, H H^T>, with ``HHt`` (H H^T) and ``X_sq_norm``
    (||X||^2, :func:`sq_norm`) when the caller has them."""
    if loss == "F" and mask is None and stats is not None:
        X_sq_norm = sq_norm(X) if X_sq_norm is None else X_sq_norm
        HHt = H @ H.T if HHt is None else HHt
        value = X_sq_norm - 2.0 * np.vdot(stats[f"{prefix}_num"], H) + np.vdot(stats[f"{prefix}_WtW"], HHt)
        return max(float(value), 0.0)
    if _dense_path(X, mask):
        MX = X if mask is None else mask * X
        MWH = W @ H if mask is None else mask * (W @ H)
    elif mask is None:  # sparse X, every entry observed: the zeros only add through sums of W H
        x, wh = X.data, wh_at_nonzeros(X, W, H)
        if loss == "F":
            return float(np.sum((x - wh) ** 2) - np.sum(wh ** 2) + np.vdot(W.T @ W, H @ H.T))
        return float(np.sum(x * np.log((x + eps) / (wh + eps)) - x) + W.sum(axis=0) @ H.sum(axis=1))
    else:
        _, m, x, MWH = _mask_terms(X, W, H, mask)
        MX = m * x
    if loss == "F":
        return float(np.sum((MX - MWH) ** 2))
    return float(np.sum(MX * np.log((MX + eps) / (MWH + eps)) - MX + MWH))


def w_update(W, parts: list, eps: float):
    """W <- W / (eps + sum_t c_t den_t) o sum_t c_t num_t over the loss terms ``parts`` = [(c_t, (num_t, den_t))]."""
    # a weight of 1 is not multiplied by: 1.0 * x is x, bitwise (FF and DD with lam = 1, every iteration)
    num = sum(n if c == 1.0 else c * n for c, (n, _) in parts)
    den = sum(d if c == 1.0 else c * d for c, (_, d) in parts)
    return W / (eps + den) * num
