"""The driver loop shared by every iterative method (DESIGN §1).

    pass 0:   statistics of the initial local factors
    loop:     global step on the driver (from reduced statistics)
              one pass: local step per block + its statistics, fixed-order tree sum
              [a column pass, for methods that sweep X by columns too (column_step)]
              objective from the statistics, callback, checkpoint, stopping rule

A method supplies the hooks of :class:`IterativeMethod`; the loop knows nothing
of their mathematics, and the executor decides where the passes run.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np

from ..kernels.blas_threads import pieces_on_cores
from ..kernels.memory import ReusedBuffers, aligned, aligned_holding, numpy_allocates_aligned
from .finite import NonFiniteError, all_finite, check_global, check_objective

logger = logging.getLogger("distfact")


class IterativeMethod(Protocol):
    """What a method module provides to the engine. Global state is a small dict of arrays."""

    def initial_global(self, data, rng: np.random.Generator) -> dict: ...

    def initial_local(self, block, global_state: dict, rows: "RowStream"): ...

    def block_stats(self, X_b, local, block, global_state: dict) -> dict: ...

    def local_step(self, X_b, local, block, global_state: dict) -> tuple[object, dict]: ...

    def global_step(self, global_state: dict, stats: list[dict], data) -> dict: ...

    def objective(self, global_state: dict, stats: list[dict], data) -> tuple[float, np.ndarray]: ...

    def converged(self, objectives: list[float], group_objectives: list[np.ndarray]) -> bool: ...

    # Optional: ``block_state(global_state) -> dict``, the part of the global state the blocks use
    # (the rest stays on the driver and is not shipped to the workers every pass).
    # Optional, for methods that also sweep X by columns (sCD): ``column_step(Xc, W, column_block,
    # global_state) -> (piece, statistics as arrays over groups)``, run as a second pass after the
    # row pass, and ``assemble_columns(global_state, pieces) -> global_state``; the column pass's
    # statistics join the row pass's, group by group.
    # Optional: ``passes_on_cores(data) -> bool``, whether every pass does its arithmetic in pieces on the cores
    # (``kernels/blas_threads.py``) and the driver's steps make small products only: an in-process fit whose blocks
    # run in turn then holds BLAS at one thread for the loop (:func:`_blas_hold`).


def shipped(method, global_state: dict) -> dict:
    """What the blocks receive of the global state."""
    return _shipping(method)(global_state)


def _shipping(method) -> Callable[[dict], dict]:
    """What gives the blocks' part of a global state for ``method`` (:func:`shipped`), its ``block_state`` looked up
    once (a missing attribute costs an exception inside ``getattr``: the driver ships the global state every
    iteration, and small fits make many, issue 19)."""
    select = getattr(method, "block_state", None)
    return (lambda global_state: global_state) if select is None else select


@dataclass
class IterationInfo:
    """What the per-iteration callback receives."""

    iteration: int
    max_iter: int
    objective: float
    group_objectives: np.ndarray
    seconds: float
    n_passes: int


@dataclass
class FitState:
    global_state: dict
    stats: list[dict]
    objectives: list[float] = field(default_factory=list)
    group_objectives: list[np.ndarray] = field(default_factory=list)
    iteration: int = 0
    converged: bool = False
    timed_out: bool = False


class RowStream:
    """Random draws for rows ``[start, stop)`` (stored order) that do not depend on how the rows
    are cut into blocks: rows are drawn in fixed tiles of ``TILE`` rows, each from its own
    ``SeedSequence(entropy, spawn_key=(1, stream, tile))``, and the block takes its slice."""

    TILE = 4096

    def __init__(self, entropy, start: int, stop: int):
        self.entropy, self.start, self.stop = entropy, start, stop

    def standard_normal(self, n_cols: int, stream: int = 0) -> np.ndarray:
        return self._draw("standard_normal", n_cols, stream)

    def uniform(self, n_cols: int, stream: int = 0) -> np.ndarray:
        """Uniform on [0, 1)."""
        return self._draw("random", n_cols, stream)

    def _draw(self, distribution: str, n_cols: int, stream: int) -> np.ndarray:
        first, last = self.start // self.TILE, (self.stop - 1) // self.TILE
        tiles = [getattr(np.random.default_rng(np.random.SeedSequence(self.entropy, spawn_key=(1, stream, t))),
                         distribution)((self.TILE, n_cols)) for t in range(first, last + 1)]
        offset = self.start - first * self.TILE
        return np.concatenate(tiles)[offset:offset + self.stop - self.start]


class BlockSeeds:
    """Random streams from one root ``SeedSequence``: one for the global state, and row streams
    for the local factors (independent of scheduling and of the chunking)."""

    def __init__(self, random_state):
        if isinstance(random_state, np.random.RandomState | np.random.Generator):
            raise ValueError("random_state must be an int or None (a seed, so that blocks can derive their own)")
        self.entropy = np.random.SeedSequence(random_state).entropy

    def global_rng(self) -> np.random.Generator:
        return np.random.default_rng(np.random.SeedSequence(self.entropy, spawn_key=(0,)))


def _initial_block(block, method, entropy, global_state, *inputs):
    return method.initial_local(block, global_state, RowStream(entropy, block.row_start, block.row_stop), *inputs)


def initialise(method, data, executor, random_state, local_inputs: list | None = None, **global_args) -> dict:
    """Global state and local factors of every block, from ``random_state``.

    ``local_inputs``: per block (by index), row-aligned inputs that become part of its local state
    (SSNMF's targets and masks; each block's task receives its own); ``global_args`` go to
    ``method.initial_global``."""
    seeds = BlockSeeds(random_state)
    global_state = method.initial_global(data, seeds.global_rng(), **global_args)
    executor.init_local(_initial_block, method, seeds.entropy, global_state, per_block=local_inputs)
    return global_state


def _reinitial_block(local, block, method, entropy, global_state, kept: tuple):
    inputs = {name: local[name] for name in kept if name in local}
    return method.initial_local(block, global_state, RowStream(entropy, block.row_start, block.row_stop), inputs)


def initialise_keeping(method, data, executor, random_state, kept: tuple) -> dict:
    """:func:`initialise` where every block already holds a local state (a dict) whose parts named in ``kept``
    (row-aligned inputs such as the block's mask, from an earlier loop of the same fit) are the inputs of its new
    one: they stay where they live instead of being shipped again (and so a later loop of a model in a
    ``fit_many`` sweep, where per-block inputs cannot be given once the models' local states exist, starts as
    its fit alone does). The same local states as :func:`initialise` with those inputs."""
    seeds = BlockSeeds(random_state)
    global_state = method.initial_global(data, seeds.global_rng())
    executor.map_local(_reinitial_block, method, seeds.entropy, global_state, tuple(kept))
    return global_state


def _blas_hold(method, data, executor):
    """``kernels/blas_threads.py: pieces_on_cores`` for the loop where the method's passes run in pieces on the cores
    (its ``passes_on_cores``) and the executor runs the blocks in turn in this process, so that no BLAS call of
    the driver between passes wakes BLAS's threads to spin on the cores the pieces need; else nothing. (Not for
    the start: NNDSVDa's passes are whole-block BLAS products.) The callback runs within it too."""
    declared = getattr(method, "passes_on_cores", None)
    if getattr(executor, "blocks_in_turn_here", False) and declared is not None and declared(data):
        return pieces_on_cores()
    return contextlib.nullcontext()


@numpy_allocates_aligned()  # the arrays the loop makes in this thread need no aligned copies (kernels/memory.py)
def fit(method: IterativeMethod, data, executor, *, max_iter: int, start: Callable[[], dict],
        callback: Callable[[IterationInfo], None] | None = None, checkpointer=None,
        resume: bool = False, deadline: float | None = None, global_args: dict | None = None) -> FitState:
    """Run the loop from the newest checkpoint (``resume``) or else from ``start()``, which
    initialises the executor's local factors and returns the initial global state (or the
    pair (global state, statistics) when its last pass already produced pass 0's statistics).

    ``deadline``: the ``time.perf_counter()`` after which no new iteration starts (None: none). An instant, not a
    duration from this call: the loops of one fit (a start phase's loop runs inside ``start``) share it, so that
    none starts an iteration once the start's loop has reached it.
    ``global_args``: the keyword arguments ``start`` gives ``method.initial_global`` (see :func:`initialise`);
    a resumed state is checked against the global state they give (:func:`check_restored`)."""
    state = None
    if resume and checkpointer is not None:
        found = checkpointer.restore(executor, lambda saved: check_restored(saved, method, data, global_args or {}))
        if found is not None:
            saved, path = found
            executor.n_passes = saved["n_passes"]
            state = FitState(saved["global_state"], saved["stats"], saved["objectives"].tolist(),
                             list(saved["group_objectives"]), saved["iteration"], saved["converged"])
            logger.info("resumed from %s (iteration %d)", path, state.iteration)
    if state is None:
        if checkpointer is not None:
            checkpointer.check_fresh_start()
        try:
            started = start()
            if isinstance(started, tuple):  # an initialisation whose last pass already gave the statistics
                global_state, stats = started
            else:
                global_state = started
                check_global(global_state, 0, "the initial global state")
                stats = executor.run_pass(method.block_stats, shipped(method, global_state), update=False)
            value, per_group = method.objective(global_state, stats, data)
            check_objective(value, per_group, data.group_names, 0)
        except NonFiniteError as exc:
            raise exc.at(0, data.group_names) from None
        state = FitState(global_state, stats, [value], [per_group])
        logger.info("pass 0: objective %.6g", value)
    # the first global step's inputs aligned as every later one's: a fresh start's global state (made here) and a
    # restored state (read from disk)
    state.global_state, state.stats = aligned(state.global_state), aligned(state.stats)
    if checkpointer is not None:
        checkpointer.begin()
    with _blas_hold(method, data, executor):
        columns = hasattr(method, "column_step")
        reused = ReusedBuffers()  # the global state's aligned copies, made into the same allocations every iteration
        ship = _shipping(method)
        group_names = data.group_names  # for the error message of a non-finite objective
        saved = state.iteration  # the last iteration whose state is on disk (or was restored, or none ran)

        def save():
            nonlocal saved
            checkpointer.save(state.iteration, {
                "global_state": state.global_state, "stats": state.stats,
                "objectives": np.asarray(state.objectives, dtype=np.float64),
                "group_objectives": np.stack(state.group_objectives), "converged": state.converged,
                "n_passes": executor.n_passes}, executor)
            saved = state.iteration

        while state.iteration < max_iter and not state.converged:
            started = time.perf_counter()
            if deadline is not None and started >= deadline:
                state.timed_out = True
                logger.info("time limit reached after %d iterations", state.iteration)
                if checkpointer is not None and saved != state.iteration:  # the last state, as at max_iter
                    save()
                break
            iteration = state.iteration + 1
            try:
                # what a step leaves as it was (the same object) was checked already
                state.global_state = aligned_checked(method.global_step(state.global_state, state.stats, data), reused,
                                                     iteration)
                block_args = ship(state.global_state)  # the global state itself: aligned just now
                state.stats = executor.run_pass(method.local_step, block_args, update=True,
                                                args_aligned=block_args is state.global_state)
                if columns:
                    pieces, column_stats = executor.run_column_pass(method.column_step, ship(state.global_state))
                    state.global_state = aligned_checked(method.assemble_columns(state.global_state, pieces), reused,
                                                         iteration)
                    state.stats = [{**row, **column} for row, column in zip(state.stats, column_stats)]
                value, per_group = method.objective(state.global_state, state.stats, data)
                check_objective(value, per_group, group_names, iteration)
            except NonFiniteError as exc:
                raise exc.at(iteration, group_names) from None
            state.objectives.append(value)
            state.group_objectives.append(per_group)
            state.iteration = iteration
            state.converged = method.converged(state.objectives, state.group_objectives)
            seconds = time.perf_counter() - started
            logger.info("iteration %d: objective %.6g (%.3f s)", state.iteration, value, seconds)
            if callback is not None:
                callback(IterationInfo(state.iteration, max_iter, value, per_group, seconds, executor.n_passes))
            # the last state is always saved (at a time limit too, above), so that a later phase of the same fit can
            # resume after it
            finished = state.converged or state.iteration >= max_iter
            if checkpointer is not None and (checkpointer.due(state.iteration) or finished):
                save()
    return state


def aligned_checked(global_state: dict, reused: ReusedBuffers, iteration: int) -> dict:
    """A global state after a step, aligned (its small arrays copied into ``reused``'s allocations) and checked for
    non-finite values: one test over what holds it (each kept allocation whole), and :func:`check_global`, to name
    the entry, only when that fails."""
    global_state, holding = aligned_holding(global_state, reused)
    if not all_finite(holding):
        check_global(global_state, iteration)
    return global_state


def check_restored(saved: dict, method, data, global_args: dict) -> None:
    """ValueError unless a checkpoint's state has the structure this fit's own would have: the entries of
    ``method.initial_global`` (for this data and ``global_args``) of the same kinds, shapes and dtypes (the
    global state may hold more: what the global steps add), statistics for every group alike (the same names,
    arrays of the same dtype and number of dimensions: a group's statistic may have its own length, as a
    stratum's at its kept columns in Stratified-NMF), a loss history of ``iteration + 1`` entries."""
    def kind(value, shape=True):
        if isinstance(value, np.ndarray):
            if not shape:
                return f"an array of {value.ndim} dimensions and dtype {value.dtype}"
            return f"an array of shape {value.shape} and dtype {value.dtype}"
        if isinstance(value, (bool, np.bool_)):
            return "a bool"
        return "a number" if isinstance(value, (int, float, np.number)) else f"a {type(value).__name__}"

    missing = {"global_state", "stats", "objectives", "group_objectives", "converged", "n_passes"} - saved.keys()
    if missing:
        raise ValueError(f"the state lacks {sorted(missing)}")
    expected = method.initial_global(data, np.random.default_rng(0), **global_args)
    restored = saved["global_state"]
    if not isinstance(restored, dict):
        raise ValueError(f"the global state is {kind(restored)}, not a dict")
    for key in expected.keys() & restored.keys():
        if kind(restored[key]) != kind(expected[key]):
            raise ValueError(f"global state {key!r} is {kind(restored[key])}, this fit's is {kind(expected[key])}")
    stats, iteration = saved["stats"], saved["iteration"]
    if (not isinstance(stats, list) or len(stats) != data.n_groups or not all(isinstance(s, dict) for s in stats)
            or any({k: kind(v, False) for k, v in s.items()} != {k: kind(v, False) for k, v in stats[0].items()}
                   for s in stats)):
        raise ValueError(f"the statistics are not {data.n_groups} alike per-group dicts")
    for name in ("objectives", "group_objectives"):
        history = saved[name]
        if not isinstance(history, np.ndarray) or history.ndim == 0 or len(history) != iteration + 1:
            raise ValueError(f"{name} is not a history of {iteration + 1} entries (iteration {iteration})")
    if not isinstance(saved["n_passes"], int) or not isinstance(saved["converged"], (bool, np.bool_)):
        raise ValueError("n_passes or converged is not of its kind")
