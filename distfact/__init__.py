"""distfact: group-aware matrix factorisation at scale, on Dask.

The public names are imported when first used (PEP 562), so that ``import distfact`` (and the command line's
start-up) does not pay for scikit-learn, Dask and Zarr before it needs them.
"""

import importlib

from ._version import __version__

# public name -> (module, attribute)
_PUBLIC = {
    **{name: ("distfact.estimators", name) for name in ("NMF", "FairerNMF", "StratifiedNMF", "WeightedL1NMF", "SSNMF",
                                                         "MultigroupSVD", "SSNMFClassifier")},
    "load": ("distfact.estimators.persistence", "load"),
    "fit_many": ("distfact.estimators.sweep", "fit_many"),
    "select_rank": ("distfact.estimators.select", "select_rank"),
    **{name: ("distfact.store", name) for name in ("GroupedMatrix", "from_arrays", "from_corpus", "from_table")},
    "open": ("distfact.store", "open_store"),
}

__all__ = [*_PUBLIC, "__version__"]


SUBPACKAGES = ("datasets", "engine", "estimators", "kernels", "methods", "pipeline", "registry", "reports", "store")


def __getattr__(name):
    if name in SUBPACKAGES:  # ``import distfact; distfact.store.StoreWriter`` as when every module loaded at once
        return importlib.import_module(f"distfact.{name}")
    if name not in _PUBLIC:
        raise AttributeError(f"module 'distfact' has no attribute {name!r}")
    module, attribute = _PUBLIC[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value  # looked up once
    return value


def __dir__():
    return sorted({*globals(), *_PUBLIC})
