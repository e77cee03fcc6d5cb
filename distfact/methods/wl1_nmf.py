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

Start (Section 7, Setup): ``HALSStart`` iterations of HALS for Frobenius NMF from NMF's random start,
then ``l1_balance``: W's columns and H's rows rescaled to equal l1 norms (W H unchanged).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from ..kernels import l1
from ..kernels.products import gram, wt_times_block
from ..metrics import frobenius_sq_errors
from .nmf import NMFMethod

ONE_GROUP = np.zeros(1, dtype=np.int64)  # a row block lies in one group


def as_csr(X_b):
    """sCD sweeps non-zeros: a dense block is swept through its CSR form."""
    return X_b if sp.issparse(X_b) else sp.csr_matrix(X_b)


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
        return float(per_group.sum() / data.group_totals.sum()), per_group

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
