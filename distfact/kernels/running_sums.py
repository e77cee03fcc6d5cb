"""Running sums over rows in order: a group's squared norm, sum and column sums that do not depend on where its rows
are cut into blocks (nor on whether they are stored dense or CSR).

Every entry is added, in float64, in row order and within a row in column order, to running accumulators that
carry over from one block to the next (and, in a store, from one version to the next): ``sq += x * x``,
``total += x``, ``column_sums[j] += x``. One rounding per addition in a fixed order, so the result is a function of
the rows alone. A zero adds nothing exactly (``s + 0.0 == s`` for every ``s`` but ``-0.0``, which an accumulator
started at ``0.0`` never holds), so the dense and the CSR forms of the same rows give the same bits.
"""

from __future__ import annotations

import numba
import numpy as np
import scipy.sparse as sp

SQ_NORM, TOTAL = 0, 1  # the positions in ``running``


@numba.njit(nogil=True, cache=True)
def add_dense_rows(X, column_sums, running):
    """Add the rows of the C-contiguous array ``X`` to ``column_sums`` (float64, n) and ``running`` (float64,
    ``[sum of squares, sum]``), entry by entry in row order."""
    sq, total = running[0], running[1]
    for i in range(X.shape[0]):
        for j in range(X.shape[1]):
            x = np.float64(X[i, j])
            sq += x * x
            total += x
            column_sums[j] += x
    running[0], running[1] = sq, total


@numba.njit(nogil=True, cache=True)
def add_csr_rows(indptr, indices, data, column_sums, running):
    """:func:`add_dense_rows` for the CSR arrays of rows whose column indices are sorted within each row."""
    sq, total = running[0], running[1]
    for i in range(indptr.shape[0] - 1):
        for p in range(indptr[i], indptr[i + 1]):
            x = np.float64(data[p])
            sq += x * x
            total += x
            column_sums[indices[p]] += x
    running[0], running[1] = sq, total


def add_rows(block, column_sums: np.ndarray, running: np.ndarray) -> None:
    """Add the rows of ``block`` (a dense array or a CSR matrix; a CSR matrix's indices are sorted in place) to the
    running ``column_sums`` and ``running`` = ``[sum of squares, sum]`` (float64 arrays, updated in place)."""
    if sp.issparse(block):
        block = block.tocsr()
        block.sort_indices()
        add_csr_rows(block.indptr, block.indices, block.data, column_sums, running)
    else:
        add_dense_rows(np.ascontiguousarray(block), column_sums, running)
