"""Plumbing shared by the estimators: input coercion, executor, checkpoints, gathering rows."""

from __future__ import annotations

import functools
import logging
import numbers
import os
import shutil
import tempfile
import time
import uuid
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin
from sklearn.exceptions import ConvergenceWarning, NotFittedError

from .._warnings import user_stacklevel
from ..engine import Checkpointer, FitState, WorkerLost, make_executor
from ..engine import fit as run_loop
from ..engine.executor.base import joined_input
from ..store.coerce import as_grouped
from .masks import block_masks
from .persistence import save_model
from .tables import FittedTable, set_table

logger = logging.getLogger("distfact")
MAX_WORKER_LOSSES = 3


def survives_worker_loss(fit):
    """Run ``fit`` (an estimator's fitting method) again when a Dask worker dies under it (:class:`WorkerLost`),
    at most ``MAX_WORKER_LOSSES`` times: from the newest checkpoint when the estimator has a ``checkpoint_dir``
    (the work since it is redone), else from the start. Every step is deterministic and independent of where
    blocks run, so the result is bitwise that of an undisturbed fit; ``worker_losses_`` counts the reruns.
    A callback sees the redone iterations again. The rerun first waits (``engine/cluster.py: REJOIN_WAIT``) for
    the cluster to regain the workers it had, so that X is not all placed on the survivors."""
    @functools.wraps(fit)
    def run(self, *args, **kwargs):
        resume = getattr(self, "resume", None)
        checkpoints = getattr(self, "checkpoint_dir", None)
        try:
            for losses in range(MAX_WORKER_LOSSES + 1):
                try:
                    out = fit(self, *args, **kwargs)
                    self.worker_losses_ = losses
                    return out
                except WorkerLost as exc:
                    if losses == MAX_WORKER_LOSSES:
                        raise WorkerLost(f"{exc}; gave up after {MAX_WORKER_LOSSES} reruns of the fit, each "
                                         "losing a worker (a task that exceeds the workers' memory?)") from None
                    logger.warning("%s; %s", exc, "restarting the fit (set checkpoint_dir to resume instead)"
                                   if checkpoints is None else f"resuming from the newest checkpoint in {checkpoints}")
                    if checkpoints is not None:
                        self.resume = True  # the checkpoints the lost attempt wrote are this fit's own
                    self._workers_before_loss = exc.n_workers
        finally:
            if resume is not None:
                self.resume = resume
            self.__dict__.pop("_workers_before_loss", None)
    return run


def check_rank(n_components, shape) -> int:
    m, n = shape
    if n_components is None:
        return min(m, n)
    if not isinstance(n_components, numbers.Integral) or n_components < 1:
        raise ValueError(f"n_components must be a positive integer, got {n_components!r}")
    if n_components > min(m, n):
        raise ValueError(f"n_components={n_components} is larger than min(n_samples, n_features) = "
                         f"min({m}, {n}) = {min(m, n)}")
    return int(n_components)


def check_iteration_params(max_iter, tol, random_state=None) -> None:
    """``max_iter`` a non-negative integer, ``tol`` a finite non-negative number, ``random_state`` None or a
    non-negative integer (a seed from which every block derives its own)."""
    if not isinstance(max_iter, numbers.Integral) or isinstance(max_iter, bool) or max_iter < 0:
        raise ValueError(f"max_iter must be a non-negative integer, got {max_iter!r}")
    if not isinstance(tol, numbers.Real) or not np.isfinite(tol) or tol < 0:
        raise ValueError(f"tol must be a finite non-negative number, got {tol!r}")
    if random_state is not None and (not isinstance(random_state, numbers.Integral) or isinstance(random_state, bool)
                                     or random_state < 0):
        raise ValueError(f"random_state must be None or a non-negative integer (a seed), got {random_state!r}")


def check_factor(F, shape, name: str, dtype) -> np.ndarray:
    F = np.asarray(F)
    if F.shape != shape:
        raise ValueError(f"{name} has shape {F.shape}, expected {shape}")
    if not np.all(np.isfinite(F)) or (F < 0).any():
        raise ValueError(f"{name} must be finite and non-negative")
    return np.ascontiguousarray(F, dtype=dtype)


