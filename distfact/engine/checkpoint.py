"""Checkpoints: ``run_dir/checkpoints/iter-NNNNNN/``, written aside and committed by a marker written last.

A checkpoint holds

- ``state.npz``: the driver's state (global state, last reduced statistics, loss history, iteration, passes)
  as an array tree (``arraytree.py``: arrays plus JSON, read back without unpickling anything);
- ``local/``: the local factors, one Zarr node per block, each written by the process that holds it
  (``executor.save_local``);
- ``config.json``: the configuration (method parameters, data fingerprint, chunking, seed) and its hash;
- ``COMMITTED``, written last: JSON with the format and its version, the iteration, the configuration hash,
  the SHA-256 of ``state.npz`` and ``config.json``, for every block the shape, dtype and CRC32C of each array
  of its local factor (computed where it was written), and the SHA-256 of all of that (``seal``), so that an
  edited marker is recognised too.

It is written into ``iter-NNNNNN.partial-<hex>/`` and renamed into place after ``COMMITTED``: a directory
named ``iter-NNNNNN`` is complete. :meth:`Checkpointer.restore` tries the committed checkpoints newest first,
checking each file against the marker before it is used (and the local factors where they are loaded); a
damaged one is named in a warning and the previous one is tried. The digests catch damage (a lost chunk,
a truncated or edited file); a checkpoint's files are never unpickled, so whoever can write the run
directory can change a result but cannot run code in the process that resumes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import numbers
import os
import re
import shutil
import time
import uuid
import warnings

from .._warnings import user_stacklevel
from ..outputs import file_sha256
from .arraytree import TreeFile, save as save_tree

logger = logging.getLogger("distfact")

MARKER = "COMMITTED"
STATE = "state.npz"
CONFIG = "config.json"
LOCAL = "local"
FORMAT = "distfact.checkpoint"
VERSION = 1
COMMITTED_NAME = re.compile(r"iter-\d{6}")
PARTIAL_NAME = re.compile(r"iter-\d{6}\.partial-[0-9a-f]{8}")
#: ``checkpoint_every="auto"``: a checkpoint every ``AUTO_EVERY`` iterations, skipped while the checkpoints written
#: so far took more than ``TIME_SHARE`` of the fit's time
AUTO, AUTO_EVERY, TIME_SHARE = "auto", 10, 0.1


class DamagedCheckpoint(ValueError):
    """What is wrong with one committed checkpoint (a resume then tries the previous one)."""


class DamagedCheckpointWarning(UserWarning):
    """A committed checkpoint was found damaged and skipped by a resume."""


def config_hash(config: dict) -> str:
    """A stable hash of what determines a run's iterates (method parameters, data, chunking, seed)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def seal(record: dict) -> str:
    """The SHA-256 of a marker's content (everything but its ``seal``)."""
    content = {key: value for key, value in record.items() if key != "seal"}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


