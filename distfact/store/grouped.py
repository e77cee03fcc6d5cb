"""``GroupedMatrix``: a non-negative matrix whose rows are partitioned into named groups.

It lives either on disk (a Zarr v3 store, see ``docs/format.md``) or in memory (the
fast path for data that fit); both expose the same row blocks, which never straddle
a group, and the per-group constants gathered at ingest (||X_l||_F^2, sums, nnz).
Methods that sweep over columns can add a CSC copy of X by column blocks
(``with_column_blocks``), built out of core for stores on disk.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import zarr
from zarr.core.buffer.cpu import NDBuffer

from ..kernels.memory import aligned, empty_aligned
from .format import Block, ColumnBlock, GroupStats, Metadata
from .validate import check_block_values

DEFAULT_BLOCK_BYTES = 128 * 2**20

logger = logging.getLogger("distfact")


def read_node(path: str, key: str, what: str, load):
    """``load(node)`` on the sub-group ``key`` of the store at ``path``; a failure names the store and ``what``."""
    try:
        return load(zarr.open_group(path, mode="r", path=key))
    except Exception as exc:  # zarr/codec errors of a damaged chunk come in many types
        raise ValueError(f"store {path!r} is corrupt: {what} cannot be read: {exc}") from exc


def compressed(node, kind, shape):
    """The CSR or CSC matrix (``kind``) held by a group's ``data``, ``indices`` and ``indptr`` arrays."""
    return kind((node["data"][...], node["indices"][...], node["indptr"][...]), shape=shape)


def write_arrays(node, **arrays) -> None:
    """Write each array into ``node`` as a single chunk (the block is the unit of I/O)."""
    for name, arr in arrays.items():
        node.create_array(name, shape=arr.shape, dtype=arr.dtype, chunks=tuple(max(s, 1) for s in arr.shape))[...] = arr


def read_aligned(array: zarr.Array) -> np.ndarray:
    """The whole Zarr array, read into a 64-byte-aligned buffer (see ``kernels/memory.py``): the
    block tasks then use it as it is instead of copying it every pass."""
    out = empty_aligned(array.shape, array.dtype)
    array.get_basic_selection(Ellipsis, out=NDBuffer.from_numpy_array(out))
    return out


@dataclass(frozen=True)
class BlockReader:
    """Picklable loader of one block from a store on disk (what a worker runs)."""

    path: str
    layout: str
    shape: tuple[int, int]

    def __call__(self, block: Block):
        def load(node):
            if self.layout == "dense":
                return read_aligned(node["X"])
            return compressed(node, sp.csr_matrix, (block.n_rows, self.shape[1]))

        return read_node(self.path, f"blocks/{block.key}", f"block {block.index} (key {block.key!r})", load)


@dataclass(frozen=True)
class ColumnBlockReader:
    """Picklable loader of one column block (CSC, all m rows in stored order) from a store on disk."""

    path: str
    shape: tuple[int, int]

    def __call__(self, block: ColumnBlock) -> sp.csc_matrix:
        return read_node(self.path, f"columns/{block.key}", f"column block {block.index} (key {block.key!r})",
                         lambda node: compressed(node, sp.csc_matrix, (self.shape[0], block.n_cols)))


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


def check_blocks_present(root, folder: str, blocks, what: str, where: str) -> None:
    """Every block listed in the metadata has its sub-group ``<folder>/<key>``."""
    present = set(root[folder].group_keys()) if folder in root else set()
    for block in blocks:
        if block.key not in present:
            raise ValueError(f"{where} is corrupt: {what} {block.index} (key {block.key!r}) is missing")


