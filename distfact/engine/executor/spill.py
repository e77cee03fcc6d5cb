"""Local factors in Zarr: written and read back by the process that holds them, for the out-of-core mode (a
factor larger than the memory budget lives on disk between passes) and for checkpoints (with a manifest of
every array's shape, dtype and CRC32C, checked on restore)."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from typing import NamedTuple

import google_crc32c
import numcodecs
import numpy as np
import scipy.sparse as sp
import zarr

from ...store.chunks import array_codecs, chunk_key
from ...store.format import Block
from ...store.writing import write_arrays


CSR_PARTS = ("data", "indices", "indptr")


def save_local(directory: str, block, local) -> dict:
    """Write one block's local factor under ``directory`` (run where the factor lives): one Zarr
    array, or for a local state of several named row-aligned parts (a dict of dense arrays and
    CSR matrices) one Zarr group with an array, or a data/indices/indptr group, per part.

    Returns the block's manifest (what :func:`load_local` checks when given it): for every array written,
    its Zarr path under ``directory`` -> shape, dtype and CRC32C of its bytes; for a CSR part, its path ->
    the matrix's shape."""
    name = f"{block.index:06d}"
    path = os.path.join(directory, name)
    if not isinstance(local, dict):  # an array on its own path: blocks written concurrently share no node
        local = np.asarray(local)
        write_one_chunk_array(path, local)
        return {name: _array_manifest(local)}
    node = zarr.open_group(path, mode="w", zarr_format=3)
    manifest = {}
    for part_name, part in local.items():
        if sp.issparse(part):
            part = sp.csr_matrix(part)
            sub = node.create_group(part_name)
            sub.attrs["shape"] = list(part.shape)
            arrays = dict(zip(CSR_PARTS, (part.data, part.indices, part.indptr)))
            write_arrays(sub, **arrays)
            manifest[f"{name}/{part_name}"] = {"csr_shape": list(part.shape)}
            manifest.update({f"{name}/{part_name}/{key}": _array_manifest(array) for key, array in arrays.items()})
        else:
            part = np.asarray(part)
            write_arrays(node, **{part_name: part})
            manifest[f"{name}/{part_name}"] = _array_manifest(part)
    return manifest


def write_one_chunk_array(path: str, array: np.ndarray) -> None:
    """A numeric ``array`` (booleans, integers, floats) as a Zarr v3 array of one chunk at ``path``, replacing what
    is there (a spill's generation, a checkpoint or ``W_out`` being written: distfact's own), written as two files
    with the codecs of every array distfact writes (``store/chunks.py: array_codecs``): the files zarr-python
    writes for ``zarr.open_array(path, mode="w", chunks=...)[...] = array`` with the chunk shape and
    ``write_empty_chunks`` of a store's arrays (``store/writing.py: write_arrays``: no dimension of a chunk below 1,
    and the chunk written even when it holds only zeros), at a seventh of its cost: 0.34 against 2.4 ms for a
    100 x 5 factor, most of it zarr's own machinery. With a checkpoint every 10 iterations a 400 x 100 fit of 4
    blocks took about 12 times as long as without (BENCHMARKS.md, "Checkpoints of small fits"). The metadata is
    written aside and renamed into place, last: a node without it is no array."""
    if array.dtype.kind not in "biuf":  # checked before anything at ``path`` is replaced
        raise TypeError(f"{path}: a local factor holds numbers (booleans, integers, floats), got dtype {array.dtype}")
    if os.path.lexists(path):
        shutil.rmtree(path)
    serializer, compressor = array_codecs(array.dtype)
    config = compressor.to_dict()["configuration"]
    os.makedirs(path)
    if array.size:  # an array without elements has no chunk
        chunk = os.path.join(path, chunk_key("", "", array.ndim))
        os.makedirs(os.path.dirname(chunk), exist_ok=True)
        little = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
        with open(chunk, "wb") as f:
            f.write(numcodecs.Zstd(level=config["level"], checksum=config["checksum"]).encode(little.tobytes()))
    bytes_codec = serializer.to_dict()
    if array.dtype.itemsize == 1:  # as zarr records it: one byte has no endianness
        del bytes_codec["configuration"]
    metadata = {"zarr_format": 3, "node_type": "array", "shape": list(array.shape), "data_type": array.dtype.name,
                "chunk_grid": {"name": "regular",
                               "configuration": {"chunk_shape": [max(size, 1) for size in array.shape]}},
                "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
                "fill_value": array.dtype.type(0).item(), "codecs": [bytes_codec, compressor.to_dict()],
                "attributes": {}, "storage_transformers": []}
    aside = os.path.join(path, ".zarr.json.tmp")
    with open(aside, "w") as f:
        json.dump(metadata, f)
    os.replace(aside, os.path.join(path, "zarr.json"))


