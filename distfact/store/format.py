"""The on-disk format of a grouped matrix (documented in ``docs/format.md``).

A store is a Zarr v3 group whose attribute ``"distfact"`` holds the JSON metadata
below; the attribute is written last, so a store without it is not a store.
Each row block is a Zarr sub-group ``blocks/<key>`` holding either one dense array
``X`` (rows x n) or the three CSR arrays ``data``, ``indices``, ``indptr``, plus ``rows``.
A store may also hold a copy of X by column blocks, each the sub-group ``columns/<key>``
holding the three CSC arrays of a range of columns, and a mask (which entries of X are observed): per row
block, the sub-group ``blocks/<key>/mask`` holding the CSR arrays of the block's mask in one of two sparse
forms (format version 4; a store without a mask is written as version 3, as before).

The metadata records, for every stored array, its dtype and the CRC32C of its chunk file, and
for every row block its non-zeros, sum of squares, sum and smallest value; it carries a
SHA-256 checksum of itself. :meth:`Metadata.from_json` checks every field's type, the
document's internal consistency and the checksum; readers (``reading.py``) check each
array's shape, dtype and codecs, and its chunk's CRC32C, as they read it.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from dataclasses import asdict, dataclass, field, fields, replace
from typing import get_type_hints


FORMAT_NAME = "distfact.grouped-matrix"
FORMAT_VERSION = 3
MASKED_FORMAT_VERSION = 4  # a store with a mask: an older distfact refuses it rather than fit it unmasked
READ_VERSIONS = (FORMAT_VERSION, MASKED_FORMAT_VERSION)
UNCHECKSUMMED_VERSIONS = (1, 2)  # written by distfact before checksums (2: a signed store)
LAYOUTS = ("dense", "csr")
DTYPES = ("float32", "float64")
INDEX_DTYPES = ("int32", "int64")
STRING_DTYPE = "str"  # how a record names the dtype of a string array (feature_names)
MASK_KINDS = ("nan", "weights")  # X's NaN entries at ingest (weights 0 or 1), or a weight array given at ingest
MASK_FORM_NAMES = ("complement", "observed")  # CSR of 1 - weight where weight != 1, or CSR of the weights
MASK_DTYPE = "float64"  # a mask's data (its weights, or 1 - weight)
# The store's own arrays that stores written before appends (issue 21) lack: the per-group column sums and, for a
# tf-idf corpus, the idf weights. A store without ``group_column_sums`` cannot be appended to.
OPTIONAL_ARRAYS = ("group_column_sums", "idf")
# Fields written only when not 0 (``version``, of the store and of its blocks) or not empty (``ingests``), so that
# the metadata, and its checksum, of a store never appended to are what they were before appends existed.
DEFAULT_FIELDS = {"version": 0}
# Left out of the metadata checksum: the checksum itself, and the column blocks, which are added to a
# committed store (so that a store's checksum identifies X by rows whether or not it has them). Every
# column block record is checked on its own: tiling and non-zeros at open, shapes and CRC32Cs on read.
UNCHECKSUMMED_FIELDS = ("checksum", "column_blocks")


@dataclass(frozen=True)
class ArrayRecord:
    """What one stored array must read back as: its dtype, and the CRC32C of its chunk file's bytes as stored
    (None for an array without elements, which has no chunk file)."""

    name: str
    dtype: str
    crc32c: int | None


@dataclass(frozen=True)
class BlockMask:
    """A row block's mask: ``form`` (one of ``MASK_FORM_NAMES``), the CSR of ``nnz`` entries of that form, and
    ``observed_total``, the sum of the block's X over its observed entries as a masked fit computes it
    (``store/masks.py: block_observed_total``), recorded so that a fit need not read X to scale its start."""

    form: str
    nnz: int
    observed_total: float
    arrays: tuple[ArrayRecord, ...] = ()

    def array_shapes(self, n_rows: int) -> dict[str, tuple]:
        """``name -> shape`` of the mask's stored CSR arrays."""
        return {"data": (self.nnz,), "indices": (self.nnz,), "indptr": (n_rows + 1,)}


