"""The on-disk format of a grouped matrix (documented in ``docs/format.md``).

A store is a Zarr v3 group whose attribute ``"distfact"`` holds the JSON metadata
below; the attribute is written last, so a store without it is not a store.
Each row block is a Zarr sub-group ``blocks/<key>`` holding either one dense array
``X`` (rows x n) or the three CSR arrays ``data``, ``indices``, ``indptr``. A store may
also hold a copy of X by column blocks, each the sub-group ``columns/<key>`` holding the
three CSC arrays of a range of columns (optional: version-1 readers that ignore
``"column_blocks"`` still read X correctly).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

FORMAT_NAME = "distfact.grouped-matrix"
FORMAT_VERSION = 1
SIGNED_FORMAT_VERSION = 2  # a signed store: readers that predate the flag must refuse it, not give NMF negative data
READ_VERSIONS = (FORMAT_VERSION, SIGNED_FORMAT_VERSION)
LAYOUTS = ("dense", "csr")


@dataclass(frozen=True)
class Block:
    """One row block: rows ``[row_start, row_stop)`` of the stored order, all in one group."""

    index: int
    key: str
    group: int
    row_start: int
    row_stop: int
    nnz: int

    @property
    def n_rows(self) -> int:
        return self.row_stop - self.row_start


@dataclass(frozen=True)
class ColumnBlock:
    """One column block: columns ``[col_start, col_stop)`` of X over all rows, stored as CSC."""

    index: int
    key: str
    col_start: int
    col_stop: int
    nnz: int

    @property
    def n_cols(self) -> int:
        return self.col_stop - self.col_start


@dataclass
class GroupStats:
    """Per-group constants gathered while ingesting (one streaming pass)."""

    name: str
    row_start: int
    row_stop: int
    sq_norm: float  # ||X_l||_F^2
    total: float  # sum of X_l's entries
    nnz: int


@dataclass
class Metadata:
    shape: tuple[int, int]
    dtype: str
    layout: str
    groups: list[GroupStats]
    blocks: list[Block]
    has_feature_names: bool = False
    source: dict = field(default_factory=dict)
    column_blocks: list[ColumnBlock] = field(default_factory=list)  # the optional CSC copy
    signed: bool = False  # True: negative entries were allowed at ingest (multigroup SVD); NMF methods refuse it

    def to_json(self) -> dict:
        return {
            "format": FORMAT_NAME,
            "format_version": SIGNED_FORMAT_VERSION if self.signed else FORMAT_VERSION,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "layout": self.layout,
            "groups": [asdict(g) for g in self.groups],
            "blocks": [asdict(b) for b in self.blocks],
            "has_feature_names": self.has_feature_names,
            "source": self.source,
            "column_blocks": [asdict(c) for c in self.column_blocks],
            "signed": self.signed,
        }

    @classmethod
    def from_json(cls, doc: dict, where: str) -> "Metadata":
        if doc.get("format") != FORMAT_NAME:
            raise ValueError(f"{where}: not a distfact store (format {doc.get('format')!r})")
        version = doc.get("format_version")
        if version not in READ_VERSIONS:
            raise ValueError(
                f"{where}: store format version {version!r} is not supported "
                f"(this distfact reads versions {', '.join(map(str, READ_VERSIONS))})"
            )
        try:
            meta = cls(
                shape=(int(doc["shape"][0]), int(doc["shape"][1])),
                dtype=str(np.dtype(doc["dtype"])),
                layout=doc["layout"],
                groups=[GroupStats(**g) for g in doc["groups"]],
                blocks=[Block(**b) for b in doc["blocks"]],
                has_feature_names=bool(doc.get("has_feature_names", False)),
                source=dict(doc.get("source", {})),
                column_blocks=[ColumnBlock(**c) for c in doc.get("column_blocks", [])],  # older stores have none
                signed=version == SIGNED_FORMAT_VERSION,
            )
        except (KeyError, TypeError, IndexError) as exc:
            raise ValueError(f"{where}: corrupt store metadata ({exc!r})") from exc
        meta.check(where)
        return meta

    def check(self, where: str) -> None:
        """Internal consistency: blocks tile the rows group by group, in order (column blocks the columns)."""
        if self.layout not in LAYOUTS:
            raise ValueError(f"{where}: unknown layout {self.layout!r}")
        row = 0
        for g_idx, g in enumerate(self.groups):
            if g.row_start != row or g.row_stop <= g.row_start:
                raise ValueError(f"{where}: corrupt metadata: group {g.name!r} rows {g.row_start}:{g.row_stop}")
            row = g.row_stop
        if row != self.shape[0]:
            raise ValueError(f"{where}: corrupt metadata: groups cover {row} rows, shape says {self.shape[0]}")
        row = 0
        for i, b in enumerate(self.blocks):
            g = self.groups[b.group] if 0 <= b.group < len(self.groups) else None
            if (b.index != i or b.row_start != row or g is None
                    or not g.row_start <= b.row_start < b.row_stop <= g.row_stop):
                raise ValueError(f"{where}: corrupt metadata: block {i} (rows {b.row_start}:{b.row_stop})")
            row = b.row_stop
        if row != self.shape[0]:
            raise ValueError(f"{where}: corrupt metadata: blocks cover {row} rows, shape says {self.shape[0]}")
        if self.column_blocks:
            self._check_column_blocks(where)

    def _check_column_blocks(self, where: str) -> None:
        """Column blocks tile ``[0, n)`` in order and hold every non-zero of the groups."""
        n, col, nnz = self.shape[1], 0, 0
        for i, c in enumerate(self.column_blocks):
            last = i == len(self.column_blocks) - 1
            if (c.index != i or c.col_start != col or not c.col_start < c.col_stop <= n or c.nnz < 0
                    or (last and c.col_stop != n)):
                raise ValueError(f"{where}: corrupt metadata: column block {i} (columns {c.col_start}:{c.col_stop}); "
                                 f"column blocks must tile columns 0:{n} in order")
            col, nnz = c.col_stop, nnz + c.nnz
        total = sum(g.nnz for g in self.groups)
        if nnz != total:
            raise ValueError(f"{where}: corrupt metadata: column blocks hold {nnz} non-zeros, groups hold {total}")
