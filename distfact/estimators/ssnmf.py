"""``distfact.SSNMF`` and ``distfact.SSNMFClassifier``: semi-supervised NMF (Haddock et al., 2020).

Paper: J. Haddock, L. Kassab, S. Li, A. Kryshchenko, R. Grotheer, E. Sizikova, C. Wang, T. Merkh,
R. W. M. A. Madushani, M. Ahn, D. Needell and K. Leonard, "Semi-supervised NMF Models for Topic Modeling in Learning
Tasks", 2020 (arXiv:2010.07956).
"""

from __future__ import annotations

import hashlib
import numbers
import warnings
from numbers import Real

import numpy as np
import pandas as pd
import scipy.sparse as sp
from sklearn.base import BaseEstimator, ClassifierMixin, ClassNamePrefixFeaturesOutMixin, TransformerMixin
from sklearn.exceptions import NotFittedError
from sklearn.metrics import accuracy_score
from sklearn.utils import column_or_1d
from sklearn.utils._param_validation import StrOptions
from sklearn.utils.multiclass import check_classification_targets

from .._warnings import user_stacklevel
from ..engine.driver import initialise
from ..engine.executor.base import ReadInput, joined_input
from ..methods.ssnmf import MODELS, SSNMFMethod
from ..metrics import group_metric_frame, relative_error, relative_to
from ..store.masks import check_weights
from ..store.validate import check_label_spellings
from .base import (FactorEstimator, Phase, SavedEstimator, check_factor, check_iteration_params, data_fingerprint,
                   given_local, with_input_tags)
from .contract import NON_NEGATIVE, SURFACE_CONSTRAINTS, FitInput, MethodDeclaration, Number, PaperReport
from .masks import block_masks, resolve_mask, stored_mask_conflict

INITS = ("random", "custom")


def _check_weights(values, shape, name: str):
    """A mask or target: the right shape, finite, non-negative."""
    if values.shape != shape:
        raise ValueError(f"{name} has shape {values.shape}, expected {shape} (one row per row of X)")
    data = values.data if sp.issparse(values) else values
    if not np.all(np.isfinite(data)):
        raise ValueError(f"{name} has NaN or infinite values")
    if (data < 0).any():
        raise ValueError(f"{name} has negative values; it must be non-negative")


def _with_stored_mask(data, inputs: list) -> list:
    """Each block's ``inputs`` (its rows of Y and L) with the block's data mask from the store's own mask, in the
    stored form ({form: P}, ``kernels/masked.py``): read on this process for data in memory, else where the block
    lives (the driver never holds it)."""
    read = data.mask_reader()
    if data.in_memory:
        return [{**read(block), **entry} for block, entry in zip(data.blocks, inputs)]
    return [joined_input(ReadInput(read), **entry) for entry in inputs]


def renamed_mask(mask, data_mask):
    """``mask``, or the same given under its former name ``data_mask`` (with a FutureWarning naming ``mask``,
    the name every method's fit takes)."""
    if data_mask is None:
        return mask
    if mask is not None:
        raise ValueError("give the data mask as mask only (data_mask is its former name)")
    warnings.warn("SSNMF's data_mask is now called mask (one name for every method); data_mask will be removed",
                  FutureWarning, stacklevel=user_stacklevel())
    return data_mask


def one_hot(y, n_rows: int):
    """Class labels (-1: unlabelled, scikit-learn's convention) as (Y one-hot, L rows, classes)."""
    y = np.asarray(y)
    if y.shape != (n_rows,):
        raise ValueError(f"y has shape {y.shape}, expected ({n_rows},): one label per row of X")
    missing = pd.isna(y)
    if missing.any():
        row = int(np.flatnonzero(missing)[0])
        raise ValueError(f"y has a missing label ({y[row]}) at row {row}; mark unlabelled rows with -1")
    labelled = ~pd.Series(y).isin([-1, "-1"]).to_numpy()
    if not labelled.any():
        raise ValueError("y has no labelled row (every label is -1)")
    if y.dtype == object:
        check_label_spellings(y[labelled], "y (the labelled rows)")
    try:
        classes, codes = np.unique(y[labelled], return_inverse=True)
    except TypeError:  # labels of several types do not sort
        kinds = sorted({type(v).__name__ for v in y[labelled]})
        raise ValueError(f"y mixes labels of types {', '.join(kinds)}; give labels of one type") from None
    Y = np.zeros((n_rows, len(classes)))
    Y[np.flatnonzero(labelled), codes] = 1.0
    return Y, labelled, classes