@dataclass(frozen=True)
class Block:
    """One row block: rows ``[row_start, row_stop)`` of the stored order, all in one group.

    ``nnz``, ``sq_norm`` (sum of squares), ``total`` (sum) and ``min_value`` (smallest stored
    value, 0 when none) are float64 statistics taken at ingest; ``arrays`` (empty in memory)
    the records of the block's stored arrays.
    """

    index: int
    key: str
    group: int
    row_start: int
    row_stop: int
    nnz: int
    sq_norm: float
    total: float
    min_value: float
    arrays: tuple[ArrayRecord, ...] = ()
    version: int = 0  # the store version that added the block: 0 at ingest, k for the k-th append
    mask: BlockMask | None = None  # in a store with a mask: the block's (every block has one), under its node

    @property
    def node(self) -> str:
        """The block's Zarr group in the store."""
        return f"{version_node(self.version)}blocks/{self.key}"

    @property
    def n_rows(self) -> int:
        return self.row_stop - self.row_start

    def array_shapes(self, layout: str, n_cols: int) -> dict[str, tuple]:
        """``name -> shape`` of the block's stored arrays."""
        rows = {"rows": (self.n_rows,)}
        if layout == "dense":
            return {"X": (self.n_rows, n_cols), **rows}
        return {"data": (self.nnz,), "indices": (self.nnz,), "indptr": (self.n_rows + 1,), **rows}


@dataclass(frozen=True)
class ColumnBlock:
    """One column block: columns ``[col_start, col_stop)`` of X over all rows, stored as CSC."""

    index: int
    key: str
    col_start: int
    col_stop: int
    nnz: int
    arrays: tuple[ArrayRecord, ...] = ()
    version: int = 0  # the store version they were built for (an append leaves a store without column blocks)

    @property
    def node(self) -> str:
        """The column block's Zarr group in the store."""
        return f"{version_node(self.version)}columns/{self.key}"

    @property
    def n_cols(self) -> int:
        return self.col_stop - self.col_start

    def array_shapes(self) -> dict[str, tuple]:
        """``name -> shape`` of the block's stored CSC arrays."""
        return {"data": (self.nnz,), "indices": (self.nnz,), "indptr": (self.n_cols + 1,)}


def version_node(version: int) -> str:
    """The folder (``""`` or ``"versions/NNNNNN/"``) of what store version ``version`` added: the blocks and own arrays
    of the first ingest are at the root, those of the k-th append under ``versions/<k>/``."""
    return f"versions/{version:06d}/" if version else ""


def allowed_dtypes(name: str, dtype: str) -> tuple[str, ...]:
    """The dtypes a stored array ``name`` may have in a store of ``dtype``."""
    return {"X": (dtype,), "data": (dtype,), "rows": ("int64",), "column_sums": ("float64",),
            "group_column_sums": ("float64",), "idf": ("float64",),
            "feature_names": (STRING_DTYPE,)}.get(name, INDEX_DTYPES)


@dataclass
class GroupStats:
    """Per-group constants, functions of the group's rows alone (not of where they are cut into blocks): ``sq_norm``
    and ``total`` are running sums of its entries in row order (``kernels/running_sums.py``), ``nnz`` its blocks'
    non-zeros added up."""

    name: str
    row_start: int
    row_stop: int
    sq_norm: float  # ||X_l||_F^2
    total: float  # sum of X_l's entries
    nnz: int


def blocks_group_stats(name: str, blocks: list[Block]) -> GroupStats:
    """A group's statistics as its blocks' add up (given in block order): correctly rounded sums (``math.fsum``)
    of their ``sq_norm`` and ``total``, and their ``nnz``; what :meth:`Metadata.check` compares a group's record
    with (see :func:`group_sum_tolerances`)."""
    return GroupStats(name, blocks[0].row_start, blocks[-1].row_stop, math.fsum(b.sq_norm for b in blocks),
                      math.fsum(b.total for b in blocks), sum(b.nnz for b in blocks))


