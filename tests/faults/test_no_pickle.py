"""Nothing distfact reads back is unpickled (DESIGN §7): a pickle payload planted in every file of a committed
checkpoint, of a saved model and of a pipeline run never runs; the read fails with an error, or the damaged
checkpoint is skipped, and the result is the undisturbed one.

The payload is a pickle whose unpickling runs ``touch MARKER``; it is planted as raw pickle bytes, as an ``.npy``
of an object array holding it, and as an ``.npz`` whose arrays (or skeleton) are such object arrays. Checkpoint
files are also planted with their digests recomputed, so that the parser itself, not only the digest check,
meets the payload."""

import hashlib
import io
import json
import os
import pickle
import shlex
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest

import distfact
from conftest import grouped_data
from distfact.cli import main as cli_main
from distfact.engine.checkpoint import seal
from distfact.outputs import PARTIAL_MARKER

DATE = "2026-11-22"


class Payload:
    """Unpickling this runs ``touch <marker>``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(self.marker)}",)


def object_array(marker) -> np.ndarray:
    array = np.empty(1, dtype=object)
    array[0] = Payload(marker)
    return array


def payload(variant: str, marker, original: bytes = b"") -> bytes:
    """The bytes planted in place of a file: ``original`` is the file's content (for the npz variants)."""
    if variant == "pickle":
        return pickle.dumps(Payload(marker))
    out = io.BytesIO()
    if variant == "npy":
        np.save(out, object_array(marker), allow_pickle=True)
        return out.getvalue()
    with np.load(io.BytesIO(original), allow_pickle=False) as npz:
        members = {name: npz[name] for name in npz.files}
    for name in members:  # npz-arrays: every array but the skeleton; npz-skeleton: the skeleton only
        if (name == "skeleton") == (variant == "npz-skeleton"):
            members[name] = object_array(marker)
    np.savez(out, **members)
    return out.getvalue()


def plant(path, variant: str, marker) -> None:
    original = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(payload(variant, marker, original))


def test_the_payloads_run_when_unpickled(tmp_path):
    """The control: each planted form runs its command when read with pickle allowed (so the tests below can fail)."""
    pickle.loads(payload("pickle", tmp_path / "a"))
    np.load(io.BytesIO(payload("npy", tmp_path / "b")), allow_pickle=True)
    original = io.BytesIO()
    np.savez(original, skeleton=np.array("{}"), a0=np.zeros(2))
    for variant, member, marker in (("npz-arrays", "a0", "c"), ("npz-skeleton", "skeleton", "d")):
        np.load(io.BytesIO(payload(variant, tmp_path / marker, original.getvalue())), allow_pickle=True)[member]
    assert sorted(os.listdir(tmp_path)) == ["a", "b", "c", "d"]


# -- (1) checkpoints ----------------------------------------------------------------------------------------

X, GROUPS = grouped_data(m=60, n=10, seed=41)
FIT = dict(random_state=3, tol=0, checkpoint_every=2)  # three blocks (one per group)
CHECKPOINT_FILES = ["COMMITTED", "config.json", "state.npz",
                    *(f"local/{block:06d}/{name}" for block in range(3) for name in ("zarr.json", "c/0/0"))]


@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory):
    """(a run directory with checkpoints at iterations 2 and 4, the factors of the fit continued to 8)."""
    run_dir = tmp_path_factory.mktemp("checkpointed") / "run"
    distfact.NMF(3, max_iter=4, checkpoint_dir=run_dir, **FIT).fit(X, groups=GROUPS)
    return run_dir, distfact.NMF(3, max_iter=8, **FIT).fit(X, groups=GROUPS).components_


def test_the_planted_files_are_every_file_of_a_checkpoint(checkpointed):
    newest = checkpointed[0] / "checkpoints" / "iter-000004"
    found = sorted(os.path.relpath(os.path.join(d, n), newest) for d, _, names in os.walk(newest) for n in names)
    assert found == sorted(CHECKPOINT_FILES)


def reseal(checkpoint, name):
    """Record the planted file's digest in COMMITTED and seal it again: the parser, not the digest, meets it."""
    record = json.loads((checkpoint / "COMMITTED").read_text())
    record["files"][name] = hashlib.sha256((checkpoint / name).read_bytes()).hexdigest()
    record["seal"] = seal(record)
    (checkpoint / "COMMITTED").write_text(json.dumps(record))


