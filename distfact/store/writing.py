"""Writing into a store: arrays as single checksummed chunks, the statistics the metadata records of a block,
what a destination may be, and the copy of X by column blocks (CSC), built in memory or out of core."""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import uuid
from dataclasses import replace

import numpy as np

# imported at their first use, which ``distfact info`` never makes (distfact/lazy.py)
from ..lazy import scipy_sparse as sp, store_chunks as chunks, zarr, zarr_codecs, zarr_storage
from .format import ArrayRecord, ColumnBlock, Metadata

DEFAULT_BLOCK_BYTES = 128 * 2**20


def write_arrays(node, **arrays) -> None:
    """Write each array into ``node`` as a single chunk (the block is the unit of I/O), with the codecs of
    :func:`array_codecs`; the chunk file is written even when it holds only the fill value, so that a missing
    chunk file is always damage."""
    for name, values in arrays.items():
        serializer, compressor = chunks.array_codecs(values.dtype)
        dtype = str if isinstance(serializer, zarr_codecs.VLenUTF8Codec) else values.dtype  # variable-length strings
        array = node.create_array(name, shape=values.shape, dtype=dtype, chunks=tuple(max(s, 1) for s in values.shape),
                                  serializer=serializer, compressors=compressor,
                                  fill_value=chunks.missing_chunk_value(dtype),
                                  chunk_key_encoding={"name": "default", "separator": "/"},
                                  config={"write_empty_chunks": True})
        array[...] = values


def array_records(written: dict, node_path: str, **arrays) -> tuple[ArrayRecord, ...]:
    """The metadata's records of arrays just written into the group ``node_path`` through a
    :class:`ChecksummingStore` whose ``written`` is given: dtype and chunk CRC32C (None without elements)."""
    return tuple(ArrayRecord(name, chunks.dtype_name(values.dtype),
                             written[chunks.chunk_key(node_path, name, values.ndim)] if values.size else None)
                 for name, values in arrays.items())


def block_stats(block) -> dict:
    """A block's statistics for the metadata, in float64: non-zeros, sum of squares, sum and smallest stored value
    (0 when none)."""
    values = block.data if sp.issparse(block) else block
    flat = values.ravel().astype(np.float64, copy=False)
    with np.errstate(over="ignore", invalid="ignore"):  # overflowing data are refused by check_block_values, by name
        return {"nnz": int(block.nnz) if sp.issparse(block) else int(np.count_nonzero(block)),
                "sq_norm": float(np.dot(flat, flat)), "total": float(values.sum(dtype=np.float64)),
                "min_value": float(values.min()) if values.size else 0.0}


class StoreLocked(ValueError):
    """Another process is appending to the store."""


def lock_store(path: str, wait: bool = False) -> int:
    """The store's lock, held by whoever rewrites its metadata (an append, the commit of column blocks): an exclusive
    ``flock`` on its directory (no file is created; the system releases it when the process ends, however it ends).
    Returns the descriptor holding it (closing it releases the lock); if another process holds it, waits for it
    with ``wait``, else raises ``StoreLocked``."""
    if not os.path.isdir(path):
        raise ValueError(f"store {path!r} does not exist (write one with 'distfact ingest' first)")
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise StoreLocked(f"store {path!r}: another process is appending to it; try again when it is done") \
                from None
        raise
    return fd


def check_destination(path, overwrite: bool) -> None:
    """Refuse to replace anything but a distfact store, and a store unless ``overwrite``."""
    if path is None or not os.path.exists(path):
        return
    path = os.path.abspath(os.fspath(path))
    if not overwrite:
        raise ValueError(f"destination {path!r} already exists (pass overwrite=True, or --overwrite, to replace it)")
    is_store = (os.path.exists(os.path.join(path, "zarr.json"))
                and "distfact" in zarr.open_group(path, mode="r").attrs)
    if not is_store:
        raise ValueError(f"destination {path!r} exists and is not a distfact store; not replacing it")


def column_index_dtype(n_rows: int) -> np.dtype:
    """Row numbers of a column block: int32 while they fit, as scipy would choose."""
    return np.dtype(np.int32 if n_rows < 2**31 else np.int64)