def group_sum_tolerances(from_blocks: GroupStats) -> dict[str, float]:
    """How far a group's recorded ``sq_norm`` and ``total`` may lie from the ``fsum`` of its blocks' (``from_blocks``,
    :func:`blocks_group_stats`): both approximate the exact sum of the same N = ``nnz`` non-zero terms (zeros add
    nothing exactly), the record in one order (row-sequential), the blocks' in others (a BLAS dot product, numpy's
    pairwise sum), each within gamma_N sum |term| (gamma_N ~ N u, u = 2^-53, for any order of additions; the product
    x * x adds one rounding), and ``fsum`` adds half an ulp. So the gap is at most about 2 N u sum |term|; allowed:
    4 (N + 1) eps sum |term| (eps = 2u), with sum |x^2| = the blocks' ``sq_norm`` and sum |x| <= sqrt(N sq_norm)
    (Cauchy-Schwarz; a signed store's sum may cancel), plus (N + 1) times the smallest subnormal for the squares
    that underflow."""
    n = from_blocks.nnz
    bound, underflow = 4.0 * (n + 1) * sys.float_info.epsilon, (n + 1) * math.ulp(0.0)
    return {"sq_norm": bound * from_blocks.sq_norm + underflow,
            "total": bound * math.sqrt(n * from_blocks.sq_norm) + underflow}


