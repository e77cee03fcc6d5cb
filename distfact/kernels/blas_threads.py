"""Work split into pieces that run on BLAS's threads, each piece calling BLAS on one thread.

A kernel that tiles a block (so that each tile of X is read from memory once and multiplied while it
is in cache) makes products too small for multi-threaded BLAS; running the pieces side by side, each
with single-threaded BLAS, uses the cores instead. The pieces are fixed by the caller, never by the
number of threads, so that results do not depend on where or how a block runs. Where BLAS is already
held at one thread (blocks running in parallel threads, or on the workers of a cluster) the pieces run
one after the other in the calling thread. A fit whose driver makes small products only may hold BLAS at one thread
for its whole loop and have its pieces on as many threads as BLAS had (:func:`pieces_on_cores`). Every hold of BLAS
at one thread goes through one counted limit (:func:`hold_one_thread`).

The driver's own sweeps between passes (no BLAS in them) run on the cores whatever BLAS's limit
(:func:`map_on_cores`), in pieces fixed by the caller likewise.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import os
import threading

_state = threading.Lock()
_blas = None  # threadpoolctl's controller of the loaded BLAS libraries, made at first use
_pool = None
_in_piece = threading.local()  # set in the pool's threads while they run a piece: a call from there runs inline
_holds = 0  # holds of BLAS at one thread (``hold_one_thread``)
_hold_limiter = None  # threadpoolctl's limit to one thread while there is one
_fit_holding = threading.local()  # ``threads``: BLAS's threads before this thread's ``pieces_on_cores``, else 0


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the platform has one, else ``os.cpu_count()``)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def _controller():
    global _blas
    with _state:
        if _blas is None:
            import scipy.linalg  # noqa: F401  (numba's products call scipy's BLAS: load it before looking)
            from threadpoolctl import ThreadpoolController

            _blas = ThreadpoolController().select(user_api="blas")
        return _blas


#: OpenBLAS's core types whose builds have small-matrix GEMM kernels (AVX-512): OpenBLAS runs a product of at most
#: ``SMALL_PRODUCT`` multiply-adds (m n k) with them rather than with its packed, blocked GEMM (its
#: ``gemm_small_kernel_permit`` for these cores; a product with A transposed and B not has further conditions)
SMALL_KERNEL_CORES = frozenset({"SkylakeX", "Cooperlake", "SapphireRapids"})
SMALL_PRODUCT = 100 ** 3


@functools.cache
def small_product_limit() -> int:
    """The most multiply-adds (m n k) of a product that the BLAS of numba's products runs with small-matrix kernels:
    ``SMALL_PRODUCT`` where that BLAS is an OpenBLAS of a core type in ``SMALL_KERNEL_CORES``, else 0 (none known). That
    BLAS is scipy's (numba's ``np.dot`` calls ``scipy.linalg.cython_blas``): the one scipy's wheel bundles, else, where
    scipy uses a BLAS of the system or of conda, every BLAS loaded when distfact first looks must qualify. So a library
    loaded later by another package (cvxpy's solvers bundle their own OpenBLAS) does not change the answer, and every
    process on one machine takes the same runs. The core type is OpenBLAS's choice for the processor (or
    ``OPENBLAS_CORETYPE``'s)."""
    import scipy

    libraries = _controller().lib_controllers
    bundled = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(scipy.__file__))), "scipy.libs")
    scipys = [library for library in libraries if os.path.dirname(os.path.abspath(library.filepath)) == bundled]
    infos = [library.info() for library in scipys or libraries]
    if infos and all(info["internal_api"] == "openblas" and info.get("architecture") in SMALL_KERNEL_CORES
                     for info in infos):
        return SMALL_PRODUCT
    return 0


def blas_threads() -> int:
    """The number of threads BLAS would use now (the largest over the loaded BLAS libraries)."""
    return max((lib.num_threads for lib in _controller().lib_controllers), default=1)


def map_on_blas_threads(fn, items: list) -> list:
    """``[fn(item) for item in items]``, in order, computed on as many threads as BLAS has (BLAS held at
    one thread meanwhile: :func:`hold_one_thread`), or within this thread's :func:`pieces_on_cores` on as many as BLAS
    had when it began. The first exception, in item order, is raised once every piece has ended."""
    held = getattr(_fit_holding, "threads", 0)
    n_threads = min(held or blas_threads(), len(items))
    if n_threads <= 1:
        return [fn(item) for item in items]
    if held:
        return _on_threads(fn, items, n_threads)
    return _on_threads_blas_held(fn, items, n_threads)


