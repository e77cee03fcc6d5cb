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
(solver, loss, model, ...); the dense matrix also as a block of several row tiles (:func:`_tall`), and the CSR
step's column bands narrowed to the matrix (:func:`_narrow_csr_bands`), so that the fits take the paths of large
data too. So the signatures compiled are those real fits use, whatever kernels the methods call: nothing here
names a method. It runs when the package is built (``setup.py``: ``pip install .`` ships
the cache for the machine it installs on), as ``distfact warmup`` (after installing a wheel built elsewhere, or
for a read-only installation, where it fills the user's cache directory), and before the test suite's first run in
a checkout (``tests/conftest.py``), each in a process per core (:func:`warm_up_side_by_side`), every process with a
share of the fits and its cache saves taking turns with the others'. Numba checks every entry on load (its
version, the source file's contents, the CPU): an entry that does not fit is ignored and the kernel compiled as
without it.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import itertools
import json
import os
import pkgutil
import subprocess
import sys
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
#: the warm-up data's dtypes; each comes dense and as CSR (:func:`_data`): the kinds of data the processes of
#: :func:`warm_up_side_by_side` share
DTYPES = (np.float64, np.float32)
KINDS = 2 * len(DTYPES)
#: the most processes the warm-up runs in: one a kind of data (a process more would fit nothing; measured on 2 cores:
#: BENCHMARKS.md, "The warm-up side by side")
MAX_PROCESSES = KINDS
#: seconds a warm-up process stopped early (:func:`warm_up_side_by_side`) has to end before it is killed
STOP_SECONDS = 10


class WarmupFailed(RuntimeError):
    """A process of :func:`warm_up_side_by_side` failed, or the processes cannot share a cache here."""


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
    for dtype in DTYPES:
        yield X.astype(dtype), groups
        yield sp.csr_matrix(X.astype(dtype)), groups


def _tall(X, groups):
    """Dense data whose first group's block holds more than one tile of the dense local step (``kernels/nmf.py:
    TILE_BYTES``), so that the fits reach its tiled path (``_dense_frobenius_rows``), which the small data do not:
    that group's rows repeated, the others' as they are (a tile is 1 MiB: more of them would only slow the warm-up)."""
    from .kernels.nmf import TILE_BYTES

    first = groups == groups[0]
    repeats = -(-(TILE_BYTES // (X.shape[1] * X.itemsize) + 1) // int(first.sum()))
    rows = np.concatenate([np.tile(np.flatnonzero(first), repeats), np.flatnonzero(~first)])
    return X[rows], groups[rows]


@contextlib.contextmanager
def _narrow_csr_bands():
    """The CSR step's bands (``kernels/nmf.py: CSR_BAND_BYTES``) narrower than the warm-up data for the duration, so
    that fits of CSR blocks held in memory reach its banded path from their second pass (``csr_frobenius_local``),
    as a text corpus's vocabulary does (a band holds 1 MiB of H^T and (W^T X)^T rows: 32,768 columns at rank 2 in
    float64), which the small data do not. The bands' kernels take their width as an argument: the signatures
    compiled are those of any width. (Data as wide as a band instead made the warm-up 151 s against 54, on 2 cores.)"""
    from .kernels import nmf

    saved = nmf.CSR_BAND_BYTES
    nmf.CSR_BAND_BYTES = 2 * RANK * min(np.dtype(dtype).itemsize for dtype in DTYPES) * (COLUMNS // 2)
    try:
        yield
    finally:
        nmf.CSR_BAND_BYTES = saved


def _settings(declaration) -> list[dict]:
    """Every combination of the method's choice parameters, each with few iterations."""
    parameters = declaration.parameters()
    iterations = {name: ITERATIONS for name, p in parameters.items() if p.kind is int and name.endswith("max_iter")}
    choices = {name: p.choices for name, p in parameters.items() if p.choices}
    return [{**iterations, **dict(zip(choices, combination))} for combination in itertools.product(*choices.values())]


def _masks(X) -> list:
    """Weights for a fit that takes ``mask``: a tenth of X's zeros and a fiftieth of its non-zeros missing (a block
    keeps the complement form; where X is a store, or in memory as a grouped matrix, the kernels zero X's missing
    non-zeros, as in ``select_rank``'s folds, ``kernels/masked.py: observed_block``), and X's non-zeros observed
    with weight 0.5 (the observed form)."""
    nonzero = (X != 0).toarray() if hasattr(X, "toarray") else X != 0
    draws = np.random.default_rng(1).random(X.shape)
    missing = (~nonzero & (draws < 0.1)) | (nonzero & (draws < 0.02))
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


def _share_of(part: tuple[int, int], n_kinds: int) -> list[int]:
    """Which of the warm-up's ``n_kinds`` kinds of data (:func:`_data`'s order: dtype, then dense or CSR) the share
    ``part`` = (k, n) fits on: the k-th of n runs of them (none when n is above ``n_kinds``). A kernel compiles a
    signature for each dtype and layout it meets, so shares of different kinds compile different signatures (by fits'
    settings, the shares would compile the same kernels side by side: 116 signatures for 70). The n shares are every
    kind once."""
    k, n = part
    if not (isinstance(n, int) and isinstance(k, int) and 0 <= k < n):
        raise ValueError(f"part must be (k, n) with 0 <= k < n, got {part!r}")
    return [kind for kind in range(n_kinds) if kind * n // n_kinds == k]


def warm_up(progress=None, part: tuple[int, int] = (0, 1)) -> dict:
    """Compile every kernel signature the registered methods' fits use into numba's cache (the fits of those
    that call kernels of their own). It narrows the CSR step's bands for the whole process while it runs
    (:func:`_narrow_csr_bands`): not while fits run in other threads of the same process (the warm-up's own
    processes, and ``distfact warmup``'s, run nothing else).

    Parameters
    ----------
    progress : callable or None
        Called with a line of text after each method that has numba kernels of its own.
    part : (k, n), default (0, 1)
        Run the k-th of n shares of the fits (those on the data of :func:`_share_of`), so that n processes can fill
        the cache side by side (:func:`warm_up_side_by_side`); (0, 1) is the whole warm-up.

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
    with tempfile.TemporaryDirectory() as scratch, warnings.catch_warnings(), _narrow_csr_bands():
        warnings.simplefilter("ignore", ConvergenceWarning)
        kinds = list(_data())
        share = _share_of(part, len(kinds))
        inputs = [(from_arrays(*data, path), data[0]) for k in share  # in memory and on disk, dense also tall
                  for data in [kinds[k]] + ([_tall(*kinds[k])] if isinstance(kinds[k][0], np.ndarray) else [])
                  for path in (None, f"{scratch}/{k}-{data[0].shape[0]}.zarr")]
        for declaration in methods().values():
            if not declaration.numba_kernels:
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


def _cache_saves_locked(lock_path: str) -> None:
    """Make every numba cache entry this process saves take an exclusive lock on ``lock_path`` first (``flock``).
    numba adds an entry to a kernel's cache by reading the kernel's index, choosing a data file's name and writing
    the index back, with no lock: two processes adding different signatures of one kernel at once could drop one
    from the index, or write both to one data file, so that one signature would load the other's code. The
    warm-up's processes add theirs one at a time."""
    import fcntl

    from numba.core.caching import IndexDataCacheFile

    save = IndexDataCacheFile.save

    def save_locked(self, key, data):
        with open(lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            save(self, key, data)

    IndexDataCacheFile.save = save_locked


def can_share() -> bool:
    """Whether :func:`warm_up_side_by_side` can run here: ``flock`` (POSIX) and numba's ``IndexDataCacheFile.save``,
    which :func:`_cache_saves_locked` locks."""
    import importlib.util

    from numba.core import caching

    return importlib.util.find_spec("fcntl") is not None and callable(
        getattr(getattr(caching, "IndexDataCacheFile", None), "save", None))


def default_processes() -> int:
    """The processes :func:`main` warms up in by default: one per usable core, at most ``MAX_PROCESSES``; 1 where
    the processes cannot share a cache (:func:`can_share`)."""
    from .kernels.blas_threads import usable_cores

    return min(usable_cores(), MAX_PROCESSES) if can_share() else 1


#: What each process of :func:`warm_up_side_by_side` runs: its share, from the same package as the parent's (its
#: directory first on the path; the process starts in an empty directory, so no ``distfact`` folder there is
#: imported instead), its cache saves locked, its summary written as JSON.
_SHARE_SCRIPT = """import json, sys
sys.path.insert(0, {path!r})
from {package}.warmup import _cache_saves_locked, warm_up
_cache_saves_locked({lock!r})
summary = warm_up(progress=(lambda line: print({prefix!r} + line, flush=True)) if {verbose!r} else None,
                  part=({k!r}, {n!r}))
with open({out!r}, "w") as f:
    json.dump(summary, f)
"""


def warm_up_side_by_side(processes: int, verbose: bool = False) -> dict:
    """:func:`warm_up` in ``processes`` new processes of this interpreter at once, each running its share of the fits
    (``part=(k, processes)``), so that the kernels compile on every core, most signatures once. Their cache saves
    take turns (:func:`_cache_saves_locked`); each process writes an entry aside and renames it into place, as numba
    does.

    Parameters
    ----------
    processes : int
        How many processes (1 or more; more than ``KINDS`` start ``KINDS``, as a process more would fit nothing).
    verbose : bool, default False
        Whether each process prints its progress lines (prefixed with its share) to standard output.

    Returns
    -------
    dict
        As :func:`warm_up`'s, the shares' counts added up (a signature two shares both compile counts twice);
        ``seconds`` is the wall time of the whole, ``processes`` how many ran.

    Raises
    ------
    WarmupFailed
        When a process fails, naming its share and exit status (its error is on standard error), or where the
        processes cannot share a cache (:func:`can_share`).
    """
    if not (isinstance(processes, int) and processes >= 1):
        raise ValueError(f"processes must be an integer of 1 or more, got {processes!r}")
    if not can_share():
        raise WarmupFailed("the warm-up cannot run in several processes here: it needs flock (POSIX) and numba's "
                           "IndexDataCacheFile.save to lock numba's cache saves")
    processes = min(processes, KINDS)
    start = time.perf_counter()
    path = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory() as scratch:
        lock, outs = os.path.join(scratch, "cache.lock"), [os.path.join(scratch, f"share-{k}.json")
                                                             for k in range(processes)]
        children = []
        try:
            for k, out in enumerate(outs):
                children.append(subprocess.Popen([sys.executable, "-c", _SHARE_SCRIPT.format(
                    path=path, package=__package__, lock=lock, prefix=f"[{k + 1}/{processes}] ", verbose=verbose,
                    k=k, n=processes, out=out)], cwd=scratch, stdout=None if verbose else subprocess.DEVNULL))
            statuses = [child.wait() for child in children]
        finally:  # an interrupt, or a process that could not start: none left compiling into the scratch directory
            running = [child for child in children if child.poll() is None]
            for child in running:
                child.terminate()
            for child in running:
                try:
                    child.wait(STOP_SECONDS)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
        failed = [f"{k + 1}/{processes} (exit status {status})" for k, status in enumerate(statuses) if status]
        if failed:
            raise WarmupFailed(f"the warm-up's share {', '.join(failed)} failed; see its error above")
        summaries = []
        for out in outs:
            with open(out) as f:
                summaries.append(json.load(f))
    compiled = {}
    for summary in summaries:
        for kernel, count in summary["compiled"].items():
            compiled[kernel] = compiled.get(kernel, 0) + count
    return {"fits": sum(s["fits"] for s in summaries), "refused": sum(s["refused"] for s in summaries),
            "compiled": compiled, "cache": sorted({d for s in summaries for d in s["cache"]}),
            "seconds": time.perf_counter() - start, "processes": processes}


def summary_line(summary: dict) -> str:
    """One line saying what a warm-up (:func:`warm_up_side_by_side`'s summary, or :func:`warm_up`'s with
    ``processes``) did."""
    processes = summary["processes"]
    return (f"{summary['fits']} fits; {sum(summary['compiled'].values())} kernel signatures compiled into "
            f"{', '.join(summary['cache'])} ({summary['seconds']:.1f} s, {processes} process"
            f"{'es' if processes > 1 else ''}); the rest were there already")


def main(processes: int | None = None) -> None:
    """``distfact warmup`` and setup.py's build step (``python -m distfact.warmup``): warm up, saying so; in a process
    per usable core, at most ``MAX_PROCESSES`` (:func:`warm_up_side_by_side`), unless ``processes`` says how many (1:
    in this process)."""
    processes = default_processes() if processes is None else processes
    if processes == 1:
        summary = {**warm_up(progress=print), "processes": 1}
    else:
        summary = warm_up_side_by_side(processes, verbose=True)
    print(summary_line(summary))


if __name__ == "__main__":
    main()