CHECKPOINT_CASES = ([(name, variant, False) for name in CHECKPOINT_FILES for variant in ("pickle", "npy")]
                    + [("state.npz", variant, True) for variant in ("pickle", "npy", "npz-arrays", "npz-skeleton")]
                    + [("config.json", "pickle", True)])


@pytest.mark.parametrize("name, variant, resealed", CHECKPOINT_CASES)
def test_a_payload_in_a_checkpoint_never_runs_on_resume(checkpointed, tmp_path, name, variant, resealed):
    run_dir = tmp_path / "run"
    shutil.copytree(checkpointed[0], run_dir)
    newest = run_dir / "checkpoints" / "iter-000004"
    marker = tmp_path / "MARKER"
    plant(newest / name, variant, marker)
    if resealed:
        reseal(newest, name)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        model = distfact.NMF(3, max_iter=8, checkpoint_dir=run_dir, resume=True, **FIT).fit(X, groups=GROUPS)
    assert not marker.exists()
    # the damaged checkpoint was skipped (config.json is only hashed, never parsed: resealed, it is not damage)
    skipped = [w for w in seen if "iter-000004 is damaged" in str(w.message)]
    assert skipped or (name, resealed) == ("config.json", True)
    assert np.array_equal(model.components_, checkpointed[1])


def cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "distfact.cli", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def test_a_payload_in_a_checkpoint_never_runs_on_distfact_fit_resume(tmp_path):
    store = distfact.from_arrays(X, GROUPS, tmp_path / "x.zarr")
    H = distfact.NMF(3, max_iter=8, tol=0, random_state=1).fit(store).components_
    fit = ["fit", store.path, "--rank", 3, "--tol", 0, "--seed", 1, "--no-progress", "--checkpoint-every", 2]
    for case, (name, variant) in enumerate([("state.npz", "npz-arrays"), ("local/000001/c/0/0", "pickle")]):
        out, staging = tmp_path / f"out{case}", tmp_path / f".out{case}.partial"
        # what a `distfact fit -o out --checkpoint-every 2` killed after iteration 4 leaves: its staging directory
        distfact.NMF(3, max_iter=4, tol=0, random_state=1, checkpoint_dir=staging, checkpoint_every=2).fit(store)
        (staging / PARTIAL_MARKER).write_text("{}")
        newest = staging / "checkpoints" / "iter-000004"
        plant(newest / name, variant, tmp_path / "MARKER")
        if name == "state.npz":
            reseal(newest, name)
        resumed = cli(*fit, "--max-iter", 8, "-o", out, "--resume", cwd=tmp_path)
        assert not (tmp_path / "MARKER").exists(), name
        assert resumed.returncode == 0 and f"{newest} is damaged" in resumed.stderr, resumed.stderr
        assert np.array_equal(np.load(out / "components.npy"), H)


def test_a_zarr_v2_pickle_array_in_place_of_a_local_factor_never_runs(checkpointed, tmp_path):
    """Zarr v2 arrays may declare an object dtype and a pickle filter: a local factor is only read as Zarr v3."""
    run_dir = tmp_path / "run"
    shutil.copytree(checkpointed[0], run_dir)
    node = run_dir / "checkpoints" / "iter-000004" / "local" / "000000"
    shutil.rmtree(node)
    node.mkdir()
    (node / ".zarray").write_text(json.dumps({"zarr_format": 2, "shape": [1], "chunks": [1], "dtype": "|O",
                                              "compressor": None, "fill_value": None, "order": "C",
                                              "filters": [{"id": "pickle", "protocol": 5}]}))
    (node / "0").write_bytes(pickle.dumps(object_array(tmp_path / "MARKER")))
    with pytest.warns(UserWarning, match=r"iter-000004 is damaged .*block 0's local factor"):
        model = distfact.NMF(3, max_iter=8, checkpoint_dir=run_dir, resume=True, **FIT).fit(X, groups=GROUPS)
    assert not (tmp_path / "MARKER").exists()
    assert np.array_equal(model.components_, checkpointed[1])


# -- (2) saved models ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["pickle", "npy", "npz-arrays", "npz-skeleton"])
@pytest.mark.parametrize("estimator", ["NMF", "SSNMFClassifier"])
def test_a_payload_in_a_model_file_never_runs_on_load(tmp_path, estimator, variant):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if estimator == "NMF":
            model = distfact.NMF(3, max_iter=3, random_state=0).fit(X, groups=GROUPS)
        else:
            model = distfact.SSNMFClassifier(3, max_iter=3, random_state=0).fit(X, np.arange(60) % 2)
    path = tmp_path / "model.npz"
    model.save(path)
    plant(path, variant, tmp_path / "MARKER")
    with pytest.raises(ValueError, match=str(path)):
        distfact.load(path)
    assert not (tmp_path / "MARKER").exists()