class GroupedMatrix:
    """X (m x n, non-negative unless ingested with ``signed=True``) with its rows partitioned into named groups.

    Build one with :func:`distfact.GroupedMatrix.from_arrays` (or the other
    ``distfact.store.from_*`` ingest functions) and reopen a stored one with
    :func:`distfact.open`. Rows are kept in group order; ``row_index()`` maps each
    stored row back to the caller's row number.
    """

    def __init__(self, meta: Metadata, column_sums: np.ndarray, *, path: str | None = None,
                 blocks: list | None = None, block_rows: list | None = None,
                 feature_names: np.ndarray | None = None, column_data: list | None = None):
        self.meta = meta
        self.column_sums = column_sums
        self.path = path
        self._blocks = blocks
        self._block_rows = block_rows
        self.feature_names = feature_names
        self._column_data = column_data  # in memory: the CSC column blocks, in order

    # -- construction -------------------------------------------------------
    @staticmethod
    def from_arrays(X, groups=None, path=None, **kwargs) -> "GroupedMatrix":
        """See :func:`distfact.store.ingest.from_arrays`."""
        from .ingest import from_arrays

        return from_arrays(X, groups, path, **kwargs)

    @classmethod
    def open(cls, path) -> "GroupedMatrix":
        """Open a store written by distfact; a missing or corrupt store raises ``ValueError``."""
        path = os.path.abspath(os.path.normpath(os.fspath(path)))  # workers may run elsewhere
        where = f"store {path!r}"
        if not os.path.isdir(path):
            raise ValueError(f"{where} does not exist (write one with 'distfact ingest')" if not os.path.exists(path)
                             else f"{where} is a file, not a distfact store (a directory written by 'distfact ingest')")
        try:
            root = zarr.open_group(path, mode="r")
            doc = root.attrs.get("distfact")
        except Exception as exc:  # zarr raises several types for a damaged zarr.json
            raise ValueError(f"{where} is not a readable Zarr group: {exc}") from exc
        if doc is None:
            raise ValueError(f"{where} has no distfact metadata (not a store, or an ingest that did not finish)")
        meta = Metadata.from_json(doc, where)
        check_blocks_present(root, "blocks", meta.blocks, "block", where)
        check_blocks_present(root, "columns", meta.column_blocks, "column block", where)
        if "column_sums" not in root:
            raise ValueError(f"{where} is corrupt: array 'column_sums' is missing")
        names = root["feature_names"][...] if meta.has_feature_names else None
        return cls(meta, root["column_sums"][...], path=path, feature_names=names)

    # -- description --------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        return self.meta.shape

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.meta.dtype)

    @property
    def layout(self) -> str:
        return self.meta.layout

    @property
    def is_sparse(self) -> bool:
        return self.meta.layout == "csr"

    @property
    def in_memory(self) -> bool:
        return self._blocks is not None

    @property
    def blocks(self) -> list[Block]:
        return self.meta.blocks

    @property
    def n_blocks(self) -> int:
        return len(self.meta.blocks)

    @property
    def has_column_blocks(self) -> bool:
        """Whether X is also stored by column blocks (see :meth:`with_column_blocks`)."""
        return bool(self.meta.column_blocks)

    @property
    def column_blocks(self) -> list[ColumnBlock]:
        return self.meta.column_blocks

    @property
    def n_groups(self) -> int:
        return len(self.meta.groups)

    @property
    def group_names(self) -> list[str]:
        return [g.name for g in self.meta.groups]

    @property
    def group_sizes(self) -> np.ndarray:
        return np.array([g.row_stop - g.row_start for g in self.meta.groups])

    @property
    def group_sq_norms(self) -> np.ndarray:
        """||X_l||_F^2 per group."""
        return np.array([g.sq_norm for g in self.meta.groups])

    @property
    def group_totals(self) -> np.ndarray:
        return np.array([g.total for g in self.meta.groups])

    @property
    def group_nnz(self) -> np.ndarray:
        return np.array([g.nnz for g in self.meta.groups])

    @property
    def nbytes(self) -> int:
        """Bytes of X in memory (values, plus indices and row pointers for CSR)."""
        if self.is_sparse:
            return self.nnz * (self.dtype.itemsize + 4) + 4 * (self.shape[0] + self.n_blocks)
        return self.shape[0] * self.shape[1] * self.dtype.itemsize

    @property
    def nnz(self) -> int:
        return int(self.group_nnz.sum())

    def info(self) -> dict:
        """A JSON-able summary (what ``distfact info`` prints)."""
        return {
            "path": self.path,
            "shape": list(self.shape),
            "dtype": str(self.dtype),
            "layout": self.layout,
            "nnz": self.nnz,
            "n_blocks": self.n_blocks,
            "n_column_blocks": len(self.column_blocks),
            "groups": [
                {"name": g.name, "rows": g.row_stop - g.row_start, "nnz": g.nnz,
                 "frobenius_norm": float(np.sqrt(g.sq_norm)),
                 "blocks": sum(1 for b in self.blocks if b.group == i)}
                for i, g in enumerate(self.meta.groups)
            ],
        }

    def __repr__(self) -> str:
        where = f"path={self.path!r}" if self.path else "in memory"
        return (f"GroupedMatrix(shape={self.shape}, dtype={self.dtype}, layout={self.layout!r}, "
                f"groups={self.group_names}, n_blocks={self.n_blocks}, {where})")

    # -- access -------------------------------------------------------------
    def reader(self):
        """A callable ``block -> array`` that a worker can run (picklable for stores on disk)."""
        if self.in_memory:
            return lambda block: self._blocks[block.index]
        return BlockReader(self.path, self.layout, self.shape)

    def column_reader(self):
        """A callable ``column block -> CSC matrix`` (m x its columns, rows in stored order).

        Picklable for stores on disk, like :meth:`reader`. Requires the column blocks.
        """
        if not self.has_column_blocks:
            raise ValueError(f"{self!r} has no column blocks (build them with with_column_blocks())")
        if self.in_memory:
            return lambda block: self._column_data[block.index]
        return ColumnBlockReader(self.path, self.shape)

    def with_column_blocks(self, block_bytes=None, n_blocks=None) -> "GroupedMatrix":
        """This matrix with a copy of X by column blocks (CSC), for methods that sweep over columns.

        Column ranges are contiguous and hold about equal numbers of non-zeros (the
        columns of text data are very unequal): ``n_blocks`` ranges (at most n) if given,
        else about ``block_bytes`` (default 128 MiB) per block. Returns ``self`` if the
        copy exists. In memory the blocks are built with scipy; a store on disk gets them
        out of core, one row block or one column block in memory at a time, committed
        with the metadata last (a failure leaves the store as it was), and is reopened.
        """
        if self.has_column_blocks:
            return self
        m, n = self.shape
        where = "X (in memory)" if self.in_memory else f"store {self.path!r}"
        reader = self.reader()
        col_nnz = np.zeros(n, dtype=np.int64)
        for block in self.blocks:  # pass A: non-zeros per column
            X = reader(block)
            col_nnz += (np.bincount(X.indices[X.data != 0], minlength=n) if sp.issparse(X)
                        else np.count_nonzero(X, axis=0))
        if int(col_nnz.sum()) != self.nnz:  # e.g. a lost chunk, which zarr reads back as zeros
            raise ValueError(f"{where} is corrupt: its row blocks hold {int(col_nnz.sum())} non-zeros, "
                             f"its metadata says {self.nnz}")
        ranges = column_ranges(col_nnz, self.dtype.itemsize, m, block_bytes, n_blocks)
        logger.info("building %d column blocks (a CSC copy of X, %d x %d, %d non-zeros) for %s",
                    len(ranges), m, n, self.nnz, where)
        if self.in_memory:
            column_blocks, matrices = self._build_column_blocks(ranges, None)
            return GroupedMatrix(replace(self.meta, column_blocks=column_blocks), self.column_sums,
                                 blocks=self._blocks, block_rows=self._block_rows,
                                 feature_names=self.feature_names, column_data=matrices)
        return self._commit_column_blocks(ranges)

    def _build_column_blocks(self, ranges, stage_path) -> tuple[list[ColumnBlock], list]:
        """Passes B and C: cut every row block at the column ranges, then stack each range's pieces.

        With ``stage_path`` (a new Zarr group) the pieces and then the blocks
        ``columns/<key>`` go there, so only one row block or one column block is in memory
        at a time; with ``None`` everything stays in memory and the CSC matrices are
        returned too.
        """
        reader, m = self.reader(), self.shape[0]
        stage = None if stage_path is None else zarr.open_group(stage_path, mode="w", zarr_format=3)
        held, filled = {}, [[] for _ in ranges]  # filled[j]: the row blocks with a piece of range j
        for block in self.blocks:
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
                      compressed(stage[f"pieces/{j:06d}/{r:06d}"], sp.csc_matrix, (self.blocks[r].n_rows, shape[1]))
                      for r in filled[j]]
            data, indices, indptr = stack_column_pieces(pieces, [self.blocks[r].row_start for r in filled[j]],
                                                        shape[1], self.dtype, column_index_dtype(m))
            column_blocks.append(ColumnBlock(j, f"{j:06d}", start, stop, len(data)))
            if stage is None:
                matrices.append(sp.csc_matrix((data, indices, indptr), shape=shape))
            else:
                write_arrays(stage.create_group(f"columns/{j:06d}"), data=data, indices=indices, indptr=indptr)
                if filled[j]:  # its pieces are done with: do not keep two staged copies of X
                    shutil.rmtree(os.path.join(stage_path, "pieces", f"{j:06d}"))
        return column_blocks, matrices

    def _commit_column_blocks(self, ranges) -> "GroupedMatrix":
        """Build the column blocks beside the store, move them in, then list them in the metadata.

        The metadata is written last: a store whose metadata lists no column blocks has
        none, whatever directories exist, so any failure before it leaves the store as it
        was (a stray ``columns/`` is replaced by the next attempt).
        """
        where = f"store {self.path!r}"  # on disk only
        parent, name = os.path.split(self.path)
        stage_path = os.path.join(parent, f".{name}.columns-partial-{uuid.uuid4().hex[:8]}")
        target = os.path.join(self.path, "columns")
        try:
            column_blocks, _ = self._build_column_blocks(ranges, stage_path)
            meta = replace(self.meta, column_blocks=column_blocks)
            meta.check(where)
            root = zarr.open_group(self.path, mode="r+")
            current = Metadata.from_json(root.attrs["distfact"], where)
            if not current.column_blocks and current != self.meta:
                raise ValueError(f"{where} was replaced while its column blocks were being built; not adding them")
            if not current.column_blocks:  # else another process committed first: keep its blocks
                if os.path.exists(target):  # left by an attempt that failed before its metadata write
                    shutil.rmtree(target)
                os.rename(os.path.join(stage_path, "columns"), target)
                root.attrs["distfact"] = meta.to_json()  # the commit (zarr writes zarr.json aside, then renames)
        finally:
            shutil.rmtree(stage_path, ignore_errors=True)
        return GroupedMatrix.open(self.path)

    def load_block(self, index: int):
        """Block ``index`` as a numpy array (dense layout) or a CSR matrix."""
        return self.reader()(self.blocks[index])

    def row_index(self) -> np.ndarray:
        """For each stored row, its row number in the data as it was given to ingest."""
        if self.in_memory:
            return np.concatenate(self._block_rows)
        root = zarr.open_group(self.path, mode="r")
        return np.concatenate([root[f"blocks/{b.key}/rows"][...] for b in self.blocks])

    def to_dask(self):
        """X as a dask array chunked by blocks: numpy chunks, or ``sparse.COO`` chunks for CSR."""
        import dask
        import dask.array as da

        reader = self.reader()
        n = self.shape[1]

        def load(block):
            out = reader(block)
            if sp.issparse(out):
                import sparse

                return sparse.COO.from_scipy_sparse(out)
            return out

        if self.is_sparse:
            import sparse

            meta = sparse.COO.from_numpy(np.zeros((0, 0), dtype=self.dtype))
        else:
            meta = np.empty((0, 0), dtype=self.dtype)
        parts = [da.from_delayed(dask.delayed(load)(b), shape=(b.n_rows, n), dtype=self.dtype, meta=meta)
                 for b in self.blocks]
        return da.concatenate(parts, axis=0)


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


