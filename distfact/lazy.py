"""Modules imported when they are first used.

``distfact info`` reads a store's metadata document and nothing else (``store/describe.py``), under 0.5 s (issue 19:
start-up); the store's modules import two packages it never uses, each about as slow as that budget allows:
scipy (250-300 ms here: scipy 1.17's bundled ``array_api_compat`` runs ``from numpy import *``, which loads
numpy.f2py and numpy.testing) and zarr (0.4-0.5 s: asyncio, donfig, numcodecs, fsspec). The store's modules name
them as the objects below, each imported at its first attribute read (a block read, an ingest, a fit), which
``info`` never makes.
"""

from __future__ import annotations

import importlib


class LazyModule:
    """Stands for the module ``name``: each attribute read is the module's own, the module imported at the first
    (Python's import lock makes that safe from several threads). Nothing is copied from the module, so a later
    change to the module itself (a test's monkeypatch of ``scipy.sparse.issparse``) is seen; attributes cannot be
    set on this object (patch the module, not ``distfact.store.masks.sp``). Not a module object: ``copy`` and
    ``inspect.ismodule`` do not treat it as one."""

    __slots__ = ("_name", "_module")

    def __init__(self, name: str):
        self._name = name
        self._module = None

    def __getattr__(self, attribute: str):
        if attribute in LazyModule.__slots__:  # unset (an object not made by __init__): not the module's to answer
            raise AttributeError(f"{attribute!r} of a LazyModule not made by its __init__")
        module = self._module
        if module is None:
            module = self._module = importlib.import_module(self._name)
        return getattr(module, attribute)

    def __reduce__(self):
        """Pickled as the module itself, imported where it is unpickled: cloudpickle ships a nested function or a
        lambda by value with the globals it uses, even from an importable module (``GroupedMatrix.to_dask``'s
        chunk loader, to Dask's scheduler and workers)."""
        return importlib.import_module, (self._name,)

    def __repr__(self) -> str:
        return f"<lazily imported module {self._name!r}>"


#: ``scipy.sparse`` for the store's modules (``from ..lazy import scipy_sparse as sp``)
scipy_sparse = LazyModule("scipy.sparse")
#: zarr and the parts of it the store's modules use (``from ..lazy import zarr``)
zarr = LazyModule("zarr")
zarr_storage = LazyModule("zarr.storage")
zarr_codecs = LazyModule("zarr.codecs")
zarr_cpu_buffer = LazyModule("zarr.core.buffer.cpu")
#: ``store/chunks.py`` (zarr's codecs and store wrapper; ``from ..lazy import store_chunks as chunks``)
store_chunks = LazyModule("distfact.store.chunks")
