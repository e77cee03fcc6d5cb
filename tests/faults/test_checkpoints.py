"""A damaged newest checkpoint: the resume names it, continues from the previous committed one, and gives bitwise
the uninterrupted fit; every checkpoint damaged is an error naming each; nothing is silently restarted or zeroed."""

import hashlib
import json
import logging
import os
import shutil

import numpy as np
import pytest
import scipy.sparse as sp

import distfact
from conftest import grouped_data
from distfact.engine.checkpoint import DamagedCheckpointWarning, seal

X, GROUPS = grouped_data(m=150, n=20, seed=22)
KWARGS = dict(random_state=5, tol=0, block_rows=16, checkpoint_every=2)  # 10 blocks


def _interrupt_at(iteration):
    def callback(info):
        if info.iteration == iteration:
            raise KeyboardInterrupt("simulated crash")
    return callback


def fit(run_dir=None, client=None, **kwargs):
    """(W, H, loss history, passes, iterations) of NMF to iteration 12, resumed from ``run_dir`` if given."""
    model = distfact.NMF(4, max_iter=12, checkpoint_dir=run_dir, resume=run_dir is not None, **KWARGS, **kwargs)
    W = model.fit_transform(X, groups=GROUPS, client=client)
    return W, model.components_, model.loss_history_, model.n_passes_, model.n_iter_


@pytest.fixture(scope="module")
def uninterrupted():
    return fit()


@pytest.fixture
def run_dir(tmp_path):
    """A fit killed at iteration 7: committed checkpoints at iterations 4 and 6 (the two newest are kept)."""
    run_dir = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        distfact.NMF(4, max_iter=12, checkpoint_dir=run_dir, callback=_interrupt_at(7), **KWARGS).fit(
            X, groups=GROUPS)
    assert sorted(os.listdir(run_dir / "checkpoints")) == ["iter-000004", "iter-000006"]
    return run_dir


def checkpoint(run_dir, iteration):
    return run_dir / "checkpoints" / f"iter-{iteration:06d}"


def delete_a_chunk(path):
    """Block 3's local factor loses its (only) chunk: Zarr would read it back as zeros."""
    os.remove(path / "local" / "000003" / "c" / "0" / "0")


def rewrite_state(path, edit):
    """state.npz re-written as a valid .npz with ``edit(skeleton, arrays)`` applied (no digest updated)."""
    with np.load(path / "state.npz", allow_pickle=False) as npz:
        arrays = {name: npz[name] for name in npz.files}
    skeleton = json.loads(str(arrays.pop("skeleton")))
    edit(skeleton, arrays)
    with open(path / "state.npz", "wb") as f:
        np.savez(f, skeleton=np.array(json.dumps(skeleton)), **arrays)


def global_state_member(skeleton, name):
    return skeleton["tree"]["items"]["global_state"]["items"][name]


def scale_H(path):
    def edit(skeleton, arrays):
        member = global_state_member(skeleton, "H")["member"]
        arrays[member] = arrays[member] * 2
    rewrite_state(path, edit)


