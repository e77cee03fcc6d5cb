"""How distfact lays its arrays in Zarr, for the writer and the readers alike: one chunk per array, pinned codecs,
the chunk keys, the fill values, and the store wrapper that checksums chunk files (CRC32C of the stored bytes) as
they are written or read."""

from __future__ import annotations

import google_crc32c
import numpy as np
from zarr.codecs import BytesCodec, VLenUTF8Codec, ZstdCodec
from zarr.storage import WrapperStore

from .format import STRING_DTYPE


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
