"""Arrays at a 64-byte boundary, so that BLAS takes the same code path wherever a block runs.

BLAS kernels take alignment-dependent code paths whose rounding differs; numpy's large
arrays start 16 bytes into a page, and arrays that arrive by pickling (on workers, or
statistics coming back) sit at arbitrary offsets. Aligning every input of a block task and
of the global step makes a result independent of where it ran. Dense blocks of X are
aligned once, where they are read or staged (``store/reading.py``, ``store/ingest.py``), so that the passes
never copy them.

Small fits align tens of arrays per iteration (issue 19): an aligned array costs a look at its address, and
the small arrays of one container (a block's statistics, a global state) that need copying share one aligned
allocation, each of them at a 64-byte boundary in it.
"""

from __future__ import annotations

import math

import numpy as np

ALIGNMENT = 64
#: arrays of a container below this size that need a copy share one allocation (larger ones get their own, so
#: that no large array is held alive by a small one, nor all of a pass's large arrays copied at once)
SHARED_BELOW_BYTES = 1 << 16


def address(array: np.ndarray) -> int:
    """Where ``array``'s data start (``__array_interface__`` is cheaper than ``ctypes.data``)."""
    return array.__array_interface__["data"][0]


def is_aligned(array: np.ndarray) -> bool:
    """C-contiguous, starting at a 64-byte boundary."""
    return array.flags.c_contiguous and address(array) % ALIGNMENT == 0


def empty_aligned(shape, dtype) -> np.ndarray:
    """An uninitialised C-contiguous array whose data start at a 64-byte boundary."""
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    size, itemsize = math.prod(shape), dtype.itemsize
    if itemsize and ALIGNMENT % itemsize == 0:  # a buffer of the dtype itself, cut at an item boundary
        buffer = np.empty(size + ALIGNMENT // itemsize, dtype=dtype)
        skip = (-address(buffer)) % ALIGNMENT
        if skip % itemsize == 0:
            return buffer[skip // itemsize:skip // itemsize + size].reshape(shape)
    nbytes = size * itemsize
    buffer = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    offset = (-address(buffer)) % ALIGNMENT
    return buffer[offset:offset + nbytes].view(dtype).reshape(shape)


def aligned_copy(array: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of ``array`` at a 64-byte boundary."""
    out = empty_aligned(array.shape, array.dtype)
    np.copyto(out, array)
    return out


def aligned(value):
    """``value`` with every numpy array in it (also inside dicts, lists, tuples) C-contiguous at a
    64-byte boundary: arrays already so are returned as they are, others copied; a container comes back
    as it is when none of its items was copied, else rebuilt around the copies."""
    if isinstance(value, np.ndarray):
        return value if is_aligned(value) else aligned_copy(value)
    pending: dict[int, np.ndarray] = {}
    _collect_unaligned(value, pending)
    if not pending:
        return value
    return _with_copies(value, _copies(list(pending.values())))


def _collect_unaligned(value, pending: dict) -> None:
    if isinstance(value, np.ndarray):
        if not is_aligned(value):
            pending[id(value)] = value
    elif isinstance(value, dict):
        for item in value.values():
            _collect_unaligned(item, pending)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _collect_unaligned(item, pending)


def _copies(arrays: list) -> dict[int, np.ndarray]:
    """Aligned copies of ``arrays`` by id: the small ones cut from one allocation, the others each in its own."""
    out, shared = {}, []
    for array in arrays:
        if array.nbytes < SHARED_BELOW_BYTES and not array.dtype.hasobject:
            shared.append(array)
        else:
            out[id(array)] = aligned_copy(array)
    if shared:
        spans = [-(-array.nbytes // ALIGNMENT) * ALIGNMENT for array in shared]
        buffer = empty_aligned(sum(spans), np.uint8)
        start = 0
        for array, span in zip(shared, spans):
            copy = buffer[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
            np.copyto(copy, array)
            out[id(array)] = copy
            start += span
    return out


def _with_copies(value, copies: dict):
    """``value`` with the arrays of ``copies`` replaced; containers rebuilt only where something was."""
    if isinstance(value, np.ndarray):
        return copies.get(id(value), value)
    if isinstance(value, dict):
        out = None
        for key, item in value.items():
            new = _with_copies(item, copies)
            if new is not item:
                if out is None:
                    out = dict(value)
                out[key] = new
        return value if out is None else out
    if isinstance(value, (list, tuple)):
        items = [_with_copies(item, copies) for item in value]
        if all(new is old for new, old in zip(items, value)):
            return value
        return items if type(value) is list else type(value)(items)
    return value