def truncate_state(path):
    content = (path / "state.npz").read_bytes()
    (path / "state.npz").write_bytes(content[: len(content) // 2])


def edit_marker(path):
    record = json.loads((path / "COMMITTED").read_text())
    record["local"][3]["000003"]["crc32c"] += 1  # as if to make a changed block pass
    (path / "COMMITTED").write_text(json.dumps(record))


@pytest.mark.parametrize("damage, reason", [
    (delete_a_chunk, "block 3's local factor: .*'000003' has crc32c"),
    (scale_H, "state.npz: its SHA-256 is not the one recorded"),
    (truncate_state, "state.npz: its SHA-256 is not the one recorded"),
    (edit_marker, "COMMITTED was changed after it was written"),
])
def test_a_damaged_newest_checkpoint_resumes_from_the_previous_one(damage, reason, run_dir, uninterrupted, caplog):
    newest = checkpoint(run_dir, 6)
    damage(newest)
    with caplog.at_level(logging.WARNING, logger="distfact"), \
            pytest.warns(DamagedCheckpointWarning, match=f"checkpoint {newest} is damaged and not resumed from: {reason}"):
        resumed = fit(run_dir)
    assert any(str(newest) in record.getMessage() for record in caplog.records if record.levelno == logging.WARNING)
    for ours, theirs in zip(resumed, uninterrupted):
        assert np.array_equal(ours, theirs)
    # the damaged iteration was saved again by the resumed fit, which went on to the end
    assert sorted(os.listdir(run_dir / "checkpoints")) == ["iter-000010", "iter-000012"]


def test_every_checkpoint_damaged_is_an_error_naming_each(run_dir):
    delete_a_chunk(checkpoint(run_dir, 6))
    truncate_state(checkpoint(run_dir, 4))
    with pytest.warns(DamagedCheckpointWarning), pytest.raises(ValueError) as error:
        fit(run_dir)
    message = str(error.value)
    assert "every committed checkpoint" in message and "not resuming" in message
    assert f"{checkpoint(run_dir, 6)}: block 3's local factor" in message
    assert f"{checkpoint(run_dir, 4)}: " in message and "state.npz: its SHA-256" in message
    assert sorted(os.listdir(run_dir / "checkpoints")) == ["iter-000004", "iter-000006"]  # nothing started afresh


def test_arrays_of_other_shapes_with_their_digests_are_refused_by_name(run_dir, uninterrupted):
    """A writer who also rewrites the digests (and the seal) can change a result, but a state of another structure
    is still refused: H with a row less, skeleton and COMMITTED made to agree."""
    newest = checkpoint(run_dir, 6)

    def fewer_rows(skeleton, arrays):
        node = global_state_member(skeleton, "H")
        arrays[node["member"]] = arrays[node["member"]][:3]
        node["shape"] = [3, 20]
    rewrite_state(newest, fewer_rows)
    record = json.loads((newest / "COMMITTED").read_text())
    record["files"]["state.npz"] = hashlib.sha256((newest / "state.npz").read_bytes()).hexdigest()
    record["seal"] = seal(record)
    (newest / "COMMITTED").write_text(json.dumps(record))
    with pytest.warns(DamagedCheckpointWarning, match=r"global state 'H' is an array of shape \(3, 20\) and dtype "
                                                      r"float64, this fit's is an array of shape \(4, 20\)"):
        resumed = fit(run_dir)
    for ours, theirs in zip(resumed, uninterrupted):
        assert np.array_equal(ours, theirs)


def test_partial_checkpoints_are_not_resumed_and_are_cleared(run_dir, uninterrupted):
    """A save killed before its rename leaves iter-N.partial-<hex>/, even with a COMMITTED in it: never resumed."""
    partial = run_dir / "checkpoints" / "iter-000008.partial-0123abcd"
    shutil.copytree(checkpoint(run_dir, 6), partial)
    truncate_state(partial)
    resumed = fit(run_dir)
    assert resumed[4] == 12 and np.array_equal(resumed[1], uninterrupted[1])
    assert not partial.exists()


def test_checkpoints_of_the_pickle_format_are_refused_saying_so(tmp_path):
    old = tmp_path / "run" / "checkpoints" / "iter-000004"
    old.mkdir(parents=True)
    (old / "state.pkl").write_bytes(b"\x80\x05N.")
    (old / "COMMITTED").write_text("54957945cab0bb21")
    with pytest.raises(ValueError, match="only checkpoints in the pickle-based format .* no longer read"):
        fit(tmp_path / "run")


@pytest.mark.parametrize("observed, form", [(0.8, "mask_complement"), (0.2, "mask_observed")])
def test_a_damaged_chunk_of_a_sparse_mask_in_an_ssnmf_checkpoint(tmp_path, observed, form):
    """A local state of several parts (W, the rows of Y, a CSR data mask in either sparse form): each array is
    checked."""
    rng = np.random.default_rng(8)
    Xs, y = rng.random((60, 10)), rng.integers(0, 3, 60)
    mask = sp.csr_matrix(rng.random((60, 10)) < observed, dtype=np.float64)
    kwargs = dict(model="FF", tol=0, random_state=2, block_rows=12, checkpoint_every=2)
    reference = distfact.SSNMF(3, max_iter=8, **kwargs).fit(Xs, y=y, mask=mask)
    run = tmp_path / "run"
    distfact.SSNMF(3, max_iter=4, checkpoint_dir=run, **kwargs).fit(Xs, y=y, mask=mask)
    os.remove(checkpoint(run, 4) / "local" / "000002" / form / "data" / "c" / "0")
    with pytest.warns(DamagedCheckpointWarning, match=rf"block 2's local factor: .*'000002/{form}/data' has crc32c"):
        resumed = distfact.SSNMF(3, max_iter=8, checkpoint_dir=run, resume=True, **kwargs).fit(Xs, y=y, mask=mask)
    assert np.array_equal(resumed.components_, reference.components_) and np.array_equal(resumed.B_, reference.B_)


@pytest.mark.cluster
def test_a_damaged_block_found_by_a_worker_process_falls_back_too(run_dir, uninterrupted, local_cluster_client):
    """The block is loaded and checked on a worker of a real LocalCluster; the resume still falls back, bitwise."""
    newest = checkpoint(run_dir, 6)
    delete_a_chunk(newest)
    with pytest.warns(DamagedCheckpointWarning, match=f"checkpoint {newest} is damaged .*block 3's local factor"):
        resumed = fit(run_dir, client=local_cluster_client)
    for ours, theirs in zip(resumed, uninterrupted):
        assert np.array_equal(ours, theirs)
