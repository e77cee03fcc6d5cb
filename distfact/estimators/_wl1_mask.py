"""A minimal resolver of ``fit``'s ``mask`` for :class:`distfact.WeightedL1NMF`, standing in for the shared
``distfact/estimators/masks.py`` of issue 20 (same semantics, same two per-block forms); at merge
:func:`resolve_wl1_mask` is replaced by the shared module's resolver.

A mask gives every entry of X a weight m_ij >= 0 (0: missing). Per row block it is kept in one of two sparse
forms, whichever has fewer entries:

- ``"observed"``: a CSR of the weights at the entries with m_ij > 0 (the others weigh 0), when few are observed;
- ``"complement"``: a CSR of 1 - m_ij at the entries with m_ij != 1 (the others weigh 1), when few are masked.

Turning one form into the other enumerates the gaps between stored entries, O(entries of both), never a dense
block.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pandas as pd
import scipy.sparse as sp

from ..store.grouped import GroupedMatrix

MASK_KEYWORDS = ("nan", "nonzero")


def resolve_wl1_mask(X, mask):
    """``fit``'s ``mask`` resolved against X (in memory, in the caller's row order).

    Returns ``(X, weights)``: X with its missing entries (weight 0) set to 0, and the weights as
    ``(implicit, M)``, a CSR M of X's shape whose unstored entries weigh ``implicit`` (0: M holds the weights;
    1: M holds 1 - m, the complement form), or None when every weight is 1 (the unmasked fit, bitwise).

    ``mask``: None; a non-negative array or sparse matrix of weights of X's shape (for a sparse one, unstored
    entries weigh 0); ``"nan"`` (X's NaN entries are missing); ``"nonzero"`` (only the stored entries of a
    sparse X are observed)."""
    if mask is None:
        return X, None
    if isinstance(X, (GroupedMatrix, str, os.PathLike)) or hasattr(X, "dask"):
        raise ValueError("WeightedL1NMF takes a mask only with X in memory (an array, sparse matrix or DataFrame)")
    frame = X if isinstance(X, pd.DataFrame) else None
    X = X.to_numpy(dtype=np.float64) if frame is not None else X
    X = X.tocsr(copy=True) if sp.issparse(X) else np.array(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"X must be 2-dimensional, got shape {X.shape}")
    values = X.data if sp.issparse(X) else X
    if isinstance(mask, str):
        if mask not in MASK_KEYWORDS:
            raise ValueError(f"mask must be an array of weights, a sparse matrix, 'nan' or 'nonzero', got {mask!r}")
        if mask == "nonzero":
            if not sp.issparse(X):
                raise ValueError("mask='nonzero' needs a sparse X (its stored entries are the observed ones)")
            X.sum_duplicates()
            weights = (0, sp.csr_matrix((np.ones_like(X.data), X.indices, X.indptr), shape=X.shape, copy=True))
        else:
            missing = np.isnan(values)
            values[missing] = 0.0
            if sp.issparse(X):  # the NaN entries, as the complement form (c = 1 there)
                M = sp.csr_matrix((missing.astype(np.float64), X.indices, X.indptr), shape=X.shape, copy=True)
            else:
                M = sp.csr_matrix(missing.astype(np.float64))
            M.eliminate_zeros()
            weights = (1, M)
    else:
        weights = (0, _checked_weights(mask, X.shape))
        if sp.issparse(X):
            X = X.multiply(weights[1].astype(bool)).tocsr()
        else:  # X is dense: a boolean of its shape
            observed = np.zeros(X.shape, dtype=bool)
            observed[weights[1].nonzero()] = True
            X[~observed] = 0.0
    if sp.issparse(X):
        X.eliminate_zeros()
    implicit, M = weights
    if (M.nnz == 0 and implicit == 1) or (implicit == 0 and M.nnz == np.prod(M.shape) and (M.data == 1).all()):
        weights = None  # all ones: no mask
    if frame is not None:
        X = pd.DataFrame(X, index=frame.index, columns=frame.columns)
    return X, weights


def _checked_weights(mask, shape) -> sp.csr_matrix:
    """The weights as a canonical CSR of the positive ones; ValueError for a mask of the wrong shape, with
    NaN, infinite or negative values."""
    if not sp.issparse(mask):
        mask = np.asarray(mask)
        if mask.dtype == object or not (np.issubdtype(mask.dtype, np.number) or mask.dtype == bool):
            raise ValueError(f"mask must be numeric weights (an array or sparse matrix), got dtype {mask.dtype}")
    if mask.shape != shape:
        raise ValueError(f"mask has shape {mask.shape}, expected X's shape {shape}")
    M = sp.csr_matrix(mask, dtype=np.float64)
    M.sum_duplicates()
    if not np.all(np.isfinite(M.data)):
        raise ValueError("mask has NaN or infinite weights; use mask='nan' for NaN entries of X")
    if (M.data < 0).any():
        raise ValueError("mask has negative weights; weights must be non-negative (0: missing)")
    M.eliminate_zeros()
    M.sort_indices()
    return M


def block_forms(data: GroupedMatrix, weights) -> list[tuple[str, sp.csr_matrix]]:
    """Per row block of ``data`` (stored row order), ``(form, CSR)``: ``"observed"`` (the weights at the entries
    with m > 0) or ``"complement"`` (1 - m at the entries with m != 1), whichever has fewer entries."""
    implicit, M = weights
    M = M[data.row_index()]
    forms = []
    for block in data.blocks:
        part = M[block.row_start:block.row_stop]
        part.sort_indices()
        flipped_nnz = part.shape[0] * part.shape[1] - int(np.count_nonzero(part.data == 1))
        given = "observed" if implicit == 0 else "complement"
        other = "complement" if implicit == 0 else "observed"
        forms.append((other, _flipped(part)) if flipped_nnz < part.nnz else (given, part))
    return forms


def _flipped(S: sp.csr_matrix) -> sp.csr_matrix:
    """The CSR of 1 - s at the entries where it is not 0, the unstored entries of S counting as s = 0: the
    observed form from the complement form and back. Enumerates the gaps between S's entries (no dense array)."""
    n_rows, n = S.shape
    flat = np.repeat(np.arange(n_rows, dtype=np.int64), np.diff(S.indptr)) * n + S.indices
    previous = np.concatenate([[-1], flat])
    gaps = np.concatenate([flat, [n_rows * n]]) - previous - 1  # unstored entries after each stored one
    starts = np.repeat(previous + 1, gaps)
    unstored = starts + np.arange(starts.size) - np.repeat(np.cumsum(gaps) - gaps, gaps)
    kept = S.data != 1
    positions = np.concatenate([unstored, flat[kept]])
    values = np.concatenate([np.ones(unstored.size), 1.0 - S.data[kept]])
    order = np.argsort(positions, kind="stable")
    positions, values = positions[order], values[order]
    indptr = np.searchsorted(positions, np.arange(n_rows + 1, dtype=np.int64) * n)
    return sp.csr_matrix((values, (positions % n).astype(S.indices.dtype), indptr), shape=S.shape)


def mask_digest(forms) -> str:
    """What identifies the mask in a checkpoint's configuration: its per-block forms."""
    digest = hashlib.sha1()
    for form, M in forms:
        for part in (M.indptr, M.indices, M.data):
            digest.update(form.encode() + np.ascontiguousarray(part).tobytes())
    return digest.hexdigest()
