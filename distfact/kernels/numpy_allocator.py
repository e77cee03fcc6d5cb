"""A numpy memory handler (NEP 49) that starts every allocation at a 64-byte boundary.

The engine aligns every input of a block step and of a global step (``memory.py``: BLAS's rounding depends on where
an array starts), by copying whatever does not start at a 64-byte boundary. Small fits make their arrays anew every
iteration (products, updates, statistics), and copying them cost a fifth of a 400 x 100 NMF iteration (issue 19).
With this handler set, numpy allocates them aligned in the first place: a fit's thread sets it for the fit
(:func:`memory.numpy_allocates_aligned`), and an array that owns memory from it (``get_handler_name``) needs no copy
and no look at its address.

The four functions numpy calls (``malloc``, ``calloc``, ``realloc``, ``free``, each with numpy's context pointer
first) are numba ``cfunc``\\ s over the C library's ``malloc``, ``calloc``, ``free``, ``memcpy`` and
``malloc_usable_size`` (glibc), compiled into numba's cache like the kernels (``warmup.py`` imports this module).
Each allocation asks the C library for 72 bytes more than numpy's size, hands numpy the first 64-byte boundary at
least 8 bytes in, and keeps the C library's pointer in the 8 bytes before it (for ``free`` and ``realloc``): so a
large ``np.zeros`` is still the C library's ``calloc``, whose fresh pages the kernel zeroes when first touched (an
``aligned_alloc`` and a memset wrote 128 MB of zeros in 109 ms, against 32 µs); blocks of 4 MiB or more are offered
transparent huge pages, as numpy's own handler offers them; a ``realloc`` always moves (numpy's own may grow in
place: numpy reallocates only in ``resize``, ``fromiter`` and text readers). The handler is set through numpy's C
API (``PyDataMem_SetHandler``, entry 304 of its table since numpy 1.22) by ctypes: no compiler at install time.
:func:`handler` checks that numpy then allocates through it at 64-byte boundaries, and gives None (the engine copies
as before) when anything differs.

Importing this module compiles (or loads from numba's cache) the four functions: ``memory.py`` imports it on the
first fit, not at ``import distfact``.
"""

from __future__ import annotations

import ctypes

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic

try:
    from numpy._core import _multiarray_umath
    from numpy._core.multiarray import get_handler_name
except ImportError:  # numpy 1.x
    from numpy.core import _multiarray_umath
    from numpy.core.multiarray import get_handler_name

#: the handler's name, as ``numpy._core.multiarray.get_handler_name`` reports it for the arrays it allocated
NAME = "distfact_aligned_64"
ALIGNMENT = 64
#: ``PyDataMem_SetHandler``'s entry in numpy's C API table since numpy 1.22 (numpy_api.py; entries are never
#: renumbered; distfact requires numpy 1.26)
SET_HANDLER_ENTRY = 304

_size = types.uintp  # size_t, and pointers as integers (numba has no arithmetic or truth test on void*)
_c_malloc = types.ExternalFunction("malloc", _size(_size))
_c_calloc = types.ExternalFunction("calloc", _size(_size, _size))
_c_free = types.ExternalFunction("free", types.void(_size))
_usable_size = types.ExternalFunction("malloc_usable_size", _size(_size))
_memcpy = types.ExternalFunction("memcpy", _size(_size, _size, _size))
_madvise = types.ExternalFunction("madvise", types.intc(_size, _size, types.intc))
_MADV_HUGEPAGE = np.intc(14)  # Linux's
# size_t constants (numba types a Python int as int64, and int64 with uint64 as float64)
_WORD = np.uintp(8)
_LOW_BITS = np.uintp(ALIGNMENT - 1)
#: what an allocation asks the C library for beyond numpy's size: the header word and up to 63 bytes to a boundary
_EXTRA = _WORD + _LOW_BITS
#: numpy's own handler advises huge pages from 4 MiB (``indicate_hugepages``), over whole 4 KiB pages
_HUGE_PAGES_FROM = np.uintp(4 << 20)
_PAGE_LOW_BITS = np.uintp(4096 - 1)


@intrinsic
def _word_at(typingctx, address):
    """The size_t stored at ``address``."""
    def codegen(context, builder, signature, args):
        word = context.get_value_type(types.uintp)
        return builder.load(builder.inttoptr(args[0], word.as_pointer()))
    return types.uintp(types.uintp), codegen


@intrinsic
def _set_word_at(typingctx, address, value):
    """Store the size_t ``value`` at ``address``."""
    def codegen(context, builder, signature, args):
        word = context.get_value_type(types.uintp)
        builder.store(args[1], builder.inttoptr(args[0], word.as_pointer()))
        return context.get_dummy_value()
    return types.void(types.uintp, types.uintp), codegen


@numba.njit(cache=True)
def _padded(size):
    """What to ask the C library for to hand numpy ``size`` bytes (0: more than size_t holds)."""
    padded = size + _EXTRA
    return padded if padded > size else np.uintp(0)