def column_ranges(col_nnz: np.ndarray, itemsize: int, n_rows: int, block_bytes=None,
                  n_blocks=None) -> list[tuple[int, int]]:
    """Contiguous column ranges ``[a, b)`` holding about equal numbers of non-zeros.

    ``n_blocks`` ranges if given, else as many as needed for about ``block_bytes`` per
    CSC block; never an empty range, so at most n. A column costs its non-zeros (value
    and row number) plus its ``indptr`` entry, as ``rows_per_block`` counts a CSR row.
    Each cut goes where the running cost is nearest an equal share of what is left, so a
    few very heavy columns (the head of a word-frequency law) do not starve the rest.
    """
    n = len(col_nnz)
    cost = col_nnz * float(itemsize + column_index_dtype(n_rows).itemsize) + 8
    if n_blocks is None:
        block_bytes = DEFAULT_BLOCK_BYTES if block_bytes is None else block_bytes
        if block_bytes <= 0:
            raise ValueError(f"block_bytes must be positive, got {block_bytes!r}")
        n_blocks = int(np.ceil(cost.sum() / block_bytes))
    elif int(n_blocks) < 1:
        raise ValueError(f"n_blocks must be a positive integer, got {n_blocks!r}")
    k = min(max(int(n_blocks), 1), n)
    prefix = np.concatenate([[0.0], np.cumsum(cost)])  # prefix[c]: cost of columns [0, c)
    cuts = [0]
    for j in range(1, k):
        done = prefix[cuts[-1]]
        goal = done + (prefix[-1] - done) / (k - j + 1)
        c = int(np.searchsorted(prefix, goal))  # the first cut with at least ``goal`` before it
        if c > 0 and goal - prefix[c - 1] < prefix[c] - goal:  # the cut just before is nearer
            c -= 1
        cuts.append(min(max(c, cuts[-1] + 1), n - (k - j)))  # leave a column for every range to come
    cuts.append(n)
    return list(zip(cuts[:-1], cuts[1:]))


def cut_columns(block, ranges) -> list[sp.csc_matrix]:
    """A row block cut at the column ranges: canonical CSC pieces, row numbers local to the block."""
    csc = sp.csc_matrix(block)  # a dense block keeps only its non-zeros
    csc.sum_duplicates()
    csc.eliminate_zeros()
    return [csc[:, a:b] for a, b in ranges]


