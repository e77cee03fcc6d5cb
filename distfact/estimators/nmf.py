"""``distfact.NMF``: non-negative matrix factorisation X ~ W H on grouped data."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from sklearn.utils._param_validation import StrOptions

from ..engine.driver import initialise
from ..methods.nmf import NMFMethod
from ..methods.nmf_init import nndsvda_start
from ..metrics import group_metric_frame, relative_error
from .base import FactorEstimator, Phase, check_factor, check_iteration_params, data_fingerprint
from .masks import block_masks, missing_entries, observed_total, resolve_mask
from .contract import POSITIVE_INT, SURFACE_CONSTRAINTS, MethodDeclaration

INITS = ("random", "nndsvda", "custom")


class NMF(FactorEstimator):
    """Non-negative matrix factorisation X ~ W H with per-group diagnostics, on Dask.

    Minimises (scikit-learn's beta-divergence convention)

        1/2 ||X - W H||_F^2                                   (beta_loss='frobenius')
        sum_ij x_ij log(x_ij / (WH)_ij) - x_ij + (WH)_ij     (beta_loss='kullback-leibler')

    with W >= 0 (n_samples x r) and H >= 0 (r x n_features), by Lee & Seung's
    multiplicative updates ('mu') or HALS ('hals', Frobenius only), H first then W
    each iteration. Each iteration reads X once; the loss and the per-group errors
    come from statistics gathered in that read (see ``distfact.methods.nmf``).

    Parameters
    ----------
    n_components : int or None
        Rank r; None means min(n_samples, n_features).
    solver : {'mu', 'hals'}
    beta_loss : {'frobenius', 'kullback-leibler'}
    init : {'random', 'nndsvda', 'custom'}
        'random': scikit-learn's scaled |N(0, 1)| draws (per block from ``random_state``);
        'nndsvda': NNDSVD with zeros filled by the mean of X, from a subspace-iteration
        SVD computed in passes over X; 'custom': the W and H passed to ``fit``.
    tol : float
        Stop when every group's loss changes by less than ``tol`` (relative) in an iteration; 0 never stops early.
    max_iter : int
    random_state : int or None
    block_rows : int or None
        Rows per block when X is an in-memory array (default: about one block per thread; a dense X under
        16 MiB a thread in fewer, one under 16 MiB in one: ``store/coerce.py: in_memory_block_rows``).
    checkpoint_dir : path or None
        Write checkpoints to ``checkpoint_dir/checkpoints/iter-NNNNNN`` every ``checkpoint_every`` iterations.
    checkpoint_every : int or "auto"
        An int: a checkpoint every ``checkpoint_every`` iterations. "auto" (default): every 10 iterations, skipped
        while the checkpoints written so far took more than a tenth of the fit's time (a fit of cheap iterations
        would otherwise mostly write checkpoints); the first one due and the final iteration's state are always
        written.
    resume : bool
        Continue from the newest committed checkpoint in ``checkpoint_dir``, if any. Without it, a
        ``checkpoint_dir`` that already holds checkpoints is refused.
    callback : callable or None
        Called after every iteration with a :class:`distfact.engine.IterationInfo`. (A Frobenius fit of large
        dense blocks in memory holds BLAS at one thread while it iterates, callback included: its passes run in
        pieces on the cores.)
    n_threads : int or None
        Threads of the in-process scheduler (default: all cores).
    local_memory_budget : int or None
        Bytes W may take in memory; above it W's blocks live in Zarr beside X (or in a
        temporary directory for in-memory X) and are streamed like X. Default: a quarter
        of this machine's memory.

    Attributes
    ----------
    components_ : ndarray (r, n_features)
        H.
    n_iter_ : int
    n_passes_ : int
        Passes over X: ``n_iter_ + 1`` with random or custom init.
    objective_history_ : ndarray (n_iter_ + 1,)
        The objective minimised (the loss above, summed over all rows) at initialisation and after every
        iteration.
    group_metrics_ : pandas.DataFrame
        Columns group, metric, value (names and units: ``distfact.metrics.METRICS``, docs/metrics.md):
        ``relative_error`` ||X_l - W_l H||_F / ||X_l||_F (whatever ``beta_loss``) and ``objective``, the
        loss restricted to group l's rows (1/2 ||X_l - W_l H||_F^2, or the generalised KL divergence).
    loss_history_ : ndarray (n_iter_ + 1,)
        The same values as ``objective_history_`` (kept for existing callers).
    group_loss_history_ : ndarray (n_iter_ + 1, n_groups)
        The ``objective`` metric of every group at initialisation and after every iteration.
    reconstruction_err_ : float
        sqrt(2 * loss): ||X - WH||_F for the Frobenius loss (as scikit-learn).
    group_names_ : list of str
    group_losses_ : ndarray (n_groups,)
        The ``objective`` metric per group (the loss restricted to each group's rows).
    group_errors_ : ndarray (n_groups,)
        The ``relative_error`` metric per group: ||X_l - W_l H||_F / ||X_l||_F (for a group of zeros, the
        error itself).
    converged_ : bool
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        When the data carry feature names.
    scheduler_ : dict
        Where the fit ran.

    Notes
    -----
    With ``fit(X, mask=M)`` (weights, 0 = missing; or "nan", "nonzero") the loss above, the stopping rule,
    ``objective_history_``, ``reconstruction_err_`` and every per-group metric are over the observed entries,
    weighted: 1/2 sum m (x - wh)^2 and sum m (x log(x / wh) - x + wh), ``relative_error`` sqrt(sum m (x - wh)^2 /
    sum m x^2) (``distfact.methods.nmf`` writes out the weighted updates). ``impute(X)`` fills X's missing
    entries from W H.

    scikit-learn's conventions (all of distfact's estimators): ``get_feature_names_out()`` gives ``nmf0``,
    ``nmf1``, ... and ``set_output(transform="pandas")`` applies to ``transform`` and ``fit_transform``; no
    ``score`` (as scikit-learn's NMF): ``GridSearchCV`` needs a ``scoring``; with metadata routing enabled,
    ``NMF(...).set_fit_request(groups=True)`` receives the groups given to ``Pipeline.fit`` or ``GridSearchCV.fit``.
    """

    _parameter_constraints: dict = {**SURFACE_CONSTRAINTS, "n_components": [POSITIVE_INT, None],
                                    "solver": [StrOptions({"mu", "hals"})],
                                    "beta_loss": [StrOptions({"frobenius", "kullback-leibler"})],
                                    "init": [StrOptions(set(INITS))]}

    def __init__(self, n_components=None, *, solver="mu", beta_loss="frobenius", init="random", tol=1e-4,
                 max_iter=200, random_state=None, block_rows=None, checkpoint_dir=None, checkpoint_every="auto",
                 resume=False, callback=None, n_threads=None, local_memory_budget=None):
        self.n_components = n_components
        self.solver = solver
        self.beta_loss = beta_loss
        self.init = init
        self.tol = tol
        self.max_iter = max_iter
        self.random_state = random_state
        self.block_rows = block_rows
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self.resume = resume
        self.callback = callback
        self.n_threads = n_threads
        self.local_memory_budget = local_memory_budget

    # ------------------------------------------------------------------ fit
    def fit(self, X, y=None, *, groups=None, mask=None, W=None, H=None, client=None, W_out=None):
        """Fit on X (array, sparse matrix, dask array, GroupedMatrix or store path) with row ``groups``.

        ``mask``: which entries of X are observed (``distfact.estimators.masks``): None (all), a non-negative
        weight array or sparse matrix of X's shape (0 = missing), "nan" (X's NaN entries are missing) or
        "nonzero" (the stored entries of a sparse X are the observed ones). The losses, the stopping rule and
        the per-group metrics are then over the observed entries, weighted (see ``distfact.methods.nmf``);
        the values of X at missing entries never change the factors.

        ``W_out``: a directory where the fitted W is written block by block, by the
        process holding each block (one Zarr array per block, in the store's row order).
        """
        self._ignore_y(y, groups)
        X, mask = resolve_mask(X, mask)
        self._run_fit(X, groups, client, want_W=False, W_out=W_out, mask=mask, W=W, H=H)
        return self

    def fit_transform(self, X, y=None, *, groups=None, mask=None, W=None, H=None, client=None):
        """Fit (``mask`` as in :meth:`fit`) and return W (n_samples x r) in X's row order. This gathers W on
        the driver."""
        self._ignore_y(y, groups)
        X, mask = resolve_mask(X, mask)
        return self._run_fit(X, groups, client, want_W=True, mask=mask, W=W, H=H)

    _custom_factors = ("W", "H")
    _reads_stored_mask = True

    def _check_params(self):
        check_iteration_params(self.max_iter, self.tol, self.random_state)
        if self.init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {self.init!r}")

    def _prepare(self, fit):
        """The method, and the mask (``fit.inputs["mask"]``) cut per block: ``inputs["mask_blocks"]`` (None
        without a mask) and its digest ``inputs["mask_digest"]``."""
        blocks, digest = block_masks(fit.data, fit.inputs.get("mask"))
        x_total = None if blocks is None else observed_total(fit.data, blocks)
        fit.method = NMFMethod(fit.rank, self.solver, self.beta_loss, float(self.tol), str(fit.data.dtype), x_total)
        fit.inputs.update(mask_blocks=blocks, mask_digest=digest)
        self._masked_fit = blocks is not None  # for _outputs, which sees the executor only

    def _phases(self, fit):
        """One loop, from the random, NNDSVDa or given start."""
        method = fit.method
        # x_total comes from X and the mask, which the data fingerprint and the mask's digest identify
        described = {name: value for name, value in method.__dict__.items() if name != "x_total"}
        config = {"estimator": "NMF", "method": described, "init": self.init,
                  "random_state": self.random_state, "data": data_fingerprint(fit.data)}
        if fit.inputs["mask_digest"] is not None:  # (unmasked fits keep their configuration, and checkpoints)
            config["mask"] = fit.inputs["mask_digest"]
        yield Phase(method, self._start(method, fit), self.max_iter, config, cut_short=(
            f"NMF stopped at max_iter={self.max_iter} before every group's loss changed by less than "
            f"tol={self.tol}; raise NMF(max_iter=...)") if self.tol > 0 else None)

    def _start(self, method, fit):
        data, executor, masks = fit.data, fit.executor, fit.inputs["mask_blocks"]
        if self.init == "random":
            return lambda: initialise(method, data, executor, self.random_state, masks)
        if self.init == "nndsvda":
            return lambda: nndsvda_start(method, data, executor, self.random_state, masks)
        W, H = fit.inputs["W"], fit.inputs["H"]
        if W is None or H is None:
            raise ValueError("init='custom' needs both W and H")
        H = check_factor(H, (method.n_components, data.shape[1]), "H", data.dtype)
        return self._custom_start(data, executor, W, method.n_components, data.dtype, method.with_derived(H, data),
                                  masks)

    def _local_states_hold_inputs(self) -> bool:
        return self._masked_fit  # the block's mask beside W_b

    def _set_results(self, fit, method, state):
        data = fit.data
        self.components_ = state.global_state["H"]
        self._set_run_facts(method, data, state, fit.executor)
        self.objective_history_ = np.asarray(state.objectives)
        self.loss_history_ = self.objective_history_.copy()
        self.group_loss_history_ = np.vstack(state.group_objectives)
        self.group_names_ = data.group_names
        self.group_losses_ = state.group_objectives[-1]
        self.reconstruction_err_ = float(np.sqrt(2.0 * max(state.objectives[-1], 0.0)))
        self.group_errors_ = relative_error(method.squared_errors(state.global_state, state.stats, data),
                                            method.observed_sq_norms(state.stats, data))
        self._set_table("group_metrics_", group_metric_frame, self.group_names_,
                        {"relative_error": self.group_errors_, "objective": self.group_losses_})

    # ------------------------------------------------------------ transform
    def transform(self, X, *, groups=None, client=None, max_iter=None, mask=None):
        """W for new X with H = components_ fixed (one read of X; rows solved independently, by the fit's
        solver and loss, at most ``max_iter`` iterations (default: the estimator's) until W changes by less
        than the estimator's ``tol`` relative). ``mask`` (as in :meth:`fit`): W fitted to the observed entries
        only, by weighted MU (whatever the solver)."""
        self._check_fitted()
        X, mask = resolve_mask(X, mask)
        return self._masked_rows(X, groups, client, max_iter, mask)

    def _masked_rows(self, X, groups, client, max_iter, mask):
        """W for X with H fixed, over the entries ``mask`` (resolved) observes."""
        return self._rows_for_fixed_H(X, groups, client, self._method, self.max_iter if max_iter is None else max_iter,
                                      self.tol, lambda data: block_masks(data, mask)[0])

    def impute(self, X, *, mask="nan", groups=None, client=None, max_iter=None):
        """X with its missing entries filled from W H, W fitted to X's observed entries with H = components_
        fixed (a masked :meth:`transform`); observed entries are returned as given.

        Parameters
        ----------
        X : array-like (n_samples, n_features), dense
            The table with holes (a sparse X would be densified by filling it: refused).
        mask : "nan" or weight array, default "nan"
            The missing entries: X's NaN entries ("nan"), or those of weight 0.

        Returns
        -------
        ndarray (n_samples, n_features)
            X (as float) with every missing entry replaced by (W H)_ij.
        """
        self._check_fitted()
        if sp.issparse(X) or (isinstance(mask, str) and mask == "nonzero"):
            raise ValueError("impute fills every missing entry, which makes a sparse X dense; give a dense X, or "
                             "use transform(X, mask=...) and inverse_transform on the rows you need")
        values = np.array(X, dtype=self.components_.dtype)  # a copy: the output
        X, resolved = resolve_mask(values, mask)
        if resolved is None:
            return values
        W = np.asarray(self._masked_rows(X, groups, client, max_iter, resolved))
        rows, cols = missing_entries(resolved)
        values[rows, cols] = np.einsum("ij,ji->i", W[rows], self.components_[:, cols])
        return values


def _nmf_facts(model) -> dict:
    return {"reconstruction_err": model.reconstruction_err_}


DECLARATION = MethodDeclaration(
    name="nmf", estimator=NMF, summary="non-negative matrix factorisation, with per-group errors",
    metrics=("relative_error", "objective"), facts=_nmf_facts)