class SSNMF(FactorEstimator):
    """Semi-supervised NMF (Haddock et al., 2020): X ~ W H and Y ~ W B jointly, W, H, B >= 0, minimising

        R(M o X, M o W H) + lam * S(L o Y, L o W B),   R, S: Frobenius^2 ("F") or I-divergence ("D")

    by the paper's multiplicative updates (H, then B, then W each iteration; ``eps`` added to every
    denominator). Rows are samples (the paper's columns): W (n_samples x r) is the representation,
    H (r x n_features) the dictionary, B (r x n_targets) the supervision model. ``model`` names
    (R, S): 'FF' (eq. 3), 'FD' (eq. 7, Algorithm 1), 'DF' (eq. 8, Algorithm 2), 'DD' (eq. 9, Algorithm 3).
    Without Y (or y) it is NMF with a data mask, with R = ``model[0]``. Each iteration reads X once;
    sparse X stays sparse, masks are sparse or implicit (all ones is never built) and the I-divergence
    is evaluated on the non-zeros only. See ``distfact.methods.ssnmf``.

    Parameters
    ----------
    n_components : int
    model : {'FF', 'FD', 'DF', 'DD'}
        'DF' (I-divergence reconstruction, Frobenius supervision): the paper's best model on 20 Newsgroups
        (Section 3.2, Table 4) (docs/ssnmf.md, "Defaults").
    lam : float >= 0
        Weight of the supervision term (100: the paper's choice for 'DF', Table 6).
    max_iter : int
        50, the paper's N in Section 3.2.
    tol : float
        The reference package's rule: stop once the objective fell by less than ``tol`` times its value
        after the first iteration; 0 never stops early (1e-3: the paper's choice for 'DF', Table 6).
    eps : float
    init : {'random', 'custom'}
        'random': W, H, B uniform on [0, 1) (the package's start); 'custom': W, H, B passed to ``fit``.
    random_state, block_rows, checkpoint_dir, checkpoint_every, resume, callback, n_threads, local_memory_budget :
        as in :class:`distfact.NMF`.

    Attributes
    ----------
    components_ : ndarray (r, n_features)
        H (the paper's A^T).
    B_ : ndarray (r, n_targets) or None
        The supervision model (the paper's B^T); Y ~ W B.
    classes_ : ndarray or None
        The classes, in the order of B's columns, when fitted with y.
    objective_history_ : ndarray (n_iter_ + 1,)
        The objective minimised, R + lam S, at the start and after every iteration (``loss_history_[:, 0]``).
    group_metrics_ : pandas.DataFrame
        Columns group, metric, value (``distfact.metrics.METRICS``, docs/metrics.md): ``relative_error``
        ||X_l - W_l H||_F / ||X_l||_F (for every model, I-divergence ones included; with a mask
        sqrt(sum m (x - wh)^2 / sum m x^2) over the observed entries); ``objective`` R_l + lam S_l;
        ``reconstruction_term`` R_l; ``supervision_term`` S_l (with targets); ``relative_i_divergence``
        R_l / sum(M_l o X_l) (models whose R is the I-divergence).
    loss_history_ : ndarray (n_iter_ + 1, 3)
        Per iteration (the first row at the start): the objective, its reconstruction part R and its
        supervision part S (Frobenius terms squared, I-divergence unsquared; S unweighted by lam).
    group_names_ : list of str
    group_losses_ : ndarray (n_groups,)
        The ``objective`` metric, R_l + lam S_l; ``group_loss_parts_`` (n_groups, 2) its R_l and S_l.
    group_errors_ : ndarray (n_groups,)
        The reconstruction per group, relative to the group's observed data: for R = F, sqrt(R_l) /
        ||M_l o X_l||_F (the ``relative_error`` metric when there is no data mask, or a 0/1 one); for R = D,
        R_l / sum(M_l o X_l) (the ``relative_i_divergence`` metric, not a Frobenius ratio); for a group of
        zeros, the numerator.
    n_iter_, n_passes_ (``n_iter_ + 1``), converged_, scheduler_, n_features_in_.
    feature_names_in_ : ndarray of str
        When the data carry feature names.

    Notes
    -----
    ``fit(X, mask=M)`` takes the mask every NMF-family method takes (docs/masks.md): weights of X's shape (0 =
    missing), ``"nan"`` (X's NaN entries) or ``"nonzero"`` (a sparse X's stored entries); a store's own mask
    (written at ingest) is read with it. M is the paper's data mask above: the updates use M o X and M o W H
    (written out in ``distfact.methods.ssnmf``), the values of X at missing entries never change the factors,
    and the objective, the stopping rule and every per-group number are over the observed entries
    (docs/ssnmf.md, "With a mask").
    """

    _parameter_constraints: dict = {**SURFACE_CONSTRAINTS, "model": [StrOptions(set(MODELS))],
                                    "lam": [NON_NEGATIVE], "eps": [Number(Real, 0, None, closed="neither")],
                                    "init": [StrOptions(set(INITS))]}

    def __init__(self, n_components, *, model="DF", lam=100.0, max_iter=50, tol=1e-3, eps=1e-10, init="random",
                 random_state=None, block_rows=None, checkpoint_dir=None, checkpoint_every="auto", resume=False,
                 callback=None, n_threads=None, local_memory_budget=None):
        self.n_components = n_components
        self.model = model
        self.lam = lam
        self.max_iter = max_iter
        self.tol = tol
        self.eps = eps
        self.init = init
        self.random_state = random_state
        self.block_rows = block_rows
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self.resume = resume
        self.callback = callback
        self.n_threads = n_threads
        self.local_memory_budget = local_memory_budget

    # ------------------------------------------------------------------ fit
    def fit(self, X, Y=None, y=None, mask=None, label_mask=None, W=None, H=None, B=None, groups=None,
            client=None, W_out=None, *, data_mask=None):
        """Fit on X (array, sparse matrix, dask array, GroupedMatrix or store path) with targets Y
        (n_samples x n_targets, non-negative; regression allowed) or class labels y (-1: unlabelled),
        or neither (NMF with a data mask).

        ``mask``: the data mask M, which entries of X are observed, as every NMF-family method takes it
        (``distfact.estimators.masks``, docs/masks.md): None (all), a non-negative weight array or sparse
        matrix of X's shape (0 = missing), "nan" (X's NaN entries are missing) or "nonzero" (the stored
        entries of a sparse X are the observed ones); a store with a mask of its own (written at ingest)
        gives that one. The values of X at missing entries never change the factors. ``data_mask``: the
        former name of ``mask``, accepted with a FutureWarning. ``label_mask`` (n_samples x n_targets)
        weights the entries of Y; all ones when None. W (X's row order), H, B: init='custom'. ``groups``:
        row labels for per-group losses."""
        X, mask = resolve_mask(X, renamed_mask(mask, data_mask))
        self._run_fit(X, groups, client, want_W=False, W_out=W_out, Y=Y, y=y, mask=mask, label_mask=label_mask,
                      W=W, H=H, B=B)
        return self

    def fit_transform(self, X, Y=None, y=None, mask=None, label_mask=None, W=None, H=None, B=None,
                      groups=None, client=None, *, data_mask=None):
        """Fit (the arguments as :meth:`fit` takes them) and return W (n_samples x r) in X's row order
        (gathered on the driver)."""
        X, mask = resolve_mask(X, renamed_mask(mask, data_mask))
        return self._run_fit(X, groups, client, want_W=True, Y=Y, y=y, mask=mask, label_mask=label_mask,
                             W=W, H=H, B=B)

    _custom_factors = ("W", "H", "B")
    _reads_stored_mask = True  # a store's own mask (written at ingest) is the data mask

    def _check_params(self):
        check_iteration_params(self.max_iter, self.tol, self.random_state)
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.model!r}")
        if not isinstance(self.lam, numbers.Real) or not np.isfinite(self.lam) or self.lam < 0:
            raise ValueError(f"lam must be a finite non-negative number, got {self.lam!r}")
        if not isinstance(self.eps, numbers.Real) or not np.isfinite(self.eps) or self.eps <= 0:
            raise ValueError(f"eps must be a positive number, got {self.eps!r}")
        if self.init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {self.init!r}")

    def _local_inputs(self, data, Y, y, mask, label_mask):
        """Per block, in the store's row order: the rows of Y, of the label mask and of the data mask."""
        m, n = data.shape
        if Y is not None and y is not None:
            raise ValueError("pass either Y (a target matrix) or y (class labels), not both")
        classes, labelled = None, None
        if y is not None:
            Y, labelled, classes = one_hot(y, m)
        elif Y is not None:
            Y = np.asarray(Y.toarray() if sp.issparse(Y) else Y, dtype=np.float64)
            Y = Y[:, None] if Y.ndim == 1 else Y
            _check_weights(Y, (m, Y.shape[1]), "Y")
        if label_mask is not None:
            if Y is None:
                raise ValueError("label_mask needs Y or y")
            label_mask = np.asarray(label_mask.toarray() if sp.issparse(label_mask) else label_mask, dtype=np.float64)
            _check_weights(label_mask, Y.shape, "label_mask")
        if labelled is not None and not labelled.all():  # unlabelled rows weigh nothing in the label term
            label_mask = (np.ones_like(Y) if label_mask is None else label_mask) * labelled[:, None]
        stored = data.row_index()
        inputs = [{} for _ in data.blocks]
        digest = hashlib.sha1()  # identifies the targets and masks in a checkpoint's configuration
        for name, values in (("Y", Y), ("L", label_mask)):
            if values is not None:
                values = values[stored]
                for part in ((values.data, values.indices, values.indptr) if sp.issparse(values) else (values,)):
                    digest.update(name.encode() + np.ascontiguousarray(part).tobytes())
                for block, entry in zip(data.blocks, inputs):
                    entry[name] = values[block.row_start:block.row_stop]
        if data.mask_kind is None:
            # each block's data mask in the form storing fewer entries, as every method takes it (a fold of
            # cross-validation, 10% held out, is the complement's 10%, not a CSR of the observed 90%)
            blocks, mask_digest = block_masks(data, mask)  # (fit_many gives each model's weights here, unresolved)
            if blocks is not None:
                digest.update(f"mask {mask_digest}".encode())
                inputs = [{**entry, **block} for entry, block in zip(inputs, blocks)]
        else:
            if check_weights(mask, (m, n)) is not None:
                raise ValueError(stored_mask_conflict(data))
            # (not "M stored:", the text of checkpoints whose local states held the mask as "M": refused on resume)
            digest.update(f"mask forms stored:{data.mask_identity()}".encode())
            inputs = _with_stored_mask(data, inputs)
        return inputs, (0 if Y is None else Y.shape[1]), classes, digest.hexdigest()

    def _prepare(self, fit):
        """The targets and masks, per block; the model (R alone without targets) and its method."""
        inputs = fit.inputs
        local, n_targets, classes, digest = self._local_inputs(fit.data, inputs["Y"], inputs["y"], inputs["mask"],
                                                               inputs["label_mask"])
        inputs.update(local=local, n_targets=n_targets, classes=classes, digest=digest)
        model = self.model if n_targets else self.model[0]
        fit.method = SSNMFMethod(fit.rank, model, float(self.lam), float(self.eps), float(self.tol))

    def _local_factors(self, fit):
        return fit.rank + 2 * fit.inputs["n_targets"], np.float64  # W, and the rows of Y and L

    def _phases(self, fit):
        """One loop, from the random or given start."""
        method, n_targets = fit.method, fit.inputs["n_targets"]
        config = {"estimator": "SSNMF", "method": method.__dict__, "init": self.init,
                  "random_state": self.random_state, "data": data_fingerprint(fit.data),
                  "targets_and_masks": fit.inputs["digest"]}
        yield Phase(method, self._start(method, fit), self.max_iter, config, global_args={"n_targets": n_targets})

    def _local_states_hold_inputs(self) -> bool:
        return True  # the block's rows of Y and of the masks beside W_b

    def _start(self, method, fit):
        data, executor, inputs, n_targets = fit.data, fit.executor, fit.inputs["local"], fit.inputs["n_targets"]
        if self.init == "random":
            return lambda: initialise(method, data, executor, self.random_state, inputs, n_targets=n_targets)
        W, H, B = fit.inputs["W"], fit.inputs["H"], fit.inputs["B"]
        if W is None or H is None or (n_targets and B is None):
            raise ValueError("init='custom' needs W and H (and B when there are targets)")
        r, n = method.n_components, data.shape[1]
        G = {"H": check_factor(H, (r, n), "H", np.float64)}
        if n_targets:
            G["B"] = check_factor(B, (r, n_targets), "B", np.float64)
        return self._custom_start(data, executor, W, r, np.float64, G, inputs)

    def _set_results(self, fit, method, state):
        data = fit.data
        parts = np.stack(state.group_objectives)  # (iterations + 1, groups, 2)
        self.components_ = state.global_state["H"]
        self.B_ = state.global_state.get("B")
        self.classes_ = fit.inputs["classes"]
        self.loss_history_ = np.column_stack([state.objectives, parts[:, :, 0].sum(axis=1), parts[:, :, 1].sum(axis=1)])
        self.group_names_ = data.group_names
        self.group_loss_parts_ = parts[-1]
        self.group_losses_ = parts[-1, :, 0] + method.lam * parts[-1, :, 1]
        metrics = {"relative_error": relative_error(method.squared_errors(state.global_state, state.stats, data),
                                                    method.observed_sq_norms(state.stats, data)),
                   "objective": self.group_losses_, "reconstruction_term": parts[-1, :, 0]}
        if method.supervised:
            metrics["supervision_term"] = parts[-1, :, 1]
        sq_norms, totals = method.data_term_scales(state.stats, data)  # of M o X_l: the observed entries
        if method.losses[0] == "F":
            self.group_errors_ = np.sqrt(relative_to(parts[-1, :, 0], sq_norms))
        else:
            self.group_errors_ = metrics["relative_i_divergence"] = relative_to(parts[-1, :, 0], totals)
        self.objective_history_ = np.asarray(state.objectives)
        self._set_table("group_metrics_", group_metric_frame, self.group_names_, metrics)
        self._set_run_facts(method, data, state, fit.executor)

    # ------------------------------------------------------------ transform
    def _warm_factors(self, data) -> dict:
        """B (the targets' factor, when the model has targets) for a fit continuing this model."""
        return {} if self.B_ is None else {"B": self.B_}

    def transform(self, X, mask=None, *, groups=None, client=None, max_iter=500, tol=1e-6, data_mask=None):
        """W for new rows with H fixed (Section 2.3, step 2): exact non-negative least squares per row
        for a Frobenius reconstruction, multiplicative updates of the I-divergence (or masked Frobenius)
        otherwise; one read of X. ``mask`` as :meth:`fit` takes it (a store's own mask is used): each row
        is solved over its observed entries."""
        self._check_fitted()
        X, mask = resolve_mask(X, renamed_mask(mask, data_mask))
        data = self._grouped(X, groups)
        self._check_width(data.shape[1])
        inputs = self._local_inputs(data, None, None, mask, None)[0]
        executor = self._executor(data, client)
        try:
            executor.init_local(given_local, per_block=inputs)  # each block's rows of the mask, where it runs
            blocks = executor.map_blocks(_represent_block, self._method, self.components_, max_iter, tol)
        finally:
            executor.close()
        return self._rows_in_caller_order(data, blocks)

    def predict_targets(self, X, **kwargs):
        """W_new B: the supervision model applied to new rows' representation."""
        self._check_fitted()
        if self.B_ is None:
            raise ValueError("this SSNMF was fitted without targets (Y or y); there is nothing to predict")
        return np.asarray(self.transform(X, **kwargs)) @ self.B_  # transform's output may be a DataFrame (set_output)


