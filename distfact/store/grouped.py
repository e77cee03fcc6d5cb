"""``GroupedMatrix``: a non-negative matrix whose rows are partitioned into named groups.

It lives either on disk (a Zarr v3 store, see ``docs/format.md``) or in memory (the
fast path for data that fit); both expose the same row blocks, which never straddle
a group, and the per-group constants gathered at ingest (||X_l||_F^2, sums, nnz).
Methods that sweep over columns can add a CSC copy of X by column blocks
(``with_column_blocks``), built out of core for stores on disk. ``GroupedMatrix.append`` (rows added as the
store's next version) is defined in ``append.py``: it writes as an ingest does, with the ingest's writer, which
opens the stores it writes with this class.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from ..lazy import scipy_sparse as sp  # not imported by ``distfact info``
from .describe import read_metadata, summary
from .format import Block, ColumnBlock, Metadata
from .reading import BlockReader, ColumnBlockReader, MaskReader, block_place, read_arrays
from .writing import build_column_blocks, column_ranges, commit_column_blocks

logger = logging.getLogger("distfact")


class GroupedMatrix:
    """X (m x n, non-negative unless ingested with ``signed=True``) with its rows partitioned into named groups.

    Build one with :func:`distfact.from_arrays` (or the other ``distfact.store.from_*``
    ingest functions) and reopen a stored one with
    :func:`distfact.open`. Rows are kept in group order; ``row_index()`` maps each
    stored row back to the caller's row number.
    """

    def __init__(self, meta: Metadata, column_sums: np.ndarray, *, path: str | None = None,
                 blocks: list | None = None, block_rows: list | None = None,
                 feature_names: np.ndarray | None = None, column_data: list | None = None, verify: bool = True,
                 masks: list | None = None, group_column_sums: np.ndarray | None = None,
                 idf: np.ndarray | None = None):
        self.meta = meta
        self.column_sums = column_sums
        self.group_column_sums = group_column_sums  # (groups x n), None in a store written before appends
        self.idf = idf  # a tf-idf corpus's idf weights (what an append weighs its documents with)
        self.path = path
        self.verify = verify  # check every array read from the store against its CRC32C
        self._blocks = blocks
        self._block_rows = block_rows
        self.feature_names = feature_names
        self._column_data = column_data  # in memory: the CSC column blocks, in order
        self._masks = masks  # in memory, with a mask: each block's {form: P}, in order
        self._per_group = None  # (meta.groups, {name: read-only array per group}): see _group_array

    # -- construction -------------------------------------------------------
    @classmethod
    def open(cls, path, *, verify: bool = True, version_metadata: dict | None = None) -> "GroupedMatrix":
        """Open a store written by distfact; a missing, damaged or inconsistent store raises ``ValueError``.

        The metadata is checked (:meth:`Metadata.from_json`), every node it lists (blocks, column blocks, masks)
        must be there (``store/describe.py``), and the small arrays are read and checked now: the column sums, the
        feature names and every row block's ``rows`` (8 bytes a row). The blocks of X, by rows and by columns, are
        checked as they are read: by every pass, or once by a fit that holds the store in memory
        (``engine/executor/inprocess.py: RESIDENT_STORE_BYTES``).
        ``verify=False`` leaves out the CRC32C checks (to measure what they cost); shapes and dtypes are
        checked all the same. The command line has no way to turn them off.
        ``version_metadata``: the metadata document (``meta.to_json()``) of an earlier version of the store, to
        open that version rather than the current one (an append leaves what an earlier version references in
        place: a pipeline run reads the version it ingested, whatever was appended since). Checked as the
        store's own; its arrays are checked against their CRC32Cs as they are read.
        """
        path, where, meta = read_metadata(path, version_metadata)
        shapes = meta.array_shapes()
        own = dict(zip(shapes, read_arrays(path, meta.node, "", meta.arrays, shapes, shapes, verify=verify)))
        data = cls(meta, own["column_sums"], path=path, feature_names=own.get("feature_names"), verify=verify,
                   group_column_sums=own.get("group_column_sums"), idf=own.get("idf"))
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
    def mask_kind(self) -> str | None:
        """The kind of the mask stored beside X (``"nan"``: X's NaN entries at ingest; ``"weights"``: a weight
        array given at ingest), or None: every entry is observed."""
        return self.meta.mask

    def mask_identity(self) -> str | None:
        """What identifies the stored mask, for a checkpoint's configuration: SHA-256 of its kind and every
        block's mask record (form, entries, observed total, the CRC32C of its arrays); None without a mask."""
        if self.meta.mask is None:
            return None
        records = [{**asdict(b.mask), "arrays": [asdict(r) for r in b.mask.arrays]} for b in self.blocks]
        text = json.dumps({"kind": self.meta.mask, "blocks": records}, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

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
        """||X_l||_F^2 per group (read-only)."""
        return self._group_array("sq_norm")

    @property
    def group_totals(self) -> np.ndarray:
        """The sum of X_l's entries per group (read-only)."""
        return self._group_array("total")

    def _group_array(self, name: str) -> np.ndarray:
        """The groups' field ``name`` as an array, made once for the groups of the metadata (small fits ask for the
        groups' constants every iteration, issue 19); read-only, since every caller shares it."""
        groups, cached = self.meta.groups, getattr(self, "_per_group", None)  # (absent from one pickled before it)
        if cached is None or cached[0] is not groups:
            cached = self._per_group = (groups, {})
        arrays = cached[1]
        array = arrays.get(name)
        if array is None:
            array = arrays[name] = np.array([getattr(g, name) for g in groups])
            array.flags.writeable = False
        return array

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
        """A JSON-able summary (what ``distfact info`` prints, from the metadata alone: ``store/describe.py``)."""
        return summary(self.meta, self.path)

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

    def mask_reader(self):
        """A callable ``block -> {form: P}``, the block's stored mask (``store/masks.py``), that a worker can run
        (picklable for stores on disk, like :meth:`reader`). Requires a store with a mask."""
        if self.meta.mask is None:
            raise ValueError(f"{self!r} has no mask")
        if self.in_memory:
            return lambda block: self._masks[block.index]
        return MaskReader(self.path, self.shape[1], self.verify)

    def without_mask(self) -> "GroupedMatrix":
        """X alone, without the mask stored beside it: the same blocks, read where they are (no copy), for a
        caller that gives each fit a mask of its own made from the stored one (``select_rank``: the stored
        weights with a fold's held-out entries at 0). ``self`` when there is no mask."""
        if self.meta.mask is None:
            return self
        meta = replace(self.meta, mask=None, blocks=[replace(b, mask=None) for b in self.blocks])
        return GroupedMatrix(meta, self.column_sums, path=self.path, blocks=self._blocks,
                             block_rows=self._block_rows, feature_names=self.feature_names,
                             column_data=self._column_data, verify=self.verify)

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
            column_blocks, matrices = build_column_blocks(self, ranges, None)
            return GroupedMatrix(replace(self.meta, column_blocks=column_blocks), self.column_sums,
                                 blocks=self._blocks, block_rows=self._block_rows,
                                 feature_names=self.feature_names, column_data=matrices, masks=self._masks,
                                 group_column_sums=self.group_column_sums, idf=self.idf)
        commit_column_blocks(self, ranges)
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


def open_store(path) -> GroupedMatrix:
    """Open the grouped matrix stored at ``path`` (``distfact.open``)."""
    return GroupedMatrix.open(Path(path))
