"""BLAS's gemm with a beta, for numba kernels: ``gemm_into(A, B, C, beta)`` sets C = A B + beta C.

numba's ``np.dot(A, B, out)`` calls the same gemm (scipy's, through numba's ``numba_xxgemm``) with beta = 0, so a
kernel that sums products, sum_t A_t B_t into C, makes each into a scratch array and adds it to C: for the dense
NMF step's W_t^T X_t at rank 20 and 2,000 columns, an r x n read twice and written once per product, about a fifth
of the product's own time. With beta = 1 the product is added where it is made, and the kernel may split it into
products small enough for OpenBLAS's small-matrix kernels (``blas_threads.small_product_limit``), which take a beta
as well. ``gemm_into`` is a compiled call, as ``np.dot``'s: it allocates nothing and holds no GIL.

numba's on-disk cache of a kernel that calls ``gemm_into`` is keyed on the kernel's own source file: after changing
this file, remove the cached kernels (``distfact/kernels/__pycache__/*.nb[ic]``) of a source tree; an installed
package is compiled anew when built.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.linalg import ensure_blas

_CHAR = ir.IntType(8)
_VOID_P = ir.IntType(8).as_pointer()
_KINDS = {types.float64: "d", types.float32: "s"}


@intrinsic
def gemm_into(typingctx, A, B, C, beta):
    """C = A B + beta C for 2-D arrays of one dtype (float64 or float32): A and B C- or F-contiguous (a row range of
    a C-contiguous array, or the transpose of one), C C-contiguous; beta a number. The shapes are not checked: the
    caller's (m x k, k x n, m x n)."""
    arrays = (A, B, C)
    if not (all(isinstance(t, types.Array) and t.ndim == 2 and t.layout in "CF" for t in arrays)
            and A.dtype == B.dtype == C.dtype and C.dtype in _KINDS and C.layout == "C"
            and isinstance(beta, (types.Float, types.Integer))):
        return None
    dtype = C.dtype

    def codegen(context, builder, signature, args):
        ensure_blas()
        intp = context.get_value_type(types.intp)
        function = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(ir.IntType(32), [_CHAR, _CHAR, _CHAR, intp, intp, intp, _VOID_P, _VOID_P, intp, _VOID_P,
                                             intp, _VOID_P, _VOID_P, intp]),
            "numba_xxgemm")
        a, b, c = (context.make_array(t)(context, builder, value) for t, value in zip(arrays, args))
        itemsize = ir.Constant(intp, context.get_abi_sizeof(context.get_data_type(dtype)))
        m, k = cgutils.unpack_tuple(builder, a.shape)
        n = cgutils.unpack_tuple(builder, b.shape)[1]

        def operand(array_type, array):
            """(transpose flag, leading dimension) in BLAS's column-major terms, where row-major C = A B is
            C^T = B^T A^T: a C-contiguous operand is its own transpose there, an F-contiguous one is transposed."""
            strides = cgutils.unpack_tuple(builder, array.strides)
            if array_type.layout == "C":
                return ir.Constant(_CHAR, ord("n")), builder.sdiv(strides[0], itemsize)
            return ir.Constant(_CHAR, ord("t")), builder.sdiv(strides[1], itemsize)

        trans_b, ld_b = operand(B, b)
        trans_a, ld_a = operand(A, a)
        ld_c = builder.sdiv(cgutils.unpack_tuple(builder, c.strides)[0], itemsize)
        value_type = context.get_value_type(dtype)
        alpha = cgutils.alloca_once_value(builder, ir.Constant(value_type, 1.0))
        beta_slot = cgutils.alloca_once_value(builder, context.cast(builder, args[3], signature.args[3], dtype))
        status = builder.call(function, (
            ir.Constant(_CHAR, ord(_KINDS[dtype])), trans_b, trans_a, n, m, k, builder.bitcast(alpha, _VOID_P),
            builder.bitcast(b.data, _VOID_P), ld_b, builder.bitcast(a.data, _VOID_P), ld_a,
            builder.bitcast(beta_slot, _VOID_P), builder.bitcast(c.data, _VOID_P), ld_c))
        with builder.if_then(cgutils.is_not_null(builder, status), likely=False):
            # numba's own products end the same way: the wrapper fails only without scipy's BLAS
            python = context.get_python_api(builder)
            python.gil_ensure()
            python.fatal_error("BLAS wrapper returned with an error")
        return context.get_dummy_value()

    return types.none(A, B, C, beta), codegen
