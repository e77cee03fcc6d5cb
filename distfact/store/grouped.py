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

import google_crc32c
import numpy as np
import scipy.sparse as sp
import zarr
from zarr.codecs import BytesCodec, VLenUTF8Codec, ZstdCodec
from zarr.core.buffer.cpu import NDBuffer
from zarr.storage import LocalStore, WrapperStore

from ..kernels.memory import aligned, empty_aligned
from .format import STRING_DTYPE, ArrayRecord, Block, ColumnBlock, Metadata, group_stats
from .validate import check_block_values

DEFAULT_BLOCK_BYTES = 128 * 2**20

logger = logging.getLogger("distfact")


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (zarr's may span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def dtype_name(dtype) -> str:
    """How the metadata names an array's dtype: numpy's name, or ``"str"`` for strings."""
    dtype = np.dtype(dtype)
    return STRING_DTYPE if dtype.kind in "OTU" else dtype.name


def array_codecs(dtype) -> tuple:
    """The codecs of every array distfact writes (zarr-python 3's defaults, pinned): a reader refuses others,
    since the checksums are of the stored bytes and the codecs say what those bytes mean."""
    serializer = VLenUTF8Codec() if dtype_name(dtype) == STRING_DTYPE else BytesCodec(endian="little")
    return serializer, ZstdCodec(level=0, checksum=False)


def chunk_key(node_path: str, name: str, ndim: int) -> str:
    """The key of the single chunk of the array ``name`` of the group ``node_path`` (``""``: the root), in
    zarr v3's default chunk key encoding, which :func:`write_arrays` sets."""
    return "/".join([*filter(None, [node_path, name]), "c", *["0"] * ndim])


def missing_chunk_value(dtype):
    """An array's fill value, which zarr returns where a chunk file is missing: NaN or -1, values that
    no store holds, rather than a plausible zero (None: zarr's default, for other dtypes)."""
    kind = np.dtype(dtype).kind
    return np.nan if kind == "f" else -1 if kind == "i" else None


class ChunkDamage(ValueError):
    """A chunk file that is missing, not the one the metadata recorded, or one that zarr should not read."""


class ChecksummingStore(WrapperStore):
    """A Zarr store that checksums chunk files, the CRC32C of their bytes as stored, while zarr writes or reads
    them: one pass over the stored (compressed) bytes, as they go by.

    Written chunks' checksums are collected in ``written`` (key -> CRC32C). With ``expected`` (key -> CRC32C),
    every chunk zarr reads must be one of those, present, with that checksum; otherwise :class:`ChunkDamage`.
    Metadata documents pass unchecked (``zarr.json``: distfact checks what they say).
    """

    def __init__(self, store, expected: dict | None = None, written: dict | None = None):
        super().__init__(store)
        self.expected = expected
        self.written = {} if written is None else written

    def _with_store(self, store):
        return type(self)(store, self.expected, self.written)

    async def set(self, key, value) -> None:
        if not is_metadata_document(key):
            self.written[key] = google_crc32c.value(value.as_numpy_array())
        await self._store.set(key, value)

    async def get(self, key, prototype, byte_range=None):
        if self.expected is None or is_metadata_document(key):
            return await self._store.get(key, prototype, byte_range)
        if key not in self.expected:  # its zarr.json was changed: chunk grid, key encoding
            raise ChunkDamage(f"zarr asked for a chunk {key!r} the store does not have")
        value = await self._store.get(key, prototype, byte_range)
        if value is None:
            raise ChunkDamage(f"its chunk file {key!r} is missing")
        if byte_range is not None or google_crc32c.value(value.as_numpy_array()) != self.expected[key]:
            raise ChunkDamage(f"checksum mismatch: its chunk file {key!r} is truncated or damaged")
        return value


def is_metadata_document(key: str) -> bool:
    """Whether ``key`` is one of the documents zarr reads to open a node (v3's, and v2's it looks for)."""
    return key.rsplit("/", 1)[-1] in ("zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata")


def compressed(node, kind, shape):
    """The CSR or CSC matrix (``kind``) held by a group's ``data``, ``indices`` and ``indptr`` arrays."""
    return kind((node["data"][...], node["indices"][...], node["indptr"][...]), shape=shape)


def write_arrays(node, **arrays) -> None:
    """Write each array into ``node`` as a single chunk (the block is the unit of I/O), with the codecs of
    :func:`array_codecs`; the chunk file is written even when it holds only the fill value, so that a missing
    chunk file is always damage."""
    for name, values in arrays.items():
        serializer, compressor = array_codecs(values.dtype)
        dtype = str if isinstance(serializer, VLenUTF8Codec) else values.dtype  # zarr's variable-length strings
        array = node.create_array(name, shape=values.shape, dtype=dtype, chunks=tuple(max(s, 1) for s in values.shape),
                                  serializer=serializer, compressors=compressor, fill_value=missing_chunk_value(dtype),
                                  chunk_key_encoding={"name": "default", "separator": "/"},
                                  config={"write_empty_chunks": True})
        array[...] = values


def array_records(written: dict, node_path: str, **arrays) -> tuple[ArrayRecord, ...]:
    """The metadata's records of arrays just written into the group ``node_path`` through a
    :class:`ChecksummingStore` whose ``written`` is given: dtype and chunk CRC32C (None without elements)."""
    return tuple(ArrayRecord(name, dtype_name(values.dtype),
                             written[chunk_key(node_path, name, values.ndim)] if values.size else None)
                 for name, values in arrays.items())


def read_aligned(array: zarr.Array) -> np.ndarray:
    """The whole Zarr array, read into a 64-byte-aligned buffer (see ``kernels/memory.py``): the
    block tasks then use it as it is instead of copying it every pass."""
    out = empty_aligned(array.shape, array.dtype)
    array.get_basic_selection(Ellipsis, out=NDBuffer.from_numpy_array(out))
    return out


def read_arrays(path: str, node_path: str, what: str, records, shapes: dict, names, *, verify: bool,
                into_aligned: bool = False) -> list[np.ndarray]:
    """The arrays ``names`` of the group ``node_path`` of the store at ``path``, checked against the metadata.

    ``records`` are the group's array records and ``shapes`` (``name -> shape``) what the metadata says the
    arrays are. Each array's shape, dtype and codecs (its ``zarr.json``) are checked before it is read; with
    ``verify``, its chunk file is read through a :class:`ChecksummingStore` (present, and the recorded
    CRC32C). A failure raises ``ValueError`` naming the store, ``what`` (the block, as "block 3 (key
    '000002')"; ``""`` for the store's own arrays) and the array.
    """
    prefix = f"store {path!r} is corrupt: "
    records = {record.name: record for record in records}
    store = LocalStore(path, read_only=True)
    if verify:
        store = ChecksummingStore(store, {chunk_key(node_path, name, len(shapes[name])): record.crc32c
                                          for name, record in records.items() if record.crc32c is not None})
    try:
        node = zarr.open_group(store=store, mode="r", path=node_path)
    except Exception as exc:  # zarr and codec errors of a damaged file come in many types
        raise damaged(prefix + (what or "its root group"), exc) from exc
    return [read_array(node, records[name], shapes[name], prefix + (f"{what}, " if what else "") + f"array {name!r}",
                       into_aligned) for name in names]


def read_array(node, record: ArrayRecord, shape: tuple, where: str, into_aligned: bool) -> np.ndarray:
    """The array ``record.name`` of the Zarr group ``node``, as :func:`read_arrays` says."""
    try:
        array = node[record.name]
        found = (array.shape, dtype_name(array.dtype))
        codecs_found = tuple(array.metadata.codecs)
        if found == (shape, record.dtype) and codecs_found == array_codecs(array.dtype):
            values = read_aligned(array) if into_aligned else array[...]
    except ChunkDamage as exc:
        raise ValueError(f"{where}: {exc}") from None
    except Exception as exc:  # as in read_arrays
        raise damaged(where, exc) from exc
    if found != (shape, record.dtype):
        raise ValueError(f"{where} has shape {found[0]} and dtype {found[1]}; the metadata says {shape} "
                         f"and {record.dtype}")
    if codecs_found != array_codecs(array.dtype):
        raise ValueError(f"{where} has codecs {[c.to_dict() for c in codecs_found]}; distfact writes "
                         f"{[c.to_dict() for c in array_codecs(array.dtype)]}")
    return values


def damaged(where: str, exc: Exception) -> ValueError:
    """The error for a group or an array of a store (``where``) that zarr cannot open or read."""
    if isinstance(exc, (KeyError, FileNotFoundError)):  # its zarr.json is gone (zarr 3.1: NodeNotFoundError)
        return ValueError(f"{where} is missing")
    return ValueError(f"{where} cannot be read ({one_line(exc)})")


def block_place(block) -> tuple[str, str]:
    """A row or column block's group in a store, and how messages name it."""
    kind, folder = ("block", "blocks") if isinstance(block, Block) else ("column block", "columns")
    return f"{folder}/{block.key}", f"{kind} {block.index} (key {block.key!r})"


@dataclass(frozen=True)
class BlockReader:
    """Picklable loader of one block from a store on disk (what a worker runs); every array read is
    checked against the metadata (:func:`read_arrays`), its chunk's CRC32C too when ``verify``."""

    path: str
    layout: str
    shape: tuple[int, int]
    verify: bool = True

    def __call__(self, block: Block):
        shapes = block.array_shapes(self.layout, self.shape[1])
        if self.layout == "dense":
            return read_arrays(self.path, *block_place(block), block.arrays, shapes, ("X",), verify=self.verify,
                               into_aligned=True)[0]
        arrays = read_arrays(self.path, *block_place(block), block.arrays, shapes, ("data", "indices", "indptr"),
                             verify=self.verify)
        return sp.csr_matrix(tuple(arrays), shape=(block.n_rows, self.shape[1]))


@dataclass(frozen=True)
class ColumnBlockReader:
    """Picklable loader of one column block (CSC, all m rows in stored order) from a store on disk,
    checked as :class:`BlockReader` checks a row block."""

    path: str
    shape: tuple[int, int]
    verify: bool = True

    def __call__(self, block: ColumnBlock) -> sp.csc_matrix:
        arrays = read_arrays(self.path, *block_place(block), block.arrays, block.array_shapes(),
                             ("data", "indices", "indptr"), verify=self.verify)
        return sp.csc_matrix(tuple(arrays), shape=(self.shape[0], block.n_cols))


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


class GroupedMatrix:
    """X (m x n, non-negative unless ingested with ``signed=True``) with its rows partitioned into named groups.

    Build one with :func:`distfact.GroupedMatrix.from_arrays` (or the other
    ``distfact.store.from_*`` ingest functions) and reopen a stored one with
    :func:`distfact.open`. Rows are kept in group order; ``row_index()`` maps each
    stored row back to the caller's row number.
    """

    def __init__(self, meta: Metadata, column_sums: np.ndarray, *, path: str | None = None,
                 blocks: list | None = None, block_rows: list | None = None,
                 feature_names: np.ndarray | None = None, column_data: list | None = None, verify: bool = True):
        self.meta = meta
        self.column_sums = column_sums
        self.path = path
        self.verify = verify  # check every array read from the store against its CRC32C
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
    def open(cls, path, *, verify: bool = True) -> "GroupedMatrix":
        """Open a store written by distfact; a missing, damaged or inconsistent store raises ``ValueError``.

        The metadata is checked (:meth:`Metadata.from_json`), every column block must be there, and
        the small arrays are read and checked now: the column sums, the feature names and every row
        block's ``rows`` (8 bytes a row). The blocks of X, by rows and by columns, are checked as
        they are read, by every pass.
        ``verify=False`` leaves out the CRC32C checks (to measure what they cost); shapes and dtypes are
        checked all the same. The command line has no way to turn them off.
        """
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
        for block in meta.column_blocks:  # read only by the methods that need them: at least they must be there
            if not os.path.isfile(os.path.join(path, "columns", block.key, "zarr.json")):
                raise ValueError(f"{where} is corrupt: column block {block.index} (key {block.key!r}) is missing")
        shapes = meta.array_shapes()
        own = dict(zip(shapes, read_arrays(path, "", "", meta.arrays, shapes, shapes, verify=verify)))
        data = cls(meta, own["column_sums"], path=path, feature_names=own.get("feature_names"), verify=verify)
        data.row_index()  # read and checked now, so that a damaged one stops a fit before it starts
        return data

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
        return BlockReader(self.path, self.layout, self.shape, self.verify)

    def column_reader(self):
        """A callable ``column block -> CSC matrix`` (m x its columns, rows in stored order).

        Picklable for stores on disk, like :meth:`reader`. Requires the column blocks.
        """
        if not self.has_column_blocks:
            raise ValueError(f"{self!r} has no column blocks (build them with with_column_blocks())")
        if self.in_memory:
            return lambda block: self._column_data[block.index]
        return ColumnBlockReader(self.path, self.shape, self.verify)

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
        stage = None if stage_path is None else zarr.open_group(store=ChecksummingStore(LocalStore(stage_path)),
                                                                mode="w", zarr_format=3)
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
            arrays = {"data": data, "indices": indices, "indptr": indptr}
            if stage is None:
                column_blocks.append(ColumnBlock(j, f"{j:06d}", start, stop, len(data)))
                matrices.append(sp.csc_matrix((data, indices, indptr), shape=shape))
            else:
                write_arrays(stage.create_group(f"columns/{j:06d}"), **arrays)
                column_blocks.append(ColumnBlock(j, f"{j:06d}", start, stop, len(data),
                                                 array_records(stage.store.written, f"columns/{j:06d}", **arrays)))
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
        return GroupedMatrix.open(self.path, verify=self.verify)

    def load_block(self, index: int):
        """Block ``index`` as a numpy array (dense layout) or a CSR matrix."""
        return self.reader()(self.blocks[index])

    def row_index(self) -> np.ndarray:
        """For each stored row, its row number in the data as it was given to ingest (each block's
        ``rows`` checked as the blocks of X are)."""
        if self.in_memory:
            return np.concatenate(self._block_rows)
        return np.concatenate([read_arrays(self.path, *block_place(b), b.arrays,
                                           b.array_shapes(self.layout, self.shape[1]), ("rows",), verify=self.verify)[0]
                               for b in self.blocks])

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


def block_stats(block) -> dict:
    """A block's statistics for the metadata, in float64: non-zeros, sum of squares, sum and smallest stored value
    (0 when none)."""
    values = block.data if sp.issparse(block) else block
    flat = values.ravel().astype(np.float64, copy=False)
    with np.errstate(over="ignore", invalid="ignore"):  # overflowing data are refused by check_block_values, by name
        return {"nnz": int(block.nnz) if sp.issparse(block) else int(np.count_nonzero(block)),
                "sq_norm": float(np.dot(flat, flat)), "total": float(values.sum(dtype=np.float64)),
                "min_value": float(values.min()) if values.size else 0.0}


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
        self._column_sums = np.zeros(n_cols, dtype=np.float64)
        self._square_sum = 0.0  # of every entry so far, in float64: it must stay representable in ``dtype``
        self._staged: list[dict] = []
        self._root = None
        if self.final_path is not None:
            parent, name = os.path.split(self.final_path)
            os.makedirs(parent, exist_ok=True)
            self.tmp_path = os.path.join(parent, f".{name}.partial-{uuid.uuid4().hex[:8]}")
            self._root = zarr.open_group(store=ChecksummingStore(LocalStore(self.tmp_path)), mode="w", zarr_format=3)

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
        stats = block_stats(block)
        check_block_values(block, group_name, source_rows, self.where, self.signed,
                           square_sum=self._square_sum + stats["sq_norm"])
        self._square_sum += stats["sq_norm"]
        self._column_sums += np.asarray(block.sum(axis=0, dtype=np.float64)).ravel()
        key = f"{len(self._staged):06d}"
        entry = {"key": key, "group": group_name, "rows": block.shape[0], "stats": stats, "arrays": ()}
        source_rows = np.ascontiguousarray(source_rows, dtype=np.int64)
        if self._root is None:  # dense blocks aligned once here rather than copied by every pass
            entry["data"], entry["source_rows"] = aligned(block), source_rows
        else:
            arrays = ({"data": block.data, "indices": block.indices, "indptr": block.indptr} if sp.issparse(block)
                      else {"X": block})
            arrays["rows"] = source_rows
            write_arrays(self._root.create_group(f"blocks/{key}"), **arrays)
            entry["arrays"] = array_records(self._root.store.written, f"blocks/{key}", **arrays)
        self._staged.append(entry)

    def commit(self, group_order: list[str], feature_names=None, source: dict | None = None) -> GroupedMatrix:
        """Order the blocks by group, write metadata last, move the store into place."""
        staged_groups = {e["group"] for e in self._staged}
        for name in group_order:
            if name not in staged_groups:
                raise ValueError(f"group {name!r} is empty: it has no rows")
        unknown = staged_groups - set(group_order)
        if unknown:
            raise ValueError(f"rows carry groups not in the group list: {sorted(unknown)}")
        own = {"column_sums": self._column_sums}
        if feature_names is not None:
            own["feature_names"] = np.asarray([str(f) for f in feature_names])
            if own["feature_names"].shape != (self.n_cols,):
                raise ValueError(f"feature_names has {own['feature_names'].shape[0]} names, "
                                 f"X has {self.n_cols} columns")
        order = {name: i for i, name in enumerate(group_order)}
        staged = sorted(self._staged, key=lambda e: order[e["group"]])  # stable: arrival order within a group
        blocks, row = [], 0
        for entry in staged:
            blocks.append(Block(len(blocks), entry["key"], order[entry["group"]], row, row + entry["rows"],
                                **entry["stats"], arrays=entry["arrays"]))
            row += entry["rows"]
        groups = [group_stats(name, [b for b in blocks if b.group == g]) for g, name in enumerate(group_order)]
        meta = Metadata((row, self.n_cols), str(self.dtype), self.layout, groups, blocks,
                        has_feature_names=feature_names is not None, source=source or {}, signed=self.signed)
        meta.check(self.where)
        if self._root is None:
            by_key = {e["key"]: e for e in staged}
            return GroupedMatrix(meta, self._column_sums, blocks=[by_key[b.key]["data"] for b in blocks],
                                 block_rows=[by_key[b.key]["source_rows"] for b in blocks],
                                 feature_names=own.get("feature_names"))
        try:
            write_arrays(self._root, **own)
            meta.arrays = array_records(self._root.store.written, "", **own)
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
