"""fit's ``mask`` argument, shared by every estimator that takes one: which entries of X are observed.

``mask`` is one of

    None          every entry observed (no mask)
    an array      non-negative finite weights of X's shape, dense or a scipy sparse matrix (0 = missing;
                  for a sparse mask, every entry it does not store is missing)
    "nan"         X's NaN entries are missing (then, and only then, X may hold NaN)
    "nonzero"     only the stored entries of a sparse X are observed (ratings; explicit zeros count as observed)

:func:`resolve_mask` turns it, at fit's surface and before X is grouped, into X with its missing entries set to 0
(so that the values there, NaN or any other, can never change the factors: the same X reaches the blocks) and a
resolved mask; an all-ones mask is no mask (None), so that it gives the unmasked fit itself. :func:`block_masks`
cuts the resolved mask per block, in the store's row order, each block in whichever of two sparse forms stores
fewer entries (``kernels/masked.py``): "observed" (CSR of the weights) or "complement" (CSR of 1 - weight at the
entries whose weight is not 1). No all-ones array is built and a sparse X is never densified.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
from dataclasses import dataclass

import numpy as np
import pandas as pd
import scipy.sparse as sp

from ..kernels.masked import COMPLEMENT, OBSERVED, observed_block, values_at
from ..store.coerce import checked_matrix

KINDS = ("nan", "nonzero")


@dataclass(frozen=True)
class ComplementMask:
    """A mask with few missing entries: ``matrix`` (CSR, X's shape and row order) holds 1 - weight at the entries
    whose weight is not 1 (1 at a missing entry); every other entry has weight 1."""

    matrix: sp.csr_matrix

    @property
    def shape(self) -> tuple:
        return self.matrix.shape


def _in_memory(X) -> bool:
    return isinstance(X, (np.ndarray, pd.DataFrame, list)) or sp.issparse(X)


def resolve_mask(X, mask):
    """``(X, mask)`` for a fit: X with its missing entries set to 0 (a copy when any are changed; X in memory) and
    the mask resolved: None (every entry observed, or all weights 1), a float64 array or CSR matrix of weights,
    or a :class:`ComplementMask`. For X that is not in memory (a store, a GroupedMatrix) only a weight array is
    accepted, and X is left as it is (the masked kernels never use X at a weight-0 entry, up to rounding).

    Raises ValueError naming the problem: an unknown string, "nan" or "nonzero" with X not in memory,
    "nonzero" with a dense X, a mask of the wrong shape, with NaN, infinite or negative weights."""
    if mask is None:
        return X, None
    if isinstance(mask, str):
        if mask not in KINDS:
            raise ValueError(f"mask must be None, a weight array or sparse matrix of X's shape, or one of {KINDS}; "
                             f"got {mask!r}")
        if not _in_memory(X):
            raise ValueError(f"mask={mask!r} needs X in memory (an array, DataFrame or sparse matrix); for a "
                             "store or GroupedMatrix give a weight array")
        frame = X if isinstance(X, pd.DataFrame) else None
        values = checked_matrix(X, "X")
        if mask == "nonzero":
            X, resolved = _nonzero(values)
        else:
            X, resolved = _nan(values)
        return _as_frame(X, frame), resolved
    weights = check_weights(mask, getattr(X, "shape", None) if _in_memory(X) else None)
    if weights is None or not _in_memory(X):
        return X, weights
    frame = X if isinstance(X, pd.DataFrame) else None
    return _as_frame(_zero_missing(checked_matrix(X, "X"), weights), frame), weights


def _as_frame(X, frame):
    """X back as a DataFrame with ``frame``'s labels (its feature names), if X came as one."""
    if frame is None or X is frame:
        return X
    return pd.DataFrame(X, index=frame.index, columns=frame.columns)


def _nonzero(X):
    if not sp.issparse(X):
        raise ValueError("mask='nonzero' needs a sparse X (its stored entries are the observed ones); for a dense "
                         "X give a weight array, or mark the missing entries NaN and use mask='nan'")
    X = sp.csr_matrix(X)
    X.sum_duplicates()
    if X.nnz == X.shape[0] * X.shape[1]:
        return X, None
    return X, sp.csr_matrix((np.ones(X.nnz), X.indices.copy(), X.indptr.copy()), shape=X.shape)


def _nan(X):
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
        _check_shape(mask.shape, shape)
        return None if mask.matrix.nnz == 0 else mask
    if isinstance(mask, str):
        raise ValueError(f"mask={mask!r} is resolved from X in memory before X is grouped (distfact.estimators."
                         "masks.resolve_mask, which fit calls); here only a weight array is accepted")
    if sp.issparse(mask):
        weights = sp.csr_matrix(mask, dtype=np.float64, copy=True)
        weights.sum_duplicates()
        values = weights.data
    else:
        weights = np.asarray(mask.to_numpy() if isinstance(mask, pd.DataFrame) else mask)
        if weights.dtype.kind not in "biuf":
            raise ValueError(f"mask has dtype {weights.dtype}; give numbers (weights, 0 = missing) or True/False")
        weights = weights.astype(np.float64)
        if weights.ndim != 2:
            raise ValueError(f"mask must be 2-D (X's shape), got {weights.ndim} dimensions")
        values = weights
    _check_shape(weights.shape, shape)
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


def _check_shape(got, expected) -> None:
    if expected is not None and tuple(got) != tuple(expected):
        raise ValueError(f"mask has shape {tuple(got)}, X has shape {tuple(expected)}; give one weight per entry of X")


def _zero_missing(X, weights):
    """X with 0 at every entry of weight 0 (a copy)."""
    if sp.issparse(X):
        X = sp.csr_matrix(X, copy=True)
        X.sum_duplicates()
        X.sort_indices()
        pattern = sp.csr_matrix((X.data, X.indices, X.indptr), shape=X.shape)
        if sp.issparse(weights):
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


# ------------------------------------------------------------------------ per block
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


_SHARED = contextvars.ContextVar("distfact_shared_masks", default=None)


@contextlib.contextmanager
def masks_shared():
    """Within it, :func:`block_masks` and :func:`observed_total` are computed once per (data, mask) object pair
    (``fit_many``: a fold's models share their fold's mask, whose per-block forms and X's observed total,
    one read of X, are the same for all of them). The models' local states then hold the same mask arrays,
    which no step changes."""
    token = _SHARED.set({})
    try:
        yield
    finally:
        _SHARED.reset(token)


def _once(kind: str, data, mask, compute):
    """``compute()``, or within :func:`masks_shared` what it gave for these very ``data`` and ``mask``."""
    memo = _SHARED.get()
    if memo is None:
        return compute()
    key = (kind, id(data), id(mask))
    if key not in memo:
        memo[key] = (data, mask, compute())  # data and mask kept alive, so that their ids stay theirs
    return memo[key][2]


def block_masks(data, mask) -> tuple[list | None, str | None]:
    """Per block of ``data`` (a GroupedMatrix), in the store's row order, the local inputs {form: P_b} of the
    mask (:func:`block_form`), and the mask's digest for a checkpoint's configuration (SHA-1 of every block's
    form and CSR arrays); (None, None) without a mask. ``mask``: as :func:`resolve_mask` returns it, or a weight
    array (checked here: ``fit_many`` passes each model's own). Computed once per mask within
    :func:`masks_shared`."""
    return _once("blocks", data, mask, lambda: _block_masks(data, mask))


def _block_masks(data, mask) -> tuple[list | None, str | None]:
    mask = check_weights(mask, data.shape)
    if mask is None:
        return None, None
    stored = data.row_index()
    digest = hashlib.sha1()
    inputs = []
    for block in data.blocks:
        form, P = block_form(mask, stored[block.row_start:block.row_stop])
        digest.update(form.encode())
        for part in (P.indptr, P.indices, P.data):
            digest.update(np.ascontiguousarray(part, dtype=np.int64 if part.dtype.kind == "i" else None).tobytes())
        inputs.append({form: P})
    return inputs, digest.hexdigest()


def missing_entries(mask) -> tuple[np.ndarray, np.ndarray]:
    """(rows, columns) of the entries of weight 0 of a resolved mask (not None), in row-major order."""
    if isinstance(mask, ComplementMask):
        C = mask.matrix.tocoo()
        rows, cols = C.row[C.data == 1], C.col[C.data == 1]
        order = np.lexsort((cols, rows))
        return rows[order], cols[order]
    if sp.issparse(mask):
        observed = np.zeros(mask.shape, dtype=bool)
        observed[mask.nonzero()] = True
        return np.nonzero(~observed)
    return np.nonzero(mask == 0)


def observed_total(data, mask_blocks) -> float:
    """sum of X over the observed entries (X read as 0 at the missing ones), block by block in the store's order:
    the same number whether or not X was zeroed there (one X serves every fold of ``fit_many``). Reads each block
    of X once (no pass of the engine: for a store, one read before the fit starts); once per ``mask_blocks``
    within :func:`masks_shared`."""
    return _once("total", data, mask_blocks, lambda: _observed_total(data, mask_blocks))


def _observed_total(data, mask_blocks) -> float:
    total = 0.0
    for block, entry in zip(data.blocks, mask_blocks):
        (form, P), = entry.items()
        X_b, x = observed_block(data.load_block(block.index), form, P)
        values = x if form == OBSERVED else (X_b.data if sp.issparse(X_b) else X_b)  # observed: P's entries only
        total += float(values.sum(dtype=np.float64))
    return total
