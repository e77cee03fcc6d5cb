"""Grouped matrices on Zarr: format, ingest and validation.

The ingest sources (tables need pandas, corpora scikit-learn's vectorizers) are imported when first used (PEP 562),
so that opening a store (``distfact info``) does not pay for them."""

import importlib

from .grouped import GroupedMatrix, open_store
from . import append as _append  # noqa: F401 (defines GroupedMatrix.append)
from .reading import BlockReader, ColumnBlockReader
from .format import Block, ColumnBlock

_LAZY = {"StoreWriter": "ingest", "from_arrays": "ingest", "from_table": "tables", "from_corpus": "corpus"}

__all__ = ["Block", "BlockReader", "ColumnBlock", "ColumnBlockReader", "GroupedMatrix", "open_store", *_LAZY]


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'distfact.store' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted({*globals(), *_LAZY})
