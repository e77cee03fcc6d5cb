"""Stratified-NMF: J. Chapman, Y. Yaniv and D. Needell, "Stratified-NMF for Heterogeneous Data", IEEE Asilomar
Conference on Signals, Systems, and Computers, 2023 (arXiv:2311.10789).

Strata i = 1..s (distfact's groups) with rows A(i) (m_i x n) share a dictionary H (r x n); each has
a shift v(i) >= 0 (n) and a representation W(i) >= 0 (m_i x r). Objective (eq. 2, constraints eq. 3):

    F = sum_i ||A(i) - 1 v(i)^T - W(i) H||_F^2

Algorithm 1, iteration k (the paper's order: v, then W, then H; eps = 1e-9 added to every denominator):

    line 5   v(i) <- v(i) * A(i)^T 1 / (m_i v(i) + H^T W(i)^T 1 + eps),   M (``v_updates``) times, global
    line 7   W(i) <- W(i) * A(i) H^T / ((W(i) H + 1 v(i)^T) H^T + eps)    local, per block:
             (W H + 1 v^T) H^T = W (H H^T) + 1 (H v)^T, so A(i) - 1 v(i)^T is never formed
    line 8   H <- H * sum_i W(i)^T A(i) / (sum_i W(i)^T (W(i) H + 1 v(i)^T) + eps)
                = H * sum_i W(i)^T A(i) / (sum_i [W(i)^T W(i) H + (W(i)^T 1) v(i)^T] + eps)     global

Statistics per stratum from one pass: W(i)^T A(i), W(i)^T W(i), W(i)^T 1, and in pass 0 the constant
A(i)^T 1. On the engine an iteration is: global step = line 8 of the previous iteration (once W has
moved) then line 5; one pass = line 7 and the statistics of the new W. The loss after iteration k
therefore evaluates line 8 on the pass's statistics (``stratum_sq_errors``), and the fit ends by
applying it (``final_global``). Theorem 2: F is non-increasing under lines 5, 7 and 8.

The objective from statistics (never forming the residual):

    ||A - 1 v^T - W H||^2 = ||A||^2 + m ||v||^2 + <W^T W, H H^T> - 2 v . A^T 1 - 2 <W^T A, H> + 2 (W^T 1)^T H v

Section IV: loss = sqrt(F), normalised loss = sqrt(F / sum_i ||A(i)||^2); start H, W(i) ~ U[0, 1/sqrt(r)],
v(i) ~ U[0, 1]. Stopping rule: ``tol`` None runs ``max_iter`` iterations (the paper's practice); otherwise
stop when F fell by less than ``tol`` relative to the previous iteration.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels import nmf as k
from .stopping import relative_decrease_below


@dataclass(frozen=True)
class StratifiedMU:
    n_components: int
    v_updates: int = 2
    eps: float = 1e-9
    tol: float | None = None

    # -- initialisation (Section IV) ---------------------------------------------
    def initial_global(self, data, rng):
        r, n = self.n_components, data.shape[1]
        return self.with_derived(rng.random((r, n)) / np.sqrt(r), rng.random((data.n_groups, n)))

    def initial_local(self, block, G, rows):
        return rows.uniform(self.n_components) / np.sqrt(self.n_components)

    def with_derived(self, H, v, colsum=None, w_moved=False):
        """Global state: H and v plus what the blocks need from them. ``w_moved``: W has been
        updated since H was (line 8 is due at the next global step)."""
        state = {"H": H, "HHt": H @ H.T, "v": v, "Hv": v @ H.T, "w_moved": w_moved}
        if colsum is not None:
            state["colsum"] = colsum
        return state

    @staticmethod
    def block_state(G):
        """What line 7 needs (v and A^T 1, s x n each, stay on the driver)."""
        return {"H": G["H"], "HHt": G["HHt"], "Hv": G["Hv"]}

    # -- pass ------------------------------------------------------------------------
    def block_stats(self, A_b, W_b, block, G):
        """Pass 0: the statistics of the initial W, and the constant A(i)^T 1."""
        WtA, WtW = k.frobenius_stats(A_b, W_b)
        colsum = np.asarray(A_b.sum(axis=0, dtype=np.float64)).ravel()
        return {"WtA": WtA, "WtW": WtW, "Wt1": W_b.sum(axis=0, dtype=np.float64), "colsum": colsum}

    def local_step(self, A_b, W_b, block, G):
        """Line 7 for the block's rows (its stratum's v), then the statistics of the new W."""
        shift = G["Hv"][block.group] + self.eps
        W_new, WtA, WtW = k.frobenius_local(A_b, W_b, G["H"], G["HHt"], "mu", shift=shift)
        return W_new, {"WtA": WtA, "WtW": WtW, "Wt1": W_new.sum(axis=0, dtype=np.float64)}

    # -- global ---------------------------------------------------------------------
    def h_update(self, G, stats):
        """Line 8 from the statistics of the current W and the current v."""
        H, v = G["H"], G["v"]
        numerator = sum(s["WtA"] for s in stats)
        # sum_i W(i)^T W(i) H + (W(i)^T 1) v(i)^T as two products over all strata (not 2 s products of r x n)
        denominator = sum(s["WtW"] for s in stats) @ H + np.stack([s["Wt1"] for s in stats], axis=1) @ v
        denominator += self.eps
        numerator *= H
        numerator /= denominator
        return numerator

    def v_update(self, v, H, stats, colsum, sizes):
        """Line 5, ``v_updates`` times (H^T W(i)^T 1 does not change between them)."""
        HtWt1 = np.stack([s["Wt1"] for s in stats]) @ H
        for _ in range(self.v_updates):
            v = v * colsum / (sizes[:, None] * v + HtWt1 + self.eps)
        return v

    def global_step(self, G, stats, data):
        colsum = self.stratum_colsums(G, stats)
        H = self.h_update(G, stats) if G["w_moved"] else G["H"]
        v = self.v_update(G["v"], H, stats, colsum, data.group_sizes.astype(np.float64))
        return self.with_derived(H, v, colsum, w_moved=True)

    def final_global(self, G, stats):
        """The state after the last iteration's line 8. (The objective evaluates it too, and the next
        global step again: O(s r n) on the driver, against O(nnz r) for the pass.)"""
        if not G["w_moved"]:
            return G
        return self.with_derived(self.h_update(G, stats), G["v"], G.get("colsum"), w_moved=False)

    @staticmethod
    def stratum_colsums(G, stats) -> np.ndarray:
        """A(i)^T 1 per stratum (s x n): from pass 0's statistics, then kept in the global state."""
        if "colsum" in G:
            return G["colsum"]
        return np.stack([s["colsum"] for s in stats])

    # -- objective and stopping ---------------------------------------------------------
    def stratum_sq_errors(self, G, stats, data) -> np.ndarray:
        """||A(i) - 1 v(i)^T - W(i) H||_F^2 per stratum, after line 8 (eq. 2's terms; clipped at 0)."""
        G = self.final_global(G, stats)
        H, v = G["H"].astype(np.float64), G["v"].astype(np.float64)
        HHt, colsum = H @ H.T, self.stratum_colsums(G, stats)
        sizes = data.group_sizes.astype(np.float64)
        errs = np.array([
            data.group_sq_norms[i] + sizes[i] * (v[i] @ v[i]) + np.vdot(s["WtW"], HHt)
            - 2.0 * (v[i] @ colsum[i]) - 2.0 * np.vdot(s["WtA"], H) + 2.0 * (s["Wt1"] @ (H @ v[i]))
            for i, s in enumerate(stats)])
        return np.maximum(errs, 0.0)

    def objective(self, G, stats, data):
        per_stratum = self.stratum_sq_errors(G, stats, data)
        return float(per_stratum.sum()), per_stratum

    def converged(self, objectives, group_objectives):
        return relative_decrease_below(objectives, self.tol)

    # -- transform ----------------------------------------------------------------------
    def solve_local(self, A_b, _local, block, H, Hv_by_group, max_iter, tol):
        """W_b for fixed H and v (line 7 iterated), from one read of A_b."""
        start = 0.5 / np.sqrt(H.shape[0])  # the mean of the U[0, 1/sqrt(r)] start
        W_b = np.full((block.n_rows, H.shape[0]), start, dtype=H.dtype)
        shift = Hv_by_group[block.group] + self.eps
        return k.frobenius_solve_w(A_b, W_b, H, "mu", max_iter, tol, shift=shift)
