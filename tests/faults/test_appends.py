"""Appends killed at random points (issue 21): a real ``GroupedMatrix.append`` in a child process, SIGKILLed after a
random delay; the store must then open, verify (every block read against its CRC32C, the metadata against its
checksum) and be bitwise its previous version: every file the previous version's metadata references, and the
metadata. A kill that lands after the commit must leave the complete next version instead (and the previous
version's files untouched all the same). After the kills, an append completes and equals one never interrupted.

(Named test_appends.py: tests/test_append.py holds the appends' other tests, and test files must have distinct
names.)"""

import contextlib
import os
import shutil
import signal
import time

import numpy as np
import pytest
import scipy.sparse as sp

import distfact
import killable_append
from test_append import referenced_files

BLOCK_ROWS = 20
N_BLOCKS = 30  # appended: kills land anywhere among them, and in the commit


def start_append(store, tmp_path, paced: bool = False):
    """The append in a child process (a forkserver's: tests/faults/killable_append.py); ``paced``: it waits after
    each block for a go-ahead (so that a kill lands where the test chose, however loaded the machine), else it runs
    through. Returns the process and the test's end of its connection, once it has read its rows."""
    return killable_append.start(store, tmp_path / "X.npz", tmp_path / "groups.npy", BLOCK_ROWS, paced)


def said_to_the_end(connection) -> list:
    """Everything the child said until it closed its end (its exit)."""
    said = []
    with contextlib.suppress(EOFError):
        while True:
            said.append(connection.recv())
    return said


def read_everything(store) -> None:
    """Every block read, its chunks checked against their CRC32Cs (the metadata was checked on open)."""
    for j in range(store.n_blocks):
        store.load_block(j)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """The store before the append (a copy kept pristine), the rows to append (30 blocks of 20 rows), and the store
    after an uninterrupted append."""
    tmp_path = tmp_path_factory.mktemp("appends")
    rng = np.random.default_rng(0)
    X = sp.random(400, 60, density=0.2, random_state=rng, format="csr")
    distfact.from_arrays(X, rng.choice(["a", "b"], size=400), tmp_path / "pristine", block_rows=BLOCK_ROWS)
    sp.save_npz(tmp_path / "X.npz", sp.random(N_BLOCKS * BLOCK_ROWS, 60, density=0.2, random_state=rng, format="csr"))
    np.save(tmp_path / "groups.npy", np.repeat(["a", "b", "c"], N_BLOCKS * BLOCK_ROWS // 3))
    shutil.copytree(tmp_path / "pristine", tmp_path / "reference")
    process, connection = start_append(tmp_path / "reference", tmp_path)
    said = said_to_the_end(connection)
    process.join()
    assert process.exitcode == 0 and len(said) == N_BLOCKS + 1 and said[-1] == "done"
    return tmp_path, distfact.open(tmp_path / "reference")


outcomes_seen = []


@pytest.mark.parametrize("seed", range(5))
def test_an_append_killed_at_a_random_point_leaves_the_previous_version(stores, tmp_path, seed):
    source, reference = stores
    store = tmp_path / "s"
    shutil.copytree(source / "pristine", store)
    before = distfact.open(store)
    previous = referenced_files(before)
    rng = np.random.default_rng(seed)
    outcomes = []
    for _ in range(3):  # kills on the same store: what a killed append leaves must not trouble the next
        process, connection = start_append(store, source, paced=True)
        # after a random number of blocks written (each one a line, each let go on), and a random part of the next
        # block's time: anywhere in the staging or, after the last block (2 kills in 5), in the commit
        for _ in range(N_BLOCKS if rng.random() < 0.4 else rng.integers(0, N_BLOCKS)):
            connection.recv()
            connection.send("go on")
        time.sleep(rng.uniform(0, 0.1))
        process.kill()  # SIGKILL
        process.join()
        # after the last block the append may end before the kill (its commit can take less than the sleep): then
        # it must have left the next version, as a kill just after the commit
        ended = process.exitcode == 0
        assert ended or process.exitcode == -signal.SIGKILL, process.exitcode
        opened = distfact.open(store)  # the metadata checked, its checksum too
        read_everything(opened)
        assert referenced_files(before) == previous  # every file the previous version references, bitwise
        if opened.meta.version == 0:
            assert not ended, "the append ended (exit status 0) but left the previous version"
            assert opened.meta == before.meta and referenced_files(opened) == previous  # and its metadata
            outcomes.append("previous")
        else:  # the kill came after the commit, or the append ended: the whole next version
            assert opened.meta == reference.meta
            outcomes.append("next")
            shutil.rmtree(store)
            shutil.copytree(source / "pristine", store)
    assert "previous" in outcomes, "no kill landed before the commit"
    outcomes_seen.extend(outcomes)
    process, connection = start_append(store, source)  # an append after the kills completes, as if none had been
    assert said_to_the_end(connection)[-1] == "done"
    process.join()
    assert process.exitcode == 0
    appended = distfact.open(store)
    read_everything(appended)
    assert appended.meta == reference.meta
    for j in range(appended.n_blocks):
        assert (appended.load_block(j) != reference.load_block(j)).nnz == 0
    assert not os.path.exists(store / "versions" / "000002")


def test_the_kills_landed_on_both_sides_of_the_commit():
    """Of the kills above, some left the previous version and some (in the commit, or just after it) the next."""
    if len(outcomes_seen) < 15:
        pytest.skip("runs after the kills above (in the same process)")
    assert {"previous", "next"} <= set(outcomes_seen), outcomes_seen
