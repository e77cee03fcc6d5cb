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
A(i)^T 1 (CSR blocks: see below). On the engine an iteration is: global step = line 8 of the previous iteration (once W has
moved) then line 5; one pass = line 7 and the statistics of the new W. The loss after iteration k
therefore evaluates line 8 on the pass's statistics (``stratum_sq_errors``), and the fit ends by
applying it (``final_global``); the objective leaves it in the global state it came from, where the next global
step takes it (line 8 runs once per iteration). Theorem 2: F is non-increasing under lines 5, 7 and 8.

CSR blocks (issue 19): a stratum stores entries in a fraction of the n columns, and W(i)^T A(i) is zero elsewhere.
Pass 0 adds the entries stored per column (``stored``), which give each stratum's *kept columns*; from then on a
block's statistic is A(i)^T W(i) at its stratum's kept columns (k_i x r, ``AtW_kept``, ``kernels/stratified.py``),
and line 8 scatters them into the r x n sum in stratum order (the same sums, in the same order, as the r x n
statistics: the same H, v and W bits). Pass 0's W^T A enters only the objective (line 8 waits for the first W
update), as <W, A H^T> per block (``WtA_H``). The objective's <W^T A, H> is then a sum over the kept columns: the
loss history moves by rounding (1e-16 relative) against r x n inner products.

The objective from statistics (never forming the residual):

    ||A - 1 v^T - W H||^2 = ||A||^2 + m ||v||^2 + <W^T W, H H^T> - 2 v . A^T 1 - 2 <W^T A, H> + 2 (W^T 1)^T H v