def metadata_checksum(doc: dict) -> str:
    """SHA-256 (hex) of the canonical JSON (sorted keys, no spaces) of the document's checksummed fields."""
    content = {key: value for key, value in doc.items() if key not in UNCHECKSUMMED_FIELDS}
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


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
    arrays: tuple[ArrayRecord, ...] = ()  # column_sums, group_column_sums, feature_names, idf (empty in memory)
    mask: str | None = None  # the kind of the store's mask (one of MASK_KINDS), None: every entry observed
    version: int = 0  # 0 at ingest, +1 per append; the own arrays are under version_node(version)
    ingests: list[dict] = field(default_factory=list)  # one record per version: rows added, source fingerprints

    def array_shapes(self, names=None) -> dict[str, tuple]:
        """``name -> shape`` of the store's own arrays: those it has (``names``: those of its records), of those
        it may have."""
        n = self.shape[1]
        shapes = {"column_sums": (n,), "group_column_sums": (len(self.groups), n),
                  **({"feature_names": (n,)} if self.has_feature_names else {}), "idf": (n,)}
        names = {r.name for r in self.arrays} if names is None else set(names)
        return {name: shape for name, shape in shapes.items() if name in names or name not in OPTIONAL_ARRAYS}

    @property
    def node(self) -> str:
        """The Zarr group holding this version's own arrays (``""``: the root)."""
        return version_node(self.version).rstrip("/")

    def checksum(self) -> str:
        """The metadata checksum (what identifies the data: every field but the column blocks)."""
        return self.to_json()["checksum"]

    def to_json(self) -> dict:
        """The metadata document; a store without a mask has exactly the fields (and checksum) it had before
        masks existed, a store with one the field ``mask`` and each block's ``mask`` record too; ``version`` and
        ``ingests`` (of the store, ``version`` of its blocks) are written only when not 0 / not empty."""
        doc = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION if self.mask is None else MASKED_FORMAT_VERSION,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "layout": self.layout,
            "signed": self.signed,
            "groups": [asdict(g) for g in self.groups],
            "blocks": [{**_scalars(b), "arrays": _records_json(b.arrays), **_mask_json(b.mask)} for b in self.blocks],
            "has_feature_names": self.has_feature_names,
            "arrays": _records_json(self.arrays),
            "source": self.source,
            "column_blocks": [{**_scalars(c), "arrays": _records_json(c.arrays)} for c in self.column_blocks],
            **({"version": self.version} if self.version else {}),
            **({"ingests": self.ingests} if self.ingests else {}),
        }
        if self.mask is not None:
            doc["mask"] = {"kind": self.mask}
        return {**doc, "checksum": metadata_checksum(doc)}

    @classmethod
    def from_json(cls, doc, where: str) -> "Metadata":
        """The metadata of the store ``where`` (a description, for messages) from its JSON document.

        Checked in this order, so that an edit gets the most specific message that applies:
        every field's presence and type, the document's internal consistency (:meth:`check`),
        then its checksum, which catches any other change."""
        top = _Fields(doc, where, "")
        if top.doc.get("format") != FORMAT_NAME:
            raise ValueError(f"{where}: not a distfact store (format {top.doc.get('format')!r})")
        version = top.doc.get("format_version")
        if version in UNCHECKSUMMED_VERSIONS:
            raise ValueError(f"{where} was written by an older distfact (format version {version}), without the "
                             "checksums this version verifies its data with: ingest it again")
        if version not in READ_VERSIONS:
            raise ValueError(f"{where}: store format version {version!r} is not supported "
                             f"(this distfact reads version {', '.join(map(str, READ_VERSIONS))})")
        shape = top.get("shape", "list")
        if len(shape) != 2 or not all(_KINDS["count"][0](s) for s in shape):
            raise top.error("shape", f"must be two non-negative integers [m, n], not {_short(shape)}")
        dtype = top.get("dtype", "text")
        if dtype not in DTYPES:
            raise top.error("dtype", f"must be one of {', '.join(DTYPES)}, not {_short(dtype)}")
        layout = top.get("layout", "text")
        if layout not in LAYOUTS:
            raise top.error("layout", f"must be one of {', '.join(LAYOUTS)}, not {_short(layout)}")
        groups = [GroupStats(**_Fields(g, where, f"group {i}").read(GroupStats))
                  for i, g in enumerate(top.get("groups", "list"))]
        mask = _mask_kind(top, version)
        blocks = []
        for i, item in enumerate(top.get("blocks", "list")):
            entry = _Fields(item, where, _place("block", i, item))
            block = Block(**entry.read(Block))
            blocks.append(replace(block, arrays=entry.records(block.array_shapes(layout, shape[1]), dtype),
                                  mask=entry.block_mask(block, mask)))
        column_blocks = []
        for i, item in enumerate(top.get("column_blocks", "list")):
            entry = _Fields(item, where, _place("column block", i, item))
            block = ColumnBlock(**entry.read(ColumnBlock))
            column_blocks.append(replace(block, arrays=entry.records(block.array_shapes(), dtype)))
        meta = cls(shape=(shape[0], shape[1]), dtype=dtype, layout=layout, groups=groups, blocks=blocks,
                   has_feature_names=top.get("has_feature_names", "flag"), source=top.get("source", "object"),
                   column_blocks=column_blocks, signed=top.get("signed", "flag"), mask=mask,
                   version=top.get("version", "count", optional=True), ingests=top.get("ingests", "list", optional=True))
        for i, item in enumerate(meta.ingests):
            _Fields(item, where, f"ingest {i}").get("version", "count")
        meta.arrays = top.records(meta.array_shapes(OPTIONAL_ARRAYS), dtype)
        meta.check(where)
        if top.get("checksum", "text") != metadata_checksum(doc):
            raise ValueError(f"{where}: corrupt metadata: its checksum does not match its content "
                             "(the document was edited or damaged)")
        return meta

    def check(self, where: str) -> None:
        """Internal consistency: blocks tile the rows group by group, in order (column blocks the columns);
        statistics are finite, non-negative where they must be, and the groups' are the sums of their blocks' (the
        non-zeros exactly, the squared norm and sum to within rounding: :func:`group_sum_tolerances`)."""
        if self.layout not in LAYOUTS:
            raise ValueError(f"{where}: unknown layout {self.layout!r}")
        row = 0
        for g_idx, g in enumerate(self.groups):
            if g.row_start != row or g.row_stop <= g.row_start:
                raise ValueError(f"{where}: corrupt metadata: group {g.name!r} rows {g.row_start}:{g.row_stop}")
            row = g.row_stop
        if row != self.shape[0]:
            raise ValueError(f"{where}: corrupt metadata: field 'shape': {self.shape[0]} rows, the groups cover {row}")
        row = 0
        for i, b in enumerate(self.blocks):
            g = self.groups[b.group] if 0 <= b.group < len(self.groups) else None
            if (b.index != i or b.row_start != row or g is None
                    or not g.row_start <= b.row_start < b.row_stop <= g.row_stop):
                raise ValueError(f"{where}: corrupt metadata: block {i} (rows {b.row_start}:{b.row_stop})")
            if not b.nnz <= b.n_rows * self.shape[1]:
                raise ValueError(f"{where}: corrupt metadata: block {i} (key {b.key!r}), field 'nnz': {b.nnz} "
                                 f"non-zeros in {b.n_rows} x {self.shape[1]} entries")
            self._check_block_mask(b, where)
            self._check_stats(b, f"block {i} (key {b.key!r})", where)
            if b.version > self.version:
                raise ValueError(f"{where}: corrupt metadata: block {i} (key {b.key!r}), field 'version': {b.version}, "
                                 f"but the store is at version {self.version}")
            row = b.row_stop
        if row != self.shape[0]:
            raise ValueError(f"{where}: corrupt metadata: field 'shape': {self.shape[0]} rows, the blocks cover {row}")
        for g_idx, g in enumerate(self.groups):
            self._check_stats(g, f"group {g_idx} ({g.name!r})", where)
            expected = blocks_group_stats(g.name, [b for b in self.blocks if b.group == g_idx])
            tolerances = {"nnz": 0, **group_sum_tolerances(expected)}
            for name, tolerance in tolerances.items():
                if not abs(getattr(g, name) - getattr(expected, name)) <= tolerance:
                    raise ValueError(f"{where}: corrupt metadata: group {g_idx} ({g.name!r}), field {name!r}: "
                                     f"{getattr(g, name)!r}, but its blocks' add up to {getattr(expected, name)!r}"
                                     + (f" (to within {tolerance:.3g}, rounding)" if tolerance else ""))
        if self.column_blocks:
            self._check_column_blocks(where)

    def _check_block_mask(self, b: Block, where: str) -> None:
        """A store with a mask has one per block, of a known form, within the block, with a finite observed total
        (non-negative unless signed); a store without a mask has none."""
        place = f"block {b.index} (key {b.key!r})"
        if (b.mask is None) != (self.mask is None):
            raise ValueError(f"{where}: corrupt metadata: {place} " + (
                "has no field 'mask', but the store has a mask" if b.mask is None
                else "has a mask, but the store has none"))
        if b.mask is None:
            return
        if b.mask.form not in MASK_FORM_NAMES:
            raise ValueError(f"{where}: corrupt metadata: {place}, mask, field 'form': must be one of "
                             f"{', '.join(MASK_FORM_NAMES)}, not {_short(b.mask.form)}")
        if not b.mask.nnz <= b.n_rows * self.shape[1]:
            raise ValueError(f"{where}: corrupt metadata: {place}, mask, field 'nnz': {b.mask.nnz} entries in "
                             f"{b.n_rows} x {self.shape[1]}")
        if b.mask.observed_total < 0 and not self.signed:
            raise ValueError(f"{where}: corrupt metadata: {place}, mask, field 'observed_total': "
                             f"{b.mask.observed_total!r} is negative, but the store is not signed")

    def _check_stats(self, item, place: str, where: str) -> None:
        """A block's or a group's statistics are possible: finite, and never negative where the data cannot
        make them so (a sum of squares; in an unsigned store, a sum or a smallest value)."""
        names = [name for name in ("sq_norm", "total", "min_value") if hasattr(item, name)]
        for name in names:
            value = getattr(item, name)
            if not math.isfinite(value):
                raise ValueError(f"{where}: corrupt metadata: {place}, field {name!r}: {value!r} is not finite")
            if value < 0 and (name == "sq_norm" or not self.signed):
                raise ValueError(f"{where}: corrupt metadata: {place}, field {name!r}: {value!r} is negative"
                                 + ("" if name == "sq_norm" else ", but the store is not signed"))

    def _check_column_blocks(self, where: str) -> None:
        """Column blocks tile ``[0, n)`` in order and hold every non-zero of the groups."""
        n, col, nnz = self.shape[1], 0, 0
        for i, c in enumerate(self.column_blocks):
            last = i == len(self.column_blocks) - 1
            if (c.index != i or c.col_start != col or not c.col_start < c.col_stop <= n
                    or (last and c.col_stop != n)):
                raise ValueError(f"{where}: corrupt metadata: column block {i} (columns {c.col_start}:{c.col_stop}); "
                                 f"column blocks must tile columns 0:{n} in order")
            if not 0 <= c.nnz <= c.n_cols * self.shape[0]:
                raise ValueError(f"{where}: corrupt metadata: column block {i} (key {c.key!r}), field 'nnz': "
                                 f"{c.nnz} non-zeros in {self.shape[0]} x {c.n_cols} entries")
            if c.version != self.version:
                raise ValueError(f"{where}: corrupt metadata: column block {i} (key {c.key!r}), field 'version': "
                                 f"{c.version}, but the store is at version {self.version} (an append drops them)")
            col, nnz = c.col_stop, nnz + c.nnz
        total = sum(g.nnz for g in self.groups)
        if nnz != total:
            raise ValueError(f"{where}: corrupt metadata: column blocks hold {nnz} non-zeros, groups hold {total}")