class Checkpointer:
    """Saves a fit's state under ``run_dir/checkpoints`` (the ``keep`` newest are kept) and restores the newest
    intact one.

    ``every``: an int, a checkpoint every ``every`` iterations; ``"auto"``, one every ``AUTO_EVERY`` iterations
    unless the checkpoints written so far took more than ``TIME_SHARE`` of the time since the loop began
    (:meth:`begin`). A fit of cheap iterations would otherwise spend most of its time writing checkpoints: a
    400 x 100 NMF fit of 200 iterations took 13 times as long with one every 10 iterations (BENCHMARKS.md,
    "Checkpoints by their share of a fit's time"). With ``"auto"`` the first checkpoint due is always written, as
    is the state of a loop that converges, reaches ``max_iter`` or stops at a time limit (``driver.fit``), and a
    killed fit loses at most ``AUTO_EVERY`` iterations or about ``1 / TIME_SHARE`` times a checkpoint's own cost,
    whichever is longer."""

    def __init__(self, run_dir, every: int | str, config: dict, keep: int = 2):
        if isinstance(every, str) and every == AUTO:
            every, self.time_share = AUTO_EVERY, TIME_SHARE
        elif isinstance(every, numbers.Integral) and not isinstance(every, bool) and every >= 1:
            self.time_share = math.inf
        else:
            raise ValueError(f"checkpoint_every must be an int >= 1 or {AUTO!r}, got {every!r}")
        self.root = os.path.join(os.path.abspath(os.fspath(run_dir)), "checkpoints")
        self.every = int(every)
        self.config = config
        self.hash = config_hash(config)
        self.keep = keep
        self.begin()

    def begin(self) -> None:
        """Start the clock of ``"auto"``'s share: at the loop's start (a phase's start phase, whose own loop runs
        before it, is not counted)."""
        self._started = time.perf_counter()
        self._saving_seconds = 0.0

    def due(self, iteration: int) -> bool:
        if iteration % self.every:
            return False
        return self.time_share == math.inf or \
            self._saving_seconds <= self.time_share * (time.perf_counter() - self._started)

    def save(self, iteration: int, state: dict, executor) -> str:
        """Write ``state`` (an array tree) and the executor's local factors as iteration ``iteration``'s
        checkpoint; returns its directory."""
        started = time.perf_counter()
        final = os.path.join(self.root, f"iter-{iteration:06d}")
        for name in self._names(PARTIAL_NAME):  # left by a save that was killed
            shutil.rmtree(os.path.join(self.root, name), ignore_errors=True)
        partial = f"{final}.partial-{uuid.uuid4().hex[:8]}"
        os.makedirs(partial)
        local = executor.save_local(os.path.join(partial, LOCAL))
        with open(os.path.join(partial, CONFIG), "w") as f:
            json.dump({"hash": self.hash, "config": self.config}, f, indent=1, default=str)
        record = {"format": FORMAT, "version": VERSION, "iteration": iteration, "config_hash": self.hash,
                  "files": {STATE: save_tree(os.path.join(partial, STATE), {"iteration": iteration, **state}),
                            CONFIG: file_sha256(os.path.join(partial, CONFIG))},
                  "local": local}
        with open(os.path.join(partial, MARKER), "w") as f:
            json.dump({**record, "seal": seal(record)}, f)
        if os.path.isdir(final):  # this iteration saved before, by an attempt that a resume skipped as damaged
            shutil.rmtree(final)
        os.rename(partial, final)
        for old in self.committed()[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        self._saving_seconds += time.perf_counter() - started
        return final

    def check_fresh_start(self) -> None:
        """A run that does not resume must not mix its checkpoints with an earlier run's."""
        if self.committed():
            raise ValueError(f"{self.root!r} already holds checkpoints of an earlier run: pass resume=True "
                             "(--resume) to continue it, or use another directory")

    def _names(self, pattern) -> list[str]:
        return sorted(n for n in os.listdir(self.root) if pattern.fullmatch(n)) if os.path.isdir(self.root) else []

    def committed(self) -> list[str]:
        """The committed checkpoints, oldest first."""
        return [os.path.join(self.root, n) for n in self._names(COMMITTED_NAME)
                if os.path.exists(os.path.join(self.root, n, MARKER))]

    def restore(self, executor, check=None):
        """``(state, path)`` of the newest intact committed checkpoint, its local factors restored into
        ``executor``; None if there is no committed checkpoint.

        ``check(state)`` raises ValueError for a state this fit cannot continue (e.g. arrays of other shapes).
        A damaged checkpoint is skipped with a :class:`DamagedCheckpointWarning` (and a log line) naming it
        and what is wrong; if all are damaged, ValueError names each. A checkpoint of another configuration
        is refused rather than silently continued."""
        found = self.committed()
        if found and all(_legacy(path) for path in found):
            raise ValueError(f"{self.root!r} holds only checkpoints in the pickle-based format of earlier distfact "
                             "versions (state.pkl), which is no longer read (a pickle runs code when it is loaded); "
                             "they cannot be resumed: start afresh in another directory")
        damaged = []
        for path in reversed(found):
            try:
                return self._read(path, executor, check), path
            except DamagedCheckpoint as exc:
                damaged.append(f"{path}: {exc}")
                message = f"checkpoint {path} is damaged and not resumed from: {exc}"
                logger.warning(message)
                warnings.warn(message, DamagedCheckpointWarning, stacklevel=user_stacklevel())
        if damaged:
            raise ValueError(f"every committed checkpoint in {self.root!r} is damaged; not resuming:\n  "
                             + "\n  ".join(damaged))
        return None

    def _read(self, path: str, executor, check) -> dict:
        record = _read_marker(path)
        if record["config_hash"] != self.hash:
            raise ValueError(f"checkpoint {path!r} was written by a run with another configuration "
                             f"(hash {record['config_hash']}, this run {self.hash}); use a new run directory")
        try:
            if file_sha256(os.path.join(path, CONFIG)) != record["files"][CONFIG]:
                raise DamagedCheckpoint(f"{CONFIG} is not the file that was written")
            state = TreeFile(os.path.join(path, STATE), record["files"][STATE]).read()
            if not (isinstance(state, dict) and type(state.get("iteration")) is int
                    and state["iteration"] == record["iteration"]):
                raise DamagedCheckpoint(f"{STATE} is not iteration {record['iteration']}'s state")
            if check is not None:
                check(state)
            executor.load_local(os.path.join(path, LOCAL), record["local"])
        except DamagedCheckpoint:
            raise
        except (OSError, ValueError) as exc:  # a missing file, a TreeError, check's verdict, a block's local factor
            raise DamagedCheckpoint(str(exc).replace(path + os.sep, "")) from None  # files named within the checkpoint
        return state


def _legacy(path: str) -> bool:
    """A checkpoint of the pickle-based format (before ``state.npz``)."""
    return os.path.exists(os.path.join(path, "state.pkl")) and not os.path.exists(os.path.join(path, STATE))


def _read_marker(path: str) -> dict:
    """A checkpoint's ``COMMITTED``, checked: its format, version, fields and seal."""
    name = os.path.join(path, MARKER)
    if _legacy(path):
        raise DamagedCheckpoint("it is in the pickle-based format of earlier distfact versions (state.pkl), which "
                                "is no longer read")
    try:
        with open(name) as f:
            record = json.load(f)
    except (OSError, ValueError) as exc:
        raise DamagedCheckpoint(f"{MARKER} is not readable JSON ({exc})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise DamagedCheckpoint(f"{MARKER} is not a distfact checkpoint marker")
    if not isinstance(record.get("version"), int) or record["version"] > VERSION:
        raise DamagedCheckpoint(f"{MARKER} has format version {record.get('version')!r}; this distfact reads "
                                f"versions up to {VERSION}")
    if record.get("seal") != seal(record):
        raise DamagedCheckpoint(f"{MARKER} was changed after it was written (its seal does not match its content)")
    if record.get("iteration") != int(os.path.basename(path).removeprefix("iter-")):
        raise DamagedCheckpoint(f"{MARKER} records iteration {record.get('iteration')!r}, not its directory's")
    files = record.get("files")
    if (not isinstance(files, dict) or not all(isinstance(files.get(name), str) for name in (STATE, CONFIG))
            or not isinstance(record.get("local"), list) or not isinstance(record.get("config_hash"), str)):
        raise DamagedCheckpoint(f"{MARKER} lacks the digests of the checkpoint's files")
    return record
