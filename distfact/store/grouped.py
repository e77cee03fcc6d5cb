"""``GroupedMatrix``: a non-negative matrix whose rows are partitioned into named groups.

It lives either on disk (a Zarr v3 store, see ``docs/format.md``) or in memory (the
fast path for data that fit); both expose the same row blocks, which never straddle
a group, and the per-group constants gathered at ingest (||X_l||_F^2, sums, nnz).
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import zarr

from .format import Block, GroupStats, Metadata
from .validate import check_block_values

DEFAULT_BLOCK_BYTES = 128 * 2**20


@dataclass(frozen=True)
class BlockReader:
    """Picklable loader of one block from a store on disk (what a worker runs)."""

    path: str
    layout: str
    shape: tuple[int, int]

    def __call__(self, block: Block):
        try:
            node = zarr.open_group(self.path, mode="r", path=f"blocks/{block.key}")
            if self.layout == "dense":
                return node["X"][...]
            return sp.csr_matrix(
                (node["data"][...], node["indices"][...], node["indptr"][...]),
                shape=(block.n_rows, self.shape[1]),
            )
        except Exception as exc:  # zarr/codec errors of a damaged chunk come in many types
            raise ValueError(f"store {self.path!r} is corrupt: block {block.index} (key {block.key!r}) "
                             f"cannot be read: {exc}") from exc


class GroupedMatrix:
    """X (m x n, non-negative) with its rows partitioned into named groups.

    Build one with :func:`distfact.GroupedMatrix.from_arrays` (or the other
    ``distfact.store.from_*`` ingest functions) and reopen a stored one with
    :func:`distfact.open`. Rows are kept in group order; ``row_index()`` maps each
    stored row back to the caller's row number.
    """

    def __init__(self, meta: Metadata, column_sums: np.ndarray, *, path: str | None = None,
                 blocks: list | None = None, block_rows: list | None = None,
                 feature_names: np.ndarray | None = None):
        self.meta = meta
        self.column_sums = column_sums
        self.path = path
        self._blocks = blocks
        self._block_rows = block_rows
        self.feature_names = feature_names

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
        present = set(root["blocks"].group_keys()) if "blocks" in root else set()
        for block in meta.blocks:
            if block.key not in present:
                raise ValueError(f"{where} is corrupt: block {block.index} (key {block.key!r}) is missing")
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
                 where: str = "X"):
        self.n_cols = n_cols
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
        check_block_values(block, group_name, source_rows, self.where)
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
        if self._root is None:
            entry["data"], entry["source_rows"] = block, source_rows
        else:
            node = self._root.create_group(f"blocks/{key}")
            if sp.issparse(block):
                for name in ("data", "indices", "indptr"):
                    arr = getattr(block, name)
                    node.create_array(name, shape=arr.shape, dtype=arr.dtype, chunks=(max(arr.shape[0], 1),))[...] = arr
            else:
                node.create_array("X", shape=block.shape, dtype=block.dtype, chunks=block.shape)[...] = block
            node.create_array("rows", shape=source_rows.shape, dtype=np.int64, chunks=(max(len(source_rows), 1),))[...] = source_rows
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
                        has_feature_names=feature_names is not None, source=source or {})
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


def open_store(path) -> GroupedMatrix:
    """Open the grouped matrix stored at ``path`` (``distfact.open``)."""
    return GroupedMatrix.open(Path(path))
