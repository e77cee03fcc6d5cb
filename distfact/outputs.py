"""Output directories written all or nothing, and never over someone else's files (DESIGN §7).

``distfact fit -o DIR``, ``distfact report -o DIR`` and a pipeline's dated runs write into a staging directory
beside the destination, ``.<name>.partial``, and swap it into place only when everything is written, with the
manifest ``distfact-output.json`` (the files written, and when) last. So a kill, an error or a full disk leaves the
previous complete output, or nothing, at the destination.

- **What may be replaced** (:func:`check_destination`, before any work): nothing, an empty directory, or an
  earlier distfact output of the same kind holding only what its manifest lists (no other file, directory or
  symbolic link), and that only when asked (``overwrite``). Not a symbolic link, a mount point or the current
  directory (a swap cannot replace those).
- **The swap** (:func:`swap_into_place`): one ``renameat2(RENAME_EXCHANGE)`` (Linux: a reader sees the old
  directory or the new one); where the file system lacks it, the old output is renamed to ``.<name>.old`` and the
  new one into place. The old output is then removed.
- **A killed process** (:func:`settle`, run first, under the lock ``.<name>.lock``): a staging directory with a
  manifest and no ``distfact-partial.json`` is a complete output whose swap did not finish; the newer of it and the
  destination stays. An ``.<name>.old`` goes back into place if the destination is missing, else it is removed.
  A staging directory with ``distfact-partial.json`` is an interrupted attempt: resumed (a fit's checkpoints) or
  discarded.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import logging
import os
import shutil
import time
import uuid

import numpy as np

from ._version import __version__

logger = logging.getLogger("distfact")

MANIFEST = "distfact-output.json"
MANIFEST_FORMAT = "distfact.output"
PARTIAL_MARKER = "distfact-partial.json"  # written first into a staging directory: an attempt in progress


class Locked(RuntimeError):
    """Another process holds the lock (a run of the same pipeline and date, a fit into the same directory)."""


@contextlib.contextmanager
def locked(path: str, what: str):
    """An exclusive lock on the file ``path`` for as long as the block runs (created for it and removed after, so
    nothing is left behind; released when the process ends, however it ends). ``what`` names the work in the
    :class:`Locked` error a second process gets."""
    import fcntl

    while True:
        handle = open(path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise Locked(f"{what} is in progress in another process (pid {holder}); not starting a second") from None
        try:
            if os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino:
                break  # else the holder removed the file as we locked it: lock the one now at ``path``
        except FileNotFoundError:
            pass
        handle.close()
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        yield
    finally:
        with contextlib.suppress(OSError):
            os.remove(path)  # while still holding it: a process that opened it meanwhile retries (above)
        handle.close()


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def write_json(path, doc, indent: int | None = 2) -> None:
    """``doc`` as strict JSON (numpy values converted; NaN and infinities refused rather than written as the
    invalid tokens ``NaN``/``Infinity``), written aside and renamed into place."""
    path = os.fspath(path)
    try:
        text = json.dumps(doc, indent=indent, allow_nan=False, default=_json_default)
    except ValueError as exc:
        raise ValueError(f"{path}: not written: {exc} (a result holds NaN or an infinity)") from None
    write_text(path, text + "\n")


def file_sha256(path) -> str:
    """The SHA-256 of the file ``path`` (hex), read in chunks."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def read_text(path) -> str | None:
    """The content of the small text file ``path`` (``LATEST``, a hash), stripped, or None when there is none."""
    try:
        with open(path) as f:
            return f.read().strip()
    except FileNotFoundError:
        return None


def write_text(path, text: str) -> None:
    """``text`` written aside and renamed into place (a reader never sees a partly written file)."""
    path = os.fspath(path)
    aside = f"{path}.partial-{uuid.uuid4().hex[:8]}"
    try:
        with open(aside, "w") as f:
            f.write(text)
        os.replace(aside, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(aside)
        raise


def sibling(dest: str, suffix: str) -> str:
    """``.<name>.<suffix>`` beside ``dest``: its staging directory, lock, or replaced output."""
    parent, name = os.path.split(dest)
    return os.path.join(parent, f".{name}.{suffix}")


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: str, b: str) -> bool:
    """Swap the directories ``a`` and ``b`` in one atomic step (``renameat2(RENAME_EXCHANGE)``); False where the
    system or file system has no such call (nothing was done)."""
    try:
        swap = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    if swap(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM):  # EPERM: some seccomp profiles
        return False
    raise OSError(code, f"cannot swap {a!r} and {b!r}: {os.strerror(code)}")


def swap_into_place(staging: str, dest: str) -> None:
    """Put the complete directory ``staging`` at ``dest``, removing the earlier ``dest`` (see the module doc)."""
    if not os.path.lexists(dest):
        os.rename(staging, dest)
        return
    old = sibling(dest, "old")
    if _exchange(staging, dest):
        os.rename(staging, old)  # the earlier output, under a name settle() recognises
    else:
        os.rename(dest, old)
        os.rename(staging, dest)
    shutil.rmtree(old)


