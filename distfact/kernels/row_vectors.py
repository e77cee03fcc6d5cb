"""Vector code for numba kernels that gather and scatter rows of an n x r factor at a sparse matrix's indices.

A CSR sweep (``kernels/nmf.py: _csr_frobenius_local``) adds, for every stored entry x_ij, x_ij times row j of H^T
into the row's sum (the gather) and x_ij times row i of W into row j of (W^T X)^T (the scatter). Written as numba
loops over the r entries of a row, LLVM makes each of those short loops a vector loop behind run-time checks that the
two rows do not overlap, with a scalar tail (at r = 20 with 4-wide vectors twice unrolled, 16 entries in vectors and
4 one by one), and keeps the row's sum in memory, so each entry's gather waits for the previous one's store. These
two intrinsics emit the vector code themselves, in 64-byte vectors (8 float64 or 16 float32; LLVM splits them for
narrower processors):

- ``gather_row(out, i, data, indices, start, stop, src)``: row i of ``out`` = the sum over p in [start, stop) of
  data[p] src[indices[p]], the sum in registers (``GATHER_VECTORS`` vectors of r's entries at a time, lanes past r
  masked), with row indices[p + PREFETCH_DISTANCE] of ``src`` prefetched (``kernels/prefetch.py``);
- ``gather_row_onto``: the same sum continued from row i of ``out`` (a row gathered in runs, band by band);
- ``add_scaled_row(dst, i, a, src, j)``: row i of ``dst`` += a row j of ``src``, in full vectors, then one of half
  width, then one entry at a time.

Both use ``llvm.fmuladd`` (a fused multiply-add where the processor has one), as the numba loops compiled with
``fastmath`` do: on the sparse MU benchmark's matrix the step gives the same bits as those loops. Factor arrays are
2-D, C-contiguous, float64 or float32 (one dtype); ``data`` and ``indices`` are contiguous; row indices are not
checked against the arrays' shapes (the callers' come from validated CSR blocks). Measured on the sparse MU
benchmark's matrix (100,000 x 20,000 at 0.5%, r = 20, Emerald Rapids): the fused step alone on one thread 0.84-0.92
of the numba loops' time (medians of 12 alternated runs), 0.58-0.80 with H^T's rows all in cache (columns taken
modulo 2,000), 0.946 in ``bench_sparse_sweep.py``'s thread CPU time (50,000 rows); a fit's MU iteration 0.145 ->
0.114 s (``bench_nmf.py --cases sparse --mu-only``).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .prefetch import PREFETCH_DISTANCE, emit_prefetch_row

#: Vectors of accumulators ``gather_row`` keeps in registers: 32 float64 or 64 float32 entries of a row per sweep of
#: its stored entries (a rank above that sweeps them again for each further 32 or 64).
GATHER_VECTORS = 4
_VECTOR_BYTES = 64
_I32 = ir.IntType(32)


def _is_row_array(array, written: bool = False) -> bool:
    return (isinstance(array, types.Array) and array.ndim == 2 and array.layout == "C"
            and array.dtype in (types.float64, types.float32) and (array.mutable or not written))


def _suffix(vector: ir.VectorType) -> str:
    return f"v{vector.count}{'f64' if vector.element == ir.DoubleType() else 'f32'}"


def _fmuladd(builder, vector):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(vector, [vector] * 3),
                                          f"llvm.fmuladd.{_suffix(vector)}")


def _masked_load(builder, vector, mask_type):
    function_type = ir.FunctionType(vector, [vector.as_pointer(), _I32, mask_type, vector])
    return cgutils.get_or_insert_function(builder.module, function_type, f"llvm.masked.load.{_suffix(vector)}.p0")


def _masked_store(builder, vector, mask_type):
    function_type = ir.FunctionType(ir.VoidType(), [vector, vector.as_pointer(), _I32, mask_type])
    return cgutils.get_or_insert_function(builder.module, function_type, f"llvm.masked.store.{_suffix(vector)}.p0")


def _splat(builder, value, vector):
    """``value`` in every lane of a vector of type ``vector``."""
    one = builder.insert_element(ir.Constant(vector, ir.Undefined), value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(one, ir.Constant(vector, ir.Undefined),
                                  ir.Constant(ir.VectorType(_I32, vector.count), [0] * vector.count))


def _row(context, builder, array_type, array_value, row, row_type):
    """(pointer to row ``row``'s first entry, the row's length) of a C-contiguous 2-D array."""
    array = context.make_array(array_type)(context, builder, array_value)
    width = cgutils.unpack_tuple(builder, array.shape)[1]
    index = context.cast(builder, row, row_type, types.intp)
    return builder.gep(array.data, [builder.mul(index, width)]), width


def _vector_at(builder, row, offset, vector):
    return builder.bitcast(builder.gep(row, [offset]), vector.as_pointer())


@intrinsic
def add_scaled_row(typingctx, dst, i, a, src, j):
    """``dst[i, :] += a * src[j, :dst.shape[1]]``; ``src`` has at least as many columns (not checked: every caller's
    are equal); returns nothing."""
    if not (_is_row_array(dst, written=True) and _is_row_array(src) and dst.dtype == src.dtype
            and isinstance(i, types.Integer) and isinstance(j, types.Integer)
            and isinstance(a, (types.Integer, types.Float))):
        return None

    def codegen(context, builder, signature, args):
        dst_type, i_type, a_type, src_type, j_type = signature.args
        element = context.get_data_type(dst_type.dtype)
        itemsize = context.get_abi_sizeof(element)
        intp = context.get_value_type(types.intp)
        dst_row, n = _row(context, builder, dst_type, args[0], args[1], i_type)
        src_row, _ = _row(context, builder, src_type, args[3], args[4], j_type)
        scale = context.cast(builder, args[2], a_type, dst_type.dtype)
        done = cgutils.alloca_once_value(builder, ir.Constant(intp, 0))
        full = _VECTOR_BYTES // itemsize
        for lanes in (full, full // 2):
            vector = ir.VectorType(element, lanes)
            fmuladd, scales = _fmuladd(builder, vector), _splat(builder, scale, vector)
            start = builder.load(done)
            stop = builder.sub(n, builder.urem(builder.sub(n, start), ir.Constant(intp, lanes)))
            if lanes != full:  # at most one half-width vector: what is left is under a full one
                one_more = builder.add(start, ir.Constant(intp, lanes))
                stop = builder.select(builder.icmp_signed(">", stop, start), one_more, stop)
            with cgutils.for_range_slice(builder, start, stop, ir.Constant(intp, lanes)) as (k, _):
                dst_at, src_at = _vector_at(builder, dst_row, k, vector), _vector_at(builder, src_row, k, vector)
                total = builder.call(fmuladd, [scales, builder.load(src_at, align=itemsize),
                                               builder.load(dst_at, align=itemsize)])
                builder.store(total, dst_at, align=itemsize)
            builder.store(stop, done)
        with cgutils.for_range_slice(builder, builder.load(done), n, ir.Constant(intp, 1)) as (k, _):
            dst_at = builder.gep(dst_row, [k])
            product = builder.fmul(scale, builder.load(builder.gep(src_row, [k])), flags=("contract",))
            builder.store(builder.fadd(builder.load(dst_at), product, flags=("contract",)), dst_at)
        return context.get_dummy_value()

    return types.void(dst, i, a, src, j), codegen


def _gather_arguments(out, i, data, indices, start, stop, src) -> bool:
    return (_is_row_array(out, written=True) and _is_row_array(src) and out.dtype == src.dtype
            and isinstance(data, types.Array) and data.ndim == 1 and data.layout == "C"
            and isinstance(data.dtype, types.Float)
            and isinstance(indices, types.Array) and indices.ndim == 1 and indices.layout == "C"
            and isinstance(indices.dtype, types.Integer)
            and all(isinstance(value, types.Integer) for value in (i, start, stop)))


@intrinsic
def gather_row(typingctx, out, i, data, indices, start, stop, src):
    """``out[i, :] = sum(data[p] * src[indices[p], :] for p in range(start, stop))`` over ``out.shape[1]`` entries
    (``src`` has at least as many columns, not checked: every caller's are equal); returns nothing."""
    if not _gather_arguments(out, i, data, indices, start, stop, src):
        return None
    return types.void(out, i, data, indices, start, stop, src), _gather_codegen(onto=False)


@intrinsic
def gather_row_onto(typingctx, out, i, data, indices, start, stop, src):
    """``gather_row`` whose sums start from ``out[i, :]`` rather than 0: gathering a row's entries in runs, in
    order, one run onto the last, makes the bits of one ``gather_row`` of them all."""
    if not _gather_arguments(out, i, data, indices, start, stop, src):
        return None
    return types.void(out, i, data, indices, start, stop, src), _gather_codegen(onto=True)


def _gather_codegen(onto: bool):
    def codegen(context, builder, signature, args):
        out_type, i_type, data_type, indices_type, start_type, stop_type, src_type = signature.args
        element = context.get_data_type(out_type.dtype)
        itemsize = context.get_abi_sizeof(element)
        intp = context.get_value_type(types.intp)
        out_row, r = _row(context, builder, out_type, args[0], args[1], i_type)
        src = context.make_array(src_type)(context, builder, args[6])
        src_width = cgutils.unpack_tuple(builder, src.shape)[1]
        data = context.make_array(data_type)(context, builder, args[2])
        indices = context.make_array(indices_type)(context, builder, args[3])
        n_indices = cgutils.unpack_tuple(builder, indices.shape)[0]
        start = context.cast(builder, args[4], start_type, types.intp)
        stop = context.cast(builder, args[5], stop_type, types.intp)
        lanes = _VECTOR_BYTES // itemsize
        vector, lane_numbers = ir.VectorType(element, lanes), ir.VectorType(intp, lanes)
        mask_type = ir.VectorType(ir.IntType(1), lanes)
        load, store = _masked_load(builder, vector, mask_type), _masked_store(builder, vector, mask_type)
        fmuladd, zero = _fmuladd(builder, vector), ir.Constant(vector, [0.0] * lanes)
        align = ir.Constant(_I32, itemsize)
        lane_offsets = ir.Constant(lane_numbers, list(range(lanes)))
        ends = _splat(builder, r, lane_numbers)

        def src_row(p, offset):
            column = context.cast(builder, builder.load(builder.gep(indices.data, [p])), indices_type.dtype, types.intp)
            return builder.gep(src.data, [builder.add(builder.mul(column, src_width), offset)])

        span = ir.Constant(intp, lanes * GATHER_VECTORS)
        with cgutils.for_range_slice(builder, ir.Constant(intp, 0), r, span) as (offset, _):
            firsts = [builder.add(offset, ir.Constant(intp, g * lanes)) for g in range(GATHER_VECTORS)]
            masks = [builder.icmp_signed("<", builder.add(_splat(builder, first, lane_numbers), lane_offsets), ends)
                     for first in firsts]
            sums = [cgutils.alloca_once_value(builder, builder.call(load, [_vector_at(builder, out_row, first, vector),
                                                                            align, mask, zero]) if onto else zero)
                    for first, mask in zip(firsts, masks)]
            left = builder.sub(r, offset)  # this sweep's entries of a row: at most span
            row_bytes = builder.mul(builder.select(builder.icmp_signed("<", left, span), left, span),
                                    ir.Constant(intp, itemsize))
            with cgutils.for_range_slice(builder, start, stop, ir.Constant(intp, 1)) as (p, _):
                ahead = builder.add(p, ir.Constant(intp, PREFETCH_DISTANCE))
                with builder.if_then(builder.icmp_signed("<", ahead, n_indices), likely=True):
                    emit_prefetch_row(builder, src_row(ahead, offset), row_bytes)
                x = context.cast(builder, builder.load(builder.gep(data.data, [p])), data_type.dtype, out_type.dtype)
                scales, row = _splat(builder, x, vector), src_row(p, offset)
                for g in range(GATHER_VECTORS):
                    entries = builder.call(load, [_vector_at(builder, row, ir.Constant(intp, g * lanes), vector), align,
                                                  masks[g], zero])
                    builder.store(builder.call(fmuladd, [scales, entries, builder.load(sums[g])]), sums[g])
            for g in range(GATHER_VECTORS):
                builder.call(store, [builder.load(sums[g]), _vector_at(builder, out_row, firsts[g], vector), align,
                                     masks[g]])
        return context.get_dummy_value()

    return codegen
