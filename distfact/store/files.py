"""Small input files shared by the CLI and the pipelines: .npz arrays, label files, class labels."""

from __future__ import annotations

import os

import numpy as np

from ..outputs import file_sha256


def read_labels(path: str) -> np.ndarray:
    """One label per row: a .npy array (numbers or text; never Python objects), or a UTF-8 text file with one label
    per line (the labels are then strings)."""
    if path.endswith(".npy"):
        try:
            return np.load(path, allow_pickle=False)
        except ValueError as exc:  # an object array, or not an .npy file
            raise ValueError(f"labels file {path!r} cannot be read as an array of numbers or text: {exc}") from None
    with open(path, "rb") as f:
        lines = utf8_text(f.read(), f"labels file {path!r}").split("\n")  # not splitlines(): \x0c is no line end
    if lines[-1] == "":  # the new line that ends the last label
        lines.pop()
    return np.array([line.removesuffix("\r") for line in lines], dtype=str)


def fingerprint(path) -> dict:
    """What a store's ``ingests`` record of a source file: its absolute path and the SHA-256 of its bytes (a
    partition is recognised by its content, whatever its name)."""
    return {"file": os.path.abspath(os.fspath(path)), "sha256": file_sha256(path)}


def utf8_text(raw: bytes, where: str, error=ValueError) -> str:
    """``raw`` decoded as UTF-8; else ``error`` naming ``where``, the line and the column of the first bad byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise error(f"{where}:{line}: not UTF-8 text (byte {raw[exc.start:exc.start + 1]!r} at column {column})") \
            from None


def load_npz(path: str):
    """``(X, groups)`` from an .npz holding an array ``X`` (and optionally ``groups``), or a scipy sparse .npz
    (``groups`` None). Arrays of Python objects are refused (nothing is unpickled)."""
    import zipfile

    import scipy.sparse as sp

    if not zipfile.is_zipfile(path):
        raise ValueError(f"{path!r} is not an .npz file (a zip archive of arrays, as numpy.savez writes)")
    try:
        with np.load(path, allow_pickle=False) as z:
            keys = set(z.files)
            if "X" in keys:
                return z["X"], (z["groups"] if "groups" in keys else None)
        return sp.load_npz(path), None
    except ValueError as exc:
        if "allow_pickle" in str(exc):
            raise ValueError(f"{path!r} holds an array of Python objects, which distfact does not load (give numbers, "
                             "and labels as numbers or text)") from None
        raise ValueError(f"{path!r} holds neither an array 'X' nor a scipy sparse matrix ({exc})") from None
    except (KeyError, OSError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{path!r} holds neither an array 'X' nor a scipy sparse matrix ({exc})") from None


def class_labels(option: str, data):
    """Class labels in the input's row order: the store's groups ('groups'), none ('none'), or a file."""
    if option == "none":
        return None
    if option == "groups":
        labels = np.empty(data.shape[0], dtype=object)
        labels[data.row_index()] = np.repeat(data.group_names, data.group_sizes)
        return labels
    if not os.path.exists(option):
        raise ValueError(f"--labels {option!r}: expected 'groups', 'none' or an existing file")
    labels = read_labels(option)
    if labels.dtype.kind in "OUS":  # text: "-1" stays the unlabelled marker
        labels = labels.astype(object)
        labels[labels == "-1"] = -1
    return labels


def load_mask(path: str):
    """A mask file for ingest (``distfact ingest --mask``): entry weights, 0 = missing, as a dense ``.npy`` array or
    a scipy sparse ``.npz`` (``scipy.sparse.save_npz``; or an ``.npz`` holding an array ``mask``). Its shape and
    values are checked by the store writer; here, that it is one of these, without unpickling anything."""
    import zipfile

    import scipy.sparse as sp

    where = f"mask file {path!r}"
    if not os.path.isfile(path):
        raise ValueError(f"{where} does not exist")
    if path.endswith(".npy"):
        try:
            values = np.load(path, allow_pickle=False)
        except ValueError as exc:
            raise ValueError(f"{where} cannot be read as an array of numbers: {exc}") from None
    elif zipfile.is_zipfile(path):
        try:
            with np.load(path, allow_pickle=False) as z:
                values = z["mask"] if "mask" in z.files else sp.load_npz(path)
        except ValueError as exc:
            raise ValueError(f"{where} holds neither an array 'mask' nor a scipy sparse matrix: {exc}") from None
    else:
        raise ValueError(f"{where} is neither an .npy array nor an .npz (scipy.sparse.save_npz, or an array 'mask')")
    if values.ndim != 2:
        raise ValueError(f"{where} holds an array of {values.ndim} dimensions; a mask has X's shape (rows x columns)")
    return values