def _scalars(item) -> dict:
    """A block's fields but its array records, its mask, and those at their default (:data:`DEFAULT_FIELDS`)."""
    return {f.name: getattr(item, f.name) for f in fields(item) if f.name not in ("arrays", "mask")
            and (f.name not in DEFAULT_FIELDS or getattr(item, f.name) != DEFAULT_FIELDS[f.name])}


def _mask_json(mask: BlockMask | None) -> dict:
    """A block's ``mask`` field: none without a mask (so that an unmasked store's document is what it was)."""
    return {} if mask is None else {"mask": {**_scalars(mask), "arrays": _records_json(mask.arrays)}}


def _mask_kind(top, version) -> str | None:
    """The store's mask kind: the field ``mask`` ({"kind": ...}), which version 4 has and version 3 has not."""
    if version != MASKED_FORMAT_VERSION:
        if "mask" in top.doc:
            raise top.error("mask", f"is not in format version {version} (a store with a mask is version "
                                    f"{MASKED_FORMAT_VERSION})")
        return None
    kind = _Fields(top.get("mask", "object"), top.where, "mask").get("kind", "text")
    if kind not in MASK_KINDS:
        raise top.error("mask", f"kind must be one of {', '.join(MASK_KINDS)}, not {_short(kind)}")
    return kind


