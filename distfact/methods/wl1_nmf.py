"""Weighted L1-NMF by sparse coordinate descent (sCD): G. Seraghiti, K. Dubrulle, A. Vandaele and N. Gillis,
"Nonnegative Matrix Factorization in the Component-Wise L1 Norm for Sparse Data", 2026 (arXiv:2603.29715).

Objective (eq. 5.1), W >= 0 (m x r, local), H >= 0 (r x n, global), 0 <= lambda <= 1:

    F(W, H) = sum_{(i,j) in kappa+} |X - WH|_ij + lambda sum_{(i,j) in kappa0} (WH)_ij
            = sum_{kappa+} (|X - WH| - lambda WH) + lambda (1^T W)(H 1)        (Section 6.2, O(nnz r))

lambda = 1 is L1-NMF; lambda < 1 trusts the zeros less (false zeros, Section 5).

Iteration k, in Algorithm 6.2's order (all of W, then all of H; each entry by the constrained
weighted median of Algorithm 2.1, clipped at 0, ``kernels/l1.py``):

    row pass (local step)      W_b <- Algorithm 6.1 over the rows of the CSR row block X_b, H broadcast
    column pass (column_step)  H[:, c] <- Algorithm 6.1 over the columns of the CSC column block c,
                               W (all row blocks) broadcast; the sweep also returns the sums over the
                               non-zeros of |x - wh| and wh at the new (W, H), per row group
    statistics per group l     1^T W_l, W_l^T X_l, W_l^T W_l (row pass); sum_{kappa+ in l} |x - wh|,
                               sum_{kappa+ in l} wh (column pass)
    global step                nothing: H comes from the column pass

so F_l = sum_l |x - wh| - lambda sum_l wh + lambda (1^T W_l)(H 1) needs no further read of X, and an
iteration reads X twice (once by rows, once by columns). W_l^T X_l and W_l^T W_l (O(nnz r) in the row
pass, beside its O(r nnz log nnz) sweep) give the Frobenius error ||X_l - W_l H||_F^2 at the final (W, H)
without another read (``squared_errors``): the metric ``relative_error`` that every method reports.

Stopping rule (Section 7, Setup): the objective normalised by sum(X) changed by less than ``tol``
between two iterations.

Masks (issue 20). With entry weights m_ij >= 0 (0: missing), eq. (5.1) becomes

    F_M(W, H) = sum_{kappa+} m_ij |x_ij - (WH)_ij| + lambda sum_{kappa0} m_ij (WH)_ij,

and every scalar subproblem of Algorithm 6.1 (eq. 6.4, row i of W, coordinate q; columns of H alike) keeps its
form: a term |a - b alpha| weighted by m >= 0 is |m a - m b alpha|, so the stored entries enter the weighted
median with their weights multiplied by m_ij (a weight 0 drops the term, whatever x_ij is), and the zeros'
linear term lambda sum_{j in kappa0(i)} h_qj becomes lambda sum_{j in kappa0(i)} m_ij h_qj. A block keeps its
mask in one of two sparse forms (``estimators/masks.py``, ``kernels/masked.py``), and that sum is computed without visiting the
zeros:

    complement form (C: the entries with m != 1, c_ij = 1 - m_ij; few masked):
        lambda (sum_{j in kappa0(i)} h_qj - sum_{j in kappa0(i), (i,j) in C} c_ij h_qj)
        = lambda (S_q - sum_{j in nz(i)} h_qj - sum_{j in kappa0(i) cap C(i)} c_ij h_qj),   S_q = sum_j h_qj;
    observed form (O: the entries with m > 0; few observed):
        lambda sum_{j in kappa0(i) cap O(i)} m_ij h_qj        (only the observed zeros count; with
        mask="nonzero" no zero is observed and the term vanishes).

The kernel (``kernels/l1.py``, ``masked_sweep_rows``) writes both as a base weight per index (1 in the
complement form, 0 in the observed one) plus adjustments d = -c or d = m at the form's entries, so the H sweep
over a column, whose rows come from blocks of either form, is the same code. Per iteration that is
O(r (nnz + masked entries)) beside the medians (O(r (nnz + observed entries)) in the observed form). The
objective and the per-group errors sum over the weighted entries: with b_i the base of row i,

    F_M = sum_{kappa+} m |x - wh| + lambda (sum_i b_i W_i (H 1) - sum_{kappa+} b wh + sum_{zeros of the form} d wh),
    sum m (x - wh)^2 = sum_{kappa+} (m (x - wh)^2 - b wh^2) + sum_{zeros of the form} d wh^2
                       + <W^T diag(b) W, H H^T>,

the first sums from the column sweep (at the new W and H, O(r) per form entry at a zero), the Gram terms from
the row pass; relative errors divide by the weighted sums sum m x and sum m x^2 of each group. A masked fit's
local state is a dict: W_b and the block's mask as row-aligned parts (``mask_local``), which the column pass
receives stacked (all rows) and cuts to its columns (``column_adjustments``). Without a mask nothing of this
runs: ``WeightedL1SCD`` is the unmasked method, ``MaskedWeightedL1SCD`` the masked one.

Start (Section 7, Setup): ``HALSStart`` iterations of HALS for Frobenius NMF from NMF's random start,
then ``l1_balance``: W's columns and H's rows rescaled to equal l1 norms (W H unchanged).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from ..kernels import l1
from ..kernels.masked import COMPLEMENT
from ..kernels.products import gram, wt_times_block
from ..metrics import frobenius_sq_errors
from .nmf import NMFMethod

ONE_GROUP = np.zeros(1, dtype=np.int64)  # a row block lies in one group


def as_csr(X_b):
    """sCD sweeps non-zeros: a dense block is swept through its CSR form."""
    return X_b if sp.issparse(X_b) else sp.csr_matrix(X_b)


def with_sorted_indices(X):
    """The masked kernel merges the weights with the non-zeros in index order: X (CSR or CSC) with sorted
    indices (stored blocks are canonical already; scipy remembers the check)."""
    return X if X.has_sorted_indices else X.sorted_indices()


def row_stats(X_b, W_b) -> dict:
    """The row pass's statistics of a CSR block: 1^T W_b (for F), W_b^T X_b and W_b^T W_b (for the Frobenius
    error)."""
    return {"Wsum": W_b.sum(axis=0), "WtX": wt_times_block(W_b, X_b), "WtW": gram(W_b)}


@dataclass(frozen=True)
class WeightedL1SCD:
    n_components: int
    lam: float = 1.0
    tol: float = 1e-6

    # -- start ------------------------------------------------------------------
    def initial_global(self, data, rng):
        """NMF's random start (scikit-learn's scale sqrt(mean(X) / r)), in float64."""
        G = NMFMethod(self.n_components).initial_global(data, rng)
        return self.with_derived(G["H"], data, G["scale"])

    def initial_local(self, block, G, rows):
        return NMFMethod(self.n_components).initial_local(block, G, rows)

    def with_derived(self, H, data, scale=None):
        """Global state: H^T (n x r, what both sweeps read) and the first row of every group
        (to split the column pass's sums by group)."""
        starts = np.array([g.row_start for g in data.meta.groups], dtype=np.int64)
        state = {"Ht": np.ascontiguousarray(np.asarray(H, dtype=np.float64).T), "group_starts": starts}
        if scale is not None:
            state["scale"] = scale
        return state

    @staticmethod
    def components(G) -> np.ndarray:
        return np.ascontiguousarray(G["Ht"].T)

    # -- passes -----------------------------------------------------------------
    def block_stats(self, X_b, W_b, block, G):
        """Pass 0: the objective's terms at the starting (W_b, H)."""
        X_b = as_csr(X_b)
        abs_residual, fitted = l1.nonzero_terms(X_b.indptr, X_b.indices, X_b.data, W_b, G["Ht"], ONE_GROUP)
        return {"abs_residual": abs_residual[0], "fitted": fitted[0], **row_stats(X_b, W_b)}

    def local_step(self, X_b, W_b, block, G):
        """Algorithm 6.2 line 4: Algorithm 6.1 on X_b^T, (H^k)^T, (W_b^k)^T, i.e. every entry of W_b
        in index order for the current H."""
        X_b = as_csr(X_b)
        W_new = np.array(W_b, dtype=np.float64, order="C")
        l1.scd_sweep_rows(X_b.indptr, X_b.indices, X_b.data, W_new, G["Ht"], self.lam, ONE_GROUP)
        return W_new, row_stats(X_b, W_new)

    def column_step(self, Xc, W, column_block, G):
        """Algorithm 6.2 line 5: Algorithm 6.1 on the columns of the CSC block (the CSC arrays of X
        are the CSR arrays of X^T) for the new W; the non-zero sums at (W^{k+1}, H^{k+1}) per group."""
        Ht = np.array(G["Ht"][column_block.col_start:column_block.col_stop], order="C")
        abs_residual, fitted = l1.scd_sweep_rows(Xc.indptr, Xc.indices, Xc.data, Ht, W, self.lam,
                                                 G["group_starts"])
        return Ht, {"abs_residual": abs_residual, "fitted": fitted}

    def assemble_columns(self, G, pieces):
        return {**G, "Ht": np.concatenate(pieces)}

    def global_step(self, G, stats, data):
        return G

    # -- objective and stopping -----------------------------------------------------
    def group_objectives(self, G, stats, lam=None) -> np.ndarray:
        """F_l per group (eq. 5.1 on group l's rows); ``lam=1`` gives ||X_l - W_l H||_1."""
        lam = self.lam if lam is None else lam
        H_rowsum = G["Ht"].sum(axis=0)
        return np.array([l1.wl1_objective(float(s["abs_residual"]), float(s["fitted"]), lam, s["Wsum"], H_rowsum)
                         for s in stats])

    @staticmethod
    def squared_errors(G, stats, data) -> np.ndarray:
        """||X_l - W_l H||_F^2 per group at the (W, H) of ``stats``, from the row pass's Gram statistics."""
        return frobenius_sq_errors(data.group_sq_norms, [(s["WtX"], s["WtW"]) for s in stats], G["Ht"].T)

    def objective(self, G, stats, data):
        """F / sum(X) (the normalised objective the stopping rule and ``loss_history_`` use), and F_l."""
        per_group = self.group_objectives(G, stats)
        return float(per_group.sum() / self.group_totals(data).sum()), per_group

    @staticmethod
    def group_totals(data) -> np.ndarray:
        """sum(X_l) per group (what the objective and the L1 errors are relative to)."""
        return data.group_totals

    @staticmethod
    def group_sq_norms(data) -> np.ndarray:
        """||X_l||_F^2 per group (what the Frobenius error is relative to)."""
        return data.group_sq_norms

    def converged(self, objectives, group_objectives):
        return self.tol > 0 and len(objectives) > 1 and abs(objectives[-2] - objectives[-1]) < self.tol

    # -- transform ----------------------------------------------------------------
    def solve_local(self, X_b, _local, block, Ht, scale, max_iter, tol):
        """W_b for a fixed H (transform): W sweeps from W_b = ``scale`` until the block's objective falls
        by less than ``tol`` (relative) or ``max_iter`` sweeps; rows are independent."""
        X_b = as_csr(X_b)
        W_b = np.full((block.n_rows, Ht.shape[1]), scale)
        H_rowsum = Ht.sum(axis=0)
        previous = None
        for _ in range(max_iter):
            abs_residual, fitted = l1.scd_sweep_rows(X_b.indptr, X_b.indices, X_b.data, W_b, Ht, self.lam, ONE_GROUP)
            value = l1.wl1_objective(abs_residual[0], fitted[0], self.lam, W_b.sum(axis=0), H_rowsum)
            if previous is not None and previous - value <= tol * abs(previous):
                break
            previous = value
        return W_b


def mask_local(block, form: str, M_b) -> dict:
    """A block's mask as a masked fit keeps it in the local state beside W_b ("W"): parts that stack over blocks
    into the whole mask (``engine/executor/base.py: stacked_rows``), ``base`` (per row: 1 in the complement
    form, 0 in the observed one) and the form's entries as (stored row, column, adjustment d), d = -c or d = m."""
    M_b = M_b.tocoo()
    complement = form == COMPLEMENT
    return {"base": np.full(block.n_rows, 1.0 if complement else 0.0),
            "rows": (block.row_start + M_b.row).astype(np.int64), "cols": M_b.col.astype(np.int64),
            "adjust": -M_b.data if complement else np.array(M_b.data, dtype=np.float64)}


def weighted_group_sums(data, forms) -> tuple[np.ndarray, np.ndarray]:
    """sum m x and sum m x^2 per group (what a masked fit's errors are relative to), from X in memory and the
    blocks' mask forms."""
    totals, sq_norms = np.zeros(data.n_groups), np.zeros(data.n_groups)
    for block, (form, M_b) in zip(data.blocks, forms):
        X_b = as_csr(data.load_block(block.index)).astype(np.float64)
        weighted = M_b.multiply(X_b), M_b.multiply(X_b.multiply(X_b))
        if form == COMPLEMENT:  # 1 - c
            weighted = X_b.sum() - weighted[0].sum(), X_b.multiply(X_b).sum() - weighted[1].sum()
        else:
            weighted = weighted[0].sum(), weighted[1].sum()
        totals[block.group] += weighted[0]
        sq_norms[block.group] += weighted[1]
    return totals, sq_norms


def row_adjustments(local, block, n_cols):
    """The row pass's view of a block's mask: the base of every column and the adjustments as a CSR by rows."""
    indptr = np.searchsorted(local["rows"], block.row_start + np.arange(block.n_rows + 1))
    return np.full(n_cols, local["base"][0] if block.n_rows else 0.0), (indptr, local["cols"], local["adjust"])


def column_adjustments(stacked, col_start, col_stop):
    """The column pass's view of the whole mask (the blocks' parts stacked): the base of every row and the
    adjustments in columns [col_start, col_stop) as a CSR by columns (rows increasing: the parts are in row
    order and the sort is stable). O(masked entries) per column block."""
    cols = stacked["cols"]
    mine = np.flatnonzero((cols >= col_start) & (cols < col_stop))
    mine = mine[np.argsort(cols[mine], kind="stable")]
    indptr = np.searchsorted(cols[mine], np.arange(col_start, col_stop + 1))
    return stacked["base"], (indptr, stacked["rows"][mine], stacked["adjust"][mine])


def masked_row_stats(W_b, base) -> dict:
    """The row pass's statistics of a masked block: sum_i b_i W_i and W_b^T diag(b) W_b (b: the rows' base,
    the same for the whole block)."""
    flag = base[0] if base.size else 0.0
    return {"Wsum": flag * W_b.sum(axis=0), "WtW": flag * gram(W_b)}


def sums_by_name(sums, index=slice(None)) -> dict:
    """The masked kernel's three sums (``kernels/l1.py: masked_sweep_rows``) as named statistics."""
    return {"abs_residual": sums[0, index], "fitted": sums[1, index], "squared": sums[2, index]}


@dataclass(frozen=True)
class MaskedWeightedL1SCD(WeightedL1SCD):
    """sCD with entry weights (the module docstring's "Masks"): the local state is ``mask_local``'s dict, and
    the objective and errors are relative to the groups' weighted sums ``observed_totals`` (sum m x) and
    ``observed_sq_norms`` (sum m x^2)."""

    observed_totals: tuple = ()
    observed_sq_norms: tuple = ()

    def initial_local(self, block, G, rows, own):
        """NMF's random start for W_b, beside the block's mask (``own``: ``mask_local`` without W)."""
        return {**own, "W": super().initial_local(block, G, rows)}

    def _row_sweep(self, X_b, local, block, G, update):
        X_b = with_sorted_indices(as_csr(X_b))
        W_b = np.array(local["W"], dtype=np.float64, order="C") if update else local["W"]
        base, adjustments = row_adjustments(local, block, X_b.shape[1])
        sums = l1.masked_sweep_rows(X_b.indptr, X_b.indices, X_b.data, W_b, G["Ht"], self.lam, ONE_GROUP, base,
                                    adjustments, update)
        return W_b, sums, masked_row_stats(W_b, local["base"])

    def block_stats(self, X_b, local, block, G):
        """Pass 0: the weighted objective's terms at the starting (W_b, H)."""
        _, sums, stats = self._row_sweep(X_b, local, block, G, update=False)
        return {**sums_by_name(sums, 0), **stats}

    def local_step(self, X_b, local, block, G):
        """Algorithm 6.1 on the rows of X_b with the block's weights."""
        W_new, _, stats = self._row_sweep(X_b, local, block, G, update=True)
        return {**local, "W": W_new}, stats

    def column_step(self, Xc, stacked, column_block, G):
        """Algorithm 6.1 on the columns of the CSC block with the weights of its columns; the weighted sums at
        (W^{k+1}, H^{k+1}) per group."""
        Ht = np.array(G["Ht"][column_block.col_start:column_block.col_stop], order="C")
        Xc = with_sorted_indices(Xc)
        base, adjustments = column_adjustments(stacked, column_block.col_start, column_block.col_stop)
        sums = l1.masked_sweep_rows(Xc.indptr, Xc.indices, Xc.data, Ht, stacked["W"], self.lam, G["group_starts"],
                                    base, adjustments)
        return Ht, sums_by_name(sums)

    def squared_errors(self, G, stats, data) -> np.ndarray:
        """sum_l m (x - wh)^2 per group (see the module docstring), clipped at 0 against round-off."""
        HHt = G["Ht"].T @ G["Ht"]
        return np.maximum([float(s["squared"]) + float(np.vdot(s["WtW"], HHt)) for s in stats], 0.0)

    def group_totals(self, data) -> np.ndarray:
        return np.asarray(self.observed_totals, dtype=np.float64)

    def group_sq_norms(self, data) -> np.ndarray:
        return np.asarray(self.observed_sq_norms, dtype=np.float64)


@dataclass(frozen=True)
class HALSStart(NMFMethod):
    """The start of Section 7: HALS for Frobenius NMF (``NMFMethod`` with solver='hals'), whose
    statistics also carry 1^T W_b, for ``l1_balance``."""

    solver: str = "hals"
    tol: float = 0.0

    def block_stats(self, X_b, W_b, block, G):
        return {**super().block_stats(X_b, W_b, block, G), "Wsum": W_b.sum(axis=0, dtype=np.float64)}

    def local_step(self, X_b, W_b, block, G):
        W_new, stats = super().local_step(X_b, W_b, block, G)
        return W_new, {**stats, "Wsum": W_new.sum(axis=0, dtype=np.float64)}


def l1_balance(H, W_colsum):
    """d_k = sqrt(||H_k,:||_1 / ||W_:,k||_1), so that W_:,k d_k and H_k,: / d_k have equal l1 norms and
    the same product. A component that is zero in W or H keeps d_k = 1. Returns (d, H / d)."""
    H = np.asarray(H, dtype=np.float64)
    H_rowsum = H.sum(axis=1)
    ok = (W_colsum > 0) & (H_rowsum > 0)
    d = np.ones_like(H_rowsum)
    d[ok] = np.sqrt(H_rowsum[ok] / W_colsum[ok])
    return d, H / d[:, None]


def scale_columns(W_b, block, d):
    """W_b's columns times d (float64: sCD computes in float64)."""
    return np.asarray(W_b, dtype=np.float64) * d
