"""The vector intrinsics of kernels/row_vectors.py against numpy, at every length of row a vector splits it into, and
on rows that end where readable memory ends (a masked lane past a row must not be read)."""

import ctypes
import mmap

import numba
import numpy as np
import pytest

from distfact.kernels.row_vectors import GATHER_VECTORS, add_scaled_row, gather_row


@numba.njit
def _gather(out, i, data, indices, start, stop, src):
    gather_row(out, i, data, indices, start, stop, src)


@numba.njit
def _add_scaled(dst, i, a, src, j):
    add_scaled_row(dst, i, a, src, j)


def _lengths(dtype):
    """Row lengths around every split: one vector (8 or 16 entries), half of one, a gather's sweep of
    ``GATHER_VECTORS`` vectors, and past two sweeps."""
    lanes = 64 // np.dtype(dtype).itemsize
    return sorted({1, 2, 3} | {k * lanes // 2 + d for k in range(1, 2 * GATHER_VECTORS + 2) for d in (-1, 0, 1)}
                  | {2 * GATHER_VECTORS * lanes + 5})


def _tolerance(dtype):
    return 1e-13 if dtype == np.float64 else 2e-5


def _guarded(rows, r, dtype):
    """A C-contiguous rows x r array whose last entry ends at a page with no access rights: reading one byte past it
    is a segmentation fault. Returns (array, keep-alive objects)."""
    page = mmap.PAGESIZE
    nbytes = rows * r * np.dtype(dtype).itemsize
    pages = -(-nbytes // page)
    region = mmap.mmap(-1, (pages + 1) * page, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(base + pages * page, page, 0) == 0, ctypes.get_errno()
    offset = pages * page - nbytes
    array = np.frombuffer(region, dtype=dtype, count=rows * r, offset=offset).reshape(rows, r)
    return array, region


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gather_row_is_the_weighted_sum_of_rows(dtype):
    rng = np.random.default_rng(0)
    for r in _lengths(dtype):
        src, region = _guarded(30, r, dtype)
        src[:] = rng.random((30, r))
        indices = rng.integers(0, 30, size=40).astype(np.int32)
        indices[-1] = 29  # the last entry reads the row that ends at the guard page
        data = rng.random(40).astype(dtype)
        out = np.full((3, r), np.nan, dtype=dtype)
        _gather(out, 1, data, indices, 5, 40, src)
        expected = (data[5:40, None].astype(np.float64) * src[indices[5:40]]).sum(axis=0)
        np.testing.assert_allclose(out[1], expected, rtol=_tolerance(dtype), err_msg=f"r = {r}")
        assert np.isnan(out[[0, 2]]).all(), f"r = {r}: another row written"
        _gather(out, 2, data, indices, 7, 7, src)  # no entries: zeros
        assert (out[2] == 0).all()
        del src
        region.close()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_add_scaled_row_adds_a_multiple_of_one_row_to_another(dtype):
    rng = np.random.default_rng(1)
    for r in _lengths(dtype):
        dst, dst_region = _guarded(4, r, dtype)
        src, src_region = _guarded(5, r, dtype)
        dst[:], src[:] = rng.random((4, r)), rng.random((5, r))
        before = dst.copy()
        _add_scaled(dst, 3, 0.375, src, 4)  # the last rows of both: they end at the guard pages
        expected = before.copy()
        expected[3] = before[3].astype(np.float64) + 0.375 * src[4]
        np.testing.assert_allclose(dst, expected, rtol=_tolerance(dtype), err_msg=f"r = {r}")
        assert (dst[:3] == before[:3]).all()
        del dst, src
        dst_region.close()
        src_region.close()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_rows_of_a_wider_source_are_read_at_its_own_width(dtype):
    """A source with more columns than the output: its rows start at its own width, its first r entries are read."""
    rng = np.random.default_rng(2)
    r, wide = 20, 27
    src = rng.random((9, wide)).astype(dtype)
    indices, data = np.array([8, 3, 5], dtype=np.int64), rng.random(3).astype(dtype)
    out = np.zeros((1, r), dtype=dtype)
    _gather(out, 0, data, indices, 0, 3, src)
    expected = (data[:, None].astype(np.float64) * src[indices, :r]).sum(axis=0)
    np.testing.assert_allclose(out[0], expected, rtol=_tolerance(dtype))
    dst = rng.random((2, r)).astype(dtype)
    expected = dst[1].astype(np.float64) + 2.0 * src[8, :r]
    _add_scaled(dst, 1, 2, src, 8)
    np.testing.assert_allclose(dst[1], expected, rtol=_tolerance(dtype))


def test_row_intrinsics_refuse_what_they_cannot_read():
    """A Fortran-ordered array, mixed dtypes, an integer array, strided entries, a read-only output or a complex
    scale is a typing error, not wrong memory reads or writes."""
    rows = np.zeros((3, 4))
    with pytest.raises(numba.TypingError):
        _add_scaled(np.asfortranarray(rows), 0, 1.0, rows, 1)
    with pytest.raises(numba.TypingError):
        _add_scaled(rows, 0, 1.0, rows.astype(np.float32), 1)
    with pytest.raises(numba.TypingError):
        _gather(rows, 0, np.ones(2), np.zeros(2, dtype=np.int64), 0, 2, rows.astype(np.int64))
    read_only = rows.copy()
    read_only.flags.writeable = False
    with pytest.raises(numba.TypingError):
        _add_scaled(read_only, 0, 1.0, rows, 1)
    with pytest.raises(numba.TypingError):
        _add_scaled(rows, 0, 1j, rows, 1)
    with pytest.raises(numba.TypingError):  # strided entries: the intrinsic reads them as contiguous
        _gather(rows, 0, np.ones(4)[::2], np.zeros(2, dtype=np.int64), 0, 2, rows)
    with pytest.raises(numba.TypingError):
        _gather(rows, 0, np.ones(2), np.zeros(4, dtype=np.int64)[::2], 0, 2, rows)
