"""The append that tests/faults/test_appends.py kills, in a child of the tests' forkserver
(``conftest.forkserver_child``), which imported this module once: each of the test's 21 appends starts in
milliseconds, not in a new interpreter's 2 s (numpy, pandas, zarr, numba and its cached kernel: what
``distfact.store.append`` loads at its first block). Importing this module opens no store and starts no thread."""

import numpy as np
import pandas  # noqa: F401  (the groups' check imports it at the first block)
import scipy.sparse as sp

from conftest import forkserver_child
from distfact.kernels.running_sums import add_rows
from distfact.store.append import append_arrays

add_rows(sp.csr_matrix(np.ones((1, 1))), np.zeros(1), np.zeros(2))  # numba's kernels loaded from their cache
add_rows(np.ones((1, 1)), np.zeros(1), np.zeros(2))


def append(store: str, x_path: str, groups_path: str, block_rows: int, connection, paced: bool) -> None:
    """``append_arrays`` of the rows saved at ``x_path`` and ``groups_path`` to ``store``; says "ready" on
    ``connection`` once the rows are read, each block's rows done as it is written (and, ``paced``, then waits
    for a go-ahead), and "done" at the end."""
    X, groups = sp.load_npz(x_path), np.load(groups_path)
    connection.send("ready")

    def each_block(done, total):
        connection.send(done)
        if paced:
            connection.recv()

    append_arrays(store, X, groups, block_rows=block_rows, progress=each_block)
    connection.send("done")


def start(store, x_path, groups_path, block_rows: int, paced: bool):
    """:func:`append` in a child process; returns the process and the test's end of the connection once the child
    is ready."""
    import multiprocessing

    ours, theirs = multiprocessing.Pipe()
    process = forkserver_child(append, str(store), str(x_path), str(groups_path), block_rows, theirs, paced)
    theirs.close()
    assert ours.recv() == "ready"
    return process, ours
