"""Semi-supervised NMF on the engine: J. Haddock, L. Kassab, S. Li, A. Kryshchenko, R. Grotheer, E. Sizikova,
C. Wang, T. Merkh, R. W. M. A. Madushani, M. Ahn, D. Needell and K. Leonard, "Semi-supervised NMF Models for Topic
Modeling in Learning Tasks", 2020 (arXiv:2010.07956).

In distfact's orientation (rows are samples): X (m x n) ~ W H and Y (m x k) ~ W B, W >= 0 local (the
paper's S^T), H >= 0 and B >= 0 global (the paper's A^T and B^T). The objective (eqs. 3, 7, 8, 9):

    R(M o X, M o W H) + lam * S(L o Y, L o W B),   R, S in {F: ||.||_F^2, D: I-divergence}

with the data mask M and the label mask L (all ones when not given, and then never built). Models
"FF" (eq. 3, updates of the paper's reference [28]), "FD" (eq. 7, Algorithm 1), "DF" (eq. 8,
Algorithm 2), "DD" (eq. 9, Algorithm 3); without Y, plain NMF with a data mask, F or D.

One iteration, in the paper's order (lines 3, 4, 5 of Algorithms 1-3):

    global step   H <- update from the data term's statistics (line 3, the paper's A)
                  B <- update from the label term's statistics (line 4)
    local step    W_b <- W_b / (eps + c_R den_R + lam c_S den_S) o (c_R num_R + lam c_S num_S)   (line 5)
                  with (c_R, c_S) = (1, 1) for FF and DD, (2, 1) for FD (Algorithm 1), (1, 2) for DF
                  (Algorithm 2): the factor 2 of a squared Frobenius term's gradient
    statistics    per group, at the new W and the current H, B: each term's numerator and denominator
                  for its global update, and its loss (``kernels/ssnmf.py``); and W^T X, W^T W, from
                  which ||X_l - W_l H||_F (the metric ``relative_error``) follows without another read
                  of X (``squared_errors``; an unmasked Frobenius data term has them already); with a
                  data mask, sums over the observed entries instead: sum m (x - wh)^2 and sum m x^2 (the
                  metric), ||M o X_l||^2 and sum(M o X_l) (``data_term_scales``)

With a data mask M (weights, 0 = missing; the estimator's ``mask``: an array, X's NaN entries or a
sparse X's stored entries, or a store's own mask) every data term is the paper's masked one above,
M o X and M o W H: the values of X where M is 0 never enter an update, and X reaches the blocks with 0
there. The masked updates of W and of the global factor F (H, or B with L) are, entrywise,

    F:  W <- W o [(M o X) H^T] / [eps + (M o W H) H^T]        F <- F o [W^T (M o X)] / [eps + W^T (M o W F)]
    D:  W <- W o [Q H^T] / [eps + M H^T]                       F <- F o [W^T Q] / [eps + W^T M]
        Q = (M o X) / (eps + M o W H) o M

(with M = 1 these are the paper's: Algorithms 1-3, lines 3-5).

``eps`` (default 1e-10) is added to every denominator as in the reference package. A block's local
state is a dict: W, and the rows of Y, of L and of M that belong to the block (row-aligned inputs
that stay with it; M in the sparse form of ``kernels/masked.py`` that stores fewer entries, its observed
weights or, with few entries masked, its complement), and from its first step on the terms' ||X_b||^2 and
||Y_b||^2 (constants of the loss; with a complement, ||X_b||^2 and sum X_b, and X_b's values at the complement's
entries: ``kernels/masked.py: KEPT_VALUES``). Stopping rule (the reference package's): after the second iteration,
stop once the objective fell by less than ``tol`` times its value after the first iteration (for plain F-NMF the
value compared is the unsquared norm, as there).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels import ssnmf as k
from ..kernels.nnls import nnls_gram
from ..kernels.products import gram, wt_times_block
from ..metrics import frobenius_sq_errors
from .stopping import group_sums

MODELS = ("FF", "FD", "DF", "DD")
PLAIN = ("F", "D")
TERM_WEIGHTS = {"FF": (1.0, 1.0), "FD": (2.0, 1.0), "DF": (1.0, 2.0), "DD": (1.0, 1.0)}


@dataclass(frozen=True)
class SSNMFMethod:
    n_components: int
    model: str = "FF"  # one of MODELS, or "F" / "D" without labels
    lam: float = 1.0
    eps: float = 1e-10
    tol: float = 1e-4

    @property
    def supervised(self) -> bool:
        return len(self.model) == 2

    @property
    def losses(self) -> tuple[str, str | None]:
        return self.model[0], (self.model[1] if self.supervised else None)

    # -- start (uniform on [0, 1), as the reference package) --------------------------
    def initial_global(self, data, rng, n_targets: int = 0):
        G = {"H": rng.random((self.n_components, data.shape[1]))}
        if self.supervised:
            G["B"] = rng.random((self.n_components, n_targets))
        return G

    def initial_local(self, block, G, rows, inputs):
        """The block's inputs (its rows of Y, L, M) and W uniform on [0, 1)."""
        return {**inputs, "W": rows.uniform(self.n_components)}

    # -- pass -------------------------------------------------------------------
    def _terms(self, X_b, mask, local, G):
        """(loss, data, factor, mask, prefix, weight) for the data term and, if any, the label term."""
        R, S = self.losses
        c_R, c_S = TERM_WEIGHTS.get(self.model, (1.0, 0.0))
        terms = [(R, X_b, G["H"], mask, "R", c_R)]
        if S is not None:
            terms.append((S, local["Y"], G["B"], local.get("L"), "S", self.lam * c_S))
        return terms

    def block_stats(self, X_b, local, block, G, grams=None):
        """Each term's statistics for its global update and its loss, at (W_b, H, B). ``grams``: per term, F F^T
        of its global factor F (H, B) where the caller has it."""
        return self._stats(*k.block_mask(X_b, local), local, G, grams)

    def _stats(self, X_b, mask, local, G, grams):
        """:meth:`block_stats` of X_b and its data mask as ``kernels/ssnmf.py: block_mask`` gives them."""
        W = local["W"]
        stats = {}
        sq_norms = local.get("sq_norms")
        X_sums = local.get("X_sums")  # a complement's: its losses are the unmasked ones less P's entries'
        for i, (loss, Z, F, term_mask, prefix, _) in enumerate(self._terms(X_b, mask, local, G)):
            stats.update(k.term_stats(Z, W, F, term_mask, loss, self.eps, prefix))
            sq_norm = X_sums[0] if isinstance(term_mask, k.Complement) and X_sums is not None else \
                None if sq_norms is None else sq_norms[i]
            stats[f"{prefix}_loss"] = np.float64(k.term_loss(
                Z, W, F, term_mask, loss, self.eps, stats, prefix, None if grams is None else grams[i],
                None if sq_norm is None else float(sq_norm)))
        if mask is not None:  # the metrics over the observed entries (X is not read elsewhere)
            stats.update(k.observed_sums(X_b, W, G["H"], mask, X_sums,
                                         float(stats["R_loss"]) if self.losses[0] == "F" else None))
        elif "R_WtW" not in stats:  # the data term's statistics are not W^T X, W^T W: add them
            stats.update(WtX=wt_times_block(W, X_b), WtW=gram(W))
        return stats

    def local_step(self, X_b, local, block, G):
        """Line 5: W_b from both terms at the current H and B; then the new W_b's statistics. The terms' ||Z||^2
        (X_b's, Y_b's), constants, are computed in the block's first step and kept in its local state
        (``sq_norms``: 0 for a term whose loss does not take it; with a complement-form data mask ``X_sums``,
        the block's ||X_b||^2 and sum X_b; with either form X_b's values at the mask's entries, ``constants``), and
        each F F^T is formed once for both the update and the loss (small fits, issue 19)."""
        X_b, mask = k.block_mask(X_b, local)
        terms = self._terms(X_b, mask, local, G)
        grams = [F @ F.T if loss == "F" and (term_mask is None or isinstance(term_mask, k.Complement)) else None
                 for loss, _, F, term_mask, _, _ in terms]
        parts = [(weight, k.term_update_parts(Z, local["W"], F, term_mask, loss, self.eps, FFt))
                 for (loss, Z, F, term_mask, _, weight), FFt in zip(terms, grams)]
        local = {**local, "W": k.w_update(local["W"], parts, self.eps)}
        if "sq_norms" not in local:
            local["sq_norms"] = np.array([k.sq_norm(Z) if FFt is not None and term_mask is None else 0.0
                                          for (_, Z, _, term_mask, _, _), FFt in zip(terms, grams)])
        if isinstance(mask, k.Complement) and "X_sums" not in local:
            local["X_sums"] = k.block_sums(X_b)
        if isinstance(mask, (k.Complement, k.Observed)):
            local.update(mask.constants())
        return local, self._stats(X_b, mask, local, G, grams)

    # -- global -------------------------------------------------------------------
    def global_step(self, G, stats, data):
        """Lines 3 and 4: H, then B, each from its term's statistics summed over the groups."""
        total = group_sums(stats)
        R, S = self.losses
        G = {**G, "H": k.global_update(G["H"], total, R, self.eps, "R")}
        if S is not None:
            G["B"] = k.global_update(G["B"], total, S, self.eps, "S")
        return G

    # -- objective and stopping -------------------------------------------------------
    def objective(self, G, stats, data):
        """R + lam S, and per group its two parts (reconstruction, supervision)."""
        parts = np.array([[float(s["R_loss"]), float(s.get("S_loss", 0.0))] for s in stats])
        return float(parts[:, 0].sum() + self.lam * parts[:, 1].sum()), parts

    @staticmethod
    def squared_errors(G, stats, data) -> np.ndarray:
        """||X_l - W_l H||_F^2 per group (whatever the model) at the (W, H) of ``stats``; with a data mask
        sum m (x - wh)^2 over group l's observed entries."""
        if "M_sq_error" in stats[0]:
            return np.array([s["M_sq_error"] for s in stats], dtype=np.float64)
        grams = [(s["R_num"], s["R_WtW"]) if "R_WtW" in s else (s["WtX"], s["WtW"]) for s in stats]
        return frobenius_sq_errors(data.group_sq_norms, grams, G["H"])

    @staticmethod
    def observed_sq_norms(stats, data) -> np.ndarray:
        """What ``squared_errors`` is relative to: ||X_l||_F^2, or with a data mask sum m x^2 over group l."""
        if "M_sq_norm" in stats[0]:
            return np.array([s["M_sq_norm"] for s in stats], dtype=np.float64)
        return data.group_sq_norms

    @staticmethod
    def data_term_scales(stats, data) -> tuple[np.ndarray, np.ndarray]:
        """Per group, what its data term R_l is relative to (``group_errors_``): ||M_l o X_l||_F^2 and
        sum(M_l o X_l), X_l's own without a data mask."""
        if "MX_sq_norm" in stats[0]:
            return (np.array([s["MX_sq_norm"] for s in stats], dtype=np.float64),
                    np.array([s["MX_total"] for s in stats], dtype=np.float64))
        return data.group_sq_norms, data.group_totals

    def converged(self, objectives, group_objectives):
        if self.tol <= 0 or len(objectives) < 3:
            return False
        values = np.sqrt(objectives) if self.model == "F" else np.asarray(objectives)
        return bool((values[-2] - values[-1]) / values[1] < self.tol)

    # -- new rows (Section 2.3) -------------------------------------------------------
    def represent(self, X_b, H, inputs: dict, max_iter: int, tol: float, W0):
        """W for new rows with H fixed, from the reconstruction term only: exact non-negative least
        squares per row for F (without a mask), I-divergence (or masked F) multiplicative updates
        otherwise, until the relative change of W is below ``tol`` or ``max_iter`` updates. ``inputs``: the
        block's, with its data mask if any."""
        R = self.losses[0]
        X_b, mask = k.block_mask(X_b, inputs)
        if R == "F" and mask is None:  # rows solve min ||x_i - w H|| on the Gram form: H H^T, X H^T
            return nnls_gram(H @ H.T, np.asarray(X_b @ H.T))
        HHt = H @ H.T if R == "F" and isinstance(mask, k.Complement) else None
        W = W0
        for _ in range(max_iter):
            W_new = k.w_update(W, [(1.0, k.term_update_parts(X_b, W, H, mask, R, self.eps, HHt))], self.eps)
            change = np.abs(W_new - W).sum() / max(np.abs(W).sum(), np.finfo(float).tiny)
            W = W_new
            if change < tol:
                break
        return W
