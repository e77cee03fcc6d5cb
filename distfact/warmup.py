"""Compile the numba kernels into numba's cache before a user's first fit needs them.

A kernel decorated ``numba.njit(cache=True)`` is compiled once per signature (argument types: dtype, layout,
read-only or not) and kept in numba's cache, beside its source in the installed package (``__pycache__``; or
in ``NUMBA_CACHE_DIR``, or a user cache directory where the package's directory is read-only). A process that
finds a signature there loads it in milliseconds; one that does not compiles it, a second to several seconds
per kernel, on its first fit.

:func:`warm_up` makes those entries by running the small fits (and ``transform``) of every registered method
whose fits call numba kernels of their own (its declaration's ``numba_kernels``; not the multigroup SVD, whose LAPACK
and SDP solver compile nothing and whose SDP dominated the warm-up's time) on a tiny grouped matrix, dense and CSR,
float64 and float32, in memory and from a store on disk, for each combination of the method's choice parameters
(solver, loss, model, ...). So the signatures compiled are those real fits use, whatever kernels the methods call:
nothing here names a method or a kernel. It runs when the package is built (``setup.py``: ``pip install .`` ships
the cache for the machine it installs on) and as ``distfact warmup`` (after installing a wheel built elsewhere, or
for a read-only installation, where it fills the user's cache directory). Numba checks every entry on load (its
version, the source file's contents, the CPU): an entry that does not fit is ignored and the kernel compiled as
without it.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import os
import pkgutil
import tempfile
import time
import warnings

import numpy as np

#: rows per group, columns, groups and rank of the warm-up data: enough for every method (a rank below each
#: group's rows, several groups; as many columns as the thin products' loops take, ``kernels/products.py``), small
#: enough that a fit costs milliseconds once its kernels are compiled
ROWS, COLUMNS, GROUPS, RANK = 12, 64, 3, 2
#: iterations of each warm-up fit: every kernel a fit calls runs in its first iteration
ITERATIONS = 2
KERNELS = f"{__package__}.kernels."


def cached_kernels() -> dict:
    """Every numba dispatcher of ``distfact.kernels`` that caches its compilations (``cache=True``), by
    ``module.name``."""
    from numba.core.caching import NullCache
    from numba.core.dispatcher import Dispatcher

    out = {}
    for module_info in pkgutil.iter_modules([os.path.join(os.path.dirname(__file__), "kernels")], KERNELS):
        module = importlib.import_module(module_info.name)
        for name, value in vars(module).items():
            if isinstance(value, Dispatcher) and not isinstance(value._cache, NullCache) \
                    and value.py_func.__module__ == module.__name__:
                out[f"{module.__name__.rpartition('.')[2]}.{name}"] = value
    return out


def compilations(kernels: dict) -> dict:
    """``{kernel: number of signatures compiled in this process}`` (signatures not found in the cache), for
    the kernels that compiled any."""
    return {name: sum(d.stats.cache_misses.values()) for name, d in kernels.items() if d.stats.cache_misses}


def cache_directories(kernels: dict) -> list[str]:
    """The directories numba reads and writes these kernels' cache entries in."""
    return sorted({d._cache._cache_path for d in kernels.values()})


def _data():
    """The warm-up inputs: (X, groups) for dense and CSR X in float64 and float32."""
    import scipy.sparse as sp

    rng = np.random.default_rng(0)
    X = rng.random((ROWS * GROUPS, COLUMNS))
    X[X < 0.5] = 0.0  # zeros, so that the CSR blocks have a pattern; every row and column keeps non-zeros
    X[np.arange(ROWS * GROUPS), np.arange(ROWS * GROUPS) % COLUMNS] = 1.0
    groups = np.repeat([f"g{i}" for i in range(GROUPS)], ROWS)
    for dtype in (np.float64, np.float32):
        yield X.astype(dtype), groups
        yield sp.csr_matrix(X.astype(dtype)), groups


