"""Output directories written all or nothing, and never over someone else's files (DESIGN §7).

``distfact fit -o DIR`` and ``distfact report -o DIR`` (and the pipelines' dated runs) write into a staging
directory beside the destination, ``.<name>.partial``, and swap it into place only when everything is written,
with the manifest ``distfact-output.json`` (the files written) last. So a kill, an error or a full disk leaves
the previous complete output, or nothing, at the destination. A destination is written only when it does not
exist, is empty, or is an earlier distfact output of the same kind whose files are all listed in its manifest
(replaced only when asked: ``overwrite``); anything else is refused before any work, naming a file distfact did
not write.

The swap is one ``renameat2(RENAME_EXCHANGE)`` (Linux; atomic: a reader sees the old directory or the new one),
else two renames; if a process dies between those two, the next run puts the old output back first.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime as dt
import errno
import json
import logging
import os
import shutil
import uuid

import numpy as np

from . import __version__

logger = logging.getLogger("distfact")

MANIFEST = "distfact-output.json"
MANIFEST_FORMAT = "distfact.output"
PARTIAL_MARKER = "distfact-partial.json"  # written first into a staging directory: this directory is distfact's


class Locked(RuntimeError):
    """Another process holds the lock (a run of the same pipeline and date, a fit into the same directory)."""


@contextlib.contextmanager
def locked(path: str, what: str):
    """An exclusive lock on ``path`` (created if need be) for as long as the block runs; released when the process
    ends, however it ends. ``what`` names the work in the :class:`Locked` error a second process gets."""
    import fcntl

    handle = open(path, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise Locked(f"{what} is in progress in another process (pid {holder}); not starting a second") from None
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        yield
    finally:
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
    text = json.dumps(doc, indent=indent, allow_nan=False, default=_json_default)
    path = os.fspath(path)
    aside = f"{path}.partial-{uuid.uuid4().hex[:8]}"
    try:
        with open(aside, "w") as f:
            f.write(text + "\n")
        os.replace(aside, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(aside)
        raise


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def exchange(a: str, b: str) -> None:
    """Swap the directories ``a`` and ``b`` in one atomic step (``renameat2(RENAME_EXCHANGE)``); where the system
    or file system has no such call, by ``b -> b.old-<hex>``, ``a -> b``, ``b.old -> a`` (see :func:`recover`)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        swap = libc.renameat2
    except (OSError, AttributeError):
        swap = None
    if swap is not None:
        if swap(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
            return
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise OSError(code, f"cannot swap {a!r} and {b!r}: {os.strerror(code)}")
    parent, name = os.path.split(b)
    old = os.path.join(parent, f".{name}.old-{uuid.uuid4().hex[:8]}")
    os.rename(b, old)
    os.rename(a, b)
    os.rename(old, a)


def recover(dest: str) -> None:
    """Undo a swap interrupted between its two renames: ``dest`` missing and ``.<name>.old-<hex>`` present."""
    parent, name = os.path.split(dest)
    if os.path.exists(dest) or not os.path.isdir(parent):
        return
    olds = sorted(n for n in os.listdir(parent) if n.startswith(f".{name}.old-"))
    if olds:
        os.rename(os.path.join(parent, olds[-1]), dest)
        logger.warning("restored %s from %s (a replacement was interrupted)", dest, olds[-1])


def _files(directory: str) -> list[str]:
    """Every file below ``directory``, relative, sorted."""
    found = []
    for top, dirs, names in os.walk(directory):
        dirs.sort()
        found += [os.path.relpath(os.path.join(top, n), directory) for n in names]
    return sorted(found)


def read_manifest(directory: str, kind: str | None = None) -> dict | None:
    """The manifest of an earlier distfact output in ``directory`` (of ``kind`` if given), or None."""
    path = os.path.join(directory, MANIFEST)
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT or not isinstance(doc.get("files"), list):
        return None
    if kind is not None and doc.get("kind") != kind:
        return None
    return doc


def check_destination(dest: str, kind: str, overwrite: bool, option: str = "--output") -> None:
    """Refuse ``dest`` unless it is absent, an empty directory, or (with ``overwrite``) an earlier distfact output
    of ``kind`` holding only the files its manifest lists. Raises ``ValueError`` naming the problem."""
    recover(dest)
    if not os.path.lexists(dest):
        return
    if not os.path.isdir(dest) or os.path.islink(dest):
        raise ValueError(f"{option} {dest!r} exists and is not a directory; choose another {option}")
    present = _files(dest)
    if not present and not os.listdir(dest):
        return
    manifest = read_manifest(dest, kind)
    if manifest is None:
        raise ValueError(f"{option} {dest!r} is not empty and is not an earlier distfact {kind} output (it has no "
                         f"{MANIFEST}); distfact does not write over files it did not write: choose another {option}")
    foreign = sorted(set(present) - set(manifest["files"]) - {MANIFEST})
    if foreign:
        more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
        raise ValueError(f"{option} {dest!r} holds {foreign[0]!r}{more}, which the earlier {kind} output did not "
                         f"write; distfact does not delete files it did not write: move it, or choose another "
                         f"{option}")
    if not overwrite:
        raise ValueError(f"{option} {dest!r} holds an earlier {kind} output; pass --overwrite (overwrite=True) to "
                         f"replace it")


class OutputDir:
    """Write a ``kind`` of output (``"fit"``, ``"report"``) to ``dest``, all or nothing.

    ``with OutputDir(dest, kind, overwrite=...) as out:`` checks the destination and that its parent is writable
    (before any work), locks it, and gives ``out.path``, the staging directory to write into; ``out.commit()`` (at
    the end of the block) writes the manifest and swaps the staging directory into place, replacing an earlier
    output. If the block raises, the staging directory is removed, except its ``keep`` subdirectories (a fit's
    checkpoints, for ``resume``); ``resume=True`` keeps a staging directory left by an interrupted run for the new
    one (else it is discarded). Files listed in ``scratch`` (e.g. ``checkpoints``) are removed before the swap.
    """

    def __init__(self, dest, kind: str, *, overwrite: bool = False, resume: bool = False, option: str = "--output",
                 keep: tuple = (), scratch: tuple = ()):
        self.dest = os.path.abspath(os.fspath(dest))
        self.kind, self.overwrite, self.resume, self.option = kind, overwrite, resume, option
        self.keep, self.scratch = tuple(keep), tuple(scratch)
        parent, name = os.path.split(self.dest)
        self.path = os.path.join(parent, f".{name}.partial")
        self._lock_fd = None
        self.committed = False

    def __enter__(self) -> "OutputDir":
        check_destination(self.dest, self.kind, self.overwrite, self.option)
        parent = os.path.dirname(self.dest)
        try:
            os.makedirs(parent, exist_ok=True)
            os.makedirs(self.path, exist_ok=True)  # the first write: a read-only or full disk says so here
            self._lock_fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            raise ValueError(f"{self.option} {self.dest!r} cannot be written ({exc.strerror} in {parent!r})") from None
        try:
            self._lock_and_prepare()
        except BaseException:
            os.close(self._lock_fd)
            raise
        return self

    def _lock_and_prepare(self) -> None:
        """Lock the staging directory (its own inode: it becomes the destination), then make it this run's."""
        import fcntl

        marker = os.path.join(self.path, PARTIAL_MARKER)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Locked(f"another distfact process is writing {self.dest} ({self.path} is locked)") from None
        entries = os.listdir(self.path)
        if entries and PARTIAL_MARKER not in entries:
            raise ValueError(f"{self.path!r} exists and was not made by distfact; move it away")
        if entries and not self.resume:
            logger.warning("discarding %s, left by an interrupted run (resume=True / --resume continues it)",
                           self.path)
            self._clear(keep=())
        write_json(marker, {"kind": self.kind, "dest": self.dest, "pid": os.getpid()})

    def _clear(self, keep) -> None:
        """Remove what the staging directory holds but ``keep``."""
        for name in os.listdir(self.path):
            if name in keep:
                continue
            target = os.path.join(self.path, name)
            shutil.rmtree(target) if os.path.isdir(target) and not os.path.islink(target) else os.remove(target)

    def commit(self) -> None:
        """Write the manifest (last) and swap the staging directory into place."""
        for name in self.scratch:
            shutil.rmtree(os.path.join(self.path, name), ignore_errors=True)
        os.remove(os.path.join(self.path, PARTIAL_MARKER))
        files = _files(self.path)
        write_json(os.path.join(self.path, MANIFEST), {
            "format": MANIFEST_FORMAT, "version": 1, "kind": self.kind, "distfact": __version__,
            "written": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "files": files})
        check_destination(self.dest, self.kind, self.overwrite, self.option)  # again: another process may have written
        if os.path.exists(self.dest):
            exchange(self.path, self.dest)
            shutil.rmtree(self.path)  # the earlier output, which check_destination found to be all distfact's
        else:
            os.rename(self.path, self.dest)
        self.committed = True

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is not None and not self.committed and os.path.isdir(self.path):
                kept = [n for n in self.keep if os.path.isdir(os.path.join(self.path, n))]
                if kept:  # what a resumed run continues from stays; the rest of the attempt goes
                    self._clear(keep=(*kept, PARTIAL_MARKER))
                else:
                    shutil.rmtree(self.path, ignore_errors=True)
        finally:
            os.close(self._lock_fd)
        return False
