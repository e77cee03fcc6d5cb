"""Gram matrices and symmetric eigenproblems for the multigroup SVD (no Dask)."""

from __future__ import annotations

import numpy as np
import scipy.linalg
import scipy.sparse as sp


def centred_gram(X_b, centre: np.ndarray) -> np.ndarray:
    """(X_b - 1 c^T)^T (X_b - 1 c^T) in float64, for a dense or CSR block.

    A dense block is centred first (no cancellation between large terms); a CSR block is not
    densified: X^T X - c s^T - s c^T + rows c c^T with s the block's column sums.
    """
    if sp.issparse(X_b):
        X64 = X_b.astype(np.float64)
        gram = (X64.T @ X64).toarray()
        if centre.any():
            sums = np.asarray(X64.sum(axis=0)).ravel()
            cross = np.outer(centre, sums)
            gram -= cross + cross.T
            gram += X_b.shape[0] * np.outer(centre, centre)
        return gram
    Xc = np.asarray(X_b, dtype=np.float64) - centre  # a float64 copy either way
    return Xc.T @ Xc  # numpy calls SYRK for a transposed self-product


def squared_deviations(X_b, mean: np.ndarray) -> np.ndarray:
    """sum_i (x_ij - mean_j)^2 per column, summed directly (no cancellation); a CSR block adds its implicit
    zeros as (rows - nnz_j) mean_j^2 without densifying."""
    if sp.issparse(X_b):
        csr = X_b.tocsr()
        deviations = csr.data.astype(np.float64) - mean[csr.indices]
        out = np.bincount(csr.indices, weights=deviations ** 2, minlength=X_b.shape[1])
        zeros = X_b.shape[0] - np.bincount(csr.indices, minlength=X_b.shape[1])
        return out + zeros * mean ** 2
    return np.square(np.asarray(X_b, dtype=np.float64) - mean).sum(axis=0)


def sketch_products(X_b, centre: np.ndarray, omega: np.ndarray) -> np.ndarray:
    """(X_b - 1 c^T)^T (X_b - 1 c^T) Omega, without forming the centred block."""
    Y = X_b @ omega - centre @ omega  # rows x s
    if sp.issparse(X_b):
        return np.asarray(X_b.T @ Y) - np.outer(centre, Y.sum(axis=0))
    return np.asarray(X_b, dtype=np.float64).T @ Y - np.outer(centre, Y.sum(axis=0))


def projected_gram(X_b, centre: np.ndarray, basis: np.ndarray) -> np.ndarray:
    """Q^T (X_b - 1 c^T)^T (X_b - 1 c^T) Q for an orthonormal ``basis`` Q (n x s)."""
    Y = X_b @ basis - centre @ basis
    return Y.T @ Y


SMALL = 32  # up to this size a full numpy eigh costs less than scipy's call overhead for ?syevx


def top_eigenpair(G: np.ndarray) -> tuple[float, np.ndarray]:
    """The largest eigenvalue of the symmetric ``G`` and a unit eigenvector (LAPACK ?syevx,
    only the top pair: about a third of a full eigendecomposition's time)."""
    n = G.shape[0]
    if n <= SMALL:
        values, vectors = np.linalg.eigh(G)
        values, vectors = values[-1:], vectors[:, -1:]
    else:
        values, vectors = scipy.linalg.eigh(G, subset_by_index=[n - 1, n - 1], driver="evx", check_finite=False)
    v = vectors[:, 0]
    # A fixed sign (largest entry positive) makes the vectors reproducible across LAPACK builds.
    return float(values[0]), v if v[np.argmax(np.abs(v))] >= 0 else -v


def top_eigenvalue(G: np.ndarray) -> float:
    n = G.shape[0]
    if n <= SMALL:
        return float(np.linalg.eigvalsh(G)[-1])
    return float(scipy.linalg.eigh(G, eigvals_only=True, subset_by_index=[n - 1, n - 1], driver="evx",
                                   check_finite=False)[0])


def deflate(G: np.ndarray, v: np.ndarray) -> np.ndarray:
    """P G P with P = I - v v^T for a unit ``v`` (Algorithm 1, line 5, on the Gram matrix), in O(n^2)."""
    Gv = G @ v
    vGv = float(v @ Gv)
    out = G - np.outer(Gv, v)
    out -= np.outer(v, Gv)
    out += vGv * np.outer(v, v)
    return (out + out.T) / 2  # exactly symmetric, for the eigensolver