def _records_json(records: tuple[ArrayRecord, ...]) -> dict:
    return {r.name: {"dtype": r.dtype, "crc32c": r.crc32c} for r in records}


# The JSON types of the metadata's fields: a test and how a message describes it. ``bool`` is
# an ``int`` in Python, and must not pass for a count or a number.
_KINDS = {
    "count": (lambda v: type(v) is int and v >= 0, "a non-negative integer"),
    "number": (lambda v: type(v) in (int, float) and math.isfinite(v), "a finite number"),
    "text": (lambda v: isinstance(v, str), "a string"),
    "flag": (lambda v: type(v) is bool, "true or false"),
    "list": (lambda v: isinstance(v, list), "a list"),
    "object": (lambda v: isinstance(v, dict), "an object"),
    # null for an array without elements (it has no chunk file); a reader checks the chunks zarr asks for
    "checksum": (lambda v: v is None or (type(v) is int and 0 <= v < 2**32), "a 32-bit checksum or null"),
}
_FIELD_KINDS = {int: "count", float: "number", str: "text", bool: "flag"}


def _place(kind: str, index: int, item) -> str:
    """How a message names a (row or column) block of the document, by its key too when it has one."""
    key = item.get("key") if isinstance(item, dict) else None
    return f"{kind} {index}" + (f" (key {key!r})" if isinstance(key, str) else "")


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