Section IV: loss = sqrt(F), normalised loss = sqrt(F / sum_i ||A(i)||^2); start H, W(i) ~ U[0, 1/sqrt(r)],
v(i) ~ U[0, 1]. Stopping rule: ``tol`` None runs ``max_iter`` iterations (the paper's practice); otherwise
stop when F fell by less than ``tol`` relative to the previous iteration.

With a mask (weights M(i) >= 0 of A(i)'s shape, 0 = missing; ``fit(X, groups, mask=...)``) the objective is over
the observed entries, F = sum_i sum_jk m_jk (a_jk - v(i)_k - (W(i) H)_jk)^2 (||M(i) o (A(i) - 1 v(i)^T - W(i) H)||^2
for a 0/1 mask), and every product with A(i) or with the reconstruction R(i) = 1 v(i)^T + W(i) H is taken over the
observed entries (M(i) enters where the all-ones matrix was; the same eps, the W denominator floored as unmasked):

    line 5   v(i) <- v(i) * (M(i) o A(i))^T 1 / ((M(i)^T 1) o v(i) + (M(i) o W(i) H)^T 1 + eps),
             (M o W H)^T 1 = column sums of H o (W^T M), so m_i v(i) becomes (M^T 1) o v(i)
    line 7   W(i) <- W(i) * (M(i) o A(i)) H^T / ((M(i) o (W(i) H + 1 v(i)^T)) H^T + eps)          local
    line 8   H <- H * sum_i W(i)^T (M(i) o A(i)) / (sum_i W(i)^T (M(i) o (W(i) H + 1 v(i)^T)) + eps),
             W^T (M o (W H + 1 v^T)) = (W^T W) H + WtMWH_adj + (W^T M) diag(v)

Statistics per stratum from one pass: W^T (M o A), W^T W and WtMWH_adj (``kernels/masked.py:
frobenius_stats``, W^T (M o WH) = W^T W H + WtMWH_adj at the pass's H), W^T M, sum m a^2 and the column Grams
W^T diag(m_k) W = W^T W + WtMW_cols[k] (``column_grams``); in pass 0 also the constants (M o A)^T 1 and M^T 1.
The objective after line 8 (a new H, which the pass did not see) from them:

    F(i) = sum m a^2 + (M^T 1) . v^2 + <W^T W, H H^T> + sum_k h_k^T WtMW_cols[k] h_k - 2 v . (M o A)^T 1
           - 2 <W^T (M o A), H> + 2 <W^T M, H diag(v)>

The column Grams cost O(stored entries of the mask's form x r^2) per pass and an n x r x r statistic per stratum
(as weighted HALS's), the price of evaluating the quadratic term at the new H without another pass. A block's
mask travels with its W(i) in its local state ({"W": W_b, form: P_b}, ``kernels/masked.py``); the per-stratum
``relative_error`` of a masked fit is sqrt(F(i) / sum m a^2).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from ..kernels import masked as km
from ..kernels import nmf as k
from ..kernels import stratified as ks
from ..kernels.memory import aligned, aligned_copy
from ..kernels.products import block_column_sums, gram
from .nmf import dense_steps_in_pieces
from .stopping import relative_decrease_below


@dataclass(frozen=True)
class StratifiedMU:
    n_components: int
    v_updates: int = 2
    eps: float = 1e-9
    tol: float | None = None
    #: a mask given to ``fit`` (its blocks' local states carry it): set by the estimator, not part of the configuration
    masked: bool = False

    # -- initialisation (Section IV) ---------------------------------------------
    def initial_global(self, data, rng):
        r, n = self.n_components, data.shape[1]
        return self.with_derived(rng.random((r, n)) / np.sqrt(r), rng.random((data.n_groups, n)))

    def initial_local(self, block, G, rows, inputs=None):
        """W_b from the block's random rows; with ``inputs`` (a masked fit: the block's mask), the local state
        {**inputs, "W": W_b}."""
        W = rows.uniform(self.n_components) / np.sqrt(self.n_components)
        return W if inputs is None else {**inputs, "W": W}

    def with_derived(self, H, v, colsum=None, w_moved=False, Mt1=None, kept=None, like=None, passes=True):
        """Global state: H and v plus what the blocks need from them. ``w_moved``: W has been
        updated since H was (line 8 is due at the next global step). ``colsum`` (and, masked, ``Mt1``):
        the constants of pass 0. ``kept``: (kept, kept_starts), every stratum's kept columns (CSR blocks,
        unmasked: ``kernels/stratified.py``), known from pass 0's statistics; their blocks read H^T, not H.
        ``like``: a state of the same H whose H H^T (and H^T) are taken, not made again (each of these products
        reads an r x n array: a few ms on a sparse corpus). ``passes``: whether a pass may run from the state (then
        it holds v H^T, line 7's shift; the state after line 8 that only the objective and the results read has
        none)."""
        same = like is not None and like["H"] is H
        state = {"H": H, "HHt": like["HHt"] if same else H @ H.T, "v": v, "w_moved": w_moved}
        if passes:
            state["Hv"] = v @ H.T
        if colsum is not None:
            state["colsum"] = colsum
        if Mt1 is not None:
            state["Mt1"] = Mt1
        if kept is not None:
            state["kept"], state["kept_starts"] = kept
            state["Ht"] = like["Ht"] if same and "Ht" in like else aligned_copy(H.T)
        return state

    @staticmethod
    def block_state(G):
        """What line 7 needs (v and A^T 1, s x n each, stay on the driver; a masked fit's line 7 needs v; CSR
        blocks with kept columns need H^T, not H)."""
        if "kept" in G:
            return {"Ht": G["Ht"], "HHt": G["HHt"], "Hv": G["Hv"], "kept": G["kept"], "kept_starts": G["kept_starts"]}
        state = {"H": G["H"], "HHt": G["HHt"], "Hv": G["Hv"]}
        if "Mt1" in G:
            state["v"] = G["v"]
        return state

    def passes_on_cores(self, data) -> bool:
        """Whether each pass does its arithmetic in pieces on the cores (line 7 on dense float64 blocks, unmasked:
        ``methods/nmf.py: dense_steps_in_pieces``) and the driver makes small products only (s x n and r x n; its
        sweeps run on the cores without BLAS): the driver then holds BLAS at one thread for the loop."""
        return not self.masked and dense_steps_in_pieces(data, self.n_components, np.float64)

    # -- pass ------------------------------------------------------------------------
    def block_stats(self, A_b, W_b, block, G):
        """Pass 0: the statistics of the initial W, and the constant A(i)^T 1 (masked: (M o A)^T 1 and M^T 1)."""
        if isinstance(W_b, dict):
            terms = km.BlockTerms(A_b, W_b["W"], G["H"], *km.mask_of(W_b), **km.kept_constants(W_b))
            colsum, Mt1 = km.column_sums(terms)
            return {**self._masked_stats(terms), "colsum": colsum, "Mt1": Mt1}
        stats = {"Wt1": W_b.sum(axis=0, dtype=np.float64), "colsum": block_column_sums(A_b)}
        if sp.issparse(A_b):
            # Pass 0's W^T A enters only the objective (line 8 waits for the first W update), as <W^T A, H> =
            # <W, A H^T>; and the entries stored per column give the stratum's kept columns (summed over its blocks)
            stats["WtA_H"] = ks.inner_at_start(A_b, W_b, G["H"])
            stats["WtW"] = gram(W_b)
            stats["stored"] = np.bincount(A_b.indices, minlength=A_b.shape[1]).astype(np.float64)
        else:
            stats["WtA"], stats["WtW"] = k.frobenius_stats(A_b, W_b)
        return stats

    def local_step(self, A_b, W_b, block, G):
        """Line 7 for the block's rows (its stratum's v), then the statistics of the new W."""
        if isinstance(W_b, dict):
            return self._masked_local_step(A_b, W_b, block, G)
        shift = G["Hv"][block.group] + self.eps
        if "kept" in G:  # a CSR block: its statistic at its stratum's kept columns
            kept = ks.kept_of(G["kept"], G["kept_starts"], block.group)
            W_new, AtW = ks.kept_columns_mu_step(A_b, W_b, G["Ht"], G["HHt"], shift, kept)
            return W_new, {"AtW_kept": AtW, "WtW": gram(W_new), "Wt1": W_new.sum(axis=0, dtype=np.float64)}
        W_new, WtA, WtW = k.frobenius_local(A_b, W_b, G["H"], G["HHt"], "mu", shift=shift)
        return W_new, {"WtA": WtA, "WtW": WtW, "Wt1": W_new.sum(axis=0, dtype=np.float64)}

    def _masked_local_step(self, A_b, local, block, G):
        """Line 7 over the block's observed entries (weighted MU with its stratum's shift), then the statistics of
        the new W."""
        form, P = km.mask_of(local)
        g = block.group
        terms = km.BlockTerms(A_b, local["W"], G["H"], form, P, **km.kept_constants(local))
        W_new = km.shifted_w_update(terms, G["HHt"], G["v"][g], G["Hv"][g], self.eps)
        terms = km.BlockTerms(A_b, W_new, G["H"], form, P, terms)
        stats = self._masked_stats(terms)
        # A_b's constants (its sums, its values at P's entries), computed in its first step, kept with the block
        return {**local, "W": W_new, **terms.constants()}, stats

    @staticmethod
    def _masked_stats(terms):
        """A masked block's statistics at (W_b, H): ``WtA`` = W^T (M o A), ``WtW``, ``WtMWH_adj``, ``Mxx`` =
        sum m a^2, ``WtM`` = W^T M and ``WtMW_cols`` (see the module's docstring)."""
        stats = km.frobenius_stats(terms, False)
        stats["WtA"] = stats.pop("WtX")
        stats["WtM"] = km.weights_times(terms)
        stats["WtMW_cols"] = km.column_grams(terms)
        return stats

    # -- global ---------------------------------------------------------------------
    def line8(self, G, stats) -> dict:
        """Line 8 from the statistics of the current W and the current v: {"H": the new H, "HHt", and, unmasked, what
        line 5 and the objective take from the new H (``kernels/stratified.py: line8``): "HtWt1" (H^T W(i)^T 1 as rows,
        s x n), "Wt1_Hv" ((W(i)^T 1)^T H v(i) at G's v, per stratum), "Ht" with kept columns}."""
        H, v = G["H"], G["v"]
        WtW = sum(s["WtW"] for s in stats)
        if "WtM" in stats[0]:  # masked: sum_i (W^T W) H + WtMWH_adj + (W^T M) diag(v(i))
            shift = sum(s["WtM"] * v[i] for i, s in enumerate(stats))
            H_new = ks.mu_ratio_in_place(sum(s["WtA"] for s in stats), H,
                                         WtW @ H + sum(s["WtMWH_adj"] for s in stats), shift, self.eps)
            return {"H": H_new, "HHt": H_new @ H_new.T}
        # sum_i W(i)^T W(i) H + (W(i)^T 1) v(i)^T as two products over all strata (not 2 s products of r x n)
        Wt1 = np.stack([s["Wt1"] for s in stats])
        if "AtW_kept" in stats[0]:
            H_new, Ht, HtWt1, Wt1_Hv = ks.line8(H, v, WtW, Wt1, self.eps, kept_sums=(
                [s["AtW_kept"] for s in stats], G["kept"], G["kept_starts"]))
        else:
            H_new, Ht, HtWt1, Wt1_Hv = ks.line8(H, v, WtW, Wt1, self.eps, numerator=sum(s["WtA"] for s in stats))
        made = {"H": H_new, "HHt": H_new @ H_new.T, "HtWt1": HtWt1, "Wt1_Hv": Wt1_Hv}
        return made if Ht is None else {**made, "Ht": Ht}

    def v_update(self, v, H, stats, colsum, sizes, HtWt1=None):
        """Line 5, ``v_updates`` times (H^T W(i)^T 1, ``HtWt1`` if made already, does not change between them).
        Masked: ``sizes`` is M(i)^T 1 (s x n) and H^T W(i)^T 1 becomes the column sums of H o W(i)^T M(i)."""
        if "WtM" in stats[0]:
            HtWt1 = np.stack([(H * s["WtM"]).sum(axis=0) for s in stats])
        else:
            HtWt1 = np.stack([s["Wt1"] for s in stats]) @ H if HtWt1 is None else HtWt1
            sizes = sizes[:, None]
        return ks.v_updates(v, colsum, sizes, HtWt1, self.eps, self.v_updates)

    def global_step(self, G, stats, data):
        colsum, Mt1 = self.stratum_colsums(G, stats)
        after = self.final_global(G, stats)  # line 8 (the objective's, when it ran on these statistics)
        v = self.v_update(G["v"], after["H"], stats, colsum,
                          data.group_sizes.astype(np.float64) if Mt1 is None else Mt1, G.get("line8", {}).get("HtWt1"))
        return self.with_derived(after["H"], v, colsum, w_moved=True, Mt1=Mt1,
                                 kept=self.stratum_kept_columns(G, stats), like=after)

    def final_global(self, G, stats):
        """The state after the last iteration's line 8 (for the objective and the results: no pass runs from it, see
        ``with_derived``; unmasked, with "Wt1_Hv", the objective's (W(i)^T 1)^T H v(i)). The objective evaluates
        line 8 first and leaves it in ``G`` (as ``G["line8"]``: :meth:`line8`'s arrays), where the next global step
        and the end of the fit find it: line 8 is O(s r n) on the driver, against O(nnz r) for the pass (``G`` is the
        state the pass ran from, and ``stats`` that pass's: line 8 of ``G`` is a function of them)."""
        if not G["w_moved"]:
            return G
        if "line8" not in G:  # added to G after the driver aligned it: aligned here, as the next global step takes it
            G["line8"] = aligned(self.line8(G, stats))
        line8 = G["line8"]
        after = self.with_derived(line8["H"], G["v"], G.get("colsum"), w_moved=False, Mt1=G.get("Mt1"),
                                  kept=self.stratum_kept_columns(G, stats), like=line8, passes=False)
        return after if "Wt1_Hv" not in line8 else {**after, "Wt1_Hv": line8["Wt1_Hv"]}

    @staticmethod
    def stratum_kept_columns(G, stats) -> tuple[np.ndarray, np.ndarray] | None:
        """(kept, kept_starts) of CSR blocks (``kernels/stratified.py``), from pass 0's statistics, then kept in the
        global state; None for dense blocks and masked fits."""
        if "kept" in G:
            return G["kept"], G["kept_starts"]
        return ks.kept_columns(np.stack([s["stored"] for s in stats])) if "stored" in stats[0] else None

    @staticmethod
    def stratum_colsums(G, stats) -> tuple[np.ndarray, np.ndarray | None]:
        """(A(i)^T 1 per stratum (s x n), None); masked: ((M(i) o A(i))^T 1, M(i)^T 1). From pass 0's
        statistics, then kept in the global state."""
        if "colsum" in G:
            return G["colsum"], G.get("Mt1")
        return np.stack([s["colsum"] for s in stats]), (np.stack([s["Mt1"] for s in stats]) if "Mt1" in stats[0]
                                                        else None)

    # -- objective and stopping ---------------------------------------------------------
    def stratum_sq_errors(self, G, stats, data) -> np.ndarray:
        """||A(i) - 1 v(i)^T - W(i) H||_F^2 per stratum, after line 8 (eq. 2's terms; clipped at 0)."""
        G = self.final_global(G, stats)
        colsum, Mt1 = self.stratum_colsums(G, stats)
        kept = "AtW_kept" in stats[0]
        H, v = np.asarray(G["H"], dtype=np.float64), np.asarray(G["v"], dtype=np.float64)
        HHt = G["HHt"] if H is G["H"] else H @ H.T  # the state's own (float64 like every factor of a fit)
        if Mt1 is not None:
            return np.maximum(np.array([
                float(s["Mxx"]) + Mt1[i] @ (v[i] * v[i]) + np.vdot(s["WtW"], HHt)
                + np.einsum("kj,jkl,lj->", H, s["WtMW_cols"], H) - 2.0 * (v[i] @ colsum[i])
                - 2.0 * np.vdot(s["WtA"], H) + 2.0 * np.vdot(s["WtM"], H * v[i]) for i, s in enumerate(stats)]), 0.0)
        if kept:  # <W^T A, H> at the kept columns
            WtA_H = ks.kept_inners([s["AtW_kept"] for s in stats], G["Ht"], G["kept"], G["kept_starts"])
        else:
            WtA_H = [s["WtA_H"] if "WtA_H" in s else np.vdot(s["WtA"], H) for s in stats]
        if "Wt1_Hv" in G:  # after line 8: made with the new H
            Wt1_Hv = G["Wt1_Hv"]
        else:  # (W^T 1)^T H v(i) from v H^T (s x r)
            Hv = G["Hv"] if "Hv" in G and H is G["H"] and v is G["v"] else v @ H.T
            Wt1_Hv = [s["Wt1"] @ Hv[i] for i, s in enumerate(stats)]
        sizes = data.group_sizes.astype(np.float64)
        errs = np.array([
            data.group_sq_norms[i] + sizes[i] * (v[i] @ v[i]) + np.vdot(s["WtW"], HHt)
            - 2.0 * (v[i] @ colsum[i]) - 2.0 * WtA_H[i] + 2.0 * Wt1_Hv[i]
            for i, s in enumerate(stats)])
        return np.maximum(errs, 0.0)

    @staticmethod
    def observed_sq_norms(stats, data) -> np.ndarray:
        """||A(i)||_F^2 per stratum over the observed entries (sum m a^2; all of A(i) without a mask): what the
        ``relative_error`` and the normalised loss are relative to."""
        if "Mxx" in stats[0]:
            return np.array([float(s["Mxx"]) for s in stats])
        return data.group_sq_norms

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
