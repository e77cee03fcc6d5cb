"""``distfact.WeightedL1NMF``: weighted L1-NMF by sparse coordinate descent (sCD).

Paper: G. Seraghiti, K. Dubrulle, A. Vandaele and N. Gillis, "Nonnegative Matrix Factorization in the Component-Wise
L1 Norm for Sparse Data", 2026 (arXiv:2603.29715).
"""

from __future__ import annotations

import numbers
import os
import warnings
from numbers import Real

import numpy as np
import scipy.sparse as sp
from sklearn.utils._param_validation import StrOptions

from .._warnings import user_stacklevel
from ..engine.driver import initialise
from ..methods.wl1_nmf import (HALSStart, MaskedWeightedL1SCD, WeightedL1SCD, as_csr, l1_balance, mask_local,
                                scale_columns, weighted_group_sums)
from ..metrics import group_metric_frame, relative_error, relative_to
from ..kernels.masked import COMPLEMENT, values_at
from ..store.coerce import checked_matrix
from ..store.grouped import GroupedMatrix
from .masks import block_masks, resolve_mask
from .base import FactorEstimator, Phase, check_factor, check_iteration_params, data_fingerprint
from .contract import COUNT, POSITIVE_INT, SURFACE_CONSTRAINTS, MethodDeclaration, Number

INITS = ("hals", "random", "custom")