def _written(directory: str) -> int:
    manifest = read_manifest(directory)
    return int(manifest.get("written_ns", 0)) if manifest else 0


def settle(dest: str, kind: str) -> None:
    """Finish or undo what a killed process left of a swap into ``dest`` (see the module doc). Run under the
    lock, before anything else looks at ``dest``."""
    staging, old = sibling(dest, "partial"), sibling(dest, "old")
    complete = (read_manifest(staging, kind) is not None
                and not os.path.exists(os.path.join(staging, PARTIAL_MARKER)))
    if os.path.lexists(dest) and read_manifest(dest, kind) is None:
        return  # not an output of ours: nothing is replaced (check_destination says why)
    if complete and (not os.path.lexists(dest) or _written(staging) > _written(dest)):
        logger.warning("completing the interrupted replacement of %s by %s", dest, staging)
        swap_into_place(staging, dest)
    elif complete:
        shutil.rmtree(staging)  # the earlier output, swapped out before it could be removed
    if os.path.isdir(old) and read_manifest(old, kind) is not None:
        if os.path.lexists(dest):
            shutil.rmtree(old)
        else:
            logger.warning("restoring %s, which an interrupted replacement left at %s", dest, old)
            os.rename(old, dest)


def _entries(directory: str) -> tuple[list[str], list[str]]:
    """(every file, every directory) below ``directory``, relative and sorted; symbolic links count as files."""
    files, dirs = [], []
    for top, subdirs, names in os.walk(directory):
        links = [d for d in subdirs if os.path.islink(os.path.join(top, d))]
        subdirs[:] = sorted(d for d in subdirs if d not in links)
        dirs += [os.path.relpath(os.path.join(top, d), directory) for d in subdirs]
        files += [os.path.relpath(os.path.join(top, n), directory) for n in names + links]
    return sorted(files), sorted(dirs)


def _ancestors(name: str):
    """The directories of a relative path: ``a/b/c`` -> ``a/b``, ``a``."""
    while name := os.path.dirname(name):
        yield name


def read_manifest(directory: str, kind: str | None = None) -> dict | None:
    """The manifest of a distfact output in ``directory`` (of ``kind`` if given), or None."""
    try:
        with open(os.path.join(directory, MANIFEST)) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT or not isinstance(doc.get("files"), list):
        return None
    return doc if kind is None or doc.get("kind") == kind else None


def check_destination(dest: str, kind: str, overwrite: bool, option: str = "--output") -> None:
    """Refuse ``dest`` unless it is absent, an empty directory, or (with ``overwrite``) an earlier distfact output
    of ``kind`` holding only what its manifest lists. Raises ``ValueError`` naming the problem."""
    if os.path.islink(dest):
        raise ValueError(f"{option} {dest!r} is a symbolic link; give the directory it points to, or another")
    if not os.path.lexists(dest):
        return
    if not os.path.isdir(dest):
        raise ValueError(f"{option} {dest!r} exists and is not a directory; choose another {option}")
    if os.path.ismount(dest):
        raise ValueError(f"{option} {dest!r} is a mount point, which cannot be replaced as a whole; give a "
                         "directory inside it")
    cwd = os.getcwd()
    if cwd == dest or cwd.startswith(dest + os.sep):
        raise ValueError(f"{option} {dest!r} is (or holds) the current directory, which a replacement would leave "
                         "you in after it is gone; give another directory")
    files, dirs = _entries(dest)
    if not files and not dirs:
        return
    manifest = read_manifest(dest, kind)
    if manifest is None:
        raise ValueError(f"{option} {dest!r} is not empty and is not an earlier distfact {kind} output (it has no "
                         f"{MANIFEST}); distfact does not write over files it did not write: choose another {option}")
    listed = set(manifest["files"]) | {MANIFEST}
    holding = {parent for name in listed for parent in _ancestors(name)}  # the directories its files are in
    foreign = sorted(set(files) - listed) + sorted(d + os.sep for d in dirs if d not in holding)
    if foreign:
        more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
        raise ValueError(f"{option} {dest!r} holds {foreign[0]!r}{more}, which the earlier {kind} output did not "
                         f"write; distfact does not delete files it did not write: move it, or choose another "
                         f"{option}")
    if not overwrite:
        raise ValueError(f"{option} {dest!r} holds an earlier {kind} output; pass --overwrite (overwrite=True) to "
                         f"replace it")


