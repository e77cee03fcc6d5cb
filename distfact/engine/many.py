"""Many models in the same passes over X (issue 19): k methods run as one :class:`IterativeMethod`.

A rank sweep, repeated seeds, the folds of a cross-validation: k fits of the same data whose passes differ only
in the factors. :class:`ManyModels` runs them as one method of the driver loop (``driver.fit``), so that each
pass reads every block of X once for all k:

    global state          {"0": G_0, ..., "k-1": G_(k-1)}           (each model's own, untouched by the others)
    local state (block)   model i's local state under the key "i" (an array), or under "i.<name>" for each
                          part of a local state that is a dict (so that checkpoints and spilling write it as
                          they write any local state of named parts)
    statistics            model i's statistic <name> under "i/<name>" (summed by the same fixed-order tree as
                          alone: the pairing depends on the blocks only)
    objective             the sum of the models' objectives; per group, their per-group vectors side by side

Each model stops on its own: after every pass its own stopping rule is asked on its own history (or its own
``max_iter`` or deadline has come), and from then on it is frozen: its global step and its local steps are no
longer run (its factors do not move, its statistics are the last ones it had) and its state is not shipped to
the blocks. The loop ends when every model has stopped. Every step of model i runs the method's own code on
the same inputs, aligned alike, as when it is fitted alone, so each model's result is bitwise that of its fit
alone (tests/test_sweep.py). With ``shared_products`` (``fit_many``'s default) the local steps of the running
models, and their pass 0's statistics, go where their method offers it (e.g. NMF's Frobenius MU and HALS on large
dense blocks: ``local_step_many``, ``block_stats_many``) through one call that forms each product of X for all of
them; those models' results are then equal to their fits alone to rounding, not bitwise. The engine only groups the
calls; the products are the method's.

Starts: each model's start runs as it does alone, against a :class:`ModelView` of the executor, which acts on
the model's part of every block's local state; ``init_local`` calls are gathered and made in one go
(:meth:`SharedLocals.flush`) once every model's start has run, so random starts cost no pass. The blocks
receive only the methods (:class:`PerModel`), not the driver-side record of the models' histories.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from .driver import FitState, shipped
from .executor.base import checkpoint_one
from .finite import NonFiniteError, check_objective


# -- a block's local state: the models' parts side by side -------------------------------------------------------

def split_models(local) -> dict:
    """Every model's part of a block's joint local state, by model index (an array, or a dict of named parts), in
    one scan of its names (no model's part is copied)."""
    parts = {}
    for name, value in (local or {}).items():
        model, dot, part = name.partition(".")
        if dot:
            parts.setdefault(int(model), {})[part] = value
        else:
            parts[int(model)] = value
    return parts


def join_models(parts: dict) -> dict:
    """The joint local state of the models' parts (the inverse of :func:`split_models`)."""
    out = {}
    for i, part in parts.items():
        if isinstance(part, dict):
            out.update({f"{i}.{name}": value for name, value in part.items()})
        else:
            out[str(i)] = part
    return out


def model_local(local, i: int):
    """Model ``i``'s local state in a block's joint local state (None before it has one)."""
    return split_models(local).get(i)


def with_model_local(local, i: int, new) -> dict:
    """The joint local state with model ``i``'s part replaced by ``new`` (an array, or a dict of named parts)."""
    return join_models({**split_models(local), i: new})


def model_stats(stats: list[dict], n_models: int) -> list[list[dict]]:
    """Per model, its per-group statistics (names without the model's prefix); empty for a model the pass did
    not run."""
    out = [[{} for _ in stats] for _ in range(n_models)]
    for g, group_stats in enumerate(stats):
        for key, value in group_stats.items():
            i, name = key.split("/", 1)
            out[int(i)][g][name] = value
    return out


def _prefixed(i: int, stats: dict) -> dict:
    return {f"{i}/{name}": value for name, value in stats.items()}


@dataclass(frozen=True)
class PerModel:
    """A block hook (``block_stats`` or ``local_step``) of every model the pass ships a global state to: what the
    blocks run. ``shipped_states``: model index (as a string) -> the part of its global state its blocks use.

    ``shared_products``: the hook of two or more models goes, where their methods offer it, through the methods'
    ``<hook>_many(methods, X_b, locals, block, Gs)`` in one call (a list, in the models' order, of what each
    model's hook returns, or None for a block it does not take): the method may then form one product of X_b for
    all of them, whose results equal the models' own hooks' to rounding only."""

    methods: tuple
    hook: str
    shared_products: bool = False

    def __call__(self, X_b, local, block, shipped_states: dict):
        update = self.hook == "local_step"
        stats, parts = {}, split_models(local)  # split once: k models cost O(k) name lookups, not O(k^2)
        joint = self._joint(X_b, parts, block, shipped_states) if self.shared_products else None
        for n, (key, G) in enumerate(shipped_states.items()):
            i = int(key)
            out = joint[n] if joint is not None else getattr(self.methods[i], self.hook)(X_b, parts.get(i), block, G)
            if update:
                parts[i], out = out
            stats.update(_prefixed(i, out))
        return (join_models(parts), stats) if update else stats

    def _joint(self, X_b, parts: dict, block, shipped_states: dict) -> list | None:
        """The models' hooks in one call of their methods' common ``<hook>_many`` (None if there is one model, if
        not every method offers the same one, or if it declines the block)."""
        methods = [self.methods[int(key)] for key in shipped_states]
        hooks = {getattr(type(method), self.hook + "_many", None) for method in methods}
        if len(methods) < 2 or len(hooks) > 1 or None in hooks:
            return None
        return hooks.pop()(methods, X_b, [parts.get(int(key)) for key in shipped_states], block,
                           list(shipped_states.values()))


@dataclass(frozen=True)
class PerModelColumns:
    """``column_step`` of every model the pass ships a global state to: pieces by model, statistics prefixed."""

    methods: tuple

    def __call__(self, Xc, W, column_block, shipped_states: dict):
        pieces, stats, parts = {}, {}, split_models(W)
        for key, G in shipped_states.items():
            i = int(key)
            pieces[key], out = self.methods[i].column_step(Xc, parts.get(i), column_block, G)
            stats.update(_prefixed(i, out))
        return pieces, stats


@dataclass
class ModelRecord:
    """What the driver side keeps of one model: its histories, its last statistics, whether and why it stopped."""

    objectives: list = field(default_factory=list)
    group_objectives: list = field(default_factory=list)
    stats: list | None = None
    stopped: bool = False
    converged: bool = False
    timed_out: bool = False
    stats_from_start: bool = False  # its start gave pass 0's statistics (no pass 0 of its own)


class ManyModels:
    """``methods`` fitted in the same passes over X, each stopping on its own (see the module docstring).

    Parameters
    ----------
    methods : sequence of IterativeMethod
        The models' methods (any; per-model parameters are the methods' own). Either all or none sweep X by
        columns too (``column_step``).
    max_iters : sequence of int
        Each model's iteration cap (the loop's is their maximum).
    deadlines : sequence of float or None, optional
        Each model's ``time.perf_counter()`` after which it starts no iteration (None: none).
    shared_products : bool
        Run the models' local steps and pass 0's statistics through their methods' ``local_step_many`` and
        ``block_stats_many`` where offered (see :class:`PerModel`): one product of each block for all the models,
        each model then equal to its fit alone to rounding. False: every step is the model's own, bitwise its fit
        alone.
    """

    def __init__(self, methods, max_iters, deadlines=None, shared_products: bool = False):
        self.methods = tuple(methods)
        self.max_iters = list(max_iters)
        self.deadlines = list(deadlines) if deadlines is not None else [None] * len(self.methods)
        if not self.methods or len(self.max_iters) != len(self.methods) or len(self.deadlines) != len(self.methods):
            raise ValueError("ManyModels needs at least one method, and one max_iter and deadline per method")
        sweeps_columns = [hasattr(method, "column_step") for method in self.methods]
        if any(sweeps_columns) and not all(sweeps_columns):
            raise ValueError("the methods of one ManyModels either all sweep X by columns (column_step) or none do")
        self.block_stats = PerModel(self.methods, "block_stats", shared_products)
        self.local_step = PerModel(self.methods, "local_step", shared_products)
        if all(sweeps_columns):
            self.column_step = PerModelColumns(self.methods)
        self.records = [ModelRecord() for _ in self.methods]

    def passes_on_cores(self, data) -> bool:
        """Whether every model's passes run in pieces on the cores (the driver's ``passes_on_cores``)."""
        return all(getattr(method, "passes_on_cores", lambda data: False)(data) for method in self.methods)

    @property
    def running(self) -> list[int]:
        """The models not stopped yet."""
        return [i for i, record in enumerate(self.records) if not record.stopped]

    # -- the hooks of the driver loop -------------------------------------------------------------------------
    def block_state(self, G: dict) -> dict:
        """What the blocks receive: the shipped part of every running model's global state."""
        return {str(i): shipped(self.methods[i], G[str(i)]) for i in self.running}

    def begin(self, shared: "SharedLocals", starts: list) -> tuple[dict, list[dict]] | dict:
        """The joint start from the models' starts (each a callable that initialises the model's local state
        through its :class:`ModelView` and returns its global state, or the pair (global state, pass-0
        statistics)): the pending ``init_local`` calls are made, and a pass of ``block_stats`` runs for the
        models whose start gave no statistics, unless none did (then the driver's own pass 0 does it)."""
        results = [start() for start in starts]
        shared.flush()
        G, given = {}, {}
        for i, result in enumerate(results):
            if isinstance(result, tuple):
                G[str(i)], given[i] = result
                self.records[i].stats_from_start = True
            else:
                G[str(i)] = result
        if not given:
            return G
        lacking = {str(i): shipped(self.methods[i], G[str(i)]) for i in range(len(self.methods)) if i not in given}
        stats = shared.executor.run_pass(self.block_stats, lacking, update=False) if lacking else \
            [{} for _ in next(iter(given.values()))]
        for i, own in given.items():
            for group_stats, own_group in zip(stats, own):
                group_stats.update(_prefixed(i, own_group))
        return G, stats

    def global_step(self, G: dict, stats: list[dict], data) -> dict:
        split = model_stats(stats, len(self.methods))
        running = set(self.running)
        return {key: self.methods[int(key)].global_step(G_i, split[int(key)], data) if int(key) in running else G_i
                for key, G_i in G.items()}

    def assemble_columns(self, G: dict, pieces: list[dict]) -> dict:
        return {key: self.methods[int(key)].assemble_columns(G_i, [piece[key] for piece in pieces])
                if key in pieces[0] else G_i for key, G_i in G.items()}

    def objective(self, G: dict, stats: list[dict], data):
        """Record the pass of every running model (the driver calls this once per pass): its objective, and
        whether it stops here, by its own rule, its ``max_iter`` or its deadline. Returns the sum of the models'
        objectives and their per-group vectors side by side (the stopped ones' last)."""
        split = model_stats(stats, len(self.methods))
        now = time.perf_counter()
        for i in self.running:
            method, record = self.methods[i], self.records[i]
            value, per_group = method.objective(G[str(i)], split[i], data)
            try:
                check_objective(value, per_group, data.group_names, 0)
            except NonFiniteError as exc:
                raise NonFiniteError(exc.what, where=f"model {i}: {exc.where}") from None
            record.objectives.append(value)
            record.group_objectives.append(per_group)
            record.stats = split[i]
            iteration = len(record.objectives) - 1
            if iteration >= 1 and method.converged(record.objectives, record.group_objectives):
                record.stopped = record.converged = True
            elif iteration >= self.max_iters[i]:
                record.stopped = True
            elif self.deadlines[i] is not None and now >= self.deadlines[i]:
                record.stopped = record.timed_out = True
        total = float(sum(record.objectives[-1] for record in self.records))
        per_group = np.concatenate([np.ravel(record.group_objectives[-1]) for record in self.records])
        return total, per_group.astype(np.float64, copy=False)

    def converged(self, objectives, group_objectives) -> bool:
        """Every model has stopped (each by its own rule, cap or deadline: see :meth:`objective`)."""
        return not self.running

    # -- after the loop ---------------------------------------------------------------------------------------
    def states(self, state: FitState) -> list[FitState]:
        """Each model's own final state, as its fit alone ends with it."""
        return [FitState(state.global_state[str(i)], record.stats, list(record.objectives),
                         list(record.group_objectives), len(record.objectives) - 1, record.converged,
                         record.timed_out or (state.timed_out and not record.stopped))
                for i, record in enumerate(self.records)]

    def passes(self, i: int) -> int:
        """The passes over X model ``i`` took part in (as many as its fit alone makes after its start)."""
        record = self.records[i]
        per_iteration = 2 if hasattr(self, "column_step") else 1
        return (0 if record.stats_from_start else 1) + per_iteration * (len(record.objectives) - 1)


# -- the starts: each model's, on its own part of the local state --------------------------------------------------

@dataclass(frozen=True)
class InitRequest:
    """One ``init_local`` of one model, held until every model's start has run."""

    model: int
    fn: object
    args: tuple
    per_block: list | None


def init_models(block, requests: tuple, *own):
    """A block's joint local state from the models' ``init_local`` calls (``own``: the block's inputs of those
    that have per-block inputs, in request order)."""
    inputs = iter(own[0] if own else ())
    parts = {}
    for request in requests:
        extra = (next(inputs),) if request.per_block is not None else ()
        parts[request.model] = request.fn(block, *request.args, *extra)
    return join_models(parts)


def add_models(local, block, requests: tuple):
    """``init_models`` on a block that already has a joint local state (the models' other parts are kept)."""
    parts = split_models(local)
    for request in requests:
        parts[request.model] = request.fn(block, *request.args)
    return join_models(parts)


@dataclass(frozen=True)
class OnModel:
    """A block function ``fn(X_b, local, block, *args)`` of one model, run on its part of the joint local state
    (``update``: it returns (new local state, statistics), and the joint state gets the new part)."""

    fn: object
    model: int
    update: bool

    def __call__(self, X_b, local, block, *args):
        out = self.fn(X_b, model_local(local, self.model), block, *args)
        if not self.update:
            return out
        new, stats = out
        return with_model_local(local, self.model, new), stats


@dataclass(frozen=True)
class OnModelLocal:
    """A local function ``fn(local, block, *args)`` (no read of X) of one model, on its part."""

    fn: object
    model: int

    def __call__(self, local, block, *args):
        return with_model_local(local, self.model, self.fn(model_local(local, self.model), block, *args))


def save_model_local(local, block, model: int, directory: str):
    """Write model ``model``'s part of a block's local state as its fit alone writes its own (``save_local``);
    the joint state is kept as it is."""
    checkpoint_one(directory, block, model_local(local, model))
    return local


class SharedLocals:
    """The executor's local states, shared by the models' views; ``init_local`` calls wait for :meth:`flush`."""

    def __init__(self, executor, n_models: int):
        self.executor = executor
        self.pending: list[InitRequest] = []
        self.created = False  # the blocks have a joint local state
        self.views = [ModelView(self, i) for i in range(n_models)]

    def flush(self) -> None:
        """Make the pending ``init_local`` calls: in one ``init_local`` if the blocks have no local state yet,
        else in one ``map_local`` that replaces those models' parts."""
        requests, self.pending = tuple(self.pending), []
        if not requests:
            return
        if not self.created:
            own = [request.per_block for request in requests if request.per_block is not None]
            per_block = [tuple(inputs[b] for inputs in own) for b in range(len(self.executor.blocks))] if own else None
            self.executor.init_local(init_models, requests, per_block=per_block)
            self.created = True
        elif any(request.per_block is not None for request in requests):
            raise ValueError("a model's start gives per-block inputs after other models' local states exist; "
                             "such starts cannot share passes")
        else:
            self.executor.map_local(add_models, requests)


class ModelView:
    """What a model's start and its estimator see of the executor: its own part of every block's local state,
    its own count of passes (``n_passes``: those of its start; :class:`ManyModels` adds the loop's)."""

    def __init__(self, shared: SharedLocals, model: int):
        self.shared, self.model, self.n_passes = shared, model, 0

    @property
    def executor(self):
        return self.shared.executor

    def init_local(self, fn, *args, per_block: list | None = None) -> None:
        self.shared.pending.append(InitRequest(self.model, fn, args, None if per_block is None else list(per_block)))

    def run_pass(self, fn, *args, update: bool, args_aligned: bool = False) -> list[dict]:
        self.shared.flush()
        out = self.executor.run_pass(OnModel(fn, self.model, update), *args, update=update, args_aligned=args_aligned)
        self.shared.created |= update
        self.n_passes += 1
        return out

    def map_blocks(self, fn, *args) -> list:
        self.shared.flush()
        self.n_passes += 1
        return self.executor.map_blocks(OnModel(fn, self.model, False), *args)

    def map_local(self, fn, *args) -> None:
        self.shared.flush()
        self.executor.map_local(OnModelLocal(fn, self.model), *args)

    def save_local(self, directory: str) -> None:
        """Write this model's local states block by block under ``directory`` (where they live)."""
        self.shared.flush()
        self.executor.map_local(save_model_local, self.model, directory)

    def local_factors(self) -> list:
        """This model's local states in block order (the executor gathers every model's: only for small fits)."""
        return [model_local(local, self.model) for local in self.executor.local_factors()]

    def describe(self) -> dict:
        return self.executor.describe()
