"""Direct numpy transcriptions of the papers' updates, written independently of distfact's kernels.

Each loop runs global-then-local (H first, then W), as the engine does, on a dense copy of X.
"""

import numpy as np


def lee_seung_frobenius(X, W, H, n_iter):
    eps = np.finfo(X.dtype).eps
    W, H = W.copy(), H.copy()
    for _ in range(n_iter):
        H = H * (W.T @ X) / np.maximum(W.T @ W @ H, eps)
        W = W * (X @ H.T) / np.maximum(W @ (H @ H.T), eps)
    return W, H


def lee_seung_kl(X, W, H, n_iter):
    eps = np.finfo(X.dtype).eps
    W, H = W.copy(), H.copy()
    for _ in range(n_iter):
        R = X / np.maximum(W @ H, eps)
        H = H * (W.T @ R) / np.maximum(W.sum(axis=0), eps)[:, None]
        R = X / np.maximum(W @ H, eps)
        W = W * (R @ H.T) / np.maximum(H.sum(axis=1), eps)[None, :]
    return W, H


def hals(X, W, H, n_iter):
    """Cichocki's HALS: rows of H one by one, then columns of W one by one."""
    W, H = W.copy(), H.copy()
    r = W.shape[1]
    for _ in range(n_iter):
        A, B = W.T @ W, W.T @ X
        for k in range(r):
            if A[k, k] > 0:
                H[k] = np.maximum(0.0, H[k] + (B[k] - A[k] @ H) / A[k, k])
        C, D = H @ H.T, X @ H.T
        for k in range(r):
            if C[k, k] > 0:
                W[:, k] = np.maximum(0.0, W[:, k] + (D[:, k] - W @ C[:, k]) / C[k, k])
    return W, H


def frobenius_half(X, W, H):
    return 0.5 * np.linalg.norm(X - W @ H) ** 2


def kl_divergence(X, W, H):
    WH = np.maximum(W @ H, np.finfo(X.dtype).eps)
    nz = X > 0
    return float(np.sum(X[nz] * np.log(X[nz] / WH[nz])) - X.sum() + (W @ H).sum())


def fairer_mu(groups_X, groups_W, H, E, n_iter):
    """Algorithm 3 of Kassab et al., 2024, line by line, on explicit per-group blocks (c_update='decaying')."""
    eps = np.finfo(H.dtype).eps
    norms = [np.linalg.norm(X) for X in groups_X]
    W = [w.copy() for w in groups_W]
    H = H.copy()
    c = np.zeros(len(groups_X))
    for _ in range(n_iter):
        losses = [(np.linalg.norm(X - w @ H) - e) / nrm for X, w, e, nrm in zip(groups_X, W, E, norms)]
        c[int(np.argmax(losses))] += 1.0                                                    # lines 7-8
        X_t = np.vstack([ci * X / nrm for ci, X, nrm in zip(c, groups_X, norms)])          # line 9
        W_t = np.vstack([ci * w / nrm for ci, w, nrm in zip(c, W, norms)])
        H = H * (W_t.T @ X_t) / np.maximum(W_t.T @ W_t @ H, eps)                           # line 10
        W = [w * (X @ H.T) / np.maximum(w @ H @ H.T, eps) for X, w in zip(groups_X, W)]    # line 11
    return W, H, c


def stratified_nmf(strata_A, strata_W, H, v, n_iter, M=2, eps=1e-9):
    """Algorithm 1 of Chapman, Yaniv and Needell, 2023, line by line, on explicit per-stratum blocks (dense).
    Returns the iterates and the objective (eq. 2) after every iteration (the first at the start)."""
    W = [w.copy() for w in strata_W]
    H, v = H.copy(), [vi.copy() for vi in v]
    ones = [np.ones((A.shape[0], 1)) for A in strata_A]

    def objective():
        return sum(np.linalg.norm(A - o @ vi[None, :] - w @ H) ** 2 for A, o, vi, w in zip(strata_A, ones, v, W))

    history = [objective()]
    for _ in range(n_iter):
        for _ in range(M):                                                                          # line 4
            v = [vi * (A.T @ o[:, 0]) / (vi * A.shape[0] + H.T @ (w.T @ o[:, 0]) + eps)                # line 5
                 for A, o, vi, w in zip(strata_A, ones, v, W)]
        W = [w * (A @ H.T) / ((w @ H + o @ vi[None, :]) @ H.T + eps)                                 # line 7
             for A, o, vi, w in zip(strata_A, ones, v, W)]
        H = H * sum(w.T @ A for A, w in zip(strata_A, W)) / (                                        # line 8
            sum(w.T @ (w @ H + o @ vi[None, :]) for o, vi, w in zip(ones, v, W)) + eps)
        history.append(objective())
    return W, H, np.array(v), np.array(history)


