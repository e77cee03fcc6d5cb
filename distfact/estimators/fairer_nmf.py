"""``distfact.FairerNMF``: NMF minimising the worst group's relative reconstruction loss (Kassab et al., 2024).

Paper: L. Kassab, E. George, D. Needell, H. Geng, N. Jafar Nia and A. Li, "Towards a Fairer Non-negative Matrix
Factorization", 2024 (arXiv:2411.09847).
"""

from __future__ import annotations

import warnings
from numbers import Real

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils._param_validation import StrOptions

from .._warnings import user_stacklevel
from ..engine.driver import initialise, initialise_keeping
from ..methods.fairer_nmf import FairerAM, FairerMU, GroupErrorEstimate, available_conic_solvers
from ..methods.nmf import NMFMethod
from ..metrics import group_metric_frame
from .base import FactorEstimator, Phase, check_iteration_params, data_fingerprint
from .masks import block_masks, observed_group_sums, resolve_mask
from .contract import COUNT, NON_NEGATIVE, POSITIVE_INT, SURFACE_CONSTRAINTS, MethodDeclaration, Number, PaperReport

SOLVERS = ("mu", "am")


# max_iter=None runs the scheme until eq. (10) holds; this cap only keeps a fit that never meets it (a tol too
# small for the data's precision) from running forever. The paper's data need 1,300 to 12,600 iterations.
UNTIL_CONVERGED_CAP = 100_000