def _settings(declaration) -> list[dict]:
    """Every combination of the method's choice parameters, each with few iterations."""
    parameters = declaration.parameters()
    iterations = {name: ITERATIONS for name, p in parameters.items() if p.kind is int and name.endswith("max_iter")}
    choices = {name: p.choices for name, p in parameters.items() if p.choices}
    return [{**iterations, **dict(zip(choices, combination))} for combination in itertools.product(*choices.values())]


def _masks(X) -> list:
    """Weights for a fit that takes ``mask``, 0 only where X is 0 (so X is already zeroed at its missing entries,
    as fit leaves it): a tenth of X's zeros missing (a block keeps the complement form), and X's non-zeros
    observed with weight 0.5 (the observed form)."""
    nonzero = (X != 0).toarray() if hasattr(X, "toarray") else X != 0
    missing = ~nonzero & (np.random.default_rng(1).random(X.shape) < 0.1)
    return [np.where(missing, 0.0, 1.0), 0.5 * nonzero]


def _fit_and_transform(declaration, settings: dict, data, X) -> None:
    """A fit as ``distfact fit`` makes it (the declared fit inputs at their defaults), then ``transform``; and,
    when the estimator's fit takes a mask, a fit with each of :func:`_masks`."""
    model = declaration.make(RANK, settings, random_state=0)
    inputs = {f.name: f.default for f in declaration.fit_inputs}
    arguments = declaration.fit_arguments(model, inputs, data, None)
    model.fit(data, **arguments)
    model.transform(data)
    if "mask" in inspect.signature(model.fit).parameters:
        for mask in _masks(X):
            try:
                model.fit(data, mask=mask, **arguments)
            except ValueError:  # a mask some data do not take (wL1-NMF: X in memory only)
                pass


def warm_up(progress=None) -> dict:
    """Compile every kernel signature the registered methods' fits use into numba's cache (the fits of those
    that call kernels of their own).

    Parameters
    ----------
    progress : callable or None
        Called with a line of text after each method.

    Returns
    -------
    dict
        ``fits`` run, ``refused`` (settings a method refuses, such as ``init='custom'`` without a start, or
        a solver the loss does not have), ``compiled`` (``{kernel: signatures compiled}``: those that were
        not in the cache yet), ``cache`` (the cache's directories) and ``seconds``.
    """
    from sklearn.exceptions import ConvergenceWarning

    from .registry import methods
    from .store.ingest import from_arrays

    start = time.perf_counter()
    kernels = cached_kernels()
    fits = refused = 0
    with tempfile.TemporaryDirectory() as scratch, warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        inputs = [(from_arrays(X, groups, path), X) for k, (X, groups) in enumerate(_data())
                  for path in (None, f"{scratch}/{k}.zarr")]  # in memory and on disk
        for declaration in methods().values():
            if not declaration.numba_kernels:
                if progress is not None:
                    progress(f"{declaration.name}: no kernels of its own, no fits")
                continue
            for settings in _settings(declaration):
                for data, X in inputs:
                    try:
                        _fit_and_transform(declaration, settings, data, X)
                        fits += 1
                    except (ValueError, TypeError):
                        refused += 1
            if progress is not None:
                progress(f"{declaration.name}: done ({time.perf_counter() - start:.1f} s)")
    return {"fits": fits, "refused": refused, "compiled": compilations(kernels), "cache": cache_directories(kernels),
            "seconds": time.perf_counter() - start}


def main() -> None:
    """``distfact warmup`` and setup.py's build step (``python -m distfact.warmup``): warm up, saying so."""
    summary = warm_up(progress=print)
    print(f"{summary['fits']} fits; {sum(summary['compiled'].values())} kernel signatures compiled into "
          f"{', '.join(summary['cache'])} ({summary['seconds']:.1f} s); the rest were there already")


if __name__ == "__main__":
    main()
