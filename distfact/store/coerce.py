"""Turn what a user passes as X (array, sparse matrix, dask array, store path, GroupedMatrix) into a GroupedMatrix."""

from __future__ import annotations

import os

from .grouped import GroupedMatrix
from .ingest import from_arrays


def as_grouped(X, groups=None, *, block_rows=None, where: str = "X") -> GroupedMatrix:
    """A GroupedMatrix for ``X``: stores are opened, arrays are blocked in memory.

    A dask array is materialised block by block into memory; for data larger than
    memory, ingest it into a store first (``distfact.from_arrays(X, groups, path)``).
    """
    if isinstance(X, GroupedMatrix):
        if groups is not None:
            raise ValueError(f"{where} is a GroupedMatrix, which carries its groups; do not pass groups=")
        return X
    if isinstance(X, (str, os.PathLike)):
        if groups is not None:
            raise ValueError(f"{where} is a store path, whose groups are stored with it; do not pass groups=")
        return GroupedMatrix.open(X)
    return from_arrays(X, groups, None, block_rows=block_rows)