def check_new_directory(path, name: str) -> None:
    """An output directory (``W_out``) must be new or empty: distfact writes no file over one it did not write.
    Checked before a fit starts, so that a long fit does not fail at its end."""
    if path is None:
        return
    path = os.fspath(path)
    if os.path.lexists(path) and (not os.path.isdir(path) or os.listdir(path)):
        raise ValueError(f"{name} {path!r} exists and is not an empty directory; distfact does not write over "
                         "files: give a new directory")
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(parent) and not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{name} {path!r}: its directory {parent!r} is not writable")


def given_local(block, local):
    """A block's local factor as given (init='custom')."""
    return local


def data_fingerprint(data) -> dict:
    """What identifies the data and its chunking for a checkpoint's configuration hash: readable facts, and the
    metadata checksum, which covers every block's statistics and (for a store) the CRC32C of every array."""
    return {"shape": data.shape, "dtype": str(data.dtype), "layout": data.layout,
            "groups": [(g.name, g.row_start, g.row_stop, g.sq_norm, g.total) for g in data.meta.groups],
            "blocks": [(b.row_start, b.row_stop) for b in data.blocks], "checksum": data.meta.checksum()}


@functools.cache
def machine_memory() -> int:
    """This machine's memory in bytes, asked once per process (0.3 ms a call: a small fit's fixed cost)."""
    import psutil

    return psutil.virtual_memory().total


def with_input_tags(tags, signed: bool = False):
    """scikit-learn's tags for what distfact's estimators take: sparse matrices, and (unless ``signed``) only
    non-negative values."""
    tags.input_tags.positive_only = not signed
    tags.input_tags.sparse = True
    return tags


@dataclass
class Phase:
    """One loop of a fit, which :meth:`FactorEstimator._run_fit` runs on the engine (``engine.fit``).

    Parameters
    ----------
    method : IterativeMethod
        The method the loop iterates.
    start : callable or Phase
        ``start()`` initialises the executor's local factors and returns the global state (or the pair
        (global state, pass-0 statistics)), as ``engine.fit`` takes it; or a Phase whose loop is the start
        (run, or resumed from its own checkpoints, only when this phase has no checkpoint to resume from),
        its ``then`` turning its final state into this phase's start.
    max_iter : int
        Iterations of the loop at most.
    config : dict
        The checkpoint configuration: its hash decides which checkpoints a resumed fit may continue from.
    checkpoint : str or None
        The subdirectory of ``checkpoint_dir`` of the phase's checkpoints, for fits of several loops; None:
        ``checkpoint_dir`` itself.
    callback : bool
        Whether the estimator's ``callback`` sees the phase's iterations.
    cut_short : str or None
        The ConvergenceWarning's text when the loop stops at ``max_iter`` before its stopping rule holds
        (not for a loop stopped by a time limit); None: no warning.
    global_args : dict or None
        ``engine.fit``'s ``global_args`` (the arguments ``start`` gives ``method.initial_global``).
    then : callable or None
        For a phase that is another's start: its final :class:`FitState` to the start the other's loop
        takes (the same kinds as ``start`` returns).
    """

    method: object
    start: Callable[[], object] | Phase
    max_iter: int
    config: dict
    checkpoint: str | None = None
    callback: bool = True
    cut_short: str | None = None
    global_args: dict | None = None
    then: Callable[[FitState], object] | None = None


def warn_if_cut_short(phase: Phase, state: FitState) -> None:
    """The phase's ConvergenceWarning if its loop stopped at ``max_iter`` before its stopping rule held (not when
    a time limit stopped it)."""
    if (phase.cut_short is not None and not (state.converged or state.timed_out) and phase.max_iter > 0
            and state.iteration >= phase.max_iter):
        warnings.warn(phase.cut_short, ConvergenceWarning, stacklevel=user_stacklevel())


