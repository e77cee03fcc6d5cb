"""A block's column sums (``kernels/products.py: block_column_sums``) accumulate in float64 for every dtype:
scipy's sparse ``sum(axis=0, dtype=np.float64)`` adds a float32 matrix's entries in float32 and casts the result.
Used by Stratified-NMF's A(i)^T 1, the multigroup SVD's column means and the masked complement form's sums."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from distfact.kernels.products import block_column_sums


def test_float32_sparse_columns_are_summed_in_float64():
    X = sp.csr_matrix(np.full((20_000, 3), 0.1, dtype=np.float32))
    exact = 20_000 * np.float64(np.float32(0.1))  # every term is the same float32 value, so the float64 sum is exact
    assert np.all(block_column_sums(X) == exact)
    assert not np.allclose(np.asarray(X.sum(axis=0, dtype=np.float64)).ravel(), exact, rtol=1e-6)  # scipy's


def test_the_same_bits_as_scipy_for_float64_and_as_numpy_for_dense():
    rng = np.random.default_rng(0)
    X = sp.random(500, 40, density=0.2, random_state=rng, format="csr")
    assert np.array_equal(block_column_sums(X), np.asarray(X.sum(axis=0)).ravel())
    assert np.array_equal(block_column_sums(X.tocsc()), np.asarray(X.sum(axis=0)).ravel())
    dense = X.toarray().astype(np.float32)
    assert np.array_equal(block_column_sums(dense), dense.sum(axis=0, dtype=np.float64))
    assert block_column_sums(dense).dtype == np.float64
