"""Small input files shared by the CLI and the pipelines: .npz arrays, label files, class labels."""

from __future__ import annotations

import os

import numpy as np


def read_labels(path: str) -> np.ndarray:
    """One label per row: a .npy array, or a text file with one label per line."""
    if path.endswith(".npy"):
        return np.load(path, allow_pickle=False)
    with open(path) as f:
        return np.array([line.rstrip("\n") for line in f])


def load_npz(path: str):
    """``(X, groups)`` from an .npz holding an array ``X`` (and optionally ``groups``), or a scipy sparse .npz
    (``groups`` None)."""
    import scipy.sparse as sp

    with np.load(path, allow_pickle=False) as z:
        keys = set(z.files)
        if "X" in keys:
            return z["X"], (z["groups"] if "groups" in keys else None)
    try:
        return sp.load_npz(path), None
    except (ValueError, KeyError) as exc:
        raise ValueError(f"{path!r} holds neither an array 'X' nor a scipy sparse matrix") from exc


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
    if labels.dtype.kind in "OUS":  # a text file: -1 stays the unlabelled marker
        labels = np.where(labels == "-1", -1, labels).astype(object)
    return labels