def _represent_block(X_b, inputs, block, method, H, max_iter, tol):
    W0 = np.full((block.n_rows, H.shape[0]), 1.0)
    return method.represent(X_b, H, inputs, max_iter, tol, W0)


def _forwarded(name: str):
    """A fitted attribute of ``SSNMFClassifier`` read from its ``ssnmf_`` (saved once, with ``ssnmf_``)."""
    return property(lambda self: getattr(self.ssnmf_, name), doc=f"``ssnmf_.{name}``.")


class SSNMFClassifier(SavedEstimator, ClassNamePrefixFeaturesOutMixin, ClassifierMixin, TransformerMixin,
                      BaseEstimator):
    """A classifier from SSNMF (Haddock et al., 2020, Section 2.3): fit SSNMF with the training labels,
    represent new rows with the dictionary H fixed, predict argmax(W_new B).

    Parameters are those of :class:`SSNMF`, with the same defaults (the paper's (D,F) model, lam=100,
    N=50, tol=1e-3); ``transform_max_iter`` and ``transform_tol`` bound the
    representation of new rows (for I-divergence models). ``predict_proba`` normalises W_new B's rows.
    ``transform`` gives W_new, whose columns ``get_feature_names_out()`` names ``ssnmfclassifier0``, ... (so
    ``set_output(transform="pandas")`` applies to it). ``mask`` (fit, transform, predict, score, ...): which
    entries of X are observed, as :meth:`SSNMF.fit` takes it (docs/masks.md); rows are fitted and represented
    over their observed entries.

    Attributes
    ----------
    ssnmf_ : SSNMF
        The fitted SSNMF.
    classes_ : ndarray
    objective_history_, group_metrics_, group_names_, n_iter_, n_passes_, converged_, n_features_in_,
    feature_names_in_ :
        Those of ``ssnmf_`` (see :class:`SSNMF`; ``feature_names_in_`` when the data carry feature names).
    """

    objective_history_ = _forwarded("objective_history_")
    group_metrics_ = _forwarded("group_metrics_")
    group_names_ = _forwarded("group_names_")
    n_passes_ = _forwarded("n_passes_")
    converged_ = _forwarded("converged_")
    feature_names_in_ = _forwarded("feature_names_in_")

    def __init__(self, n_components=10, *, model="DF", lam=100.0, max_iter=50, tol=1e-3, eps=1e-10,
                 random_state=None, transform_max_iter=500, transform_tol=1e-6, n_threads=None):
        self.n_components = n_components
        self.model = model
        self.lam = lam
        self.max_iter = max_iter
        self.tol = tol
        self.eps = eps
        self.random_state = random_state
        self.transform_max_iter = transform_max_iter
        self.transform_tol = transform_tol
        self.n_threads = n_threads

    def fit(self, X, y, client=None, *, mask=None):
        """Fit on X with class labels y (-1 marks unlabelled rows, used for the reconstruction only); ``mask``:
        X's observed entries (:meth:`SSNMF.fit`)."""
        y = column_or_1d(y, warn=True)  # a column of labels, as scikit-learn's classifiers take it, with a warning
        if y.dtype.kind == "f" and np.isfinite(y).all():  # continuous targets; a missing label is named by SSNMF
            check_classification_targets(y)
        self.ssnmf_ = SSNMF(self.n_components, model=self.model, lam=self.lam, max_iter=self.max_iter, tol=self.tol,
                            eps=self.eps, random_state=self.random_state, n_threads=self.n_threads)
        self.ssnmf_.fit(X, y=y, mask=mask, client=client)
        self.classes_ = self.ssnmf_.classes_
        self.n_features_in_ = self.ssnmf_.n_features_in_
        self.n_iter_ = self.ssnmf_.n_iter_
        return self

    def fit_transform(self, X, y, client=None, *, mask=None):
        """Fit, then W for X's rows as :meth:`transform` gives it (with H fixed, as for new rows)."""
        return self.fit(X, y, client=client, mask=mask).transform(X, client=client, mask=mask)

    @property
    def _n_features_out(self) -> int:
        """The width of transform's output, which get_feature_names_out names (AttributeError until fitted)."""
        return self.ssnmf_.components_.shape[0]

    def transform(self, X, client=None, *, mask=None):
        """W for new rows with H fixed (:meth:`SSNMF.transform`), over the entries ``mask`` observes."""
        self._check_fitted()
        return self.ssnmf_.transform(X, mask, client=client, max_iter=self.transform_max_iter,
                                     tol=self.transform_tol)

    def decision_function(self, X, client=None, *, mask=None):
        """W_new B (n_samples x n_classes); with two classes, as scikit-learn's binary classifiers give it,
        the second class's score less the first's (n_samples,): positive predicts ``classes_[1]``."""
        scores = self._scores(X, client, mask)
        return scores[:, 1] - scores[:, 0] if len(self.classes_) == 2 else scores

    def _scores(self, X, client, mask):
        """W_new B (n_samples x n_classes)."""
        return np.asarray(self.transform(X, client=client, mask=mask)) @ self.ssnmf_.B_  # a DataFrame: set_output

    def predict_proba(self, X, client=None, *, mask=None):
        scores = self._scores(X, client, mask)
        totals = scores.sum(axis=1, keepdims=True)
        uniform = np.full_like(scores, 1.0 / scores.shape[1])
        return np.divide(scores, totals, out=uniform, where=totals > 0)

    def predict(self, X, client=None, *, mask=None):
        scores = self._scores(X, client, mask)  # first: an unfitted model raises NotFittedError
        return self.classes_[np.argmax(scores, axis=1)]

    def score(self, X, y, sample_weight=None, *, mask=None):
        """Accuracy of :meth:`predict` (``mask``: X's observed entries); labels the model has not seen are an
        error (they could never be predicted)."""
        self._check_fitted()
        unseen = sorted(set(np.asarray(y).tolist()) - set(self.classes_.tolist()))
        if unseen:
            raise ValueError(f"y has classes {unseen} that were not seen in fit; known classes: {self.classes_.tolist()}")
        return accuracy_score(y, self.predict(X, mask=mask), sample_weight=sample_weight)

    def __sklearn_tags__(self):
        return with_input_tags(super().__sklearn_tags__())

    def _check_fitted(self):
        if not hasattr(self, "ssnmf_"):
            raise NotFittedError("this SSNMFClassifier is not fitted yet; call fit first")


