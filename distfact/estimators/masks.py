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
entries whose weight is not 1; ``store/masks.py: block_form``, which the store writers use too). A store with a
mask of its own (written at ingest, docs/format.md "Masks") gives its blocks' masks instead, read where each block
lives. No all-ones array is built and a sparse X is never densified.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib

import numpy as np
import pandas as pd
import scipy.sparse as sp

from ..engine.executor.base import ReadInput
from ..kernels.masked import OBSERVED
from ..store.coerce import checked_matrix
from ..store.masks import ComplementMask, block_form, block_observed_sums, check_weights, nan_missing, zero_missing

KINDS = ("nan", "nonzero")


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
        if getattr(X, "mask_kind", None) is not None:
            raise ValueError(stored_mask_conflict(X))
        if not _in_memory(X):
            raise ValueError(f"mask={mask!r} needs X in memory (an array, DataFrame or sparse matrix); for a "
                             "store or GroupedMatrix give a weight array, or ingest it with its mask "
                             "(missing='nan', distfact ingest --missing nan)")
        frame = X if isinstance(X, pd.DataFrame) else None
        values = checked_matrix(X, "X")
        if mask == "nonzero":
            X, resolved = _nonzero(values)
        else:
            X, resolved = nan_missing(values)
        return _as_frame(X, frame), resolved
    weights = check_weights(mask, getattr(X, "shape", None) if _in_memory(X) else None)
    if weights is None or not _in_memory(X):
        return X, weights
    frame = X if isinstance(X, pd.DataFrame) else None
    return _as_frame(zero_missing(checked_matrix(X, "X"), weights), frame), weights


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


# ------------------------------------------------------------------------ per block
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
    array (checked here: ``fit_many`` passes each model's own).

    A store with a mask of its own (written at ingest) gives that one: per block a :class:`ReadInput` that the
    block's first task reads where the block lives (checked against its CRC32C there), and as digest
    ``"stored:"`` + the store's :meth:`~distfact.store.grouped.GroupedMatrix.mask_identity`; ``mask`` must then
    be None. Computed once per mask within :func:`masks_shared`."""
    return _once("blocks", data, mask, lambda: _block_masks(data, mask))


def _block_masks(data, mask) -> tuple[list | None, str | None]:
    if data.mask_kind is not None:
        if mask is not None:
            raise ValueError(stored_mask_conflict(data))
        reader = data.mask_reader()
        inputs = [reader(block) for block in data.blocks] if data.in_memory else [ReadInput(reader)] * data.n_blocks
        return inputs, f"stored:{data.mask_identity()}"
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


def stored_weights(data):
    """The weights of the mask stored beside ``data`` (a store with a mask), in X's row order (as X was given to
    ingest), read block by block on this process: CSR when every block holds its observed entries (the form
    with few observed), else a dense array of X's shape (a block that holds its complement, 1 - weight at the
    entries whose weight is not 1, has weights 1 - that: exactly its weights when they are 0 or 1, as a NaN
    mask's are; up to rounding otherwise)."""
    reader, row_index = data.mask_reader(), data.row_index()
    parts = [next(iter(reader(block).items())) for block in data.blocks]
    if all(form == OBSERVED for form, _ in parts):
        stacked = sp.vstack([P for _, P in parts], format="csr")
        return stacked[np.argsort(row_index)]
    weights = np.empty(data.shape)
    for block, (form, P) in zip(data.blocks, parts):
        weights[row_index[block.row_start:block.row_stop]] = P.toarray() if form == OBSERVED else 1.0 - P.toarray()
    return weights


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


def _observed_block_sums(data, mask_blocks):
    """Per block of ``data`` (in the store's order): (block, sum of X over the observed entries, sum m x^2 over
    them), X read as 0 at the missing entries, in float64; one read of each block (and, for a store's own mask,
    whose ``mask_blocks`` are read where each block lives, of the block's mask too)."""
    reader = None if data.mask_kind is None else data.mask_reader()
    for block, entry in zip(data.blocks, mask_blocks):
        (form, P), = (entry if reader is None else reader(block)).items()
        yield block, *block_observed_sums(data.load_block(block.index), form, P)


def observed_total(data, mask_blocks) -> float:
    """sum of X over the observed entries (X read as 0 at the missing ones), block by block in the store's order:
    the same number whether or not X was zeroed there (one X serves every fold of ``fit_many``). Reads each block
    of X once (no pass of the engine: for a store, one read before the fit starts), except for a store's own
    mask, whose blocks' totals were recorded at ingest by the same function (no read); once per ``mask_blocks``
    within :func:`masks_shared`."""
    return _once("total", data, mask_blocks, lambda: _observed_total(data, mask_blocks))


def _observed_total(data, mask_blocks) -> float:
    total = 0.0
    if data.mask_kind is not None:
        for block in data.blocks:
            total += block.mask.observed_total
        return total
    for _, block_total, _ in _observed_block_sums(data, mask_blocks):
        total += block_total
    return total


def stored_mask_conflict(data) -> str:
    """The error for a mask given to fit on a store with its own."""
    where = f"store {data.path!r}" if data.path else "X (a GroupedMatrix)"
    made = "X's NaN entries at ingest" if data.mask_kind == "nan" else "a weight array given at ingest"
    return (f"{where} has its own mask (kind {data.mask_kind!r}: {made}), which a fit uses; fit(..., mask=...) "
            "cannot take another. Ingest X again with the mask you want (distfact ingest --mask FILE, or "
            "from_arrays(..., mask=...)), or without one")


def observed_group_sums(data, mask_blocks) -> tuple[np.ndarray, np.ndarray]:
    """Per group (float64): the sum of X over its observed entries and sum m x^2 over them (its squared norm
    over the observed entries, weighted), X read as 0 at the missing ones; one read of each block, as
    :func:`observed_total`."""
    totals, sq_norms = np.zeros(data.n_groups), np.zeros(data.n_groups)
    for block, block_total, block_sq in _observed_block_sums(data, mask_blocks):
        totals[block.group] += block_total
        sq_norms[block.group] += block_sq
    return totals, sq_norms