def stack_column_pieces(pieces, row_offsets, n_cols: int, dtype, index_dtype):
    """``(data, indices, indptr)`` of one column block from its row-block pieces, given in row order.

    A piece's rows come after those of the pieces before it, so every column's row numbers
    stay sorted without a sort: each piece is copied into the next free slots of its columns.
    """
    counts = np.zeros(n_cols, dtype=np.int64)
    for piece in pieces:
        counts += np.diff(piece.indptr)
    indptr = np.zeros(n_cols + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    data = np.empty(int(indptr[-1]), dtype=dtype)
    indices = np.empty(int(indptr[-1]), dtype=index_dtype)
    free = indptr[:-1].copy()  # the next free slot of each column
    for piece, offset in zip(pieces, row_offsets):
        per_col = np.diff(piece.indptr)
        cols = np.repeat(np.arange(n_cols), per_col)
        slots = free[cols] + np.arange(piece.nnz) - piece.indptr[cols]
        data[slots] = piece.data
        indices[slots] = piece.indices + np.int64(offset)
        free += per_col
    return data, indices, indptr


def build_column_blocks(matrix, ranges, stage_path) -> tuple[list[ColumnBlock], list]:
    """Passes B and C of ``matrix.with_column_blocks`` (a GroupedMatrix): cut every row block at the column
    ranges, then stack each range's pieces.

    With ``stage_path`` (a new Zarr group) the pieces and then the blocks
    ``columns/<key>`` go there, so only one row block or one column block is in memory
    at a time; with ``None`` everything stays in memory and the CSC matrices are
    returned too.
    """
    reader, m = matrix.reader(), matrix.shape[0]
    stage = None if stage_path is None else zarr.open_group(
        store=chunks.ChecksummingStore(zarr_storage.LocalStore(stage_path)), mode="w", zarr_format=3)
    held, filled = {}, [[] for _ in ranges]  # filled[j]: the row blocks with a piece of range j
    for block in matrix.blocks:
        for j, piece in enumerate(cut_columns(reader(block), ranges)):
            if piece.nnz == 0:  # adds nothing to its column block
                continue
            if stage is None:
                held[j, block.index] = piece
            else:
                write_arrays(stage.create_group(f"pieces/{j:06d}/{block.index:06d}"),
                             data=piece.data, indices=piece.indices, indptr=piece.indptr)
            filled[j].append(block.index)
    column_blocks, matrices = [], []
    for j, (start, stop) in enumerate(ranges):
        shape = (m, stop - start)
        pieces = [held.pop((j, r)) if stage is None else
                  chunks.compressed(stage[f"pieces/{j:06d}/{r:06d}"], sp.csc_matrix,
                                    (matrix.blocks[r].n_rows, shape[1]))
                  for r in filled[j]]
        data, indices, indptr = stack_column_pieces(pieces, [matrix.blocks[r].row_start for r in filled[j]],
                                                    shape[1], matrix.dtype, column_index_dtype(m))
        arrays = {"data": data, "indices": indices, "indptr": indptr}
        if stage is None:
            column_blocks.append(ColumnBlock(j, f"{j:06d}", start, stop, len(data)))
            matrices.append(sp.csc_matrix((data, indices, indptr), shape=shape))
        else:
            write_arrays(stage.create_group(f"columns/{j:06d}"), **arrays)
            column_blocks.append(ColumnBlock(j, f"{j:06d}", start, stop, len(data),
                                             array_records(stage.store.written, f"columns/{j:06d}", **arrays),
                                             version=matrix.meta.version))
            if filled[j]:  # its pieces are done with: do not keep two staged copies of X
                shutil.rmtree(os.path.join(stage_path, "pieces", f"{j:06d}"))
    return column_blocks, matrices


def _check_newest(matrix, current: Metadata, where: str) -> None:
    """Column blocks hold the rows of the version they are listed in: ``matrix`` must be the store's newest version
    (a matrix opened at an earlier one, as a pipeline rerun of an old night opens it, gets none)."""
    if current.version != matrix.meta.version:
        raise ValueError(f"{where}: column blocks can only be added to the store's newest version ({current.version}), "
                         f"not to version {matrix.meta.version}, which later appends have followed")


def commit_column_blocks(matrix, ranges) -> None:
    """Build the column blocks of ``matrix`` (a GroupedMatrix on disk) beside its store, move them in, then list them
    in the metadata.

    The metadata is written last: a store whose metadata lists no column blocks has
    none, whatever directories exist, so any failure before it leaves the store as it
    was (a stray ``columns/`` is replaced by the next attempt).
    """
    where = f"store {matrix.path!r}"  # on disk only
    _check_newest(matrix, Metadata.from_json(zarr.open_group(matrix.path, mode="r").attrs["distfact"], where), where)
    parent, name = os.path.split(matrix.path)
    stage_path = os.path.join(parent, f".{name}.columns-partial-{uuid.uuid4().hex[:8]}")
    # beside this version's own arrays: the column blocks of an earlier version, which a reader may still hold,
    # are never replaced
    target = os.path.join(matrix.path, matrix.meta.node, "columns")
    try:
        column_blocks, _ = build_column_blocks(matrix, ranges, stage_path)
        meta = replace(matrix.meta, column_blocks=column_blocks)
        meta.check(where)
        lock = lock_store(matrix.path, wait=True)  # an append must not commit between the check and the write
        try:
            root = zarr.open_group(matrix.path, mode="r+")
            current = Metadata.from_json(root.attrs["distfact"], where)
            _check_newest(matrix, current, where)
            if not current.column_blocks and current != matrix.meta:
                raise ValueError(f"{where} was replaced while its column blocks were being built (or appended to); "
                                 "not adding them")
            if not current.column_blocks:  # else another process committed first: keep its blocks
                if os.path.exists(target):  # left by an attempt that failed before its metadata write
                    shutil.rmtree(target)
                os.rename(os.path.join(stage_path, "columns"), target)
                root.attrs["distfact"] = meta.to_json()  # the commit (zarr writes zarr.json aside, then renames)
        finally:
            os.close(lock)
    finally:
        shutil.rmtree(stage_path, ignore_errors=True)
