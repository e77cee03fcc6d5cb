"""Shared by the fault tests: run the CLI as a user does, fingerprint directories, small and read-only disks."""

import contextlib
import hashlib
import os
import subprocess
import sys

import pytest


def cli(*args, cwd, timeout=300, env=None):
    """``distfact ARGS`` in a fresh process, as a user runs it: for the tests whose subject is the process (a kill,
    its log lines at ``-v``, its environment)."""
    return subprocess.run([sys.executable, "-m", "distfact.cli", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=env)


def snapshot(directory) -> dict:
    """Every file below ``directory`` with the SHA-256 of its bytes, and every directory: what "nothing on disk
    changed" compares."""
    found = {}
    for top, dirs, names in os.walk(directory):
        for name in dirs:
            found[os.path.relpath(os.path.join(top, name), directory) + "/"] = "dir"
        for name in names:
            path = os.path.join(top, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
    return found


def assert_refused(result, *words, status=2):
    """A failure as the CLI promises it: the exit status, a one-line message naming the problem, no traceback."""
    assert result.returncode == status, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    message = [line for line in result.stderr.splitlines() if line.startswith("distfact ")]
    assert len(message) == 1, result.stderr
    for word in words:
        assert word in message[0], (word, result.stderr)


@contextlib.contextmanager
def small_disk(path, size: str, read_only: bool = False):
    """A real file system of ``size`` (a tmpfs) mounted at ``path``, read-only if asked: a full or read-only disk
    for the writes under test. Needs the right to mount (root, as on the project's machines)."""
    os.makedirs(path, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}): the full-disk test needs root")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)
