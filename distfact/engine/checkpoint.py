"""Checkpoints: ``run_dir/checkpoints/iter-NNNNNN/`` committed by a marker written last.

A checkpoint holds the driver state (global state, last reduced statistics,
loss history, iteration, seed entropy) in ``state.pkl``, the local factors as one
Zarr array per block under ``local/`` (written by whichever process holds them),
and the configuration hash in ``config.json``. ``COMMITTED`` is written last; a
directory without it is ignored (an interrupted save).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil

MARKER = "COMMITTED"


def config_hash(config: dict) -> str:
    """A stable hash of what determines a run's iterates (method parameters, data, chunking, seed)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Checkpointer:
    def __init__(self, run_dir, every: int, config: dict, keep: int = 2):
        if every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {every}")
        self.root = os.path.join(os.path.abspath(os.fspath(run_dir)), "checkpoints")
        self.every = every
        self.config = config
        self.hash = config_hash(config)
        self.keep = keep

    def due(self, iteration: int) -> bool:
        return iteration % self.every == 0

    def save(self, iteration: int, state: dict, executor) -> str:
        path = os.path.join(self.root, f"iter-{iteration:06d}")
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)
        executor.save_local(os.path.join(path, "local"))
        with open(os.path.join(path, "state.pkl"), "wb") as f:
            pickle.dump({"iteration": iteration, **state}, f, protocol=5)
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump({"hash": self.hash, "config": self.config}, f, indent=1, default=str)
        with open(os.path.join(path, MARKER), "w") as f:
            f.write(self.hash)
        for old in self.committed()[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return path

    def check_fresh_start(self) -> None:
        """A run that does not resume must not mix its checkpoints with an earlier run's."""
        if self.committed():
            raise ValueError(f"{self.root!r} already holds checkpoints of an earlier run: pass resume=True "
                             "(--resume) to continue it, or use another directory")

    def committed(self) -> list[str]:
        if not os.path.isdir(self.root):
            return []
        names = sorted(n for n in os.listdir(self.root) if n.startswith("iter-"))
        return [os.path.join(self.root, n) for n in names if os.path.exists(os.path.join(self.root, n, MARKER))]

    def latest(self):
        """``(state, path)`` of the newest committed checkpoint, or None. A checkpoint of
        another configuration is refused rather than silently continued."""
        found = self.committed()
        if not found:
            return None
        path = found[-1]
        with open(os.path.join(path, MARKER)) as f:
            stored = f.read().strip()
        if stored != self.hash:
            raise ValueError(
                f"checkpoint {path!r} was written by a run with another configuration "
                f"(hash {stored}, this run {self.hash}); use a new run directory"
            )
        with open(os.path.join(path, "state.pkl"), "rb") as f:
            return pickle.load(f), path