def _labels_to_fit(value: str, data) -> dict:
    from ..store.files import class_labels

    return {"y": class_labels(value, data)}


def _ssnmf_arrays(model) -> dict:
    return {} if model.B_ is None else {"B.npy": model.B_}  # Y ~ W B; columns in metrics.json's "classes" order


def _ssnmf_facts(model) -> dict:
    facts = {"model": model._method.model, "lam": model.lam, "reconstruction": float(model.loss_history_[-1, 1]),
             "supervision": float(model.loss_history_[-1, 2])}
    if model.B_ is not None:
        facts["classes"] = [str(c) for c in model.classes_]
    return facts


DECLARATION = MethodDeclaration(
    name="ssnmf", estimator=SSNMF,
    summary="semi-supervised NMF: X ~ W H and the class labels ~ W B jointly",
    metrics=("relative_error", "relative_i_divergence", "reconstruction_term", "supervision_term", "objective"),
    arrays=_ssnmf_arrays, facts=_ssnmf_facts,
    fit_inputs=(FitInput("labels", "'groups' (the groups are the classes), 'none' (NMF), or a .npy/text file "
                         "with one class label per input row (-1: unlabelled)", "groups", _labels_to_fit,
                         is_path=lambda value: value not in ("groups", "none")),),
    views="distfact.reports.ssnmf:views",
    paper_report=PaperReport("ssnmf", "the SSNMF paper's report (Fig. 2, Table 5): the normalised B and the top "
                             "features of each topic", "distfact.reports.ssnmf:paper_report"))
