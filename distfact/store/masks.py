"""A mask as a store holds it, and as fit resolves it: weights checked, X zeroed at its missing entries, and each
block's mask in whichever of two sparse forms stores fewer entries (``kernels/masked.py``).

Shared by the writers (``ingest.py``: ``from_arrays(..., mask=...)``, ``missing="nan"`` for every source) and by
fit's ``mask`` (``estimators/masks.py``), so that a mask written beside X at ingest is, block by block, bitwise the
mask a fit in memory would have cut from the same array.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels.mask_forms import COMPLEMENT, OBSERVED
from ..lazy import scipy_sparse as sp  # not imported by ``distfact info``
from .validate import check_csr_structure

#: how the metadata names the forms (the kernels' names are the keys of a block's local state)
FORM_NAMES = {COMPLEMENT: "complement", OBSERVED: "observed"}
FORMS_BY_NAME = {name: form for form, name in FORM_NAMES.items()}


@dataclass(frozen=True)
class ComplementMask:
    """A mask with few missing entries: ``matrix`` (CSR, X's shape and row order) holds 1 - weight at the entries
    whose weight is not 1 (1 at a missing entry); every other entry has weight 1."""

    matrix: sp.csr_matrix

    @property
    def shape(self) -> tuple:
        return self.matrix.shape


def nan_missing(X):
    """X (a dense array or CSR matrix, float) with 0 at its NaN entries (a copy when it holds any) and the
    :class:`ComplementMask` of those entries (None when there are none)."""
    if sp.issparse(X):
        X = sp.csr_matrix(X, copy=True)
        X.sum_duplicates()
        missing = np.isnan(X.data)
        if not missing.any():
            return X, None
        C = sp.csr_matrix((missing.astype(np.float64), X.indices.copy(), X.indptr.copy()), shape=X.shape)
        C.eliminate_zeros()
        X.data[missing] = 0
        X.eliminate_zeros()
        return X, ComplementMask(C)
    missing = np.isnan(X)
    if not missing.any():
        return X, None
    return np.where(missing, np.zeros((), X.dtype), X), ComplementMask(sp.csr_matrix(missing, dtype=np.float64))


def check_weights(mask, shape):
    """A weight array or sparse matrix checked (finite, non-negative, of ``shape`` when given) as a float64 array
    or CSR matrix; None when every weight is 1. A resolved mask (:class:`ComplementMask`, from
    :func:`resolve_mask`) is checked for its shape only."""
    if mask is None:
        return None
    if isinstance(mask, ComplementMask):
        check_shape(mask.shape, shape)
        return None if mask.matrix.nnz == 0 else mask
    if isinstance(mask, str):
        raise ValueError(f"mask={mask!r} is resolved from X in memory before X is grouped (distfact.estimators."
                         "masks.resolve_mask, which fit calls); here only a weight array is accepted")
    if sp.issparse(mask):
        check_csr_structure(mask, "mask")
        weights = sp.csr_matrix(mask, dtype=np.float64, copy=True)
        weights.sum_duplicates()
        values = weights.data
    else:
        weights = np.asarray(mask.to_numpy() if hasattr(mask, "columns") else mask)  # a DataFrame's values
        if weights.dtype.kind not in "biuf":
            raise ValueError(f"mask has dtype {weights.dtype}; give numbers (weights, 0 = missing) or True/False")
        weights = weights.astype(np.float64)
        if weights.ndim != 2:
            raise ValueError(f"mask must be 2-D (X's shape), got {weights.ndim} dimensions")
        values = weights
    check_shape(weights.shape, shape)
    if np.isnan(values).any():
        raise ValueError("mask holds NaN; mark missing entries with weight 0 (or pass mask='nan' to treat X's NaN "
                         "entries as missing)")
    if not np.isfinite(values).all():
        raise ValueError("mask holds infinite weights; weights must be finite")
    if (values < 0).any():
        raise ValueError("mask holds negative weights; weights must be non-negative (0 = missing)")
    if sp.issparse(weights):
        weights.eliminate_zeros()
        all_ones = weights.nnz == weights.shape[0] * weights.shape[1] and bool((weights.data == 1).all())
    else:
        all_ones = bool((weights == 1).all())
    return None if all_ones else weights


def check_shape(got, expected) -> None:
    if expected is not None and tuple(got) != tuple(expected):
        raise ValueError(f"mask has shape {tuple(got)}, X has shape {tuple(expected)}; give one weight per entry of X")


def zero_missing(X, weights):
    """X with 0 at every entry of weight 0 (a copy)."""
    if sp.issparse(X):
        X = sp.csr_matrix(X, copy=True)
        X.sum_duplicates()
        X.sort_indices()
        pattern = sp.csr_matrix((X.data, X.indices, X.indptr), shape=X.shape)
        if sp.issparse(weights):
            from ..kernels.masked import values_at  # numba's, compiled when a mask is applied, not to open a store

            kept = values_at(pattern, weights) != 0
        else:
            kept = weights[np.repeat(np.arange(X.shape[0]), np.diff(X.indptr)), X.indices] != 0
        X.data = np.where(kept, X.data, np.zeros((), X.dtype))
        X.eliminate_zeros()
        return X
    if sp.issparse(weights):
        observed = np.zeros(X.shape, dtype=bool)
        observed[weights.nonzero()] = True
    else:
        observed = weights != 0
    return np.where(observed, X, np.zeros((), X.dtype))


def _dense_forms(D: np.ndarray):
    """(observed, complement) entry counts of a block's dense weights."""
    return int(np.count_nonzero(D)), int(np.count_nonzero(D != 1))


def _form_from_dense(D: np.ndarray, observed: bool) -> tuple[str, sp.csr_matrix]:
    if observed:
        return OBSERVED, sp.csr_matrix(D)
    return COMPLEMENT, sp.csr_matrix(np.where(D != 1, 1.0 - D, 0.0))


def block_form(mask, rows: np.ndarray) -> tuple[str, sp.csr_matrix]:
    """The mask's rows ``rows`` (a block, in the store's order) in the sparse form storing fewer entries (ties:
    "complement"): (form, CSR float64 with sorted indices). A form is converted through the block's dense weights
    only when the other one stores more than half the block's entries."""
    size = len(rows) * mask.shape[1]
    if isinstance(mask, ComplementMask):
        C = mask.matrix[rows]
        n_observed, n_complement = size - int(np.count_nonzero(C.data == 1)), C.nnz
        form = (COMPLEMENT, C) if n_complement <= n_observed else _form_from_dense(1.0 - C.toarray(), True)
    elif sp.issparse(mask):
        S = mask[rows]
        n_observed, n_complement = S.nnz, size - int(np.count_nonzero(S.data == 1))
        form = _form_from_dense(S.toarray(), False) if n_complement <= n_observed else (OBSERVED, S)
    else:
        D = mask[rows]
        n_observed, n_complement = _dense_forms(D)
        form = _form_from_dense(D, n_complement > n_observed)
    kind, P = form
    P = sp.csr_matrix(P, dtype=np.float64)
    P.sort_indices()
    return kind, P


def block_observed_total(X_b, form: str, P: sp.csr_matrix) -> float:
    """sum of X_b over the block's observed entries (X_b read as 0 at the missing ones), in float64: what a masked
    fit's random start is scaled by. Computed at ingest for a stored mask (recorded with the block's mask) and by
    ``estimators/masks.py: observed_total`` for a mask given to fit: one function, so both are the same number."""
    return block_observed_sums(X_b, form, P)[0]


def block_observed_sums(X_b, form: str, P: sp.csr_matrix) -> tuple[float, float]:
    """(sum of X_b, sum m x^2) over the block's observed entries (X_b read as 0 at the missing ones), in float64:
    the first is :func:`block_observed_total`, the second the block's squared norm over them, weighted."""
    from ..kernels.masked import observed_block  # numba's, as above

    X_b, x = observed_block(X_b, form, P)
    values = x if form == OBSERVED else (X_b.data if sp.issparse(X_b) else X_b)  # observed: P's entries only
    x = x.astype(np.float64)
    on_p = float(np.dot(P.data, x * x))
    if form == OBSERVED:
        sq = on_p
    else:
        flat = values.astype(np.float64, copy=False).reshape(-1)
        sq = float(np.dot(flat, flat)) - on_p
    return float(values.sum(dtype=np.float64)), sq
