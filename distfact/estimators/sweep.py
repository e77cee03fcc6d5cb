"""``distfact.fit_many``: several models of one estimator (a rank sweep, repeated seeds) fitted in the same passes
over X (issue 19).

Each model is its estimator's own fit (``FactorEstimator``'s hooks: ``_check_params``, ``_prepare``,
``_phases``, ``_set_results``, ``_outputs``), run against its view of one shared executor; the models' phases
run side by side, each phase's loops as one :class:`~distfact.engine.many.ManyModels` loop, so that every pass
reads X once for all of them. Each fitted model is bitwise the model its estimator's ``fit`` gives alone, except
where ``shared_products`` (the default) lets a method form one product of a block for all the models (NMF's
Frobenius MU and HALS on large dense blocks): those models equal their fits alone to rounding.
"""

from __future__ import annotations

import functools
import inspect
import numbers

import numpy as np

from ..engine import fit as run_loop
from ..engine.driver import IterationInfo
from ..engine.many import ManyModels, SharedLocals, split_models
from .base import FactorEstimator, Phase, check_new_directory, survives_worker_loss, warn_if_cut_short
from .masks import masks_shared

#: parameters that decide how X is cut into blocks and where the local factors live: one value for all models
SHARED_PARAMETERS = ("block_rows", "n_threads", "local_memory_budget", "column_blocks")


def fit_many(estimator, X, *, groups=None, ranks=None, seeds=None, masks=None, client=None, W_out=None,
             return_W=False, shared_products=True, **fit_inputs):
    """Fit several models in the same passes over X: a rank sweep, or the same rank from several seeds.

    Every pass reads each block of X once for all the models (a sweep of k models reads X once per iteration,
    not k times); each model stops by its own rule (or its ``max_iter``) and is then frozen while the others go
    on. Every fitted model is the one ``estimator``'s ``fit`` gives alone with the same parameters: bitwise with
    ``shared_products=False`` (``fit_many(NMF(tol=0), X, ranks=[2, 5], shared_products=False)[1]`` equals
    ``NMF(5, tol=0).fit(X)`` to the last bit), and by default bitwise too except where a method shares its
    products between the models (see ``shared_products``).

    Parameters
    ----------
    estimator : FactorEstimator or list of FactorEstimator
        The template, copied (``get_params``) once per (rank, seed); or the models themselves, all of one class,
        with their own parameters (those of :data:`SHARED_PARAMETERS` equal), fitted in place.
    X, groups, client
        As the estimator's ``fit`` takes them.
    ranks : iterable of int, optional
        The models' ``n_components`` (default: the estimator's).
    seeds : iterable of int, optional
        The models' ``random_state`` (default: the estimator's); one model per (rank, seed), ranks outermost.
    masks : list, optional
        Per-model data masks, each what the estimator's ``fit`` takes as ``mask`` (a weight array or sparse
        matrix of X's shape, 0: missing; None: no mask), given to that model alone (the folds of a
        cross-validation). With one estimator, an outer axis: one model per (mask, rank, seed), masks
        outermost, so model ``(f * len(ranks) + i) * len(seeds) + j`` has mask ``f``, rank ``i`` and seed ``j``;
        with a list of models, one mask per model. All the models still share every pass over X. A TypeError if
        the estimator's ``fit`` takes no ``mask``.
    W_out : list of paths, optional
        One new or empty directory per model, where its W is written block by block (as by ``fit(W_out=...)``).
    return_W : bool
        Also return each model's W (n_samples x rank, X's row order, gathered as ``fit_transform`` gathers it).
    shared_products : bool
        True (default): where the models' method offers it, their local steps on a block run as one, with one
        product of each tile of X for all the models together (X [H_1; ...; H_k]^T and [W_1 ... W_k]^T X, each
        model's update of W on its columns in between), which costs about as much as the products at the summed
        rank rather than k separate products; so do their statistics of the start (pass 0). Offered by NMF with
        the Frobenius loss (MU or HALS) on unmasked float64 dense blocks of more than one tile of the local step
        (1 MiB; a smaller block's products are small, and shared were no faster); those models' factors,
        histories and metrics then equal their fits alone to rounding (about 1e-12 relative after tens of
        iterations; not bitwise: the products' sums are grouped otherwise), and their iterations and passes are
        the same unless a stopping rule is met within rounding of its threshold. Every other model (other
        estimators, KL, masks, sparse, float32 or small blocks), and a model while it runs alone, is bitwise its
        fit alone. False: every model bitwise its fit alone, each with its own products.
    **fit_inputs
        The estimator's own ``fit`` arguments (SSNMF's ``Y``, ``y``, ``mask``), the same for every model.

    Returns
    -------
    list of FactorEstimator
        The fitted models, in the order of ``estimator`` if a list, else of (mask, rank, seed). Each has the
        attributes of its fit alone (``n_passes_``: the passes it took part in, as many as alone) and
        ``sweep_passes_``, the passes over X of the whole sweep.
    list of ndarray
        With ``return_W``: the models' W, in the same order.

    Notes
    -----
    Supported: the iterative estimators (NMF, StratifiedNMF, FairerNMF, WeightedL1NMF, SSNMF and estimators
    built as they are); MultigroupSVD is refused (one fit at the largest rank gives every smaller rank).
    Not in a sweep: checkpoints (``checkpoint_dir``) and init='custom' (per-model starts).
    """
    if masks is not None and "mask" in fit_inputs:
        raise ValueError("give either mask (the same for every model) or masks (one per model), not both")
    if isinstance(estimator, (list, tuple)):
        if ranks is not None or seeds is not None:
            raise ValueError("give ranks and seeds with one estimator (a template), not with a list of models")
        models = list(estimator)
        if masks is not None and len(masks) != len(models):
            raise ValueError(f"masks gives {len(masks)} masks for {len(models)} models (one per model)")
        model_masks = masks
    else:
        params = estimator.get_params(deep=False)
        ranks = [params.get("n_components")] if ranks is None else list(ranks)
        seeds = [params.get("random_state")] if seeds is None else list(seeds)
        folds = [None] if masks is None else list(masks)
        models = [type(estimator)(**{**params, "n_components": rank, "random_state": seed})
                  for _ in folds for rank in ranks for seed in seeds]
        model_masks = None if masks is None else [mask for mask in folds for _ in ranks for _ in seeds]
    if W_out is not None and len(W_out) != len(models):
        raise ValueError(f"W_out gives {len(W_out)} directories for {len(models)} models")
    shared_inputs = fit_arguments(models[0], fit_inputs if masks is None else {**fit_inputs, "mask": None})
    inputs = [shared_inputs] * len(models) if masks is None else \
        [{**shared_inputs, "mask": mask} for mask in model_masks]
    sweep = Sweep(models, shared_products)
    with masks_shared():  # a mask given to several models (a fold's) is cut into blocks once for all of them
        Ws = sweep.fit(X, groups, client, [None] * len(models) if W_out is None else list(W_out), inputs, return_W)
    for model in models:
        model.worker_losses_ = sweep.worker_losses_
    return (models, Ws) if return_W else models


