"""Reading a store: arrays read and checked against the metadata (shape, dtype, codecs, the CRC32C of their
chunk), and the picklable block readers a worker runs."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ..kernels.memory import empty_aligned
# imported at their first use, which ``distfact info`` never makes (distfact/lazy.py)
from ..lazy import scipy_sparse as sp, store_chunks as chunks, zarr, zarr_cpu_buffer, zarr_storage
from .format import ArrayRecord, Block, ColumnBlock
from .masks import FORMS_BY_NAME


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (zarr's may span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def read_aligned(array: zarr.Array) -> np.ndarray:
    """The whole Zarr array, read into a 64-byte-aligned buffer (see ``kernels/memory.py``): the
    block tasks then use it as it is instead of copying it every pass."""
    out = empty_aligned(array.shape, array.dtype)
    array.get_basic_selection(Ellipsis, out=zarr_cpu_buffer.NDBuffer.from_numpy_array(out))
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
    store = zarr_storage.LocalStore(path, read_only=True)
    if verify:
        store = chunks.ChecksummingStore(store, {chunks.chunk_key(node_path, name, len(shapes[name])): record.crc32c
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
        found = (array.shape, chunks.dtype_name(array.dtype))
        codecs_found = tuple(array.metadata.codecs)
        if found == (shape, record.dtype) and codecs_found == chunks.array_codecs(array.dtype):
            values = read_aligned(array) if into_aligned else array[...]
    except chunks.ChunkDamage as exc:
        raise ValueError(f"{where}: {exc}") from None
    except Exception as exc:  # as in read_arrays
        raise damaged(where, exc) from exc
    if found != (shape, record.dtype):
        raise ValueError(f"{where} has shape {found[0]} and dtype {found[1]}; the metadata says {shape} "
                         f"and {record.dtype}")
    if codecs_found != chunks.array_codecs(array.dtype):
        raise ValueError(f"{where} has codecs {[c.to_dict() for c in codecs_found]}; distfact writes "
                         f"{[c.to_dict() for c in chunks.array_codecs(array.dtype)]}")
    return values


def damaged(where: str, exc: Exception) -> ValueError:
    """The error for a group or an array of a store (``where``) that zarr cannot open or read."""
    if isinstance(exc, (KeyError, FileNotFoundError)):  # its zarr.json is gone (zarr 3.1: NodeNotFoundError)
        return ValueError(f"{where} is missing")
    return ValueError(f"{where} cannot be read ({one_line(exc)})")


def block_place(block) -> tuple[str, str]:
    """A row or column block's group in a store, and how messages name it."""
    kind = "block" if isinstance(block, Block) else "column block"
    return block.node, f"{kind} {block.index} (key {block.key!r})"


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
class MaskReader:
    """Picklable loader of one row block's mask from a store with a mask (what the block's task runs where the
    block lives): ``{form: P}``, the form as the kernels name it (``kernels/masked.py``) and P the CSR (float64,
    sorted indices) written at ingest, every array checked against the block's mask record (shape, dtype,
    codecs, CRC32C) as :class:`BlockReader` checks X."""

    path: str
    n_cols: int
    verify: bool = True

    def __call__(self, block: Block) -> dict:
        node, what = block_place(block)
        mask = block.mask
        arrays = read_arrays(self.path, f"{node}/mask", f"{what}, mask", mask.arrays,
                             mask.array_shapes(block.n_rows), ("data", "indices", "indptr"), verify=self.verify)
        check_mask_csr(*arrays, self.n_cols, mask.form, f"store {self.path!r} is corrupt: {what}, mask, array")
        return {FORMS_BY_NAME[mask.form]: sp.csr_matrix(tuple(arrays), shape=(block.n_rows, self.n_cols))}


def check_mask_csr(data: np.ndarray, indices: np.ndarray, indptr: np.ndarray, n_cols: int, form: str,
                   where: str) -> None:
    """A block's stored mask as the writer leaves it, in O(entries): ``indptr`` non-decreasing from 0 to the
    number of entries, ``indices`` in [0, ``n_cols``) and increasing within each row (sorted, no duplicates),
    ``data`` finite, and weights of the form ``form`` names: "observed" (the weights) >= 0, "complement"
    (1 - weight, at the entries whose weight is not 1) <= 1 (weight >= 0) and not 0. The checksums cannot
    tell a mask written wrong (or rewritten with new checksums) from a good one; a kernel reading such arrays
    would index out of bounds or weigh entries negatively. ValueError: ``where`` + " 'name': the problem"."""
    nnz = len(data)
    steps = np.diff(indptr)
    if indptr[0] != 0 or indptr[-1] != nnz:
        raise ValueError(f"{where} 'indptr': runs from {indptr[0]} to {indptr[-1]}, not from 0 to the mask's "
                         f"{nnz} entries")
    if (steps < 0).any():
        row = int(np.flatnonzero(steps < 0)[0])
        raise ValueError(f"{where} 'indptr': decreases at row {row} ({indptr[row]} then {indptr[row + 1]})")
    if nnz and (indices.min() < 0 or indices.max() >= n_cols):
        at = int(np.flatnonzero((indices < 0) | (indices >= n_cols))[0])
        raise ValueError(f"{where} 'indices': entry {at} is column {indices[at]}, outside [0, {n_cols})")
    row_start = np.zeros(nnz, dtype=bool)
    row_start[indptr[:-1][steps > 0]] = True
    unsorted = (np.diff(indices) <= 0) & ~row_start[1:]
    if unsorted.any():
        at = int(np.flatnonzero(unsorted)[0]) + 1
        raise ValueError(f"{where} 'indices': not increasing within a row at entry {at} (column {indices[at]} "
                         f"after {indices[at - 1]}; the writer sorts each row's columns)")
    bad = ~np.isfinite(data)
    bad |= (data < 0) if form == "observed" else (data > 1) | (data == 0)
    if bad.any():
        at = int(np.flatnonzero(bad)[0])
        rule = ("weights must be finite and non-negative" if form == "observed" else
                "a complement entry is 1 - weight: finite, at most 1 (weight >= 0) and not 0 (weight 1 is not stored)")
        raise ValueError(f"{where} 'data': entry {at} is {float(data[at])!r} in form {form!r} ({rule})")


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


def unreadable(path: str) -> str | None:
    """Why the store at ``path`` cannot be read from this process (its root metadata), or None if it can.
    Cheap: run on every worker before a fit."""
    try:
        with open(os.path.join(path, "zarr.json"), "rb") as f:
            f.read(1)
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror or exc}"
    return None
