"""Arrays at a 64-byte boundary, so that BLAS takes the same code path wherever a block runs.

BLAS kernels take alignment-dependent code paths whose rounding differs; numpy's large
arrays start 16 bytes into a page, and arrays that arrive by pickling (on workers, or
statistics coming back) sit at arbitrary offsets. Aligning every input of a block task and
of the global step makes a result independent of where it ran. Dense blocks of X are
aligned once, where they are read or staged (``store/reading.py``, ``store/ingest.py``), so that the passes
never copy them.
"""

from __future__ import annotations

import numpy as np

ALIGNMENT = 64


def empty_aligned(shape, dtype) -> np.ndarray:
    """An uninitialised C-contiguous array whose data start at a 64-byte boundary."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    buffer = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    offset = (-buffer.ctypes.data) % ALIGNMENT
    return buffer[offset:offset + nbytes].view(dtype).reshape(shape)


def aligned(value):
    """``value`` with every numpy array in it (also inside dicts, lists, tuples) C-contiguous at a
    64-byte boundary: arrays already so are returned as they are, others copied."""
    if isinstance(value, np.ndarray):
        if value.ctypes.data % ALIGNMENT == 0 and value.flags.c_contiguous:
            return value
        out = empty_aligned(value.shape, value.dtype)
        out[...] = value
        return out
    if isinstance(value, dict):
        return {key: aligned(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(aligned(item) for item in value)
    return value