@dataclass
class FitRun:
    """One call of ``fit``, as :meth:`FactorEstimator._run_fit` passes it to the estimator's hooks.

    Parameters
    ----------
    data : GroupedMatrix
        X with its groups (the estimator's ``_prepare`` may replace it, e.g. by one with column blocks).
    rank : int
        ``n_components`` checked against X's shape.
    inputs : dict
        ``fit``'s own arguments (the factors of init='custom', targets, masks) and what ``_prepare``
        derives from them.
    deadline : float or None
        ``time.perf_counter()`` after which no loop begins an iteration (an estimator's ``time_limit``).
    method : IterativeMethod or None
        The method, when ``_prepare`` builds it (so that its own checks come before the executor starts).
    executor : Executor or None
        Where the passes run; set once the inputs are checked.
    """

    data: object
    rank: int
    inputs: dict
    deadline: float | None = None
    method: object = None
    executor: object = None


def _stored_block_masks(data) -> list:
    """Per block, the mask ``data`` (a store with a mask of its own) holds, as a row solve's local inputs."""
    return block_masks(data, None)[0]


def _w_of_local_state(local, block):
    """W_b of a local state that holds the block's inputs beside it."""
    return local["W"]


class SavedEstimator:
    """``save(path)`` for distfact's estimators; ``distfact.load(path)`` reads the file back
    (``estimators/persistence.py``)."""

    #: private attributes that the fitted estimator's methods use, saved with the fitted ones (``name_``)
    _fitted_private: tuple = ()

    def save(self, path) -> None:
        """Write this fitted estimator to ``path`` in distfact's model format: one file (``.npz`` by
        convention; no suffix is added) of arrays and JSON, versioned, read back by ``distfact.load(path)``
        without unpickling anything. It holds the parameters (``get_params()``; a callable ``callback`` is
        not saved and comes back as None, paths come back as strings) and every fitted attribute the
        estimator's methods use, so that ``transform``, ``predict``, ... give bitwise the same results after
        loading. The file is written under a temporary name and renamed into place."""
        save_model(self, path)