class FairerNMF(FactorEstimator):
    """Fairer-NMF: NMF minimising the worst group's relative reconstruction loss.

    min over W, H >= 0 of max_l (||X_l - W_l H||_F - E_l) / ||X_l||_F, from L. Kassab, E. George, D. Needell,
    H. Geng, N. Jafar Nia and A. Li, "Towards a Fairer Non-negative Matrix Factorization", 2024
    (arXiv:2411.09847). E_l, the error a rank-r NMF of group l alone attains, is estimated first
    (Algorithm 1: the mean Frobenius error of ``n_estimates`` independent MU runs per group, all run in the
    same passes over X). Then the MU scheme (Algorithm 3) reweights the groups each iteration towards the
    worst one. See ``distfact.methods.fairer_nmf`` for the updates and equation numbers.

    The defaults reproduce the paper's results (Section 6; measured in docs/fairer-nmf.md): T = 5 runs for
    E_l, each stopped as in the reference code when its error changes by less than 1e-4 relative (at most
    10,000 iterations), and the scheme run until its stopping rule holds, with no iteration cap to speak of.
    With them, on the paper's Table 1 data and on UCI Heart Disease grouped by sex, the worst group's loss
    is no larger than standard NMF's at ranks 3 to 10 and every E_l run converges (tested).

    Parameters
    ----------
    n_components : int
        The rank r.
    solver : {'mu', 'am'}, default='mu'
        'mu': the multiplicative-update scheme (Algorithm 3). 'am': alternating minimisation
        (Algorithm 2): the H step is a second-order cone program on per-group statistics (r*n + 1
        variables whatever the number of rows), solved by cvxpy with the first of CLARABEL, ECOS,
        SCS that is installed (falling back to the next on failure); the W step is an exact
        non-negative least squares per row, on the workers.
    n_estimates : int, default=5
        T in Algorithm 1 (the paper's T = 5).
    c_update : {'decaying', 'fixed', 'largest'}, default='decaying'
        'decaying': c <- c + e_l* (the paper's rule); 'fixed': c <- (1 - c_step) c + c_step e_l*;
        'largest': c <- e_l* (all weight on the current worst group).
    c_step : float, default=0.5
        Step of the 'fixed' rule.
    tol : float, default=1e-5
        Eq. (10): stop when every group's error changes in an iteration by less than ``tol`` relative
        to it (errors below 1% of ||X_l|| count as 1% of ||X_l||, so that a group reconstructed exactly
        does not keep the scheme running). 0: run ``max_iter`` iterations. The paper prints 1e-4; its
        reference code applies 1e-4 to the relative change of the groups' losses, a stricter test by
        R-Error / |R-Loss| (5 to over 100 on Heart Disease) that does not end within 20,000 iterations at
        most of Heart Disease's ranks. At 1e-4 on errors the MU scheme can stop on a plateau: Heart
        Disease, rank 10, random_state=0: worst loss 0.0171 after 367 iterations, above standard NMF's
        0.0166, where 1e-5 goes on to -0.0014 after 3,287 (the paper reports losses below 0 at rank 10).
    max_iter : int or None, default=None
        Iterations of the scheme at most. None: until eq. (10) holds, as the paper and its reference code
        run, with a safety cap of ``UNTIL_CONVERGED_CAP`` = 100,000 iterations (a ConvergenceWarning if it
        is reached); the paper's data need 1,300 to 12,600.
    estimate_max_iter : int, default=10000
        Iterations of each NMF run of Algorithm 1 at most (the reference code's cap).
    estimate_tol : float, default=1e-4
        A run of Algorithm 1 stops when its error e changes in an iteration by less than ``estimate_tol``
        relative to max(e, 0.01 ||X_l||) (the reference code: relative to e). The floor lets runs on a group
        that a rank-r NMF reconstructs exactly, whose error tends to 0 too slowly for a relative test, stop
        once their error moves by less than 1e-6 of ||X_l|| per iteration (see
        ``distfact.methods.fairer_nmf.GroupErrorEstimate``).
    random_state : int or None, default=None
    block_rows, checkpoint_dir, checkpoint_every, resume, callback, n_threads, local_memory_budget :
        as in :class:`distfact.NMF`. Checkpoints of the E_l runs go to ``checkpoint_dir/estimate`` and
        those of the scheme to ``checkpoint_dir/scheme``; a resumed fit continues whichever phase was
        interrupted (a finished E_l phase is read back, not rerun).

    Attributes
    ----------
    components_ : ndarray (r, n_features)
    E_ : ndarray (n_groups,)
        Estimated attainable error per group (Algorithm 1).
    E_runs_ : ndarray (n_groups, n_estimates)
        The errors of the individual runs.
    E_converged_ : ndarray of bool (n_groups,)
        Whether every run of a group met its stopping rule within ``estimate_max_iter``.
    group_names_ : list of str
    objective_history_ : ndarray (n_iter_ + 1,)
        The objective minimised (eq. 7), max_l (||X_l - W_l H||_F - E_l) / ||X_l||_F, at the scheme's start
        and after every iteration: the maximum over groups of ``loss_history_``'s rows.
    group_metrics_ : pandas.DataFrame
        Columns group, metric, value (``distfact.metrics.METRICS``, docs/metrics.md): ``relative_error``
        ||X_l - W_l H||_F / ||X_l||_F, ``relative_loss`` (||X_l - W_l H||_F - E_l) / ||X_l||_F
        (Definition 4.1), and ``objective``, group l's term of eq. 7, which is its ``relative_loss``.
    group_errors_ : ndarray (n_groups,)
        The ``relative_error`` metric: ||X_l - W_l H||_F / ||X_l||_F, a fraction.
    group_losses_ : ndarray (n_groups,)
        The ``relative_loss`` metric: (||X_l - W_l H||_F - E_l) / ||X_l||_F (Definition 4.1), a fraction.
    loss_history_ : ndarray (n_iter_ + 1, n_groups)
        The ``relative_loss`` of every group at the scheme's start and after every iteration.
    c_ : ndarray (n_groups,)
        The final group weights ('mu').
    conic_solver_ : str or None
        The conic solver that solved the last H step ('am').
    n_iter_, n_passes_, converged_, scheduler_, n_components_, n_features_in_
        ``n_iter_`` counts the scheme's iterations; ``n_passes_`` counts the passes of Algorithm 1 too.
    feature_names_in_ : ndarray of str
        X's column names, when it has them (a DataFrame or a store with feature names).

    Notes
    -----
    With ``fit(X, groups=..., mask=M)`` (weights, 0 = missing; or "nan", "nonzero": ``distfact.estimators.masks``;
    solver='mu' only) every error, E_l, loss and metric is over the observed entries: ||X_l|| becomes
    ||M_l o X_l||_F and ||X_l - W_l H|| becomes ||M_l o (X_l - W_l H)||_F (for weights, sqrt(sum m x^2) and
    sqrt(sum m (x - wh)^2)); the E_l runs and the scheme use the weighted MU updates written out in
    ``distfact.methods.fairer_nmf``. The values of X at missing entries never change the factors.

    ``transform`` solves new rows' W with H fixed (see :meth:`transform`); scikit-learn's conventions
    (feature names out, ``set_output``, no ``score``, metadata routing) as for :class:`distfact.NMF`.
    """

    _parameter_constraints: dict = {**SURFACE_CONSTRAINTS, "solver": [StrOptions(set(SOLVERS))],
                                    "n_estimates": [POSITIVE_INT],
                                    "c_update": [StrOptions({"decaying", "fixed", "largest"})],
                                    "c_step": [Number(Real, 0, 1, closed="right")], "max_iter": [COUNT, None],
                                    "estimate_max_iter": [COUNT], "estimate_tol": [NON_NEGATIVE]}

    def __init__(self, n_components, *, solver="mu", n_estimates=5, c_update="decaying", c_step=0.5, tol=1e-5,
                 max_iter=None, estimate_max_iter=10_000, estimate_tol=1e-4, random_state=None, block_rows=None,
                 checkpoint_dir=None, checkpoint_every="auto", resume=False, n_threads=None, local_memory_budget=None,
                 callback=None):
        self.n_components = n_components
        self.solver = solver
        self.n_estimates = n_estimates
        self.c_update = c_update
        self.c_step = c_step
        self.tol = tol
        self.max_iter = max_iter
        self.estimate_max_iter = estimate_max_iter
        self.estimate_tol = estimate_tol
        self.random_state = random_state
        self.block_rows = block_rows
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self.resume = resume
        self.n_threads = n_threads
        self.local_memory_budget = local_memory_budget
        self.callback = callback

    def fit(self, X, y=None, *, groups=None, mask=None, client=None, W_out=None):
        """Fit on X with row ``groups`` (or a GroupedMatrix / store path carrying them).

        ``mask``: which entries of X are observed, as :meth:`distfact.NMF.fit` takes it (None, a weight array or
        sparse matrix of X's shape with 0 = missing, "nan" or "nonzero"); every error, E_l and loss is then over
        the observed entries (see ``distfact.methods.fairer_nmf``). solver='mu' only: 'am' refuses a mask.

        ``W_out``: a directory where the fitted W is written block by block, by the process holding each block
        (one Zarr array per block, in the store's row order)."""
        self._ignore_y(y, groups)
        X, mask = resolve_mask(X, mask)
        self._run_fit(X, groups, client, want_W=False, W_out=W_out, mask=mask)
        return self

    def fit_transform(self, X, y=None, *, groups=None, mask=None, client=None):
        """Fit (``mask`` as in :meth:`fit`) and return W in X's row order (gathered on the driver)."""
        self._ignore_y(y, groups)
        X, mask = resolve_mask(X, mask)
        return self._run_fit(X, groups, client, want_W=True, mask=mask)

    #: a store's own mask (written at ingest) is read as fit's mask is used (solver='mu')
    _reads_stored_mask = True

    def _check_params(self):
        if self.solver not in SOLVERS:
            raise ValueError(f"solver must be one of {SOLVERS}, got {self.solver!r}")
        if self.solver == "am" and not available_conic_solvers():
            raise ValueError("solver='am' needs a conic solver for cvxpy (CLARABEL, ECOS or SCS); none is "
                             "installed: pip install clarabel")
        if not isinstance(self.n_estimates, (int, np.integer)) or self.n_estimates < 1:
            raise ValueError(f"n_estimates must be a positive integer, got {self.n_estimates!r}")
        check_iteration_params(self._iteration_cap(), self.tol, self.random_state)
        check_iteration_params(self.estimate_max_iter, self.estimate_tol)

    def _prepare(self, fit):
        """Every group's relative loss must be defined: at least r rows (for E_l) and ||X_l|| > 0 (over the
        observed entries, with a mask: cut per block into ``inputs["mask_blocks"]``, its digest
        ``inputs["mask_digest"]`` and the groups' sums over the observed entries ``inputs["observed"]``, from one
        read of X)."""
        data, r = fit.data, fit.rank
        small = [(name, size) for name, size in zip(data.group_names, data.group_sizes) if size < r]
        if small:
            raise ValueError(f"group {small[0][0]!r} has {small[0][1]} rows, fewer than n_components={r}: "
                             "its rank-r error E_l is not defined")
        if (fit.inputs.get("mask") is not None or data.mask_kind is not None) and self.solver == "am":
            held = " (the store holds one: it was written at ingest)" if data.mask_kind else ""
            raise ValueError(f"FairerNMF(solver='am') takes no mask{held}: its H step is a cone program written on "
                             "each group's W_l^T W_l, and with a mask every column of H has its own Gram "
                             "W_l^T diag(m_j) W_l (and every row of W its own); use solver='mu' (the weighted "
                             "multiplicative updates of Algorithm 3)")
        blocks, digest = block_masks(data, fit.inputs.get("mask"))
        observed = None if blocks is None else observed_group_sums(data, blocks)
        sq_norms = data.group_sq_norms if observed is None else observed[1]
        zero = [name for name, sq_norm in zip(data.group_names, sq_norms) if not sq_norm > 0]
        if zero:
            raise ValueError(f"group {zero[0]!r} is all zeros{'' if blocks is None else ' at its observed entries'}: "
                             "Fairer-NMF measures each group's loss relative to ||X_l||_F (Definition 4.1), which is "
                             "0 for it; drop the group or fit NMF")
        fit.inputs.update(mask_blocks=blocks, mask_digest=digest, observed=None if observed is None else {
            "group_totals": tuple(map(float, observed[0])), "group_sq_norms": tuple(map(float, observed[1]))})
        self._masked_fit = blocks is not None  # for _outputs, which sees the executor only

    def _local_states_hold_inputs(self) -> bool:
        return self._masked_fit  # the block's mask beside W_b

    def _local_factors(self, fit):
        return fit.rank * self.n_estimates, None  # the E_l runs' W, side by side

    def _phases(self, fit):
        """Algorithm 1's runs (checkpoints in ``estimate``), then the scheme with their E_l (in ``scheme``)."""
        data, executor, r = fit.data, fit.executor, fit.rank
        dtype = str(data.dtype)
        fingerprint = data_fingerprint(data)
        masks, observed = fit.inputs["mask_blocks"], fit.inputs["observed"] or {}
        estimate = GroupErrorEstimate(r, int(self.n_estimates), float(self.estimate_tol), dtype, **observed)
        estimate_seed = None if self.random_state is None else [self.random_state, 1]
        config = {"estimator": "FairerNMF", "method": _described(estimate), "random_state": self.random_state,
                  "data": fingerprint}
        if fit.inputs["mask_digest"] is not None:  # (unmasked fits keep their configuration, and checkpoints)
            config["mask"] = fit.inputs["mask_digest"]
        state = yield Phase(estimate, lambda: initialise(estimate, data, executor, estimate_seed, masks),
                            self.estimate_max_iter, config, checkpoint="estimate", callback=False)
        self.E_runs_, self.E_, self.E_converged_ = estimate.attained(state.global_state, state.stats, data)
        if not self.E_converged_.all():
            late = [n for n, ok in zip(data.group_names, self.E_converged_) if not ok]
            warnings.warn(f"the NMF runs estimating E_l (Algorithm 1) of groups {late} did not converge "
                          f"within estimate_max_iter={self.estimate_max_iter} (estimate_tol="
                          f"{self.estimate_tol}); their E_ may be too large: raise "
                          "FairerNMF(estimate_max_iter=...)",
                          ConvergenceWarning, stacklevel=user_stacklevel())
        common = dict(n_components=r, E=tuple(self.E_), tol=float(self.tol), dtype=dtype, **observed)
        if self.solver == "am":
            method = FairerAM(**common, solvers=tuple(available_conic_solvers()))
        else:
            method = FairerMU(**common, c_update=self.c_update, c_step=float(self.c_step))
        scheme_seed = None if self.random_state is None else [self.random_state, 2]
        config = {**config, "solver": self.solver, "method": _described(method)}
        cap = self._iteration_cap()
        def start():  # a masked fit's blocks keep their masks from Algorithm 1's local states
            if masks is None:
                return initialise(method, data, executor, scheme_seed)
            return initialise_keeping(method, data, executor, scheme_seed, method.inputs_kept)
        yield Phase(method, start, cap, config,
                    checkpoint="scheme", cut_short=(
                        f"FairerNMF stopped at {cap} iterations (max_iter={self.max_iter}) before every group's error "
                        f"changed by less than tol={self.tol} (eq. 10); raise FairerNMF(max_iter=...)")
                    if self.tol > 0 else None)

    def transform(self, X, *, groups=None, client=None, max_iter=500, tol=1e-6):
        """W for new rows with H = components_ fixed: per row, min over w >= 0 of ||x - w H||.

        With H fixed, the weighted objective of Algorithm 3, sum_l (c_l / ||X_l||)^2 ||X_l - W_l H||^2, separates
        over rows and a row's group weight only scales its term; and the rows' non-negative least squares
        solutions minimise every group's error at once, so the worst group's loss (eq. 7) too. Each row's W is
        that solution whatever its group: the minimiser the W steps of both schemes move towards. It is
        computed as :meth:`distfact.NMF.transform` computes W, by HALS sweeps (exact per coordinate, faster
        to converge than MU) from a constant start, at most ``max_iter`` until W changes by less than
        ``tol`` relative; one read of X. ``groups`` only lays out the rows (it does not change W)."""
        self._check_fitted()
        return self._rows_for_fixed_H(X, groups, client, NMFMethod(self.n_components_, solver="hals"), max_iter, tol)

    def _iteration_cap(self):
        """max_iter, or the safety cap when it is None (until eq. (10) holds)."""
        return UNTIL_CONVERGED_CAP if self.max_iter is None else self.max_iter

    def _set_results(self, fit, method, state):
        data = fit.data
        relative = np.vstack(state.group_objectives)  # e_l / ||X_l|| after every iteration
        self.components_ = state.global_state["H"]
        self.c_ = state.global_state["c"]
        self.conic_solver_ = state.global_state.get("solver")
        self.group_names_ = data.group_names
        self.group_errors_ = relative[-1]
        self.group_losses_ = method.relative_losses(relative[-1], data)
        self.loss_history_ = method.relative_losses(relative, data)
        self.objective_history_ = np.asarray(state.objectives)
        self._set_table("group_metrics_", group_metric_frame, self.group_names_, {
            "relative_error": self.group_errors_, "relative_loss": self.group_losses_,
            "objective": self.group_losses_})
        self._set_run_facts(method, data, state, fit.executor)


def _described(method) -> dict:
    """A method's parameters for its checkpoint configuration: without the sums over the observed entries, which
    X and the mask (the data fingerprint and the mask's digest) identify."""
    return {name: value for name, value in method.__dict__.items() if name not in ("group_totals", "group_sq_norms")}


def _fairer_facts(model) -> dict:
    return {"E": model.E_.tolist(), "E_converged": model.E_converged_.tolist(), "c": model.c_.tolist(),
            "max_group_loss": float(model.group_losses_.max())}


DECLARATION = MethodDeclaration(
    name="fairer-nmf", estimator=FairerNMF, summary="Fairer-NMF: NMF minimising the worst group's relative loss",
    metrics=("relative_error", "relative_loss", "objective"), facts=_fairer_facts,
    paper_report=PaperReport("fairness", "the Fairer-NMF paper's fairness report (Figs. 2, 3, 5): standard NMF "
                             "and Fairer-NMF at each of --ranks", "distfact.reports.fairness:paper_report"))