class WeightedL1NMF(FactorEstimator):
    """Weighted L1-NMF (Seraghiti et al., 2026, eq. 5.1) by sparse coordinate descent (Algorithm 6.2):

        min_{W, H >= 0}  sum_{x_ij > 0} |X - W H|_ij + lam * sum_{x_ij = 0} (W H)_ij

    Robust to heavy-tailed noise and outliers (an L1 loss on the non-zeros); ``lam`` < 1 trusts the
    zeros less (for data with false zeros: small values thresholded to 0, Section 7.3); ``lam`` = 1 is
    L1-NMF. Every entry of W, then every entry of H, is the exact minimiser of its scalar subproblem,
    found by a weighted median over the non-zeros of its row or column only, so an iteration costs
    O(r nnz log nnz) rather than O(r m n log(m n)). Each iteration reads X twice: by row blocks (the W
    sweep) and by CSC column blocks (the H sweep, with W broadcast to the column tasks); the objective
    and per-group L1 errors come from sums accumulated in the sweeps. The CSC copy is built once
    (``GroupedMatrix.with_column_blocks``; for a store on disk it is written into the store).
    Computed in float64. See ``distfact.methods.wl1_nmf`` for the steps and equation numbers.

    ``fit(X, mask=...)`` weights the entries (0: missing; ``"nan"``, ``"nonzero"``, or an array or sparse
    matrix of weights): sum_{x > 0} m |X - WH| + lam sum_{x = 0} m (WH), at O(r (nnz + masked entries)) per
    iteration; the losses and errors below are then over the weighted entries (docs/wl1-nmf.md, "Masks").

    Parameters
    ----------
    n_components : int
        Rank r.
    lam : float in [0, 1]
        Weight of the zeros (lambda in eq. 5.1). 0.01: the paper's Section 7.3 finds lambda in [0.01, 0.05]
        good in all its false-zeros cases (docs/wl1-nmf.md, "Defaults"); 1 is L1-NMF.
    init : {'hals', 'random', 'custom'}
        'hals' (the paper's practice for sparse data): ``hals_iter`` HALS iterations for Frobenius NMF
        from NMF's random start, then W's columns and H's rows rescaled to equal l1 norms; 'random':
        NMF's random start (sqrt(mean(X) / r) |N(0, 1)|); 'custom': the W and H passed to ``fit``.
    hals_iter : int
        HALS iterations of init='hals' (the paper uses 10; 3 for TDT2).
    max_iter : int
        sCD iterations at most (the paper stops by ``tol`` or a time limit only; 1,000 is a cap its Section
        7.3 fits never reach: they meet ``tol`` within 186).
    tol : float
        Stop when the objective divided by sum(X) changes by less than ``tol`` in an iteration
        (Section 7: the paper's 1e-6); 0 never stops early.
    time_limit : float or None
        Seconds (from the call to ``fit``, the start included) after which no new iteration begins.
    random_state : int or None
    block_rows : int or None
        Rows per row block when X is an in-memory array.
    column_blocks : int or None
        CSC column blocks to build when X has none: default one per thread for in-memory X, about
        128 MiB each for a store.
    checkpoint_dir, checkpoint_every, resume, callback, n_threads, local_memory_budget :
        as in :class:`distfact.NMF`. Checkpoints of the HALS start go to ``checkpoint_dir/start``
        and those of sCD to ``checkpoint_dir/scd``.

    Attributes
    ----------
    components_ : ndarray (r, n_features)
        H.
    objective_history_ : ndarray (n_iter_ + 1,)
        The objective minimised, F (eq. 5.1), at the start of sCD and after every iteration.
    group_metrics_ : pandas.DataFrame
        Columns group, metric, value (``distfact.metrics.METRICS``, docs/metrics.md): ``relative_error``
        ||X_l - W_l H||_F / ||X_l||_F, ``relative_l1_error`` ||X_l - W_l H||_1 / ||X_l||_1, and ``objective``
        F_l, eq. (5.1) on group l's rows (in X's units, not divided by anything).
    loss_history_ : ndarray (n_iter_ + 1,)
        The objective (eq. 5.1) divided by sum(X), at the start of sCD and after every iteration (the
        quantity of the stopping rule): ``objective_history_ / sum(X)``.
    group_names_ : list of str
    group_losses_ : ndarray (n_groups,)
        The ``objective`` metric divided by the group's sum, F_l / sum(X_l) (for a group of zeros, F_l).
    group_loss_history_ : ndarray (n_iter_ + 1, n_groups)
        ``group_losses_`` at the start of sCD and after every iteration.
    group_errors_ : ndarray (n_groups,)
        The ``relative_l1_error`` metric (not ``relative_error``): ||X_l - W_l H||_1 / ||X_l||_1 (for a group
        of zeros, the error itself).
    reconstruction_err_ : float
        ||X - W H||_1.
    n_iter_ : int
        sCD iterations run.
    n_passes_ : int
        Reads of X: with init='hals', hals_iter + 1 for the start, then 1 + 2 n_iter_ (pass 0, and a
        row pass and a column pass per iteration).
    converged_ : bool
    timed_out_ : bool
        The fit stopped at ``time_limit``.
    scheduler_ : dict
    """

    #: why ``distfact.select_rank`` refuses this estimator (its folds share one X, which its start reads unmasked)
    _select_rank_refusal = ("its HALS start reads X unmasked, so the folds' held-out entries, which share one X, "
                            "would enter every model's start; fit(X, mask=...) alone zeroes them")

    _parameter_constraints: dict = {**SURFACE_CONSTRAINTS, "lam": [Number(Real, 0, 1, closed="both")],
                                    "init": [StrOptions(set(INITS))], "hals_iter": [COUNT],
                                    "time_limit": [Number(Real, 0, None, closed="neither"), None],
                                    "column_blocks": [POSITIVE_INT, None]}

    def __init__(self, n_components, *, lam=0.01, init="hals", hals_iter=10, max_iter=1000, tol=1e-6,
                 time_limit=None, random_state=None, block_rows=None, column_blocks=None, checkpoint_dir=None,
                 checkpoint_every="auto", resume=False, callback=None, n_threads=None, local_memory_budget=None):
        self.n_components = n_components
        self.lam = lam
        self.init = init
        self.hals_iter = hals_iter
        self.max_iter = max_iter
        self.tol = tol
        self.time_limit = time_limit
        self.random_state = random_state
        self.block_rows = block_rows
        self.column_blocks = column_blocks
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self.resume = resume
        self.callback = callback
        self.n_threads = n_threads
        self.local_memory_budget = local_memory_budget

    # ------------------------------------------------------------------ fit
    def fit(self, X, y=None, *, groups=None, mask=None, W=None, H=None, client=None, W_out=None):
        """Fit on X (array, sparse matrix, dask array, GroupedMatrix or store path) with optional row
        ``groups`` (for per-group errors). ``W`` (in X's row order) and ``H``: init='custom'.
        ``W_out``: a directory where W is written block by block (one Zarr array per block).

        ``mask``: entry weights m_ij >= 0 (0: missing) for X in memory: an array or sparse matrix of X's shape
        (a sparse one's unstored entries weigh 0), ``"nan"`` (X's NaN entries are missing) or ``"nonzero"``
        (only the stored entries of a sparse X are observed: the zeros' term vanishes). The objective becomes
        sum_{x > 0} m |X - WH| + lam sum_{x = 0} m (WH), and every error and loss is over the weighted
        entries (relative to sum m x and sum m x^2 per group); X's values at weight-0 entries are never used
        (the HALS start sees them as 0). All weights 1: the unmasked fit, bitwise."""
        self._ignore_y(y, groups)
        X, weights = resolve_mask(X, mask)
        self._run_fit(X, groups, client, want_W=False, W_out=W_out, W=W, H=H, mask=weights)
        return self

    def fit_transform(self, X, y=None, *, groups=None, mask=None, W=None, H=None, client=None):
        """Fit and return W (n_samples x r) in X's row order (gathered on the driver); ``mask`` as in ``fit``."""
        self._ignore_y(y, groups)
        X, weights = resolve_mask(X, mask)
        return self._run_fit(X, groups, client, want_W=True, W=W, H=H, mask=weights)

    _custom_factors = ("W", "H")

    def _check_params(self):
        check_iteration_params(self.max_iter, self.tol, self.random_state)
        if not isinstance(self.lam, numbers.Real) or not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"lam must be a number in [0, 1] (the weight of the zeros in eq. 5.1), got {self.lam!r}")
        if self.init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {self.init!r}")
        if not isinstance(self.hals_iter, numbers.Integral) or self.hals_iter < 0:
            raise ValueError(f"hals_iter must be a non-negative integer, got {self.hals_iter!r}")
        if self.time_limit is not None and (not isinstance(self.time_limit, numbers.Real) or self.time_limit <= 0):
            raise ValueError(f"time_limit must be a positive number of seconds or None, got {self.time_limit!r}")
        if self.column_blocks is not None and (not isinstance(self.column_blocks, numbers.Integral)
                                               or self.column_blocks < 1):
            raise ValueError(f"column_blocks must be a positive integer or None, got {self.column_blocks!r}")

    def _grouped(self, X, groups):
        """sCD sweeps non-zeros: a numpy array (or list) is stored as CSR; other inputs as they come
        (a dense store or DataFrame is swept through each block's CSR form)."""
        if isinstance(X, (np.ndarray, list, tuple)):
            X = sp.csr_matrix(checked_matrix(X, "X"))
        return super()._grouped(X, groups)

    def _prepare(self, fit):
        """X with CSC column blocks (checked first: nothing is written for bad input), and sCD; with a mask,
        each block's mask form (``fit.inputs["masks"]``: the blocks' ``mask_local`` parts) and masked sCD."""
        data, weights = fit.data, fit.inputs["mask"]
        if weights is None:
            if data.group_totals.sum() <= 0:
                raise ValueError("X is all zeros: weighted L1-NMF needs at least one positive entry")
            method = WeightedL1SCD(fit.rank, float(self.lam), float(self.tol))
        else:
            if not data.in_memory:
                raise ValueError("WeightedL1NMF takes a mask only with X in memory (an array, sparse matrix or "
                                 "DataFrame)")
            blocks, digest = block_masks(data, weights)
            forms = [next(iter(entry.items())) for entry in blocks]  # (form, P_b) of each block
            if not _zero_at_missing_entries(data, forms):
                raise ValueError("WeightedL1NMF needs X zeroed at its missing entries (its HALS start reads X "
                                 "unmasked): fit(X, mask=...) does it; fit_many and select_rank with masks, which "
                                 "share one X between several masks, do not support WeightedL1NMF yet")
            totals, sq_norms = weighted_group_sums(data, forms)
            if totals.sum() <= 0:
                raise ValueError("X has no positive entry of positive weight: weighted L1-NMF needs one")
            method = MaskedWeightedL1SCD(fit.rank, float(self.lam), float(self.tol), tuple(totals.tolist()),
                                         tuple(sq_norms.tolist()))
            fit.inputs.update(masks=[mask_local(block, *form) for block, form in zip(data.blocks, forms)],
                              mask_digest=digest)
        fit.data = self._with_column_blocks(data)
        fit.method = method

    def _with_column_blocks(self, data) -> GroupedMatrix:
        if data.in_memory:
            return data.with_column_blocks(n_blocks=min(self.column_blocks or self.n_threads or os.cpu_count() or 1,
                                                        data.shape[1]))
        if data.has_column_blocks and self.column_blocks is not None:
            warnings.warn(f"the store already has {len(data.column_blocks)} column blocks; column_blocks="
                          f"{self.column_blocks} is not used", UserWarning, stacklevel=user_stacklevel())
        try:
            return data.with_column_blocks(n_blocks=self.column_blocks)
        except OSError as exc:
            raise ValueError(f"store {data.path!r} has no column blocks and they cannot be added to it ({exc}); "
                             "write a copy with them: distfact ingest ... --column-blocks") from exc

    def _local_factors(self, fit):
        return fit.rank, np.float64  # computed in float64 whatever X's dtype

    def _phases(self, fit):
        """sCD, from the random or given start, or from the HALS start (a loop of its own, with its own
        checkpoints, run only when sCD has none to resume from)."""
        method = fit.method
        config = {"estimator": "WeightedL1NMF", "method": method.__dict__, "init": self.init,
                  "hals_iter": self.hals_iter, "random_state": self.random_state, "data": data_fingerprint(fit.data)}
        if fit.inputs["mask"] is not None:
            config["mask"] = fit.inputs["mask_digest"]
        yield Phase(method, self._start(method, fit, config), self.max_iter, config, checkpoint="scd", cut_short=(
            f"WeightedL1NMF stopped at max_iter={self.max_iter} before the normalised objective changed by less "
            f"than tol={self.tol}; raise WeightedL1NMF(max_iter=...)") if self.tol > 0 else None)

    def _start(self, method, fit, config):
        data, executor, masks = fit.data, fit.executor, fit.inputs.get("masks")
        if self.init == "random":
            return lambda: initialise(method, data, executor, self.random_state, masks)
        if self.init == "hals":
            return self._hals_start(method, fit, config)
        W, H = fit.inputs["W"], fit.inputs["H"]
        if W is None or H is None:
            raise ValueError("init='custom' needs both W and H")
        H = check_factor(H, (method.n_components, data.shape[1]), "H", np.float64)
        return self._custom_start(data, executor, W, method.n_components, np.float64, method.with_derived(H, data),
                                  masks)

    def _hals_start(self, method, fit, config) -> Phase:
        """Section 7's start: ``hals_iter`` HALS iterations from NMF's random start, then l1 balancing."""
        data, executor = fit.data, fit.executor
        hals = HALSStart(method.n_components, dtype=str(data.dtype))

        def balanced(state):
            d, H = l1_balance(state.global_state["H"], sum(s["Wsum"] for s in state.stats))
            if fit.inputs["mask"] is None:
                executor.map_local(scale_columns, d)
            else:  # sCD's local state: W_b beside the block's mask
                executor.map_local(_scaled_beside_mask, d, fit.inputs["masks"])
            return method.with_derived(H, data)
        return Phase(hals, lambda: initialise(hals, data, executor, self.random_state), self.hals_iter, config,
                     checkpoint="start", callback=False, then=balanced)

    def _local_states_hold_inputs(self) -> bool:
        return isinstance(self._method, MaskedWeightedL1SCD)  # the block's mask beside W_b

    def _set_results(self, fit, method, state):
        data = fit.data
        G = state.global_state
        totals = method.group_totals(data)

        def per_group_sum(values):
            return relative_to(values, totals)
        l1_errors = method.group_objectives(G, state.stats, lam=1.0)
        self.components_ = method.components(G)
        self.loss_history_ = np.asarray(state.objectives)
        self.group_names_ = data.group_names
        self.group_loss_history_ = per_group_sum(np.vstack(state.group_objectives))
        self.group_losses_ = self.group_loss_history_[-1]
        self.group_errors_ = per_group_sum(l1_errors)
        self.reconstruction_err_ = float(l1_errors.sum())
        self.objective_history_ = np.vstack(state.group_objectives).sum(axis=1)
        self._set_table("group_metrics_", group_metric_frame, self.group_names_, {
            "relative_error": relative_error(method.squared_errors(G, state.stats, data), method.group_sq_norms(data)),
            "relative_l1_error": self.group_errors_, "objective": state.group_objectives[-1]})
        self.timed_out_ = state.timed_out
        self._set_run_facts(method, data, state, fit.executor)

    # ------------------------------------------------------------ transform
    def transform(self, X, *, groups=None, client=None, max_iter=100, tol=1e-6):
        """W for new X with H = components_ fixed: W sweeps (Algorithm 6.1 on the rows) from a constant
        start until each block's objective falls by less than ``tol`` (relative); one read of X."""
        self._check_fitted()
        data = self._grouped(X, groups)
        self._refuse_stored_mask(data, "transform")
        self._check_width(data.shape[1])
        check_iteration_params(max_iter, tol)
        executor = self._executor(data, client)
        try:
            scale = float(np.sqrt(data.group_totals.sum() / np.prod(data.shape) / self.n_components_))
            blocks = executor.map_blocks(self._method.solve_local, np.ascontiguousarray(self.components_.T),
                                         scale, max_iter, tol)
        finally:
            executor.close()
        return self._rows_in_caller_order(data, blocks)


