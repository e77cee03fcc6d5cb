"""What every executor shares: the tasks a pass runs on each block (wherever it runs), the bookkeeping of
passes and spilled local factors, and :class:`WorkerLost`."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from ...kernels.memory import aligned, numpy_allocates_aligned
from ..finite import check_block
from ..reduce import add, keyed, split_by_group, tree_reduce
from .spill import LocalSpill, PassOutput, load_local, materialise, save_local


class WorkerLost(RuntimeError):
    """A worker process died holding results the fit needs (blocks of X read there, local factors,
    the broadcast global state): the fit cannot continue from its futures and must roll back.
    ``n_workers``: how many workers the fit had, for the rerun to wait for (a nanny restarts a lost worker)."""

    def __init__(self, message: str, n_workers: int = 0):
        super().__init__(message)
        self.n_workers = n_workers


@numpy_allocates_aligned()  # what the block's step makes needs no aligned copy (kernels/memory.py)
def run_block(fn, reader, block, X_b, local, args, update, spill=None, generation=0, inputs_aligned=False):
    """What one task does: load X_b (and a spilled local factor) if needed, run ``fn``,
    spill the new local factor if asked, key the statistics by group.

    ``inputs_aligned``: the given X_b and ``args`` are aligned already (the in-process executor aligns its
    blocks once and the arguments once per pass, not once per block and pass)."""
    if X_b is None:
        X_b = reader(block)
        X_b = X_b if sp.issparse(X_b) else aligned(X_b)
    elif not inputs_aligned:
        X_b = X_b if sp.issparse(X_b) else aligned(X_b)
        args = aligned(args)
    out = fn(X_b, aligned(materialise(local)), block, *args)
    if update:
        new_local, stats = out
        check_block(block, new_local, stats)
        if spill is not None:
            new_local = spill.store(block, new_local, generation)
        return PassOutput(new_local, keyed(block.group, stats))
    check_block(block, stats=out)
    return keyed(block.group, out)


@numpy_allocates_aligned()
def run_column_block(fn, reader, column_block, Xc, locals_, args):
    """What one column task does: load the CSC column block if needed, put the local factors of all
    row blocks together (the whole W, stored row order), run ``fn``; returns (piece, statistics)."""
    if Xc is None:
        Xc = reader(column_block)
    W = stacked_rows([materialise(local) for local in locals_])
    piece, stats = fn(Xc, aligned(W), column_block, *aligned(args))
    check_block(column_block, piece, stats, "its part of the global factor")
    return piece, stats


def stacked_rows(parts: list):
    """Row blocks' local states (stored row order) as one: arrays concatenated; local states of named parts (dicts:
    several models' side by side, ``engine/many.py``) part by part."""
    if isinstance(parts[0], dict):
        return {name: stacked_rows([part[name] for part in parts]) for name in parts[0]}
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def map_local_one(fn, block, local, args, spill, generation):
    """``local <- fn(local, block, *args)`` where the local factor lives (no read of X)."""
    new_local = fn(aligned(materialise(local)), block, *aligned(args))
    return new_local if spill is None else spill.store(block, new_local, generation)


def map_one(fn, reader, block, X_b, local, args):
    X_b = reader(block) if X_b is None else X_b
    return fn(X_b if sp.issparse(X_b) else aligned(X_b), aligned(materialise(local)), block, *aligned(args))


@dataclass(frozen=True)
class ReadInput:
    """A block's own input (``init_local``'s ``per_block``) that the block's task reads where the block lives,
    ``read(block)`` (a dict: a store's per-block mask), joined with ``parts`` (e.g. the block's W of a given
    start): so the driver never holds it, as it never holds X."""

    read: Callable
    parts: dict = field(default_factory=dict)

    def joined(self, **parts) -> "ReadInput":
        return ReadInput(self.read, {**self.parts, **parts})


def joined_input(own, **parts):
    """A block's own input (a dict, or a :class:`ReadInput`) with ``parts`` added."""
    return own.joined(**parts) if isinstance(own, ReadInput) else {**own, **parts}


def read_inputs(own, block, done: dict):
    """``own`` with every :class:`ReadInput` in it (itself, or in a tuple: several models' inputs, ``engine/many.py``)
    read for ``block``; one read per reader (``done``: reader -> what it read), which the models then share."""
    if isinstance(own, tuple):
        return tuple(read_inputs(item, block, done) for item in own)
    if not isinstance(own, ReadInput):
        return own
    if own.read not in done:
        done[own.read] = own.read(block)
    return {**done[own.read], **own.parts}


def init_one(fn, block, args, spill, *own):
    """A block's first local factor: ``fn(block, *args)``, or ``fn(block, *args, own)`` with the
    block's own input (``init_local``'s ``per_block``; a :class:`ReadInput` is read here)."""
    local = fn(block, *aligned(args), *aligned(read_inputs(own, block, {})))
    return local if spill is None else spill.store(block, local, 0)


def restore_one(directory, block, spill, expected=None):
    """A block's local factor from a checkpoint, checked against its manifest ``expected``, where it will live."""
    try:
        local = load_local(directory, block, expected)
    except Exception as exc:  # whatever a damaged file makes Zarr or a codec raise: the checkpoint is unusable
        detail = str(exc) if type(exc) is ValueError else f"{type(exc).__name__}: {exc}"
        raise ValueError(f"block {block.index}'s local factor: {detail}") from None
    return local if spill is None else spill.store(block, local, 0)


def checkpoint_one(directory, block, local) -> dict:
    """Write a block's local factor into a checkpoint (where it lives); returns its manifest."""
    return save_local(directory, block, materialise(local))


class Executor:
    """Common bookkeeping: the pass counter and the spill directory of local factors.

    An executor holds what a fit needs until :meth:`close` (threads, BLAS held at one thread, spilled local factors,
    a cluster's futures): use it as a context manager, ``with InProcessExecutor(data) as executor: ...``, or call
    ``close()`` in a ``finally``. Closing twice does nothing more."""

    def __init__(self, data, spill_dir: str | None = None):
        self.data = data
        self.blocks = data.blocks
        self.n_passes = 0
        self.spill = None if spill_dir is None else LocalSpill(os.path.abspath(os.fspath(spill_dir)))
        self.generation = 0

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _count_pass(self):
        self.n_passes += 1

    def _column_results(self, results: list) -> tuple[list, list[dict]]:
        """Pieces in column order, and the statistics summed over column blocks in a fixed order."""
        self._count_pass()
        total = tree_reduce([stats for _, stats in results], add)
        return [piece for piece, _ in results], aligned(split_by_group(total, self.data.n_groups))

    def _manifests(self, expected: list | None) -> list:
        """Per block, the manifest its restored local factor must match (None: unchecked)."""
        if expected is None:
            return [None] * len(self.blocks)
        if len(expected) != len(self.blocks):
            raise ValueError(f"local factors of {len(expected)} blocks recorded, the data have {len(self.blocks)}")
        return list(expected)

    def _remove_spill(self):
        if self.spill is not None:
            shutil.rmtree(self.spill.directory, ignore_errors=True)

    def describe(self) -> dict:
        raise NotImplementedError