class StoreWriter:
    """Receives validated blocks group by group and commits them all at once.

    On disk, blocks go to a hidden sibling directory that is renamed into place by
    :meth:`commit`; anything that fails before that leaves the destination as it
    was. With ``path=None`` the blocks are kept in memory.
    """

    def __init__(self, path, n_cols: int, dtype, layout: str, *, overwrite: bool = False,
                 where: str = "X", signed: bool = False):
        self.n_cols = n_cols
        self.signed = signed
        self.dtype = np.dtype(dtype)
        self.layout = layout
        self.where = where
        self.final_path = None if path is None else os.path.abspath(os.fspath(path))
        self.overwrite = overwrite
        if self.final_path is not None:
            self._check_destination()
        self._groups: dict[str, dict] = {}
        self._column_sums = np.zeros(n_cols, dtype=np.float64)
        self._staged: list[dict] = []
        self._root = None
        if self.final_path is not None:
            parent, name = os.path.split(self.final_path)
            os.makedirs(parent, exist_ok=True)
            self.tmp_path = os.path.join(parent, f".{name}.partial-{uuid.uuid4().hex[:8]}")
            self._root = zarr.open_group(self.tmp_path, mode="w", zarr_format=3)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()
        return False

    def abort(self) -> None:
        if self._root is not None and os.path.exists(self.tmp_path):
            shutil.rmtree(self.tmp_path, ignore_errors=True)
        self._root = None

    def add_block(self, group_name: str, block, source_rows: np.ndarray) -> None:
        """Validate one block of rows of ``group_name`` (``source_rows``: their caller row numbers), then stage it."""
        if block.shape[0] == 0:
            return
        if self.layout == "csr":
            block = sp.csr_matrix(block, dtype=self.dtype)
        else:  # a sparse block is densified only when the caller asked for the dense layout
            block = np.ascontiguousarray(block.toarray() if sp.issparse(block) else block, dtype=self.dtype)
        if block.shape[1] != self.n_cols:
            raise ValueError(f"{self.where}: rows {int(source_rows[0])}.. have {block.shape[1]} columns, expected {self.n_cols}")
        if sp.issparse(block):
            block.sum_duplicates()
            block.eliminate_zeros()
        check_block_values(block, group_name, source_rows, self.where, self.signed)
        values = block.data if sp.issparse(block) else block
        stats = self._groups.setdefault(group_name, {"rows": 0, "sq_norm": 0.0, "total": 0.0, "nnz": 0})
        stats["rows"] += block.shape[0]
        flat = values.ravel().astype(np.float64, copy=False)
        stats["sq_norm"] += float(np.dot(flat, flat))
        stats["total"] += float(values.sum(dtype=np.float64))
        nnz = int(block.nnz) if sp.issparse(block) else int(np.count_nonzero(block))
        stats["nnz"] += nnz
        self._column_sums += np.asarray(block.sum(axis=0, dtype=np.float64)).ravel()
        key = f"{len(self._staged):06d}"
        entry = {"key": key, "group": group_name, "rows": block.shape[0], "nnz": nnz}
        source_rows = np.asarray(source_rows, dtype=np.int64)
        if self._root is None:  # dense blocks aligned once here rather than copied by every pass
            entry["data"], entry["source_rows"] = aligned(block), source_rows
        else:
            node = self._root.create_group(f"blocks/{key}")
            if sp.issparse(block):
                write_arrays(node, data=block.data, indices=block.indices, indptr=block.indptr)
            else:
                write_arrays(node, X=block)
            write_arrays(node, rows=source_rows)
        self._staged.append(entry)

    def commit(self, group_order: list[str], feature_names=None, source: dict | None = None) -> GroupedMatrix:
        """Order the blocks by group, write metadata last, move the store into place."""
        for name in group_order:
            if name not in self._groups:
                raise ValueError(f"group {name!r} is empty: it has no rows")
        unknown = set(self._groups) - set(group_order)
        if unknown:
            raise ValueError(f"rows carry groups not in the group list: {sorted(unknown)}")
        if feature_names is not None:
            feature_names = np.asarray([str(f) for f in feature_names])
            if feature_names.shape != (self.n_cols,):
                raise ValueError(f"feature_names has {feature_names.shape[0]} names, X has {self.n_cols} columns")
        order = {name: i for i, name in enumerate(group_order)}
        staged = sorted(self._staged, key=lambda e: order[e["group"]])  # stable: arrival order within a group
        groups, blocks, row = [], [], 0
        for g_idx, name in enumerate(group_order):
            start = row
            for entry in (e for e in staged if e["group"] == name):
                blocks.append(Block(len(blocks), entry["key"], g_idx, row, row + entry["rows"], entry["nnz"]))
                row += entry["rows"]
            s = self._groups[name]
            groups.append(GroupStats(name, start, row, s["sq_norm"], s["total"], s["nnz"]))
        meta = Metadata((row, self.n_cols), str(self.dtype), self.layout, groups, blocks,
                        has_feature_names=feature_names is not None, source=source or {}, signed=self.signed)
        meta.check(self.where)
        if self._root is None:
            by_key = {e["key"]: e for e in staged}
            return GroupedMatrix(meta, self._column_sums, blocks=[by_key[b.key]["data"] for b in blocks],
                                 block_rows=[by_key[b.key]["source_rows"] for b in blocks],
                                 feature_names=feature_names)
        try:
            self._root.create_array("column_sums", shape=(self.n_cols,), dtype=np.float64,
                                    chunks=(max(self.n_cols, 1),))[...] = self._column_sums
            if feature_names is not None:
                self._root.create_array("feature_names", shape=(self.n_cols,), dtype=str,
                                        chunks=(max(self.n_cols, 1),))[...] = feature_names
            self._root.attrs["distfact"] = meta.to_json()
            self._replace_destination()
        except BaseException:
            self.abort()
            raise
        return GroupedMatrix.open(self.final_path)

    def _check_destination(self) -> None:
        check_destination(self.final_path, self.overwrite)

    def _replace_destination(self) -> None:
        self._check_destination()  # again: something may have appeared while we were writing
        if os.path.exists(self.final_path):
            trash = f"{self.tmp_path}.old"
            os.rename(self.final_path, trash)
            os.rename(self.tmp_path, self.final_path)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.rename(self.tmp_path, self.final_path)
        self._root = None


def unreadable(path: str) -> str | None:
    """Why the store at ``path`` cannot be read from this process (its root metadata), or None if it can.
    Cheap: run on every worker before a fit."""
    try:
        with open(os.path.join(path, "zarr.json"), "rb") as f:
            f.read(1)
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror or exc}"
    return None


def open_store(path) -> GroupedMatrix:
    """Open the grouped matrix stored at ``path`` (``distfact.open``)."""
    return GroupedMatrix.open(Path(path))