@numba.njit(cache=True)
def _aligned_in(block, padded):
    """The first 64-byte boundary at least 8 bytes into the C library's ``block`` of ``padded`` bytes (0: none), the
    block's pointer stored in the 8 bytes before it. A block of 4 MiB or more is offered transparent huge pages, as
    numpy's own handler offers them (its whole pages; the advice is only advice: its result is not looked at)."""
    if block == 0:
        return block
    start = (block + _WORD + _LOW_BITS) & ~_LOW_BITS
    _set_word_at(start - _WORD, block)
    if padded >= _HUGE_PAGES_FROM:
        first = (block + _PAGE_LOW_BITS) & ~_PAGE_LOW_BITS
        _madvise(first, (block + padded - first) & ~_PAGE_LOW_BITS, _MADV_HUGEPAGE)
    return start


@numba.cfunc(_size(_size, _size), cache=True)
def _malloc(context, size):
    padded = _padded(size)
    return _aligned_in(_c_malloc(padded), padded) if padded != 0 else padded


@numba.cfunc(_size(_size, _size, _size), cache=True)
def _calloc(context, n_elements, element_size):
    size = n_elements * element_size
    if element_size != 0 and size // element_size != n_elements:  # more than size_t holds
        return np.uintp(0)
    padded = _padded(size)
    return _aligned_in(_c_calloc(np.uintp(1), padded), padded) if padded != 0 else padded


@numba.cfunc(_size(_size, _size, _size), cache=True)
def _realloc(context, pointer, size):
    """A new allocation holding the old one's bytes (the C library's realloc would move them to its own alignment);
    the old one is freed only once copied, as realloc leaves it when it fails."""
    padded = _padded(size)
    if padded == 0:
        return padded
    moved = _aligned_in(_c_malloc(padded), padded)
    if moved != 0 and pointer != 0:
        block = _word_at(pointer - _WORD)
        kept = _usable_size(block) - (pointer - block)
        _memcpy(moved, pointer, kept if kept < size else size)
        _c_free(block)
    return moved


@numba.cfunc(types.void(_size, _size, _size), cache=True)
def _release(context, pointer, size):
    if pointer != 0:
        _c_free(_word_at(pointer - _WORD))


class _Allocator(ctypes.Structure):  # PyDataMemAllocator
    _fields_ = [("ctx", ctypes.c_void_p), ("malloc", ctypes.c_void_p), ("calloc", ctypes.c_void_p),
                ("realloc", ctypes.c_void_p), ("free", ctypes.c_void_p)]


class _Handler(ctypes.Structure):  # PyDataMem_Handler, version 1
    _fields_ = [("name", ctypes.c_char * 127), ("version", ctypes.c_uint8), ("allocator", _Allocator)]


def _python_function(name: str, restype, *argtypes):
    """A function of Python's C API with its own prototype (``ctypes.pythonapi``'s attributes are shared by every
    user in the process: setting their argtypes would change them for others)."""
    return ctypes.PYFUNCTYPE(restype, *argtypes)((name, ctypes.pythonapi))


def _immortal(value):
    """``value``, with a reference nobody releases: numpy keeps a pointer to the handler in every array it allocated
    and the capsule one to its name, and arrays are freed after this module's globals at the interpreter's exit."""
    _python_function("Py_IncRef", None, ctypes.py_object)(value)
    return value


_HANDLER = _immortal(_Handler(NAME.encode(), 1, _Allocator(None, _malloc.address, _calloc.address, _realloc.address,
                                                           _release.address)))
_CAPSULE_NAME = _immortal(ctypes.create_string_buffer(b"mem_handler"))


def _capsule():
    new = _python_function("PyCapsule_New", ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
    return new(ctypes.addressof(_HANDLER), ctypes.cast(_CAPSULE_NAME, ctypes.c_char_p), None)


def _set_handler_function():
    """numpy's ``PyDataMem_SetHandler(handler) -> previous handler`` (for this context: numpy keeps it in a context
    variable, so each thread has its own)."""
    pointer = _python_function("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)
    table = ctypes.cast(pointer(_multiarray_umath._ARRAY_API, None), ctypes.POINTER(ctypes.c_void_p))
    return ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.py_object)(table[SET_HANDLER_ENTRY])


def handler():
    """``(set_handler, capsule)``: numpy's setter and this handler, once checked (set in this thread, an array made,
    its memory from the handler at a 64-byte boundary, the previous handler set again); None if any of it differs."""
    set_handler, capsule = _set_handler_function(), _capsule()
    previous = set_handler(capsule)
    try:
        probe = np.empty(3)
        works = (get_handler_name() == NAME and get_handler_name(probe) == NAME
                 and probe.__array_interface__["data"][0] % ALIGNMENT == 0)
    finally:
        set_handler(previous)
    return (set_handler, capsule) if works else None
