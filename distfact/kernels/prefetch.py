"""A software prefetch for numba kernels that gather or scatter rows of a factor at a sparse matrix's column indices.

A CSR sweep reads row ``indices[p]`` of an n x r factor for every stored entry: rows at random, which the
hardware's prefetchers cannot predict, so each one not in cache stalls the sweep. ``prefetch_row(A, i)`` asks the
processor to start loading row i of A (every cache line of it) some entries before the sweep reaches it
(``PREFETCH_DISTANCE``). It is a hint: it changes no value, and it cannot fault (x86's PREFETCHT0, ARM's PRFM), so
an index past the array's end costs nothing but a wasted load.

Measured on the sparse MU benchmark's matrix (100,000 x 20,000 at 0.5%, r = 20, one thread): the fused CSR step of
``kernels/nmf.py`` 0.30 -> 0.26 s with this alone; with its entries taken two at a time (as it was then), a distance
of 8 entries 0.233 s, of 4 0.240 s. ``emit_prefetch_row`` is the same code for intrinsics that prefetch rows inside
their own loops (``kernels/row_vectors.py: gather_row``).

numba's on-disk cache of a kernel that calls ``prefetch_row`` (or an intrinsic built on it) is keyed on the kernel's
own source file: after changing this file or ``row_vectors.py`` (``PREFETCH_DISTANCE`` is compiled into the kernels
as a constant), remove the cached kernels
(``distfact/kernels/__pycache__/*.nb[ic]``) of a source tree; an installed package is compiled anew when built.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

#: How many stored entries ahead of the one being read a sweep prefetches.
PREFETCH_DISTANCE = 8
_CACHE_LINE = 64


@intrinsic
def prefetch_row(typingctx, array, row):
    """Prefetch every cache line of ``array[row]`` (a C-contiguous 2-D array) into all cache levels; returns
    nothing."""
    if not (isinstance(array, types.Array) and array.ndim == 2 and array.layout == "C"
            and isinstance(row, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        array_type, row_type = signature.args
        view = context.make_array(array_type)(context, builder, args[0])
        index = context.cast(builder, args[1], row_type, types.intp)
        shape = cgutils.unpack_tuple(builder, view.shape)
        start = cgutils.get_item_pointer2(context, builder, data=view.data, shape=shape,
                                          strides=cgutils.unpack_tuple(builder, view.strides),
                                          layout=array_type.layout, inds=[index, context.get_constant(types.intp, 0)],
                                          wraparound=False)
        itemsize = context.get_constant(types.intp, context.get_abi_sizeof(context.get_data_type(array_type.dtype)))
        emit_prefetch_row(builder, start, builder.mul(shape[1], itemsize))
        return context.get_dummy_value()

    return types.void(array, row), codegen


def emit_prefetch_row(builder, start, row_bytes) -> None:
    """Emit prefetches of every cache line of the ``row_bytes`` bytes (an intp value) from pointer ``start``, into
    all cache levels: ``prefetch_row``'s code, for intrinsics that prefetch rows of their own
    (``kernels/row_vectors.py``)."""
    byte_pointer = ir.IntType(8).as_pointer()
    prefetch = builder.module.declare_intrinsic(
        "llvm.prefetch", [byte_pointer],
        ir.FunctionType(ir.VoidType(), [byte_pointer, ir.IntType(32), ir.IntType(32), ir.IntType(32)]))
    first = builder.bitcast(start, byte_pointer)
    # read (0), keep in every level (3), data (1)
    hint = [ir.Constant(ir.IntType(32), value) for value in (0, 3, 1)]
    intp = row_bytes.type
    line = ir.Constant(intp, _CACHE_LINE)
    with cgutils.for_range_slice(builder, ir.Constant(intp, 0), row_bytes, line) as (offset, _):
        builder.call(prefetch, [builder.gep(first, [offset]), *hint])
    # the row's last byte: a row not starting on a line's boundary ends on one line more
    builder.call(prefetch, [builder.gep(first, [builder.sub(row_bytes, ir.Constant(intp, 1))]), *hint])