# -- (3) pipeline runs --------------------------------------------------------------------------------------

SPEC = """
name = "small"
[input]
dataset = "digits"
[[fit]]
method = "nmf"
rank = 3
max_iter = 5
tol = 0.0
"""


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory):
    """(the spec, the output root) of a finished ``distfact run``."""
    base = tmp_path_factory.mktemp("pipeline")
    (base / "spec.toml").write_text(SPEC)
    done = cli("run", base / "spec.toml", "--output", base / "runs", "--date", DATE, cwd=base)
    assert done.returncode == 0, done.stderr
    return base / "spec.toml", base / "runs"


def store_file(run_dir, which: str) -> str:
    """The store's root metadata, or the first chunk of a block of X (the fit stage reads both)."""
    store = os.path.join("ingest", "data.zarr")
    if which == "store-metadata":
        return os.path.join(store, "zarr.json")
    return min(os.path.relpath(os.path.join(d, n), run_dir) for d, _, names in
               os.walk(os.path.join(run_dir, store, "blocks")) for n in names if n != "zarr.json")


# (file under the run directory, the stage whose marker is removed so that the rerun reads the file: None for a
# plain rerun, which reads every stage's marker)
PIPELINE_FILES = [(f"{stage}/COMMITTED", None) for stage in ("ingest", "fit", "evaluate", "report", "publish")] + [
    ("ingest/input.json", "fit"), ("store-metadata", "fit"), ("store-chunk", "fit"),
    ("fit/nmf-r3/model.npz", "evaluate"), ("fit/nmf-r3/fit.json", "evaluate"),
    ("evaluate/group_metrics.csv", "report"), ("evaluate/metrics.json", "publish"), ("../LATEST", "publish")]
PIPELINE_CASES = [(name, stage, "pickle") for name, stage in PIPELINE_FILES] + [
    ("fit/nmf-r3/model.npz", "evaluate", variant) for variant in ("npy", "npz-arrays", "npz-skeleton")]


@pytest.mark.parametrize("name, stage, variant", PIPELINE_CASES)
def test_a_payload_in_a_pipeline_run_never_runs(pipeline_run, tmp_path, name, stage, variant):
    spec, pristine = pipeline_run
    root = tmp_path / "runs"
    shutil.copytree(pristine, root)
    run_dir = root / "small" / DATE
    marker = tmp_path / "MARKER"
    plant(run_dir / (store_file(run_dir, name) if name.startswith("store-") else name), variant, marker)
    if stage is not None:
        os.remove(run_dir / stage / "COMMITTED")
    status = cli_main(["run", str(spec), "--output", str(root), "--date", DATE])
    assert not marker.exists()
    if name.endswith("COMMITTED"):  # an unreadable marker: the stage is not committed, and runs again
        assert status == 0 and json.loads((run_dir / name).read_text())["stage"] == name.split("/")[0]
    else:
        assert status != 0  # the planted file was read, and refused


@pytest.mark.parametrize("stage", [None, "fit", "evaluate", "report", "publish"])
def test_the_reruns_succeed_without_a_payload(pipeline_run, tmp_path, stage):
    """The control of the test above: each rerun it makes succeeds on the files as written."""
    spec, pristine = pipeline_run
    root = tmp_path / "runs"
    shutil.copytree(pristine, root)
    if stage is not None:
        os.remove(root / "small" / DATE / stage / "COMMITTED")
    assert cli_main(["run", str(spec), "--output", str(root), "--date", DATE]) == 0
    assert (root / "small" / DATE / (stage or "publish") / "COMMITTED").exists()


def test_a_payload_in_a_pipeline_model_never_runs_in_a_distfact_run_process(pipeline_run, tmp_path):
    spec, pristine = pipeline_run
    root = tmp_path / "runs"
    shutil.copytree(pristine, root)
    run_dir = root / "small" / DATE
    plant(run_dir / "fit" / "nmf-r3" / "model.npz", "pickle", tmp_path / "MARKER")
    os.remove(run_dir / "evaluate" / "COMMITTED")
    rerun = cli("run", spec, "--output", root, "--date", DATE, cwd=tmp_path)
    assert not (tmp_path / "MARKER").exists()
    assert rerun.returncode == 1 and "stage 'evaluate' failed" in rerun.stderr and "model.npz" in rerun.stderr
