"""Turn what a user passes as X (array, sparse matrix, dask array, store path, GroupedMatrix) into a GroupedMatrix."""

from __future__ import annotations

import os

import numpy as np
import scipy.sparse as sp

from .grouped import GroupedMatrix
from .ingest import from_arrays
from .validate import SUPPORTED_DTYPES, check_csr_structure

# Arrays already in memory are cut into about as many blocks as there are threads, of nearly equal rows: the blocks
# of a pass run side by side and end together; each block costs an r x n statistics array per pass, and there is no
# I/O to overlap. A small X is cut into blocks of about this many bytes instead (X under it: one block).
MIN_IN_MEMORY_BLOCK_BYTES = 2**20
# A dense X, only from this many bytes a block on: an in-process executor runs dense blocks in memory in turn, each
# product on every core (``InProcessExecutor._serial``, a large block's tiles on BLAS's threads), so that cutting it
# only adds per-block work (issue 19: SSNMF on 500 x 300, 1.2 MB in two blocks, took a third more time than in one).
# Its blocks matter on a cluster, which gets the same blocks (the same bits as in-process): an array of less than
# 16 MiB a worker is cut into fewer blocks than the cluster has workers (a block's pass is then a few ms of
# arithmetic, near a cluster's per-pass overhead); for many workers, ingest it into a store (or pass ``block_rows``).
# A dense block of more than one tile (1 MiB) also makes ``fit_many``'s models share its products (equal to their
# fits alone to rounding, not bitwise: ``shared_products``).
MIN_IN_MEMORY_DENSE_BLOCK_BYTES = 2**24


def in_memory_block_rows(X, n_threads: int | None) -> int:
    """Rows per block of an array kept in memory: ceil(m / k) for k blocks, k the number of threads or, if fewer,
    X's bytes over ``MIN_IN_MEMORY_BLOCK_BYTES`` (sparse X: nnz x (value + index)) or
    ``MIN_IN_MEMORY_DENSE_BLOCK_BYTES`` (dense X), rounded up. One group: k blocks (fewer where m <= k (k - 1)); the
    groups are cut apart (``store/ingest.py: split_rows``), so X of several makes up to k - 1 more. Rows, not a byte
    target: a byte target rounded down to whole rows made one block too many (a CSR X of one group in three blocks
    on two threads, the third running alone: a quarter more time a pass)."""
    m = X.shape[0]
    itemsize = np.dtype(getattr(X, "dtype", np.float64)).itemsize  # a DataFrame has dtypes, not a dtype
    if sp.issparse(X):
        nbytes, per_block = X.nnz * (itemsize + 4), MIN_IN_MEMORY_BLOCK_BYTES
    else:
        nbytes, per_block = int(np.prod(X.shape)) * itemsize, MIN_IN_MEMORY_DENSE_BLOCK_BYTES
    n_blocks = max(1, min(n_threads or os.cpu_count() or 1, -(-nbytes // per_block), m))
    return -(-m // n_blocks)


def as_grouped(X, groups=None, *, block_rows=None, n_threads=None, where: str = "X",
               signed: bool = False) -> GroupedMatrix:
    """A GroupedMatrix for ``X``: stores are opened, arrays are blocked in memory.

    ``groups`` with categories (a pandas Categorical or categorical Series) fixes the groups and
    their order, so that a category without rows is an error rather than silently dropped.

    ``signed``: arrays may hold negative values (multigroup SVD); without it a store or a
    GroupedMatrix built with ``signed=True`` is refused, as the NMF methods need X >= 0.

    A dask array is materialised block by block into memory; for data larger than
    memory, ingest it into a store first (``distfact.from_arrays(X, groups, path)``).
    """
    if isinstance(X, GroupedMatrix):
        if groups is not None:
            raise ValueError(f"{where} is a GroupedMatrix, which carries its groups; do not pass groups=")
        return _checked_sign(X, signed, where)
    if isinstance(X, (str, os.PathLike)):
        if groups is not None:
            raise ValueError(f"{where} is a store path, whose groups are stored with it; do not pass groups=")
        return _checked_sign(GroupedMatrix.open(X), signed, where)
    if not hasattr(X, "shape") or isinstance(X, np.ndarray) or sp.issparse(X):
        X = checked_matrix(X, where)
    categories = getattr(getattr(groups, "cat", groups), "categories", None)
    group_names = None if categories is None else [str(c) for c in categories]
    if group_names is not None:
        groups = np.asarray(groups).astype(str)
    return from_arrays(X, groups, None, group_names=group_names, signed=signed,
                       block_rows=in_memory_block_rows(X, n_threads) if block_rows is None else block_rows)


def checked_matrix(X, where: str):
    """A list, array or sparse matrix as scikit-learn's estimators take it, with their messages (a 1-D array:
    "Reshape your data"; no rows or columns; complex numbers; an object array of numbers becomes float64).
    Values (NaN, negative, overflow) are checked later, block by block, naming the entry."""
    from sklearn.utils.validation import check_array

    dtype = X.dtype if getattr(X, "dtype", object) in SUPPORTED_DTYPES else np.float64
    check_csr_structure(X, where)  # before check_array converts it
    return check_array(X, accept_sparse=("csr", "csc", "coo"), dtype=dtype, ensure_all_finite=False,
                       input_name=where, copy=False)


def _checked_sign(data: GroupedMatrix, signed: bool, where: str) -> GroupedMatrix:
    if data.meta.signed and not signed:
        raise ValueError(f"{where} was ingested with signed=True (it may hold negative values); "
                         "this method factors non-negative data")
    return data
