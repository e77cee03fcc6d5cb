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
(for float32 data the first needs W^T X and W^T W summed in float64: a dense block's W_b^T X_b is then summed
in float64 over products of at most 128 rows (``kernels/nmf.py: frobenius_local``'s ``sums64``), which leaves an error
below FLOAT32_FORMULA_ERROR / sqrt(n_eff) ||X_l||^2, n_eff the effective number of terms of <W_l^T X_l, H>.
Where that is not small against the loss (a group's relative error below about 0.2 on 20,000 x 2,000 U(0, 1)
data at rank 20, the default tol; always with a few dominant columns; see ``_residuals_needed``), and on CSR
blocks, the pass accumulates ||X_b - W_b H||^2 directly in float64: one more product per dense block, O(nnz r)
for CSR.)
Stopping rule: every group's loss changed by less than ``tol`` relative to its previous value.

With a mask (weights M >= 0, 0 = missing; ``fit(X, mask=...)``) the losses are over the observed entries,

    frobenius:          L = 1/2 sum_ij m_ij (x_ij - (WH)_ij)^2           (1/2 ||M o (X - W H)||_F^2 for 0/1 M)
    kullback-leibler:   L = sum_ij m_ij (x_ij log(x_ij / (WH)_ij) - x_ij + (WH)_ij)

and Lee & Seung's updates above become their weighted forms (M enters where the all-ones matrix was):

    global step   H <- H * (W^T (M o X)) / (W^T (M o W H))          (MU, Frobenius)
                  H <- H * (W^T (M o X / WH)) / (W^T M)             (MU, KL)
    local step    W_b <- W_b * ((M_b o X_b) H^T) / ((M_b o W_b H) H^T)   (MU, Frobenius)
                  W_b <- W_b * ((M_b o X_b / W_b H) H^T) / (M_b H^T)      (MU, KL)
    statistics    per group l: W_l^T (M_l o X_l), and W^T (M o W H) as (W^T W) H + WtMWH_adj, sum m x^2
                  (Frobenius); W_l^T (M_l o X_l / W_l H), W_l^T M_l, sum m x log(x / wh), sum m x (KL)
    errors        sum m (x - wh)^2 = sum m x^2 - 2 <W^T (M o X), H> + <W^T W, H H^T> + <WtMWH_adj, H>
                  D_KL over observed = sum m x log(x / wh) - sum m x + <W^T M, H>

Each block's mask travels with its W_b in its local state, in the sparse form that stores fewer entries
(``kernels/masked.py``): a masked block's local state is the dict {"W": W_b, form: P_b}. The stopping rule,
the objective and the per-group ``relative_error`` (sqrt(sum m (x - wh)^2 / sum m x^2)) of a masked fit are
over the observed entries.

HALS with a mask (weighted HALS, Frobenius): each row of W and each column of H has its own Gram,

    local step    per row i: G_i = H diag(m_i) H^T, b_i = (m_i o x_i) H^T,
                  w_ik <- max(0, w_ik + (b_ik - w_i G_i[:, k]) / G_i[k, k]),  k = 1..r
    global step   per column j: G_j = W^T diag(m_j) W, b_j = W^T (m_j o x_j),
                  h_kj <- max(0, h_kj + (b_kj - G_j[k, :] h_j) / G_j[k, k]),  k = 1..r
    statistics    W^T (M o X), and G_j = WtW + WtMW_cols[j] (an n x r x r statistic per group: O(n r^2) memory)

each G formed from the mask's stored entries (O(entries x r^2) per pass); an update is skipped where G[k, k] is 0,
and for a G formed as a difference (the complement form: H H^T less the missing entries' terms) where G[k, k] is
within its round-off bound ((terms) x eps x the undiminished diagonal), as the transcription's exact zero would be.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass

import numpy as np

from ..kernels import masked as km
from ..kernels import nmf as k
from ..metrics import frobenius_sq_errors
from .stopping import group_sums, groups_relative_change_below

SOLVERS = ("mu", "hals")
#: float32 data: the error of the statistics formula of ||X_l - W_l H||^2 with float64 sums (``sums64``), relative
#: to ||X_l||^2, times sqrt(n_eff), n_eff = (sum t)^2 / sum t^2 over the terms t = (W_l^T X_l)_kj H_kj of
#: <W_l^T X_l, H> (the products' round-off averages over that many terms): 5 eps_32 sqrt(128), 128 the rows of a
#: float32 product (``kernels/nmf.py: SUM64_ROWS``). Measured errors were 0.25 to 0.82 of eps_32 sqrt(128) /
#: sqrt(n_eff) over 14 cases (12 shapes, 2,000 x 3,000 to 300,000 x 10, ranks 1 to 20, columns of Zipf popularity,
#: rows of Zipf norms; ``tests/test_nmf.py`` checks five)
FLOAT32_FORMULA_ERROR = 5 * float(np.finfo(np.float32).eps) * 128 ** 0.5
#: ... and the precision the losses need, relative to themselves, with the stopping rule's tol at 1e-4 or above
LOSS_PRECISION = 1e-6
_FLOAT64 = np.dtype(np.float64)
LOSSES = ("frobenius", "kullback-leibler")


@dataclass(frozen=True)
class NMFMethod:
    n_components: int
    solver: str = "mu"
    beta_loss: str = "frobenius"
    tol: float = 1e-4
    dtype: str = "float64"
    #: a masked fit's sum of X over its observed entries (None: X's total), for the random start's scale
    x_total: float | None = None

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
        """sqrt(mean(X) / r), the scale of scikit-learn's random initialisation; for a masked fit, of X with its
        missing entries read as 0 (``x_total``), so that X's values there change nothing, whatever X holds."""
        m, n = data.shape
        total = data.group_totals.sum() if self.x_total is None else self.x_total
        return float(np.sqrt(total / (m * n) / self.n_components))

    def initial_global(self, data, rng):
        H = self.init_scale(data) * np.abs(rng.standard_normal((self.n_components, data.shape[1])))
        return self.with_derived(H.astype(self.dtype), data)

    def initial_local(self, block, global_state, rows, inputs=None):
        """W_b from the block's random rows; with ``inputs`` (a masked fit: the block's mask), the local state
        {**inputs, "W": W_b}."""
        W = (global_state["scale"] * np.abs(rows.standard_normal(self.n_components))).astype(self.dtype)
        return W if inputs is None else {**inputs, "W": W}

    def with_derived(self, H, data=None, scale=None, residuals=False):
        """Global state: H plus what every block needs from it, computed once on the driver; for float32 data,
        also whether the next pass computes its dense blocks' residuals (``_residuals_needed``)."""
        state = {"H": H, "HHt": H @ H.T, "scale": self.init_scale(data) if scale is None else scale}
        if self._float32:
            state["residuals"] = residuals
        return state

    def passes_on_cores(self, data) -> bool:
        """Whether each pass of the fit does its arithmetic in pieces on the cores and the driver makes small
        products only (r x n): the Frobenius loss, no mask (given to ``fit``, which sets ``x_total``, or stored with
        the data), and dense blocks whose local step runs in pieces
        (``kernels/nmf.py: steps_in_pieces``). The driver then holds BLAS at one thread for the fit
        (``kernels/blas_threads.py: pieces_on_cores``)."""
        return not self.kl and self.x_total is None and dense_steps_in_pieces(data, self.n_components, self.dtype)

    # -- pass ---------------------------------------------------------------
    def block_stats(self, X_b, W_b, block, G):
        """Statistics of the block for (W_b, H) (pass 0)."""
        if isinstance(W_b, dict):
            form, P = km.mask_of(W_b)
            if self._fused(X_b, W_b["W"], G["H"], form):
                return km.complement_frobenius_step(X_b, W_b["W"], G["H"], None, P, W_b.get("X_sums"), False,
                                                    self._float32)[1]
            return self._masked_stats(km.BlockTerms(X_b, W_b["W"], G["H"], form, P, **km.kept_constants(W_b)))
        WtX, WtW = k.frobenius_stats(X_b, W_b)
        stats = {"WtX": WtX, "WtW": WtW}
        if self.kl:
            stats.update(zip(("WtR", "Wsum", "xlogx"), k.kl_stats(X_b, W_b, G["H"])))
        return self._with_residual(stats, X_b, W_b, G)

    def local_step(self, X_b, W_b, block, G):
        """Update W_b for the current H, then emit the block's statistics for the new W_b."""
        if isinstance(W_b, dict):
            return self._masked_local_step(X_b, W_b, block, G)
        if self.kl:
            W_new, WtR, Wsum, xlogx = k.kl_local(X_b, W_b, G["H"])
            WtX, WtW = k.frobenius_stats(X_b, W_new)
            stats = {"WtX": WtX, "WtW": WtW, "WtR": WtR, "Wsum": Wsum, "xlogx": xlogx}
            return W_new, self._with_residual(stats, X_b, W_new, G)
        if not _single_precision(self.dtype):
            W_new, WtX, WtW = k.frobenius_local(X_b, W_b, G["H"], G["HHt"], self.solver)
            return W_new, {"WtX": WtX, "WtW": WtW}
        dense = isinstance(X_b, np.ndarray)
        residual = G.get("residuals", True) or not dense  # a global state without the flag (an earlier version's)
        W_new, WtX, WtW, *sq_err = k.frobenius_local(X_b, W_b, G["H"], G["HHt"], self.solver, residual=residual,
                                                     sums64=dense)
        stats = {"WtX": WtX, "WtW": WtW}
        if residual:
            stats["sq_err"] = np.float64(sq_err[0])  # from the same tiles of X_b
        return W_new, stats

    @staticmethod
    def local_step_many(methods, X_b, locals_, block, Gs):
        """Several models' ``local_step`` on one block with one product per tile of X_b for all of them
        (``engine/many.py``: the running models of a sweep; ``kernels/nmf.py: frobenius_local_many``), or None
        where it does not apply (``_share_products``; also one solver, MU or HALS, for all). Each model's results
        equal its ``local_step``'s to rounding."""
        solvers = {method.solver for method in methods}
        if len(solvers) > 1 or not NMFMethod._share_products(methods, X_b, locals_, Gs):
            return None
        steps = k.frobenius_local_many(X_b, locals_, [G["H"] for G in Gs], [G["HHt"] for G in Gs], solvers.pop())
        return [(W_new, {"WtX": WtX, "WtW": WtW}) for W_new, WtX, WtW in steps]

    @staticmethod
    def block_stats_many(methods, X_b, locals_, block, Gs):
        """Several models' ``block_stats`` (pass 0) on one block with one W^T X product per tile for all of them,
        or None where it does not apply (``_share_products``). Each model's statistics equal its
        ``block_stats``'s to rounding."""
        if not NMFMethod._share_products(methods, X_b, locals_, Gs):
            return None
        return [{"WtX": WtX, "WtW": WtW} for _, WtX, WtW in k.frobenius_local_many(X_b, locals_, None, None, None)]

    @staticmethod
    def _share_products(methods, X_b, locals_, Gs) -> bool:
        """Whether several models' steps on X_b can share its products: NMF's own method (not a subclass's) with
        the Frobenius loss, float64 (float32's come with float64 sums or residuals, each model's own), unmasked
        local states and a dense block of several tiles (``kernels/nmf.py: shares_products``)."""
        return (all(type(method) is NMFMethod and not method.kl and method.dtype == "float64" for method in methods)
                and all(isinstance(W_b, np.ndarray) for W_b in locals_)
                and k.shares_products(X_b, locals_, [G["H"] for G in Gs]))

    def _masked_local_step(self, X_b, local, block, G):
        """A masked block: W_b by weighted MU (or HALS) over its observed entries, then its statistics."""
        form, P = km.mask_of(local)
        if self._fused(X_b, local["W"], G["H"], form):
            W_new, stats, X_sums = km.complement_frobenius_step(X_b, local["W"], G["H"], G["HHt"], P,
                                                                local.get("X_sums"), True, self._float32)
            kept = {"X_sums": X_sums}
        else:
            terms = km.BlockTerms(X_b, local["W"], G["H"], form, P, **km.kept_constants(local))
            if self.kl:
                terms = km.kl_local(terms)
            else:
                terms = (km.hals_local if self.solver == "hals" else km.frobenius_local)(terms, G["HHt"])
            W_new, stats, kept = terms.W, self._masked_stats(terms), terms.constants()
        # the block's constants (X_b's sums, its values at P's entries), computed in its first step, kept with it
        return {**local, "W": W_new, **kept}, stats

    def _fused(self, X_b, W_b, H, form) -> bool:
        """Whether a masked block's MU step (Frobenius) is the fused complement kernel's."""
        return not self.kl and self.solver == "mu" and km.fused(X_b, W_b, H, form)

    def _masked_stats(self, terms):
        """A masked block's statistics at (W_b, H): the Frobenius ones (the H update of 'frobenius', and the
        ``relative_error`` metric whatever the loss) and, for KL, the KL ones."""
        stats = km.frobenius_stats(terms, self._float32)
        if self.kl:
            stats.update(km.kl_block_stats(terms))
        elif self.solver == "hals":
            stats["WtMW_cols"] = km.column_grams(terms)
        return stats

    @property
    def _float32(self) -> bool:
        """float32 data: the errors come from statistics summed in float64, or from ||X_b - W_b H||^2 accumulated in
        float64 (see the module's docstring)."""
        return _single_precision(self.dtype)

    def _with_residual(self, stats, X_b, W_b, G):
        """float32 data: add ||X_b - W_b H||^2 accumulated in float64."""
        if self._float32:
            stats["sq_err"] = np.float64(k.residual_sq_norm(X_b, W_b, G["H"]))
        return stats

    # -- global -------------------------------------------------------------
    def global_step(self, G, stats, data):
        """H update from the statistics summed over all groups."""
        total = group_sums(stats)
        H = G["H"]
        if self._float32 and not self.kl:  # float64 sums (``sums64``) update H in its dtype
            total["WtX"], total["WtW"] = (total[name].astype(H.dtype, copy=False) for name in ("WtX", "WtW"))
        if "WtM" in total:
            H = km.kl_h_update(H, total["WtR"], total["WtM"])
        elif "WtMW_cols" in total:
            H = km.hals_h_update(H, total["WtX"], total["WtW"], total["WtMW_cols"], data.shape[0])
        elif "WtMWH_adj" in total:
            H = km.mu_h_update(H, total["WtX"], total["WtW"], total["WtMWH_adj"])
        elif self.kl:
            H = k.kl_h_update(H, total["WtR"], total["Wsum"])
        elif self.solver == "mu":
            H = k.mu_h_update(H, total["WtX"], total["WtW"])
        else:
            H = k.hals_h_update(H, total["WtX"], total["WtW"])
        residuals = self._float32 and self._residuals_needed(G, stats, data)
        return self.with_derived(H, scale=G["scale"], residuals=residuals)

    def _residuals_needed(self, G, stats, data) -> bool:
        """float32 data: whether the passes from the next on compute their dense blocks' residuals: once a group's
        loss, from this pass, is below ||X_l||^2 FLOAT32_FORMULA_ERROR / sqrt(n_eff) / precision, where the
        statistics formula's error could exceed ``precision`` of the loss (LOSS_PRECISION, and at most tol / 100
        for the stopping rule). Then for the rest of the fit: a loss goes down, and one formula for the losses
        compared."""
        if data.is_sparse:  # CSR blocks compute their residuals in every pass
            return True
        if G.get("residuals", True) or self.kl or "Mxx" in stats[0]:  # KL and masked fits: their own residuals
            return G.get("residuals", True)
        precision = min(LOSS_PRECISION, 0.01 * self.tol) if self.tol > 0 else LOSS_PRECISION
        H = G["H"].astype(np.float64)
        terms = [np.asarray(s["WtX"], np.float64) * H for s in stats]  # non-negative
        sums, squares = np.array([t.sum() for t in terms]), np.array([np.vdot(t, t) for t in terms])
        # 1 / sqrt(n_eff) = sqrt(sum t^2) / sum t; a group without terms (X_l or W_l zero) has <W_l^T X_l, H> = 0
        # exactly, and no error from it
        inverse_sqrt_n_eff = np.divide(np.sqrt(squares), sums, out=np.zeros_like(sums), where=sums > 0)
        errors = FLOAT32_FORMULA_ERROR * inverse_sqrt_n_eff * data.group_sq_norms
        return not bool(np.all(self.squared_errors(G, stats, data) * precision >= errors))

    # -- objective and stopping ------------------------------------------------
    @staticmethod
    def squared_errors(G, stats, data) -> np.ndarray:
        """||X_l - W_l H||_F^2 per group, from the statistics (clipped at 0 against round-off; for float32 data
        summed in float64, H H^T formed in float64), or from the residuals accumulated in float64 where the pass
        computed them. Masked: sum m (x - wh)^2 over the observed entries."""
        if "sq_err" in stats[0]:
            return np.array([max(float(s["sq_err"]), 0.0) for s in stats])
        if "Mxx" in stats[0]:
            return km.sq_errors(G, stats)
        HHt = G["HHt"] if G["HHt"].dtype is _FLOAT64 else None  # float32 data: H H^T formed in float64
        return frobenius_sq_errors(data.group_sq_norms, [(s["WtX"], s["WtW"]) for s in stats], G["H"], HHt)

    @staticmethod
    def observed_sq_norms(stats, data) -> np.ndarray:
        """||X_l||_F^2 over the observed entries (sum m x^2; all of X_l without a mask): what ``relative_error``
        is relative to."""
        if "Mxx" in stats[0]:
            return np.array([float(s["Mxx"]) for s in stats])
        return data.group_sq_norms

    def objective(self, G, stats, data):
        if "WtM" in stats[0]:
            losses = km.kl_objectives(G, stats)
        elif self.kl:
            Hsum = G["H"].sum(axis=1)
            losses = np.array([float(s["xlogx"]) - total + float(s["Wsum"] @ Hsum.astype(np.float64))
                               for s, total in zip(stats, data.group_totals)])
        else:  # in Python floats: numpy's operations on a vector of a few groups cost more than their arithmetic
            halves = [0.5 * error for error in self.squared_errors(G, stats, data).tolist()]
            # summed left to right in group order (numpy's sum pairs 9 groups or more otherwise)
            return functools.reduce(operator.add, halves), np.array(halves)
        return float(np.add.reduce(losses)), losses  # losses.sum() without numpy's Python wrapper (issue 19)

    def converged(self, objectives, group_objectives):
        return groups_relative_change_below(group_objectives, self.tol)

    # -- transform ------------------------------------------------------------
    def solve_local(self, X_b, local, block, H, scale, max_iter, tol):
        """W_b for a fixed H (transform), from one read of X_b, starting from W_b = ``scale``; with a mask
        (``local``: the block's mask), over its observed entries by weighted MU."""
        W_b = np.full((block.n_rows, H.shape[0]), scale, dtype=H.dtype)
        if isinstance(local, dict):
            return km.solve_w(X_b, W_b, H, *km.mask_of(local), self.kl, max_iter, tol)
        if self.kl:
            return k.kl_solve_w(X_b, W_b, H, max_iter, tol)
        return k.frobenius_solve_w(X_b, W_b, H, self.solver, max_iter, tol)


def dense_steps_in_pieces(data, rank: int, dtype) -> bool:
    """Whether every block's Frobenius step (``kernels/nmf.py: frobenius_local``) on these data, with factors of
    ``dtype``, runs in pieces on the cores: dense blocks of X's precision, no mask stored with the data, each block
    large enough (``steps_in_pieces``)."""
    return (not data.is_sparse and data.mask_kind is None and np.result_type(data.dtype, dtype) == data.dtype
            and all(k.steps_in_pieces(block.n_rows, data.shape[1], rank, data.dtype) for block in data.blocks))


@functools.lru_cache(maxsize=None)
def _single_precision(dtype) -> bool:
    """Whether ``dtype`` is float32 (asked every local step: the answer for a dtype, once)."""
    return np.dtype(dtype) == np.float32