def _on_threads_blas_held(fn, items: list, n_threads: int) -> list:
    """:func:`_on_threads` with BLAS held at one thread meanwhile."""
    hold_one_thread()
    try:
        return _on_threads(fn, items, n_threads)
    finally:
        release_one_thread()


def hold_one_thread() -> None:
    """Limit BLAS to one thread until the matching :func:`release_one_thread`. Counted, one limit for the process:
    BLAS's limits of before the first hold come back when the last hold ends, in whatever order the holds
    (parallel-block executors, :func:`map_on_blas_threads`' calls, fits in :func:`pieces_on_cores`) end."""
    global _holds, _hold_limiter
    controller = _controller()
    with _state:
        if not _holds:
            _hold_limiter = controller.limit(limits=1)
        _holds += 1


def release_one_thread() -> None:
    global _holds, _hold_limiter
    with _state:
        _holds -= 1
        if not _holds:
            _hold_limiter.restore_original_limits()
            _hold_limiter = None


@contextlib.contextmanager
def pieces_on_cores():
    """BLAS held at one thread (:func:`hold_one_thread`), and :func:`map_on_blas_threads`' pieces called from this
    thread run on as many threads as BLAS had: for a fit that does its heavy work in such pieces and between them
    makes small products only (a fit of the tiled dense NMF step, ``methods/nmf.py: passes_on_cores``;
    ``engine/driver.py``). Without it, the driver's products between two passes (r x n: large enough for OpenBLAS
    to thread) wake BLAS's worker threads, which then spin for a while (OpenBLAS's thread timeout) on the cores the
    next pass's pieces need: an MU iteration on 20,000 x 2,000 in float64, rank 20, took 108-110 ms against 66-73
    held. Where BLAS is on one thread already (the user's limit, another fit's hold), it does nothing."""
    threads = blas_threads()
    if threads <= 1 or getattr(_fit_holding, "threads", 0):
        yield
        return
    hold_one_thread()
    _fit_holding.threads = threads
    try:
        yield
    finally:
        _fit_holding.threads = 0
        release_one_thread()


def map_on_cores(fn, items: list, blas: bool = False) -> list:
    """``[fn(item) for item in items]``, in order, computed on as many threads as the process has cores
    (:func:`usable_cores`, as BLAS's own default), whatever BLAS's limit: for the driver's work between passes
    (nothing else of the fit runs then; an in-process executor whose blocks run in parallel threads keeps BLAS on one
    thread for the whole fit, so :func:`map_on_blas_threads` would run it in one thread), in pieces fixed by the
    caller, so that the results do not depend on the number of cores: compiled ``nogil`` kernels, or with ``blas``
    BLAS products too, BLAS then held at one thread (:func:`hold_one_thread`) unless it is already. An estimator's
    ``n_threads`` sets its executor's block threads, not these (nor a dense block's tiles on BLAS's threads). The
    first exception, in item order, is raised once every piece has ended."""
    n_threads = min(usable_cores(), len(items))
    if n_threads <= 1:
        return [fn(item) for item in items]
    if not blas or _holds:
        return _on_threads(fn, items, n_threads)
    return _on_threads_blas_held(fn, items, n_threads)


def _on_threads(fn, items: list, n_threads: int) -> list:
    """``[fn(item) for item in items]`` on ``n_threads`` threads of the shared pool, each taking the next piece when
    free; the first exception, in item order, raised once every piece has ended. Called from a piece (a nested map),
    the pieces run inline: waiting on the pool from its own threads could wait for ever."""
    if getattr(_in_piece, "active", False):
        return [fn(item) for item in items]
    global _pool
    with _state:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="distfact-tiles")
    pending = iter(range(len(items)))  # shared by the threads: each takes the next piece when free
    results: list = [None] * len(items)
    errors: list = [None] * len(items)

    def work():
        _in_piece.active = True
        try:
            for index in pending:
                try:
                    results[index] = fn(items[index])
                except BaseException as error:  # noqa: BLE001  (re-raised below, in item order)
                    errors[index] = error
        finally:
            _in_piece.active = False

    concurrent.futures.wait([_pool.submit(work) for _ in range(n_threads)])
    for error in errors:
        if error is not None:
            raise error
    return results