def lad_brute_force(x, y):
    """argmin_{alpha >= 0} sum_s |x_s - y_s alpha| by evaluating every breakpoint x_s / y_s (and 0):
    the smallest minimiser (the subproblems of Seraghiti et al., 2026, eq. 2.1)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    keep = y != 0
    candidates = np.unique(np.concatenate([[0.0], np.maximum(0.0, x[keep] / y[keep])]))
    values = np.abs(x[None, :] - candidates[:, None] * y[None, :]).sum(axis=1)
    return float(candidates[np.flatnonzero(values <= values.min())[0]])


def wl1_dense_cd(X, W, H, lam, n_iter, M=None):
    """Plain coordinate descent for sum_nz M |X - WH| + lam sum_zeros M (WH) (Seraghiti et al., 2026, eq. 5.1;
    entry weights M, all ones when None): all of W (row by row, entry by entry), then all of H (column by
    column), every scalar subproblem written on the whole row / column of X (zeros with weight lam M, non-zeros
    with weight M) and solved by brute force."""
    W, H = W.astype(np.float64).copy(), H.astype(np.float64).copy()
    m, r = W.shape
    nz = X != 0
    weight = np.where(nz, 1.0, lam)
    if M is not None:
        weight = weight * M
    M = np.ones_like(weight) if M is None else M

    def objective():
        R = X - W @ H
        return (M * np.abs(R))[nz].sum() + lam * (M * (W @ H))[~nz].sum()

    history = [objective()]
    for _ in range(n_iter):
        for i in range(m):
            for t in range(r):
                rest = X[i] - W[i] @ H + W[i, t] * H[t]
                W[i, t] = lad_brute_force(weight[i] * rest, weight[i] * H[t])
        for j in range(X.shape[1]):
            for t in range(r):
                rest = X[:, j] - W @ H[:, j] + H[t, j] * W[:, t]
                H[t, j] = lad_brute_force(weight[:, j] * rest, weight[:, j] * W[:, t])
        history.append(objective())
    return W, H, np.array(history)


def ssnmf_reference(X, A, S, lam=1.0, model="FF", Y=None, B=None, Wm=None, Lm=None, eps=1e-10, n_iter=1):
    """The SSNMF multiplicative updates in the paper's orientation (Haddock et al., 2020: X ~ A S, Y ~ B S, samples
    are columns; data mask Wm, label mask Lm, all ones when None), transcribed from Algorithms 1-3 and the
    (F,F) updates of its reference [28] with eps where the reference package (ssnmf 1.0.3) puts it.
    Order per iteration: A, then B, then S. Without Y: plain (masked) NMF, Frobenius ("F?") or I-divergence
    ("D?"). Returns A, B, S and the objective (reconstruction + lam * supervision) after every iteration."""
    A, S = A.copy(), S.copy()
    B = None if B is None else B.copy()
    Wm = np.ones_like(X) if Wm is None else Wm
    R, Sl = model[0], model[1]

    def idiv(Z, Zhat, M):
        return np.sum(M * Z * np.log((M * Z + eps) / (M * Zhat + eps)) - M * Z + M * Zhat)

    def fro(Z, Zhat, M):
        return np.sum((M * Z - M * Zhat) ** 2)

    def dict_update(Z, D, Rt, M, loss):  # D <- update of the left factor of Z ~ D Rt
        if loss == "F":
            return D / (eps + (M * (D @ Rt)) @ Rt.T) * ((M * Z) @ Rt.T)
        return D / (eps + M @ Rt.T) * (((M * Z) / (eps + M * (D @ Rt)) * M) @ Rt.T)

    history = []
    for _ in range(n_iter):
        A = dict_update(X, A, S, Wm, R)
        if Y is None:
            S = dict_update(X.T, S.T, A.T, Wm.T, R).T
            history.append(fro(X, A @ S, Wm) if R == "F" else idiv(X, A @ S, Wm))
            continue
        Lm_ = np.ones_like(Y) if Lm is None else Lm
        B = dict_update(Y, B, S, Lm_, Sl)
        if R == "F":
            num_r, den_r = A.T @ (Wm * X), A.T @ (Wm * (A @ S))
        else:
            num_r, den_r = A.T @ ((Wm * X) / (eps + Wm * (A @ S)) * Wm), A.T @ Wm
        if Sl == "F":
            num_s, den_s = B.T @ (Lm_ * Y), B.T @ (Lm_ * (B @ S))
        else:
            num_s, den_s = B.T @ ((Lm_ * Y) / (eps + Lm_ * (B @ S)) * Lm_), B.T @ Lm_
        c_r, c_s = {"FF": (1, 1), "FD": (2, 1), "DF": (1, 2), "DD": (1, 1)}[model]
        S = S / (eps + c_r * den_r + c_s * lam * den_s) * (c_r * num_r + c_s * lam * num_s)
        rec = fro(X, A @ S, Wm) if R == "F" else idiv(X, A @ S, Wm)
        sup = fro(Y, B @ S, Lm_) if Sl == "F" else idiv(Y, B @ S, Lm_)
        history.append(rec + lam * sup)
    return A, B, S, np.array(history)