def _array_manifest(array: np.ndarray) -> dict:
    return {"shape": list(array.shape), "dtype": array.dtype.str,
            "crc32c": google_crc32c.value(np.ascontiguousarray(array))}


def load_local(directory: str, block, expected: dict | None = None):
    """One block's local factor as :func:`save_local` wrote it. Only numeric Zarr v3 arrays are read (bool,
    integers, floats: nothing that decodes into objects). ``expected``: the block's manifest from
    ``save_local``; the arrays read must match it exactly (no array missing or added, the same shapes,
    dtypes and CRC32C: a lost chunk reads as zeros and is caught here), else ValueError naming the array."""
    name = f"{block.index:06d}"
    node = zarr.open(os.path.join(directory, name), mode="r", zarr_format=3)
    if isinstance(node, zarr.Array):
        arrays, shapes = {name: _read_numeric(node, name)}, {}
    else:
        arrays, shapes = {}, {}
        for part_name, part in node.members():
            path = f"{name}/{part_name}"
            if isinstance(part, zarr.Group):
                shapes[path] = part.attrs.get("shape")
                arrays.update({f"{path}/{key}": _read_numeric(array, f"{path}/{key}") for key, array in part.members()})
            else:
                arrays[path] = _read_numeric(part, path)
    if expected is not None:
        found = {**{path: {"csr_shape": shape} for path, shape in shapes.items()},
                 **{path: _array_manifest(array) for path, array in arrays.items()}}
        _check_manifest(directory, expected, found)
    if name in arrays:
        return arrays[name]
    local = {path.removeprefix(f"{name}/"): sp.csr_matrix(tuple(arrays[f"{path}/{key}"] for key in CSR_PARTS),
                                                          shape=tuple(shape))
             for path, shape in shapes.items()}
    local.update({path.removeprefix(f"{name}/"): array for path, array in arrays.items() if path.count("/") == 1})
    return local


def _read_numeric(array: zarr.Array, path: str) -> np.ndarray:
    if array.dtype.kind not in "biuf":
        raise ValueError(f"array {path!r} has dtype {array.dtype}; a local factor holds numbers only")
    return array[...]


def _check_manifest(directory: str, expected: dict, found: dict) -> None:
    """ValueError naming the first array (or CSR part) of a block that differs from what was written."""
    for path in sorted(expected.keys() | found.keys()):
        if path not in found:
            raise ValueError(f"{directory}: {path!r} is missing")
        if path not in expected:
            raise ValueError(f"{directory}: {path!r} was not written by distfact")
        if found[path] != expected[path]:
            differ = [f"{key} {found[path].get(key)!r} (written: {value!r})" for key, value in expected[path].items()
                      if found[path].get(key) != value]
            raise ValueError(f"{directory}: {path!r} has {', '.join(differ) or 'other entries'}")


@dataclass(frozen=True)
class SpilledLocal:
    """A block's local factor kept in Zarr rather than in memory (out-of-core mode)."""

    directory: str
    block: Block

    def load(self):
        return load_local(self.directory, self.block)


@dataclass(frozen=True)
class LocalSpill:
    """Where local factors go when they exceed the memory budget: ``directory/gen0`` and
    ``gen1``, alternately, so a pass never overwrites the factors it reads (a task that
    Dask re-runs still finds its input)."""

    directory: str

    def store(self, block, local, generation: int) -> SpilledLocal:
        where = os.path.join(self.directory, f"gen{generation % 2}")
        save_local(where, block, local)
        return SpilledLocal(where, block)


class PassOutput(NamedTuple):
    """What an updating pass's task returns for a block: its new local factor and its statistics. On a cluster this
    output, where it was made, stays the block's local factor (no second task to take the local factor out of it)."""

    local: object
    stats: dict


def materialise(local):
    """The local factor itself, from what an executor holds: a pass's output, a spilled factor, or the factor."""
    if isinstance(local, PassOutput):
        local = local.local
    return local.load() if isinstance(local, SpilledLocal) else local
