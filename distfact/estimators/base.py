"""Plumbing shared by the estimators: input coercion, executor, checkpoints, gathering rows."""

from __future__ import annotations

import numbers
import os
import shutil
import tempfile
import uuid

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin

from ..engine import Checkpointer, make_executor
from ..store.coerce import as_grouped


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


def check_iteration_params(max_iter, tol) -> None:
    if not isinstance(max_iter, numbers.Integral) or max_iter < 0:
        raise ValueError(f"max_iter must be a non-negative integer, got {max_iter!r}")
    if not isinstance(tol, numbers.Real) or tol < 0:
        raise ValueError(f"tol must be a non-negative number, got {tol!r}")


def check_factor(F, shape, name: str, dtype) -> np.ndarray:
    F = np.asarray(F)
    if F.shape != shape:
        raise ValueError(f"{name} has shape {F.shape}, expected {shape}")
    if not np.all(np.isfinite(F)) or (F < 0).any():
        raise ValueError(f"{name} must be finite and non-negative")
    return np.ascontiguousarray(F, dtype=dtype)


def given_block(block, W_blocks):
    """Local factor of a block from factors given per block (init='custom')."""
    return W_blocks[block.index]


def data_fingerprint(data) -> dict:
    """What identifies the data and its chunking for a checkpoint's configuration hash."""
    return {"shape": data.shape, "dtype": str(data.dtype), "layout": data.layout,
            "groups": [(g.name, g.row_start, g.row_stop, g.sq_norm, g.total) for g in data.meta.groups],
            "blocks": [(b.row_start, b.row_stop) for b in data.blocks]}


class FactorEstimator(TransformerMixin, BaseEstimator):
    """Base of distfact's estimators (fit on grouped data, run by the engine)."""

    def _grouped(self, X, groups):
        return as_grouped(X, groups, block_rows=getattr(self, "block_rows", None),
                          n_threads=getattr(self, "n_threads", None))

    def _executor(self, data, client, rank: int = 0, local_dtype=None):
        """The executor; local factors (rows x ``rank``, of ``local_dtype``, default X's) spill to
        Zarr beside X when they exceed ``local_memory_budget`` (default: a quarter of this machine's memory)."""
        budget = getattr(self, "local_memory_budget", None)
        if budget is None:
            import psutil

            budget = psutil.virtual_memory().total // 4
        spill_dir = None
        if data.shape[0] * rank * np.dtype(local_dtype or data.dtype).itemsize > budget:
            spill_dir = (f"{os.path.abspath(data.path)}.locals-{uuid.uuid4().hex[:8]}" if data.path
                         else tempfile.mkdtemp(prefix="distfact-locals-"))
        return make_executor(data, client, getattr(self, "n_threads", None), spill_dir)

    def _checkpointer(self, config: dict, phase: str | None = None):
        """Checkpoints in ``checkpoint_dir`` (or its ``phase`` subdirectory, for fits run as
        several loops), or None without a ``checkpoint_dir``."""
        if getattr(self, "checkpoint_dir", None) is None:
            return None
        run_dir = self.checkpoint_dir if phase is None else os.path.join(self.checkpoint_dir, phase)
        return Checkpointer(run_dir, self.checkpoint_every, config)

    @staticmethod
    def _save_local_factors(executor, directory) -> None:
        """Write W block by block (one Zarr array per block, by the process holding it) into
        ``directory``, replacing any blocks of an earlier fit."""
        directory = os.path.abspath(os.fspath(directory))
        shutil.rmtree(directory, ignore_errors=True)
        executor.save_local(directory)

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
