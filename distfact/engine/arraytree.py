"""Nested values as one ``.npz`` of arrays plus a JSON skeleton, read back without unpickling anything.

A *tree* is a dict (string keys), list or tuple nesting numpy arrays, numpy scalars and Python ``None``,
``bool``, ``int``, ``float`` and ``str``. :func:`save` writes it as one ``.npz`` file (``np.savez``): every
array and numpy scalar is a member (a scalar as a 0-d array), and the member ``skeleton``, a 0-d unicode
array, holds JSON recording the nesting, the kind of every leaf, the shape and dtype of every array, the
values of the Python scalars, and the caller's own JSON header (``meta``). The file is written under a
temporary name and renamed into place.

:class:`TreeFile` reads it with ``allow_pickle=False`` and checks every leaf against the skeleton: the member
exists and is used once, no member is left over, the dtype is the recorded one and one of bool, integers,
float32/float64 or unicode strings, the shape is the recorded one, and float values are finite. Object arrays are refused on writing and on reading,
except arrays of ``str`` (scikit-learn's ``feature_names_in_``): stored as unicode, read back as object
arrays. Arrays come back C-contiguous at a 64-byte boundary (``kernels/memory.py``), like those the engine
makes, so that BLAS takes the same code path with them. Every problem is a :class:`TreeError` naming the
file and the field (its path in the tree, e.g. ``global_state/H``).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import uuid
import zipfile
import numpy as np

from ..kernels.memory import aligned
from ..outputs import file_sha256

FORMAT = "distfact.arrays"
VERSION = 1
SKELETON = "skeleton"


class TreeError(ValueError):
    """An array-tree file that cannot be read, or whose content does not match its skeleton."""


def save(path, tree, meta: dict | None = None) -> str:
    """Write ``tree`` to ``path`` (written aside, then renamed into place); returns the file's SHA-256 (hex).

    ``meta``: a JSON-serialisable dict kept in the skeleton, readable before the tree is decoded
    (:attr:`TreeFile.meta`). Raises TypeError, naming the field, for a value that is not a tree, and ValueError
    for NaN or infinite values (which the reader refuses)."""
    arrays: dict[str, np.ndarray] = {}
    skeleton = {"format": FORMAT, "version": VERSION, "meta": meta or {}, "tree": _encode(tree, arrays, ())}
    path = os.fspath(path)
    aside = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(aside, "wb") as f:
            np.savez(f, **{SKELETON: np.array(json.dumps(skeleton))}, **arrays)
        digest = file_sha256(aside)
        os.replace(aside, path)
    except BaseException:
        if os.path.exists(aside):
            os.remove(aside)
        raise
    return digest


def _encode(value, arrays: dict, path: tuple) -> dict:
    if isinstance(value, (np.ndarray, np.generic)):  # first: np.float64 is a float, np.str_ a str
        return _encode_array(value, arrays, path)
    if isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            raise TypeError(f"field {_name(path)!r}: dict keys must be strings, got {list(value)!r}")
        return {"kind": "dict", "items": {key: _encode(item, arrays, (*path, key)) for key, item in value.items()}}
    if isinstance(value, (list, tuple)):
        return {"kind": type(value).__name__, "items": [_encode(item, arrays, (*path, i)) for i, item in enumerate(value)]}
    if value is None:
        return {"kind": "none"}
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"field {_name(path)!r}: the value {value} is not finite")
    for kind in (bool, int, float, str):  # bool before int: True is an int
        if isinstance(value, kind):
            return {"kind": kind.__name__, "value": kind(value)}
    raise TypeError(f"field {_name(path)!r}: a {type(value).__name__} cannot be saved (only arrays, numbers, "
                    "strings, None, and dicts, lists and tuples of them)")


def _encode_array(value, arrays: dict, path: tuple) -> dict:
    array = np.asarray(value)
    node = {"kind": "array" if isinstance(value, np.ndarray) else "scalar"}
    if array.dtype == object:
        if not all(isinstance(item, str) for item in array.flat):
            raise TypeError(f"field {_name(path)!r}: an object array can be saved only if it holds strings")
        array = array.astype(str)
        node["object"] = "str"
    problem = _dtype_problem(array.dtype)
    if problem:
        raise TypeError(f"field {_name(path)!r}: {problem}")
    if array.dtype.kind == "f" and not np.isfinite(array).all():  # the reader refuses them: refuse them here
        raise ValueError(f"field {_name(path)!r}: holds NaN or infinite values")
    member = f"a{len(arrays)}"
    arrays[member] = array
    return {**node, "member": member, "dtype": array.dtype.str, "shape": list(array.shape)}


def _dtype_problem(dtype: np.dtype) -> str | None:
    """Why ``dtype`` is not one an array tree holds, or None."""
    if dtype.kind in "biuU" or (dtype.kind == "f" and dtype.itemsize in (4, 8)):
        return None
    return f"dtype {dtype} is not allowed (bool, integers, float32, float64 or unicode strings)"


def _name(path: tuple) -> str:
    return "/".join(map(str, path)) or "(root)"


class TreeFile:
    """An array-tree file opened for reading: the container and its skeleton are checked here, :attr:`meta`
    is the writer's header, and :meth:`read` decodes and checks the tree.

    ``sha256``: the digest the file must have (recorded when it was written); checked on the bytes that are
    then parsed."""

    def __init__(self, path, sha256: str | None = None):
        self.path = os.fspath(path)
        with open(self.path, "rb") as f:
            content = f.read()
        if sha256 is not None and hashlib.sha256(content).hexdigest() != sha256:
            raise TreeError(f"{self.path}: its SHA-256 is not the one recorded when it was written (the file was "
                            "changed or damaged)")
        try:
            self._npz = np.load(io.BytesIO(content), allow_pickle=False)
            if not isinstance(self._npz, np.lib.npyio.NpzFile):
                raise ValueError("a single .npy array, not an .npz archive")
            text = self._npz[SKELETON]
            if text.shape != () or text.dtype.kind != "U":
                raise ValueError(f"its {SKELETON!r} member is not a string")
            skeleton = json.loads(str(text[()]))
        except (OSError, ValueError, KeyError, EOFError, RecursionError, zipfile.BadZipFile) as exc:
            raise TreeError(f"{self.path}: not a readable distfact array file ({type(exc).__name__}: {exc})") from None
        if not isinstance(skeleton, dict) or skeleton.get("format") != FORMAT or not isinstance(skeleton.get("meta"), dict):
            raise TreeError(f"{self.path}: its skeleton is not that of a {FORMAT!r} file")
        version = skeleton.get("version")
        if not isinstance(version, int) or version > VERSION:
            raise TreeError(f"{self.path}: array-file format version {version!r}; this distfact reads versions up "
                            f"to {VERSION} (upgrade distfact)")
        self.meta = skeleton["meta"]
        self._tree = skeleton.get("tree")

    def read(self):
        """The tree, every leaf checked against the skeleton."""
        self._unused = set(self._npz.files) - {SKELETON}
        try:
            tree = self._decode(self._tree, ())
        except RecursionError:
            raise TreeError(f"{self.path}: its skeleton is nested too deeply") from None
        if self._unused:
            raise TreeError(f"{self.path}: members {sorted(self._unused)} are not in the skeleton")
        return tree

    def _error(self, path: tuple, problem: str) -> TreeError:
        return TreeError(f"{self.path}: field {_name(path)!r}: {problem}")

    def _decode(self, node, path: tuple):
        kind = node.get("kind") if isinstance(node, dict) else None
        if kind == "dict" and isinstance(node.get("items"), dict):
            return {key: self._decode(item, (*path, key)) for key, item in node["items"].items()}
        if kind in ("list", "tuple") and isinstance(node.get("items"), list):
            items = [self._decode(item, (*path, i)) for i, item in enumerate(node["items"])]
            return items if kind == "list" else tuple(items)
        if kind == "none":
            return None
        if kind in ("array", "scalar"):
            return self._decode_array(node, path)
        value = node.get("value") if isinstance(node, dict) else None
        if kind in ("bool", "str") and isinstance(value, bool if kind == "bool" else str):
            return value
        if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
            return value
        if kind == "float" and isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise self._error(path, f"the value {value} is not finite")
            return float(value)
        raise self._error(path, f"not a valid skeleton node: {json.dumps(node)[:200]}")

    def _decode_array(self, node: dict, path: tuple):
        member, shape = node.get("member"), node.get("shape")
        if not isinstance(member, str) or member not in self._unused:
            raise self._error(path, f"its array {member!r} is missing (or used twice)")
        self._unused.discard(member)
        try:
            dtype = np.dtype(node["dtype"]) if isinstance(node.get("dtype"), str) else None
        except TypeError:
            dtype = None
        if dtype is None:
            raise self._error(path, f"the recorded dtype {node.get('dtype')!r} is not a dtype")
        problem = _dtype_problem(dtype)
        if problem:
            raise self._error(path, problem)
        if (not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape)
                or (node["kind"] == "scalar" and shape)):
            raise self._error(path, f"the recorded shape {shape!r} is not a shape")
        try:
            array = self._npz[member]  # allow_pickle=False: an object array raises here, unread
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
            raise self._error(path, f"its array cannot be read ({type(exc).__name__}: {exc})") from None
        if array.dtype != dtype or array.shape != tuple(shape):
            raise self._error(path, f"the array has dtype {array.dtype} and shape {array.shape}, the skeleton "
                                    f"records {dtype} and {tuple(shape)}")
        if dtype.kind == "f" and not np.isfinite(array).all():
            raise self._error(path, f"{int((~np.isfinite(array)).sum())} non-finite values")
        if "object" in node:
            if node["object"] != "str" or dtype.kind != "U" or node["kind"] != "array":
                raise self._error(path, f"an object array of {node['object']!r} cannot be read")
            return array.astype(object)
        return array[()] if node["kind"] == "scalar" else aligned(array)