def can_sweep(kind: type) -> bool:
    """Whether ``fit_many`` fits several models of the estimator class ``kind`` in shared passes."""
    return issubclass(kind, FactorEstimator) and hasattr(kind, "_phases")


def fit_arguments(model, given: dict) -> dict:
    """``fit``'s own arguments of ``model``'s class (those besides X, groups, client and W_out), their defaults
    updated by ``given``; TypeError for an argument its ``fit`` does not take."""
    taken = {name: parameter.default for name, parameter in inspect.signature(type(model).fit).parameters.items()
             if name not in ("self", "X", "groups", "client", "W_out")}
    unknown = sorted(given.keys() - taken.keys())
    if unknown:
        raise TypeError(f"{type(model).__name__}.fit takes no argument {unknown[0]!r}")
    return {**taken, **given}


class Sweep:
    """Models of one estimator class fitted in the same passes (see :func:`fit_many`)."""

    def __init__(self, models: list, shared_products: bool = True):
        if not models:
            raise ValueError("no models to fit")
        kind = type(models[0])
        if not all(type(model) is kind for model in models):
            raise ValueError("the models of one sweep must be of one estimator class, got "
                             f"{sorted({type(model).__name__ for model in models})}")
        if not can_sweep(kind):
            raise ValueError(f"{kind.__name__} cannot fit several models in shared passes: it is not fitted by "
                             "iterations of the engine's loop (fit its models one by one)")
        for model in models:
            if getattr(model, "checkpoint_dir", None) is not None:
                raise ValueError("a sweep writes no checkpoints: give no checkpoint_dir (fit models one by one to "
                                 "checkpoint them)")
            if getattr(model, "init", None) == "custom":
                raise ValueError("init='custom' is not supported in a sweep (each model would need its own start)")
            if not isinstance(model.n_components, numbers.Integral):
                raise ValueError(f"every model of a sweep needs an integer n_components, got {model.n_components!r}")
        for name in SHARED_PARAMETERS:
            values = {repr(getattr(model, name, None)) for model in models}
            if len(values) > 1:
                raise ValueError(f"the models of one sweep share X's blocks and local storage: {name} must be the "
                                 f"same for all, got {sorted(values)}")
        self.models = models
        self.shared_products = shared_products
        self.local_memory_budget = getattr(models[0], "local_memory_budget", None)
        self.n_threads = getattr(models[0], "n_threads", None)

    _executor = FactorEstimator._executor  # reads local_memory_budget, n_threads and _workers_before_loss

    @survives_worker_loss
    def fit(self, X, groups, client, W_outs: list, fit_inputs: list, want_W: bool = False) -> list | None:
        """The models' fits in shared passes (``fit_inputs``: each model's ``fit`` arguments); checked first, as
        each model's ``fit`` checks (no pass for a bad input). Returns the models' W if ``want_W``."""
        for W_out in W_outs:
            check_new_directory(W_out, "W_out")
        deadlines = [model._check_fit(inputs) for model, inputs in zip(self.models, fit_inputs)]
        data = self.models[0]._grouped(X, groups)
        fits = []
        for model, deadline, inputs in zip(self.models, deadlines, fit_inputs):
            fit = model._fit_run(fits[0].data if fits else data, dict(inputs), deadline)
            if fits and fit.data is not fits[0].data:
                raise ValueError("the models of this sweep need different forms of X; fit them one by one")
            fits.append(fit)
        widths = [model._local_factors(fit) for model, fit in zip(self.models, fits)]
        dtypes = {np.dtype(dtype or fits[0].data.dtype) for _, dtype in widths}
        if len(dtypes) > 1:
            raise ValueError(f"the models' local factors have different dtypes {sorted(map(str, dtypes))}")
        executor = self._executor(fits[0].data, client, sum(width for width, _ in widths), dtypes.pop())
        try:
            shared = SharedLocals(executor, len(self.models))
            for fit, view in zip(fits, shared.views):
                fit.executor = view
            generators = [model._phases(fit) for model, fit in zip(self.models, fits)]
            phases = [next(generator) for generator in generators]
            while True:
                states = self._together(fits, shared, phases)
                following = []
                for generator, state in zip(generators, states):
                    try:
                        following.append(generator.send(state))
                    except StopIteration:
                        pass
                if not following:
                    break
                if len(following) != len(generators):
                    raise RuntimeError("the models of this sweep ran different numbers of phases")
                phases = following
            gathered = executor.local_factors() if want_W else None  # once for all the models
            Ws = []
            for model, fit, phase, state, W_out in zip(self.models, fits, phases, states, W_outs):
                model._set_results(fit, phase.method, state)
                model.sweep_passes_ = executor.n_passes
                view = fit.executor if gathered is None or W_out is not None else \
                    GatheredLocals(gathered, fit.executor.model)
                Ws.append(model._outputs(fit.data, view, W_out, want_W))
            return Ws if want_W else None
        finally:
            executor.close()

    def _together(self, fits: list, shared: SharedLocals, phases: list) -> list:
        """One phase of every model as one loop (after their start phases, if they have them); each model's
        ConvergenceWarning if its loop was cut short. Returns the models' final states."""
        starts_are_phases = {isinstance(phase.start, Phase) for phase in phases}
        if len(starts_are_phases) > 1:
            raise ValueError("the models of this sweep start differently (some from a loop of their own); "
                             "fit them one by one")
        if starts_are_phases.pop():
            states = self._together(fits, shared, [phase.start for phase in phases])
            starts = [functools.partial(phase.start.then, state) for phase, state in zip(phases, states)]
        else:
            starts = [phase.start for phase in phases]
        many = ManyModels([phase.method for phase in phases], [phase.max_iter for phase in phases],
                          [fit.deadline for fit in fits], self.shared_products)
        state = run_loop(many, fits[0].data, shared.executor, max_iter=max(phase.max_iter for phase in phases),
                         start=lambda: many.begin(shared, starts), callback=self._callback(many, phases, shared))
        for i, view in enumerate(shared.views):
            view.n_passes += many.passes(i)
        states = many.states(state)
        for phase, model_state in zip(phases, states):
            warn_if_cut_short(phase, model_state)
        return states

    def _callback(self, many: ManyModels, phases: list, shared: SharedLocals):
        """Each model's ``callback`` after each of its iterations, with its own figures (None if no model has one)."""
        watched = [i for i, (model, phase) in enumerate(zip(self.models, phases))
                   if phase.callback and model.callback is not None]
        if not watched:
            return None

        def callback(info: IterationInfo) -> None:
            for i in watched:
                record = many.records[i]
                if len(record.objectives) - 1 == info.iteration:  # it ran this iteration
                    self.models[i].callback(IterationInfo(
                        info.iteration, phases[i].max_iter, record.objectives[-1], record.group_objectives[-1],
                        info.seconds, shared.views[i].n_passes + many.passes(i)))
        return callback


class GatheredLocals:
    """A model's local factors from the sweep's, gathered once for all its models (what an estimator's
    ``_outputs`` reads to return W; k models' W cost one gather, not k)."""

    def __init__(self, gathered: list, model: int):
        self.gathered, self.model = gathered, model

    def local_factors(self) -> list:
        return [split_models(local).get(self.model) for local in self.gathered]
