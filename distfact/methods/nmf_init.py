"""NNDSVDa initialisation of NMF (Boutsidis & Gallopoulos 2008; zeros filled with mean(X)),
computed in passes over the row blocks, never gathering X or W.

1. Top-r right singular vectors V and values s of X by subspace iteration on X^T X:
   each pass reduces Y = sum_b X_b^T (X_b Q) (n x k); Q <- orth(Y); the last pass
   also gives the Rayleigh-Ritz matrix Q^T X^T X Q (k x k), whose eigenpairs give V, s.
2. One pass for the norms of the positive and negative parts of each column of
   U = X V / s (per block, summed).
3. One pass building W_b = sqrt(s_j sigma_j) u_j^{+/-} / ||u_j^{+/-}|| locally, which also
   emits pass 0's statistics. H's rows are built on the driver the same way from V.
"""

from __future__ import annotations

import numpy as np

from ..engine.driver import BlockSeeds
from ..kernels.masked import zeroed

N_POWER_PASSES = 4
OVERSAMPLING = 10


def _block_inputs(block, inputs):
    """A block's local state before W exists: its own inputs."""
    return inputs


def _gram_times(X_b, local, block, Q):
    X_b = zeroed(X_b, local)
    return {"Y": np.asarray(X_b.T @ (X_b @ Q))}


def _left_vectors(X_b, V, s):
    return np.asarray(X_b @ V) / s


def _part_norms(X_b, local, block, V, s):
    U = _left_vectors(zeroed(X_b, local), V, s)
    return {"pos": (np.maximum(U, 0) ** 2).sum(axis=0), "neg": (np.minimum(U, 0) ** 2).sum(axis=0)}


def _nndsvda_rows(X_b, inputs, block, V, s, use_pos, norms, lbd, fill, method, G):
    U = _left_vectors(zeroed(X_b, inputs), V, s)
    W = np.where(use_pos, np.maximum(U, 0), np.maximum(-U, 0)) / norms * lbd
    W[:, 0] = np.sqrt(s[0]) * np.abs(U[:, 0])
    W = np.where(W < np.finfo(W.dtype).eps, fill, W).astype(method.dtype)
    local = W if inputs is None else {**inputs, "W": W}
    return local, method.block_stats(X_b, local, block, G)


def top_right_singular(data, executor, r: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """(V (n x r), s (r,)) of X by subspace iteration over passes."""
    n = data.shape[1]
    k = min(n, r + OVERSAMPLING)
    Q, _ = np.linalg.qr(rng.standard_normal((n, k)))
    for i in range(N_POWER_PASSES):
        Y = sum(s["Y"] for s in executor.run_pass(_gram_times, Q, update=False))
        if i < N_POWER_PASSES - 1:
            Q, _ = np.linalg.qr(Y)
    ritz, Z = np.linalg.eigh(Q.T @ Y)  # Q^T X^T X Q
    order = np.argsort(ritz)[::-1][:r]
    return Q @ Z[:, order], np.sqrt(np.maximum(ritz[order], np.finfo(np.float64).tiny))


def nndsvda_start(method, data, executor, random_state, local_inputs=None):
    """Initialise the executor's W blocks and return (global state, pass-0 statistics). ``local_inputs``: per
    block, row-aligned inputs (a masked fit's masks) that join W_b in its local state; the SVD is then that of X
    with its missing entries as zeros."""
    if local_inputs is not None:
        executor.init_local(_block_inputs, per_block=local_inputs)
    rng = BlockSeeds(random_state).global_rng()
    r = method.n_components
    V, s = top_right_singular(data, executor, r, rng)
    norms = executor.run_pass(_part_norms, V, s, update=False)
    u_pos = np.sqrt(sum(g["pos"] for g in norms))
    u_neg = np.sqrt(sum(g["neg"] for g in norms))
    Vt = V.T
    v_pos, v_neg = np.linalg.norm(np.maximum(Vt, 0), axis=1), np.linalg.norm(np.minimum(Vt, 0), axis=1)
    use_pos = u_pos * v_pos > u_neg * v_neg
    sigma = np.where(use_pos, u_pos * v_pos, u_neg * v_neg)
    lbd = np.sqrt(s * sigma)
    u_norm = np.maximum(np.where(use_pos, u_pos, u_neg), np.finfo(np.float64).tiny)
    v_norm = np.maximum(np.where(use_pos, v_pos, v_neg), np.finfo(np.float64).tiny)
    H = np.where(use_pos[:, None], np.maximum(Vt, 0), np.maximum(-Vt, 0)) / v_norm[:, None] * lbd[:, None]
    H[0] = np.sqrt(s[0]) * np.abs(Vt[0])
    fill = data.group_totals.sum() / (data.shape[0] * data.shape[1])
    H = np.where(H < np.finfo(H.dtype).eps, fill, H).astype(method.dtype)
    G = method.with_derived(H, data)
    stats = executor.run_pass(_nndsvda_rows, V, s, use_pos, u_norm, lbd, fill, method, G, update=True)
    return G, stats