class FactorEstimator(SavedEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Base of distfact's estimators (fit on grouped data, run by the engine).

    ``get_feature_names_out()`` names transform's columns as scikit-learn's decompositions do (``nmf0``,
    ``nmf1``, ...: the lowercased class name and the component), so ``set_output(transform="pandas")`` gives
    DataFrames from ``transform`` and ``fit_transform`` (with X's index when X is a DataFrame).

    There is no ``score``, as scikit-learn's ``NMF`` has none: give ``GridSearchCV`` or ``cross_validate`` a
    ``scoring`` (the README's scikit-learn paragraph shows one). With metadata routing enabled,
    ``set_fit_request(groups=True)`` passes the rows' groups through ``Pipeline`` and the model-selection tools."""

    _fitted_private = ("_method",)
    #: every estimator's tidy per-group metrics (``distfact.metrics.group_metric_frame``), made when first read
    group_metrics_ = FittedTable()
    #: whether X may hold negative values (scikit-learn's ``positive_only`` tag is its negation)
    _signed_input = False
    #: fit's arguments that give the start of init='custom' (refused with any other init)
    _custom_factors: tuple = ()
    #: whether the fit uses the mask a store holds beside X (``estimators/masks.py: block_masks``); a store with
    #: a mask is refused by the others rather than fitted as if every entry were observed
    _reads_stored_mask = False
    #: the reason an estimator that takes no mask at all gives for refusing a store with one;
    #: None: the store's mask is not read yet (:meth:`_refuse_stored_mask`)
    _stored_mask_refusal: str | None = None

    # ------------------------------------------------------------------ the fit every estimator runs
    @survives_worker_loss
    def _run_fit(self, X, groups, client, want_W: bool, W_out=None, **inputs):
        """The fit: check the parameters and the inputs, run the estimator's phases (one loop each, with their
        checkpoints), set the fitted attributes, write W to ``W_out`` and return it gathered if ``want_W``.

        Everything before the executor starts is checked first, so that a bad input costs no pass and
        writes nothing. The estimator supplies the hooks: ``_check_params()``, ``_prepare(fit)`` (checks of
        the data and of the inputs), ``_local_factors(fit)`` (the local factors' width and dtype),
        ``_phases(fit)`` (a generator of :class:`Phase`, each sent its final :class:`FitState`; the last
        phase's method and state are the fit's), ``_set_results(fit, method, state)`` and, when its local
        factors are not W alone, ``_outputs``.

        Parameters
        ----------
        X, groups, client
            As ``fit`` takes them.
        want_W : bool
            Return W in X's row order (``fit_transform``); otherwise None.
        W_out : path or None
            A new or empty directory to write W to, block by block.
        **inputs
            ``fit``'s own arguments, for the hooks (``FitRun.inputs``).
        """
        check_new_directory(W_out, "W_out")
        deadline = self._check_fit(inputs)
        fit = self._fit_run(self._grouped(X, groups), inputs, deadline)
        fit.executor = self._executor(fit.data, client, *self._local_factors(fit))
        try:
            phases = self._phases(fit)
            phase = next(phases)
            while True:
                state = self._loop(fit, phase)
                try:
                    phase = phases.send(state)
                except StopIteration:
                    break
            self._set_results(fit, phase.method, state)
            return self._outputs(fit.data, fit.executor, W_out, want_W)
        finally:
            fit.executor.close()

    def _check_fit(self, inputs: dict) -> float | None:
        """The checks before X is read: the parameters, and fit's inputs against ``init``. Returns the deadline
        (``time.perf_counter()`` of the end of ``time_limit``, counted from the call to fit, the input included)."""
        self._check_params()
        given = [name for name in self._custom_factors if inputs.get(name) is not None]
        if given and self.init != "custom":
            names = self._custom_factors
            raise ValueError(f"{', '.join(names[:-1])} and {names[-1]} are used only with init='custom'")
        time_limit = getattr(self, "time_limit", None)
        return None if time_limit is None else time.perf_counter() + time_limit

    def _fit_run(self, data, inputs: dict, deadline: float | None) -> FitRun:
        """The fit of ``data`` with its checks of the data and of the inputs (``_prepare``); no pass yet."""
        if not self._reads_stored_mask:
            self._refuse_stored_mask(data)
        fit = FitRun(data, check_rank(self.n_components, data.shape), inputs, deadline)
        self._prepare(fit)
        return fit

    def _refuse_stored_mask(self, data, use: str = "fit") -> None:
        """ValueError when ``data`` (a GroupedMatrix) holds a mask of its own (written at ingest) that ``use``
        ("fit", or a method's name such as "transform") would not read: X would be fitted or solved as if every
        entry were observed. Called by every surface that reads a store and does not read its mask. The reason
        is the estimator's ``_stored_mask_refusal`` when it has one (it takes no mask at all)."""
        if data.mask_kind is None:
            return
        where = f"store {data.path!r}" if data.path else "X (a GroupedMatrix)"
        name = type(self).__name__ if use == "fit" else f"{type(self).__name__}.{use}"
        reason = f": {self._stored_mask_refusal}" if self._stored_mask_refusal else (
            f", which {name} does not read from a store yet; " + (
                "fit it on X in memory with fit(X, mask=...), or ingest X without a mask" if use == "fit" else
                "it would treat every entry as observed; ingest the rows without a mask, or fill the missing "
                "entries first (NMF(...).fit(X, mask=...).impute(X))"))
        raise ValueError(f"{where} has a mask (kind {data.mask_kind!r}, written at ingest){reason}")

    def _loop(self, fit: FitRun, phase: Phase) -> FitState:
        """Run one phase's loop (after its start phase, if it has one and there is no checkpoint of its own
        to resume from) and give its ConvergenceWarning if it was cut short."""
        def after_start_phase():
            return phase.start.then(self._loop(fit, phase.start))
        start = after_start_phase if isinstance(phase.start, Phase) else phase.start
        state = run_loop(phase.method, fit.data, fit.executor, max_iter=phase.max_iter, start=start,
                         callback=self.callback if phase.callback else None,
                         checkpointer=self._checkpointer(phase.config, phase.checkpoint), resume=self.resume,
                         deadline=fit.deadline, global_args=phase.global_args)
        warn_if_cut_short(phase, state)
        return state

    def _check_params(self) -> None:
        """ValueError for a parameter out of its range (checked before X is read)."""

    def _prepare(self, fit: FitRun) -> None:
        """Check the data and ``fit``'s inputs against each other (before the executor starts); may replace
        ``fit.data``, add to ``fit.inputs`` and set ``fit.method``."""

    def _local_factors(self, fit: FitRun) -> tuple[int, object]:
        """The local factors' columns and dtype (None: X's), from which the executor decides whether they
        spill to disk."""
        return fit.rank, None

    def _ignore_y(self, y, groups) -> None:
        """scikit-learn passes targets as ``y``, which distfact's factorisations do not use; but a second
        positional argument meant as the rows' groups (``fit(X, groups)``, as the API once read) must not be
        dropped without a word. Called first thing by ``fit`` and ``fit_transform``."""
        if y is not None and groups is None:
            warnings.warn(f"{type(self).__name__} ignores y (targets); the rows' groups are passed as groups=",
                          UserWarning, stacklevel=user_stacklevel())

    def _grouped(self, X, groups):
        return as_grouped(X, groups, block_rows=getattr(self, "block_rows", None),
                          n_threads=getattr(self, "n_threads", None))

    def _executor(self, data, client, rank: int = 0, local_dtype=None):
        """The executor; local factors (rows x ``rank``, of ``local_dtype``, default X's) spill to
        Zarr beside X when they exceed ``local_memory_budget`` (default: a quarter of this machine's memory)."""
        budget = getattr(self, "local_memory_budget", None)
        if budget is None:
            budget = machine_memory() // 4
        spill_dir = None
        if data.shape[0] * rank * np.dtype(local_dtype or data.dtype).itemsize > budget:
            spill_dir = (f"{os.path.abspath(data.path)}.locals-{uuid.uuid4().hex[:8]}" if data.path
                         else tempfile.mkdtemp(prefix="distfact-locals-"))
        return make_executor(data, client, getattr(self, "n_threads", None), spill_dir,
                             getattr(self, "_workers_before_loss", 1), rank * np.dtype(local_dtype or data.dtype).itemsize)

    def _checkpointer(self, config: dict, phase: str | None = None):
        """Checkpoints in ``checkpoint_dir`` (or its ``phase`` subdirectory, for fits run as
        several loops), or None without a ``checkpoint_dir``."""
        if getattr(self, "checkpoint_dir", None) is None:
            return None
        run_dir = self.checkpoint_dir if phase is None else os.path.join(self.checkpoint_dir, phase)
        return Checkpointer(run_dir, self.checkpoint_every, config)

    def _set_run_facts(self, method, data, state, executor) -> None:
        """The fitted attributes every estimator has: shapes, iterations, passes, where it ran."""
        self.n_components_ = method.n_components
        self.n_features_in_ = data.shape[1]
        if data.feature_names is not None:
            self.feature_names_in_ = np.asarray(data.feature_names, dtype=object)
        self.n_iter_ = state.iteration
        self.n_passes_ = executor.n_passes
        self.converged_ = state.converged
        self.scheduler_ = executor.describe()
        self._method = method

    def __sklearn_tags__(self):
        return with_input_tags(super().__sklearn_tags__(), signed=self._signed_input)

    def _check_width(self, n_features: int) -> None:
        """New rows must have the fitted number of features (in scikit-learn's words, which its checks expect)."""
        if n_features != self.n_features_in_:
            raise ValueError(f"X has {n_features} features, but {type(self).__name__} is expecting "
                             f"{self.n_features_in_} features as input")

    @property
    def _n_features_out(self) -> int:
        """The width of transform's output, which get_feature_names_out names (AttributeError until fitted)."""
        return self.components_.shape[0]

    def _rows_for_fixed_H(self, X, groups, client, method, max_iter, tol, local_inputs=None):
        """W for new rows with H = components_ fixed, by NMF's W solve (``method.solve_local`` of an
        :class:`~distfact.methods.nmf.NMFMethod`, from the constant start of its scale): one read of X,
        rows in X's order. The caller checks that the estimator is fitted. ``local_inputs``: a function of the
        grouped X giving per block the row-aligned inputs ``solve_local`` receives as the block's local state
        (a mask), or None: then a store with a mask of its own gives its blocks' masks (the rows are solved over
        their observed entries, as :meth:`distfact.NMF.transform` solves them)."""
        data = self._grouped(X, groups)
        self._check_width(data.shape[1])
        if local_inputs is None and data.mask_kind is not None:
            local_inputs = _stored_block_masks
        inputs = None if local_inputs is None else local_inputs(data)
        executor = self._executor(data, client)
        try:
            if inputs is not None:
                executor.init_local(given_local, per_block=inputs)
            blocks = executor.map_blocks(method.solve_local, self.components_.astype(data.dtype, copy=False),
                                         method.init_scale(data), max_iter, tol)
        finally:
            executor.close()
        return self._rows_in_caller_order(data, blocks)

    def _warm_factors(self, data) -> dict:
        """``fit``'s custom factors besides W and H for a fit of ``data`` that continues this fitted model (a
        nightly pipeline's warm start, ``pipeline/nightly.py``): none for a method whose start is W and H."""
        return {}

    def inverse_transform(self, W):
        """W H."""
        self._check_fitted()
        return np.asarray(W) @ self.components_

    def _reconstruction_offsets(self, groups) -> np.ndarray | None:
        """The rows the model adds to W H in its reconstruction of rows of the groups ``groups`` (one label per
        row asked for; (len(groups), n_features)), or None: its reconstruction is W H. What ``select_rank``
        scores the held-out entries against: W H + 1 o^T per group."""
        return None

    _set_table = set_table  # the results' tables, made when first read (estimators/tables.py)

    def _check_fitted(self):
        if not hasattr(self, "components_"):
            raise NotFittedError(f"this {type(self).__name__} is not fitted yet; call fit first")

    def _custom_start(self, data, executor, W, rank: int, dtype, global_state: dict, local_inputs=None):
        """init='custom': ``W`` (X's row order) checked and split into the store's blocks; the start
        puts each block's rows where the block lives and returns ``global_state``. With
        ``local_inputs`` (per block, a dict of row-aligned inputs) a block's local state is that dict
        plus "W"."""
        W_blocks = self._blocks_from_rows(data, check_factor(W, (data.shape[0], rank), "W", dtype))
        if local_inputs is not None:
            W_blocks = [joined_input(inputs, W=W_b) for inputs, W_b in zip(local_inputs, W_blocks)]

        def start():
            executor.init_local(given_local, per_block=W_blocks)
            return global_state
        return start

    def _outputs(self, data, executor, W_out, want_W):
        """After a fit: W written block by block to ``W_out`` if given; W gathered in X's row order
        if ``want_W`` (fit_transform), else None. Local states that hold the block's inputs beside W_b
        (:meth:`_local_states_hold_inputs`) give W_b alone."""
        held = self._local_states_hold_inputs()
        if W_out is not None:
            if held:
                executor.map_local(_w_of_local_state)
            self._save_local_factors(executor, W_out)
        if not want_W:
            return None
        local = executor.local_factors()
        return self._rows_in_caller_order(data, [state["W"] for state in local] if held else local)

    def _local_states_hold_inputs(self) -> bool:
        """Whether the fit's local states are dicts holding the block's own inputs (targets, masks) beside W_b
        (``"W"``); known once ``_set_results`` ran."""
        return False

    @staticmethod
    def _save_local_factors(executor, directory) -> None:
        """Write W block by block (one Zarr array per block, by the process holding it) beside ``directory`` and
        rename it into place (``directory`` was absent or empty: see :func:`check_new_directory`)."""
        directory = os.path.abspath(os.fspath(directory))
        aside = f"{directory}.partial-{uuid.uuid4().hex[:8]}"
        try:
            executor.save_local(aside)
            check_new_directory(directory, "W_out")  # again: something may have appeared meanwhile
            if os.path.isdir(directory):
                os.rmdir(directory)
            os.rename(aside, directory)
        except BaseException:
            shutil.rmtree(aside, ignore_errors=True)
            raise

    @staticmethod
    def _rows_in_caller_order(data, blocks: list) -> np.ndarray:
        """Concatenate per-block rows and put them back in the order X was given in."""
        stored = np.concatenate(blocks, axis=0)
        out = np.empty_like(stored)
        out[data.row_index()] = stored
        return out

    @staticmethod
    def _blocks_from_rows(data, F: np.ndarray) -> list:
        """Split a caller-ordered row factor into the store's blocks."""
        stored = F[data.row_index()]
        return [stored[b.row_start:b.row_stop] for b in data.blocks]