class _Fields:
    """Typed access to one JSON object of the metadata: a missing field or one of the wrong type
    raises ``ValueError`` naming the store, the object (``place``) and the field."""

    def __init__(self, doc, where: str, place: str):
        self.where, self.place = where, place
        if not isinstance(doc, dict):
            raise ValueError(f"{where}: corrupt metadata: {place or 'the document'} is {_short(doc)}, not an object")
        self.doc = doc

    def error(self, key: str, problem: str) -> ValueError:
        place = f"{self.place}, field {key!r}" if self.place else f"field {key!r}"
        return ValueError(f"{self.where}: corrupt metadata: {place} {problem}")

    def get(self, key: str, kind: str, optional: bool = False):
        """The field ``key``, of the JSON type ``kind``; an ``optional`` one may be missing (its default:
        :data:`DEFAULT_FIELDS`, or an empty list)."""
        if key not in self.doc:
            if optional:
                return DEFAULT_FIELDS.get(key, [])
            raise self.error(key, "is missing")
        value = self.doc[key]
        test, description = _KINDS[kind]
        if not test(value):
            raise self.error(key, f"must be {description}, not {_short(value)}")
        return value

    def read(self, cls) -> dict:
        """The scalar fields of the dataclass ``cls`` (a block or a group), each checked for its type."""
        return {name: self.get(name, _FIELD_KINDS[kind], optional=name in DEFAULT_FIELDS)
                for name, kind in get_type_hints(cls).items() if name not in ("arrays", "mask")}

    def block_mask(self, block: Block, kind: str | None) -> BlockMask | None:
        """The block's mask record (the field ``mask``) in a store with a mask of ``kind``; None otherwise
        (checked by :meth:`Metadata.check`: a block of a store without a mask must have none)."""
        if kind is None:
            if "mask" in self.doc:
                raise self.error("mask", "is given, but the store has no mask")
            return None
        entry = _Fields(self.get("mask", "object"), self.where, f"{self.place}, mask")
        mask = BlockMask(**entry.read(BlockMask))
        return replace(mask, arrays=entry.records(mask.array_shapes(block.n_rows), MASK_DTYPE))

    def records(self, names, dtype: str) -> tuple[ArrayRecord, ...]:
        """The records, under ``"arrays"``, of the arrays ``names`` of a store of ``dtype`` (those of
        :data:`OPTIONAL_ARRAYS` may be missing)."""
        given = self.get("arrays", "object")
        required = {name for name in names if name not in OPTIONAL_ARRAYS}
        if not required <= set(given) <= set(names):
            raise self.error("arrays", f"lists {sorted(given)}, the format has {sorted(required)}"
                             + (f" (and may have {sorted(set(names) - required)})" if set(names) != required else ""))
        out = []
        for name in (name for name in names if name in given):
            dtypes = allowed_dtypes(name, dtype)
            record = _Fields(given[name], self.where, f"{self.place + ', ' if self.place else ''}array {name!r}")
            array_dtype = record.get("dtype", "text")
            if array_dtype not in dtypes:
                raise record.error("dtype", f"must be {' or '.join(dtypes)}, not {_short(array_dtype)}")
            out.append(ArrayRecord(name, array_dtype, record.get("crc32c", "checksum")))
        return tuple(out)