def _zero_at_missing_entries(data, forms) -> bool:
    """Whether X (in memory) is 0 at every entry of weight 0 of the blocks' mask forms."""
    for block, (form, P) in zip(data.blocks, forms):
        X_b = as_csr(data.load_block(block.index))
        x = values_at(P, X_b)
        if (np.any(x[P.data == 1] != 0) if form == COMPLEMENT  # c = 1: weight 0
                else np.count_nonzero(x) != np.count_nonzero(X_b.data)):  # a non-zero outside the observed
            return False
    return True


def _scaled_beside_mask(W_b, block, d, masks):
    """After the HALS start of a masked fit: W_b's columns times d, beside the block's mask."""
    return {**masks[block.index], "W": scale_columns(W_b, block, d)}


def _wl1_facts(model) -> dict:  # the L1 error ||X - WH||_1; the groups' relative_l1_error is its share
    return {"lam": model.lam, "l1_error": model.reconstruction_err_, "timed_out": model.timed_out_}


DECLARATION = MethodDeclaration(
    name="wl1-nmf", estimator=WeightedL1NMF,
    summary="weighted L1-NMF by sparse coordinate descent (robust to outliers and false zeros)",
    metrics=("relative_error", "relative_l1_error", "objective"), facts=_wl1_facts)
