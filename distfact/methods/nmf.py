"""NMF, X ~ W H with W >= 0 (local, one row per data row) and H >= 0 (global, r x n).

Losses (scikit-learn's beta-divergence convention):
    frobenius:          L = 1/2 ||X - W H||_F^2
    kullback-leibler:   L = sum_ij x_ij log(x_ij / (WH)_ij) - x_ij + (WH)_ij

Order (global first, then local, as in Lee & Seung's reference loop):
    global step   H <- H * (W^T X) / (W^T W H)              (MU, Frobenius)
                  H <- HALS sweep over rows of H from W^T X, W^T W
                  H <- H * (W^T (X / WH)) / (W^T 1)         (MU, KL)
    local step    W_b <- W_b * (X_b H^T) / (W_b H H^T)       (MU, Frobenius), HALS sweep, or
                  W_b <- W_b * ((X_b / W_b H) H^T) / (1 H^T) (MU, KL)
    statistics    per group l: W_l^T X_l, W_l^T W_l (and for KL: W_l^T (X_l / W_l H), W_l^T 1,
                  sum over X_l's non-zeros of x log(x / wh))
Errors come from the statistics, without another pass (DESIGN §1):
    ||X_l - W_l H||_F^2 = ||X_l||_F^2 - 2 <W_l^T X_l, H> + <W_l^T W_l, H H^T>
    D_KL(X_l || W_l H) = sum_nz x log(x / wh) - sum(X_l) + (W_l^T 1) . (H 1)
(for float32 data the first cancels to noise below a relative error of ~1e-3, so the pass also
accumulates ||X_b - W_b H||^2 directly in float64: one more product per dense block, O(nnz r) for CSR.)
Stopping rule: every group's loss changed by less than ``tol`` relative to its previous value.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels import nmf as k
from ..metrics import frobenius_sq_errors
from .stopping import groups_relative_change_below

SOLVERS = ("mu", "hals")
LOSSES = ("frobenius", "kullback-leibler")


@dataclass(frozen=True)
class NMFMethod:
    n_components: int
    solver: str = "mu"
    beta_loss: str = "frobenius"
    tol: float = 1e-4
    dtype: str = "float64"

    def __post_init__(self):
        if self.solver not in SOLVERS:
            raise ValueError(f"solver must be one of {SOLVERS}, got {self.solver!r}")
        if self.beta_loss not in LOSSES:
            raise ValueError(f"beta_loss must be one of {LOSSES}, got {self.beta_loss!r}")
        if self.solver == "hals" and self.beta_loss != "frobenius":
            raise ValueError("solver='hals' minimises the Frobenius loss only; use solver='mu' for 'kullback-leibler'")

    @property
    def kl(self) -> bool:
        return self.beta_loss == "kullback-leibler"

    # -- initialisation ------------------------------------------------------
    def init_scale(self, data) -> float:
        """sqrt(mean(X) / r), the scale of scikit-learn's random initialisation."""
        m, n = data.shape
        return float(np.sqrt(data.group_totals.sum() / (m * n) / self.n_components))

    def initial_global(self, data, rng):
        H = self.init_scale(data) * np.abs(rng.standard_normal((self.n_components, data.shape[1])))
        return self.with_derived(H.astype(self.dtype), data)

    def initial_local(self, block, global_state, rows):
        W = global_state["scale"] * np.abs(rows.standard_normal(self.n_components))
        return W.astype(self.dtype)

    def with_derived(self, H, data=None, scale=None):
        """Global state: H plus what every block needs from it, computed once on the driver."""
        state = {"H": H, "HHt": H @ H.T, "scale": self.init_scale(data) if scale is None else scale}
        return state

    # -- pass ---------------------------------------------------------------
    def block_stats(self, X_b, W_b, block, G):
        """Statistics of the block for (W_b, H) (pass 0)."""
        WtX, WtW = k.frobenius_stats(X_b, W_b)
        stats = {"WtX": WtX, "WtW": WtW}
        if self.kl:
            stats.update(zip(("WtR", "Wsum", "xlogx"), k.kl_stats(X_b, W_b, G["H"])))
        return self._with_residual(stats, X_b, W_b, G)

    def local_step(self, X_b, W_b, block, G):
        """Update W_b for the current H, then emit the block's statistics for the new W_b."""
        if self.kl:
            W_new, WtR, Wsum, xlogx = k.kl_local(X_b, W_b, G["H"])
            WtX, WtW = k.frobenius_stats(X_b, W_new)
            stats = {"WtX": WtX, "WtW": WtW, "WtR": WtR, "Wsum": Wsum, "xlogx": xlogx}
            return W_new, self._with_residual(stats, X_b, W_new, G)
        W_new, WtX, WtW, *sq_err = k.frobenius_local(X_b, W_b, G["H"], G["HHt"], self.solver, residual=self._float32)
        stats = {"WtX": WtX, "WtW": WtW}
        if sq_err:  # float32: from the same tiles of X_b as the products
            stats["sq_err"] = np.float64(sq_err[0])
        return W_new, stats

    @property
    def _float32(self) -> bool:
        """float32 data: the errors come from ||X_b - W_b H||^2 accumulated in float64 (see ``residual_sq_norm``)."""
        return np.dtype(self.dtype) == np.float32

    def _with_residual(self, stats, X_b, W_b, G):
        """float32 data: add ||X_b - W_b H||^2 accumulated in float64."""
        if self._float32:
            stats["sq_err"] = np.float64(k.residual_sq_norm(X_b, W_b, G["H"]))
        return stats

    # -- global -------------------------------------------------------------
    def global_step(self, G, stats, data):
        """H update from the statistics summed over all groups."""
        total = {name: sum(s[name] for s in stats) for name in stats[0]}
        H = G["H"]
        if self.kl:
            H = k.kl_h_update(H, total["WtR"], total["Wsum"])
        elif self.solver == "mu":
            H = k.mu_h_update(H, total["WtX"], total["WtW"])
        else:
            H = k.hals_h_update(H, total["WtX"], total["WtW"])
        return self.with_derived(H, scale=G["scale"])

    # -- objective and stopping ------------------------------------------------
    @staticmethod
    def squared_errors(G, stats, data) -> np.ndarray:
        """||X_l - W_l H||_F^2 per group, from the statistics (clipped at 0 against round-off);
        for float32 data, from the residuals accumulated in float64."""
        if "sq_err" in stats[0]:
            return np.array([float(s["sq_err"]) for s in stats])
        return frobenius_sq_errors(data.group_sq_norms, [(s["WtX"], s["WtW"]) for s in stats], G["H"], G["HHt"])

    def objective(self, G, stats, data):
        if self.kl:
            Hsum = G["H"].sum(axis=1)
            losses = np.array([float(s["xlogx"]) - total + float(s["Wsum"] @ Hsum.astype(np.float64))
                               for s, total in zip(stats, data.group_totals)])
        else:
            losses = 0.5 * self.squared_errors(G, stats, data)
        return float(losses.sum()), losses

    def converged(self, objectives, group_objectives):
        return groups_relative_change_below(group_objectives, self.tol)

    # -- transform ------------------------------------------------------------
    def solve_local(self, X_b, _local, block, H, scale, max_iter, tol):
        """W_b for a fixed H (transform), from one read of X_b, starting from W_b = ``scale``."""
        W_b = np.full((block.n_rows, H.shape[0]), scale, dtype=H.dtype)
        if self.kl:
            return k.kl_solve_w(X_b, W_b, H, max_iter, tol)
        return k.frobenius_solve_w(X_b, W_b, H, self.solver, max_iter, tol)
