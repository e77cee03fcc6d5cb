"""The multigroup SVD's passes over X: the block statistics the engine sums per group (each group's Gram matrix
about a centre, the columns' squared deviations, the wide-data sketch and its restricted Grams), and the columns'
scale from them (Section 8.1)."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ...kernels.gram import centred_gram, projected_gram, sketch_products, squared_deviations
from ...kernels.products import block_column_sums


def gram_block(X_b, local, block, centre, mean):
    """One block's contribution to its group's Gram matrix about ``centre``, and (unless ``mean`` is None:
    neither centring nor scaling asked) to its columns' sums of squared deviations from ``mean`` (the scale,
    free of the cancellation of sum x^2 - m mean^2)."""
    gram = centred_gram(X_b, centre)
    if mean is None:
        return {"gram": gram}
    if not sp.issparse(X_b) and np.array_equal(centre, mean):  # a dense block centred on the mean: the
        return {"gram": gram, "sq_dev": gram.diagonal().copy()}  # diagonal is these sums already
    return {"gram": gram, "sq_dev": squared_deviations(X_b, mean)}


def sketch_block(X_b, local, block, centre, omegas):
    """One block's (A_b^T A_b) Omega_l, Omega_l = ``omegas[l]`` for its group l (the wide-data sketch)."""
    return {"Y": sketch_products(X_b, centre, omegas[block.group])}


def projected_gram_block(X_b, local, block, centre, basis):
    """One block's Q^T A_b^T A_b Q (the Gram matrix restricted to the sketch's basis Q)."""
    return {"gram": projected_gram(X_b, centre, basis)}


def deviations_block(X_b, local, block, mean):
    """One block's column sums and sums of squared deviations from ``mean`` (the wide path's scale and
    its groups' ||A_l||_F^2)."""
    return {"sum": block_column_sums(X_b), "sq_dev": squared_deviations(X_b, mean)}


def column_scale(sq_dev: np.ndarray, mean: np.ndarray, n_rows: int) -> np.ndarray:
    """Population standard deviation of every column (Section 8.1's standardisation) from the sums of
    squared deviations from the mean. A constant column (its deviations are rounding, below 64 eps |mean|)
    keeps the scale 1, as scikit-learn's StandardScaler does: centred, it is zero and carries no weight;
    divided by its rounding-level deviation, it would be noise blown up to unit variance."""
    var = sq_dev / n_rows
    constant = var <= (64 * np.finfo(np.float64).eps * np.maximum(np.abs(mean), np.finfo(np.float64).tiny)) ** 2
    return np.where(constant, 1.0, np.sqrt(var))