class OutputDir:
    """Write a ``kind`` of output (``"fit"``, ``"report"``, ``"pipeline run"``) to ``dest``, all or nothing.

    ``with OutputDir(dest, kind, overwrite=...) as out:`` locks the destination, settles what a killed process
    left, checks the destination and that its directory is writable (before any work), and gives ``out.path``,
    the staging directory to write into; ``out.commit()`` (at the end of the block) writes the manifest and swaps
    the staging directory into place, replacing an earlier output.

    If the block raises, the staging directory is removed, except its ``keep`` subdirectories (a fit's
    checkpoints, for ``resume``). ``resume=True`` keeps what an interrupted attempt left in ``keep`` (the rest is
    discarded); ``keep_all=True`` keeps all of it (a pipeline reuses the stages it committed). ``scratch``
    subdirectories (e.g. ``checkpoints``) are removed before the swap. ``lock=False``: the caller holds the lock
    (``locked(sibling(dest, "lock"), ...)``) and has settled.
    """

    def __init__(self, dest, kind: str, *, overwrite: bool = False, resume: bool = False, keep_all: bool = False,
                 option: str = "--output", keep: tuple = (), scratch: tuple = (), lock: bool = True):
        self.dest = os.path.abspath(os.fspath(dest))
        self.kind, self.overwrite, self.option = kind, overwrite, option
        self.resume, self.keep_all, self.lock = resume, keep_all, lock
        self.keep, self.scratch = tuple(keep), tuple(scratch)
        self.path = sibling(self.dest, "partial")
        self._stack = contextlib.ExitStack()
        self.committed = False

    def __enter__(self) -> "OutputDir":
        parent = os.path.dirname(self.dest)
        try:
            os.makedirs(parent, exist_ok=True)
            if self.lock:
                self._stack.enter_context(locked(sibling(self.dest, "lock"), f"writing {self.dest}"))
        except OSError as exc:  # the first write: a read-only or full disk says so here
            raise ValueError(f"{self.option} {self.dest!r} cannot be written ({exc.strerror} in {parent!r})") from None
        try:
            if self.lock:
                settle(self.dest, self.kind)
            check_destination(self.dest, self.kind, self.overwrite, self.option)
            self._prepare()
        except BaseException:
            self._stack.close()
            raise
        return self

    def _prepare(self) -> None:
        """Make the staging directory this attempt's: keep what a resumed attempt continues from."""
        if os.path.lexists(self.path):
            if not os.path.isfile(os.path.join(self.path, PARTIAL_MARKER)):
                raise ValueError(f"{self.path!r} exists and was not made by distfact; move it away")
            kept = os.listdir(self.path) if self.keep_all else (PARTIAL_MARKER, *self.keep) if self.resume else ()
            discarded = [name for name in os.listdir(self.path) if name not in kept and name != PARTIAL_MARKER]
            if discarded:
                logger.warning("discarding %s of %s, left by an interrupted run%s", ", ".join(sorted(discarded)),
                               self.path, "" if self.resume or not self.keep else " (--resume continues it)")
            for name in discarded:
                _remove(os.path.join(self.path, name))
        os.makedirs(self.path, exist_ok=True)
        write_json(os.path.join(self.path, PARTIAL_MARKER), {"kind": self.kind, "dest": self.dest,
                                                             "pid": os.getpid()})

    def commit(self) -> None:
        """Write the manifest and swap the staging directory into place. If the destination has changed meanwhile
        or cannot be replaced, the complete output stays in the staging directory, and the error names it."""
        for name in self.scratch:
            shutil.rmtree(os.path.join(self.path, name), ignore_errors=True)
        files, _ = _entries(self.path)
        write_json(os.path.join(self.path, MANIFEST), {
            "format": MANIFEST_FORMAT, "version": 1, "kind": self.kind, "distfact": __version__,
            "written_ns": time.time_ns(), "files": [name for name in files if name != PARTIAL_MARKER]})
        try:
            check_destination(self.dest, self.kind, self.overwrite, self.option)  # another process may have written
            os.remove(os.path.join(self.path, PARTIAL_MARKER))  # complete: settle() would now finish the swap
            swap_into_place(self.path, self.dest)
        except (OSError, ValueError) as exc:
            self.committed = True  # keep it: the work is done
            raise ValueError(f"the {self.kind} output is complete in {self.path!r} but was not put at {self.dest!r}: "
                             f"{exc}") from None
        self.committed = True

    def __exit__(self, exc_type, exc, tb):
        try:
            if not self.committed and os.path.isdir(self.path):
                kept = [n for n in self.keep if os.path.isdir(os.path.join(self.path, n))]
                if self.keep_all or kept:  # what a resumed run continues from stays; the rest of the attempt goes
                    for name in os.listdir(self.path):
                        if not self.keep_all and name not in (*kept, PARTIAL_MARKER):
                            _remove(os.path.join(self.path, name))
                else:
                    shutil.rmtree(self.path, ignore_errors=True)
        finally:
            self._stack.close()
        return False


def remove_output(directory: str) -> None:
    """Remove the output ``directory``, its manifest last, so that a removal killed midway leaves a directory
    still recognisable as an output of ours (:func:`read_manifest`), or an empty one."""
    for name in os.listdir(directory):
        if name != MANIFEST:
            _remove(os.path.join(directory, name))
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(directory, MANIFEST))
    os.rmdir(directory)


def _remove(path: str) -> None:
    shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
