"""``distfact.StratifiedNMF``: shared topics plus a non-negative shift per stratum.

Paper: J. Chapman, Y. Yaniv and D. Needell, "Stratified-NMF for Heterogeneous Data", IEEE Asilomar Conference on
Signals, Systems, and Computers, 2023 (arXiv:2311.10789).
"""

from __future__ import annotations

import numbers
import os
from numbers import Real

import numpy as np
from sklearn.utils._param_validation import StrOptions

from ..engine.driver import initialise
from ..features import feature_names_of, top_feature_names
from ..methods.stratified_nmf import StratifiedMU
from ..metrics import group_metric_frame, relative_error
from .base import FactorEstimator, Phase, check_factor, check_iteration_params, data_fingerprint
from .masks import block_masks, resolve_mask
from .contract import NON_NEGATIVE, POSITIVE_INT, SURFACE_CONSTRAINTS, MethodDeclaration, Number, PaperReport

INITS = ("random", "custom")


class StratifiedNMF(FactorEstimator):
    """Stratified-NMF (Chapman, Yaniv and Needell, 2023): min sum_i ||A(i) - 1 v(i)^T - W(i) H||_F^2 over
    v(i), W(i), H >= 0 (eq. 2), by the multiplicative updates of Algorithm 1.

    The rows of X fall into strata i (distfact's groups). H (r x n_features) is shared; each stratum
    has a shift v(i) (its *strata features*, n_features) and its rows' representation W(i). Each
    iteration is M updates of every v(i), one of W, one of H, and one read of X; the loss comes from
    per-stratum statistics (``distfact.methods.stratified_nmf`` has the updates and equations).
    Computed in float64 whatever X's dtype.

    Parameters
    ----------
    n_components : int
        Rank r.
    v_updates : int
        M, the v updates per iteration (line 4 of Algorithm 1; the paper uses 2).
    max_iter : int
        10,000, the paper's synthetic experiment (Section IV-A) (docs/stratified-nmf.md, "Defaults").
    tol : float or None
        Stop once the objective falls by less than ``tol`` relative to the previous iteration (1e-4: never met
        on Section IV-A's data before its 10,000 iterations; the digits strata stop at 183); None runs
        ``max_iter`` iterations, the paper's practice.
    eps : float
        Added to every denominator (the paper's 1e-9).
    random_state : int or None
    init : {'random', 'custom'}
        'random': H, W(i) uniform in [0, 1/sqrt(r)], v(i) uniform in [0, 1] (Section IV);
        'custom': the W, H and v passed to ``fit``.
    block_rows, checkpoint_dir, checkpoint_every, resume, callback, n_threads, local_memory_budget :
        as in :class:`distfact.NMF`.

    Attributes
    ----------
    components_ : ndarray (r, n_features)
        H, the shared topics.
    strata_features_ : ndarray (n_strata, n_features)
        v(i), one row per stratum, in the order of ``strata_names_``.
    strata_names_ : list of str
    objective_history_ : ndarray (n_iter_ + 1,)
        The objective minimised, F = sum_i ||A(i) - 1 v(i)^T - W(i) H||_F^2 (eq. 2), at initialisation and
        after every iteration.
    group_metrics_ : pandas.DataFrame
        Columns group, metric, value (``distfact.metrics.METRICS``, docs/metrics.md): ``relative_error``
        ||A(i) - 1 v(i)^T - W(i) H||_F / ||A(i)||_F, the error of the model's reconstruction
        W(i) H + 1 v(i)^T, and ``objective`` ||A(i) - 1 v(i)^T - W(i) H||_F^2, eq. (2)'s term.
    loss_history_ : ndarray (n_iter_ + 1, 2)
        Per iteration (the first row at initialisation), the paper's loss sqrt(F) and normalised
        loss sqrt(F / sum_i ||A(i)||_F^2) (Section IV): the square roots of ``objective_history_`` and of
        it over sum_i ||A(i)||_F^2.
    group_names_ : list of str
        The strata (the same as ``strata_names_``; for the per-group tables shared by the estimators).
    group_losses_ : ndarray (n_strata,)
        The ``objective`` metric: ||A(i) - 1 v(i)^T - W(i) H||_F^2, eq. (2)'s terms (squared, not halved).
    group_loss_history_ : ndarray (n_iter_ + 1, n_strata)
        ``group_losses_`` at initialisation and after every iteration.
    group_errors_ : ndarray (n_strata,)
        The ``relative_error`` metric: ||A(i) - 1 v(i)^T - W(i) H||_F / ||A(i)||_F (for a stratum of zeros,
        the numerator).
    n_iter_, n_passes_ (``n_iter_ + 1``), converged_, scheduler_, feature_names_in_ (when the data
    carry feature names), n_features_in_.

    Notes
    -----
    With ``fit(X, groups=..., mask=M)`` (weights, 0 = missing; or "nan", "nonzero": ``distfact.estimators.masks``)
    F, the stopping rule, ``objective_history_``, ``loss_history_`` and every per-stratum metric are over the
    observed entries, weighted: F = sum_i sum m (a - v(i) - wh)^2, ``relative_error`` sqrt(F(i) / sum m a^2), the
    normalised loss sqrt(F / sum m a^2); ``distfact.methods.stratified_nmf`` writes out the weighted updates (the
    masked forms of lines 5, 7 and 8). The values of X at missing entries never change the factors.
    ``select_rank`` scores the held-out entries by the reconstruction W(i) H + 1 v(i)^T.
    """

    _parameter_constraints: dict = {**SURFACE_CONSTRAINTS, "v_updates": [POSITIVE_INT],
                                    "tol": [NON_NEGATIVE, None], "eps": [Number(Real, 0, None, closed="neither")],
                                    "init": [StrOptions(set(INITS))]}

    def __init__(self, n_components, *, v_updates=2, max_iter=10_000, tol=1e-4, eps=1e-9, random_state=None,
                 init="random", block_rows=None, checkpoint_dir=None, checkpoint_every="auto", resume=False,
                 callback=None, n_threads=None, local_memory_budget=None):
        self.n_components = n_components
        self.v_updates = v_updates
        self.max_iter = max_iter
        self.tol = tol
        self.eps = eps
        self.random_state = random_state
        self.init = init
        self.block_rows = block_rows
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self.resume = resume
        self.callback = callback
        self.n_threads = n_threads
        self.local_memory_budget = local_memory_budget

    # ------------------------------------------------------------------ fit
    def fit(self, X, y=None, *, groups=None, mask=None, W=None, H=None, v=None, client=None, W_out=None):
        """Fit on X (array, sparse matrix, dask array, GroupedMatrix or store path) with one stratum
        label per row (``groups``; a pandas Categorical fixes the strata and their order; None: one stratum).
        ``y`` is ignored (scikit-learn's place for targets).

        ``mask``: which entries of X are observed, as :meth:`distfact.NMF.fit` takes it (None, a weight array or
        sparse matrix of X's shape with 0 = missing, "nan" or "nonzero"); the objective, the stopping rule and
        the per-stratum metrics are then over the observed entries (see ``distfact.methods.stratified_nmf``).

        ``W``, ``H``, ``v`` (init='custom'): W in X's row order (n_samples x r), H (r x n_features),
        v (n_strata x n_features, strata in sorted order, or the Categorical's). ``W_out``: a
        directory where W is written block by block (one Zarr array per block, in the store's order).
        """
        self._ignore_y(y, groups)
        X, mask = resolve_mask(X, mask)
        self._run_fit(X, groups, client, want_W=False, W_out=W_out, mask=mask, W=W, H=H, v=v)
        return self

    def fit_transform(self, X, y=None, *, groups=None, mask=None, W=None, H=None, v=None, client=None):
        """Fit (``mask`` as in :meth:`fit`) and return W (n_samples x r) in X's row order (gathered on the
        driver)."""
        self._ignore_y(y, groups)
        X, mask = resolve_mask(X, mask)
        return self._run_fit(X, groups, client, want_W=True, mask=mask, W=W, H=H, v=v)

    _custom_factors = ("W", "H", "v")
    _reads_stored_mask = True  # a store's own mask (written at ingest) is read as fit's mask is used

    def _check_params(self):
        check_iteration_params(self.max_iter, 0.0 if self.tol is None else self.tol, self.random_state)
        if not isinstance(self.v_updates, numbers.Integral) or self.v_updates < 1:
            raise ValueError(f"v_updates must be a positive integer, got {self.v_updates!r}")
        if not isinstance(self.eps, numbers.Real) or not np.isfinite(self.eps) or self.eps < 0:
            raise ValueError(f"eps must be a finite non-negative number, got {self.eps!r}")
        if self.init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {self.init!r}")

    def _prepare(self, fit):
        """The method, and the mask (``fit.inputs["mask"]``) cut per block: ``inputs["mask_blocks"]`` (None
        without a mask) and its digest ``inputs["mask_digest"]``."""
        blocks, digest = block_masks(fit.data, fit.inputs.get("mask"))
        fit.method = StratifiedMU(fit.rank, int(self.v_updates), float(self.eps), self.tol, blocks is not None)
        fit.inputs.update(mask_blocks=blocks, mask_digest=digest)
        self._masked_fit = blocks is not None  # for _outputs, which sees the executor only

    def _local_states_hold_inputs(self) -> bool:
        return self._masked_fit  # the block's mask beside W_b

    def _local_factors(self, fit):
        return fit.rank, np.float64  # computed in float64 whatever X's dtype

    def _phases(self, fit):
        """One loop, from the random or given start."""
        method = fit.method
        described = {name: value for name, value in method.__dict__.items() if name != "masked"}  # in "mask"
        config = {"estimator": "StratifiedNMF", "method": described, "init": self.init,
                  "random_state": self.random_state, "data": data_fingerprint(fit.data)}
        if fit.inputs["mask_digest"] is not None:  # (unmasked fits keep their configuration, and checkpoints)
            config["mask"] = fit.inputs["mask_digest"]
        yield Phase(method, self._start(method, fit), self.max_iter, config)

    def _start(self, method, fit):
        data, executor, masks = fit.data, fit.executor, fit.inputs["mask_blocks"]
        if self.init == "random":
            return lambda: initialise(method, data, executor, self.random_state, masks)
        W, H, v = fit.inputs["W"], fit.inputs["H"], fit.inputs["v"]
        if W is None or H is None or v is None:
            raise ValueError("init='custom' needs W, H and v")
        n, r = data.shape[1], method.n_components
        H = check_factor(H, (r, n), "H", np.float64)
        v = check_factor(v, (data.n_groups, n), "v", np.float64)
        return self._custom_start(data, executor, W, r, np.float64, method.with_derived(H, v), masks)

    def _set_results(self, fit, method, state):
        data = fit.data
        G = method.final_global(state.global_state, state.stats)
        F = np.asarray(state.objectives)
        sq_norms = method.observed_sq_norms(state.stats, data)
        self.components_ = G["H"]
        self.strata_features_ = G["v"]
        self.strata_names_ = data.group_names
        self.loss_history_ = np.column_stack([np.sqrt(F), np.sqrt(F / sq_norms.sum())])
        self.group_names_ = data.group_names
        self.group_loss_history_ = np.vstack(state.group_objectives)
        self.group_losses_ = self.group_loss_history_[-1]
        self.group_errors_ = relative_error(self.group_losses_, sq_norms)
        self.objective_history_ = F
        self._set_table("group_metrics_", group_metric_frame, self.group_names_,
                        {"relative_error": self.group_errors_, "objective": self.group_losses_})
        self._set_run_facts(method, data, state, fit.executor)

    def _warm_factors(self, data) -> dict:
        """v for a fit of ``data`` continuing this model: each stratum's fitted row, by name; a stratum it never
        saw starts from the mean of the fitted strata's rows."""
        fitted = dict(zip(self.strata_names_, self.strata_features_))
        mean = self.strata_features_.mean(axis=0)
        return {"v": np.stack([fitted.get(name, mean) for name in data.group_names])}

    # ------------------------------------------------------------ transform
    def transform(self, X, *, groups=None, client=None, max_iter=200, tol=1e-4):
        """W for new rows with H and every stratum's v fixed (line 7 iterated; one read of X).
        The new rows' strata (``groups``) must be among ``strata_names_``; they may be left out when the
        model has one stratum."""
        self._check_fitted()
        groups = self._strata_of(X, groups)
        if hasattr(getattr(groups, "cat", groups), "categories"):
            groups = np.asarray(groups).astype(str)  # new rows need not cover every fitted stratum
        data = self._grouped(X, groups)
        self._refuse_stored_mask(data, "transform")  # its row solve (line 7) takes no mask yet
        self._check_width(data.shape[1])
        unknown = sorted(set(data.group_names) - set(self.strata_names_))
        if unknown:
            raise ValueError(f"strata {unknown} were not seen in fit; known strata: {self.strata_names_}")
        fitted = [self.strata_names_.index(name) for name in data.group_names]
        Hv = self.strata_features_[fitted] @ self.components_.T
        executor = self._executor(data, client)
        try:
            blocks = executor.map_blocks(self._method.solve_local, self.components_, Hv, max_iter, tol)
        finally:
            executor.close()
        return self._rows_in_caller_order(data, blocks)

    def _strata_of(self, X, groups):
        """The new rows' strata: as given, carried by a GroupedMatrix or store, or (one fitted stratum) that one."""
        if groups is not None or hasattr(X, "group_names") or isinstance(X, (str, os.PathLike)):
            return groups
        if len(self.strata_names_) == 1:
            n_rows = X.shape[0] if hasattr(X, "shape") else len(np.asarray(X))
            return np.full(n_rows, self.strata_names_[0], dtype=object)
        raise ValueError("transform needs the stratum of every new row: pass groups= (or a GroupedMatrix / store "
                         f"carrying them); the model has {len(self.strata_names_)} strata")

    def top_features(self, k=10, feature_names=None) -> dict:
        """The ``k`` largest-weighted features of every stratum's v(i) and every topic (row of H).

        Returns {"strata": {name: [feature, ...]}, "topics": [[feature, ...], ...]}, largest first.
        ``feature_names`` defaults to the data's (``feature_names_in_``), else "x0", "x1", ...
        """
        self._check_fitted()
        feature_names = feature_names_of(self, feature_names)
        if feature_names.shape != (self.n_features_in_,):
            raise ValueError(f"feature_names has {feature_names.shape[0]} names, the model has "
                             f"{self.n_features_in_} features")
        return {"strata": dict(zip(self.strata_names_, top_feature_names(self.strata_features_, feature_names, k))),
                "topics": top_feature_names(self.components_, feature_names, k)}

    def inverse_transform(self, W, groups=None):
        """W H + 1 v(i)^T: each row's reconstruction with its stratum's shift (``groups``: one label per row;
        may be left out when the model has one stratum)."""
        self._check_fitted()
        return np.asarray(W) @ self.components_ + self._reconstruction_offsets(self._strata_of(W, groups))

    def _reconstruction_offsets(self, groups) -> np.ndarray:
        """v(i) of each label's stratum: the shift the reconstruction W(i) H + 1 v(i)^T adds."""
        import pandas as pd

        strata = np.asarray(groups).astype(str)
        index = pd.Index(self.strata_names_).get_indexer(strata)
        if (index < 0).any():
            unknown = sorted(set(strata[index < 0]))
            raise ValueError(f"strata {unknown} were not seen in fit; known strata: {self.strata_names_}")
        return self.strata_features_[index]


def _stratified_arrays(model) -> dict:
    return {"v.npy": model.strata_features_}  # one row per stratum, in metrics.json's "strata" order


def _stratified_facts(model) -> dict:
    return {"strata": model.strata_names_, "normalised_loss": float(model.loss_history_[-1, 1]),
            "top_features": model.top_features(10)}


DECLARATION = MethodDeclaration(
    name="stratified-nmf", estimator=StratifiedNMF,
    summary="Stratified-NMF: shared topics plus a shift per group (the groups are the strata)",
    metrics=("relative_error", "objective"), arrays=_stratified_arrays, facts=_stratified_facts,
    views="distfact.reports.stratified_nmf:views",
    paper_report=PaperReport("stratified", "the Stratified-NMF paper's report (Figs. 1, 3-6): strata features, "
                             "images (--image-shape), top features per stratum and topic",
                             "distfact.reports.stratified_nmf:paper_report"))
