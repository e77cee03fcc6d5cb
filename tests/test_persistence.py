"""Saved models (model.save / distfact.load): every estimator comes back bitwise, with every public method giving
bitwise the same outputs; files of a newer format version, damaged or edited files are refused by name."""

import dataclasses
import json
import os
import pathlib
import warnings

import numpy as np
import pandas as pd
import pytest
from sklearn.base import BaseEstimator

import distfact
from conftest import grouped_data
from distfact.estimators.persistence import FITTED_NAME

X, GROUPS = grouped_data(m=90, n=12, n_groups=3, seed=3)
Y = np.where(np.arange(90) % 7 == 0, -1, np.arange(90) % 3)  # class labels, some rows unlabelled
X_NEW, GROUPS_NEW = grouped_data(m=25, n=12, n_groups=3, seed=4)
Y_NEW = np.arange(25) % 3
# wL1-NMF with a group of all-zero rows: its per-group losses are NaN (allowed there, and only there)
X_ZERO, GROUPS_ZERO = np.vstack([X[:60], np.zeros((10, 12))]), np.concatenate([GROUPS[:60], ["zero"] * 10])


def fitted(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning: a few iterations are enough here
        if name == "nmf":
            return distfact.NMF(3, solver="hals", max_iter=6, random_state=0).fit(X, groups=GROUPS)
        if name == "fairer-nmf":
            return distfact.FairerNMF(3, n_estimates=2, max_iter=4, estimate_max_iter=4, random_state=0).fit(
                X, groups=GROUPS)
        if name == "stratified-nmf":
            return distfact.StratifiedNMF(3, max_iter=5, random_state=0).fit(X, groups=GROUPS)
        if name == "wl1-nmf":
            return distfact.WeightedL1NMF(3, lam=0.5, max_iter=3, hals_iter=2, random_state=0).fit(
                X_ZERO, groups=GROUPS_ZERO)
        if name == "ssnmf":
            return distfact.SSNMF(3, model="FD", max_iter=5, random_state=0).fit(X, y=Y, groups=GROUPS)
        if name == "ssnmf-classifier":
            return distfact.SSNMFClassifier(3, max_iter=5, random_state=0).fit(X, Y)
        return distfact.MultigroupSVD(3, center=True).fit(X, groups=GROUPS)


ESTIMATORS = ["nmf", "fairer-nmf", "stratified-nmf", "wl1-nmf", "ssnmf", "ssnmf-classifier", "multigroup-svd"]


def outputs(name, model) -> dict:
    """What every public method of the fitted model gives."""
    if name == "nmf":
        W = model.transform(X_NEW)
        return {"transform": W, "inverse_transform": model.inverse_transform(W)}
    if name == "fairer-nmf":
        return {"inverse_transform": model.inverse_transform(np.ones((4, 3)))}
    if name == "stratified-nmf":
        W = model.transform(X_NEW, groups=GROUPS_NEW)
        return {"transform": W, "inverse_transform": model.inverse_transform(W, GROUPS_NEW),
                "top_features": model.top_features(3)}
    if name == "wl1-nmf":
        W = model.transform(X_NEW)
        return {"transform": W, "inverse_transform": model.inverse_transform(W)}
    if name == "ssnmf":
        return {"transform": model.transform(X_NEW), "predict_targets": model.predict_targets(X_NEW)}
    if name == "ssnmf-classifier":
        return {"transform": model.transform(X_NEW), "predict": model.predict(X_NEW),
                "predict_proba": model.predict_proba(X_NEW), "score": model.score(X_NEW, Y_NEW)}
    Z = model.transform(X_NEW)
    return {"transform": Z, "inverse_transform": model.inverse_transform(Z), "svd_components": model.svd_components(),
            "losses_of": model.losses_of(model.svd_components())}


def assert_bitwise(ours, theirs, where=""):
    assert type(ours) is type(theirs), where
    if isinstance(ours, np.ndarray):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, where
        assert ours.tobytes() == theirs.tobytes() if ours.dtype != object else ours.tolist() == theirs.tolist(), where
    elif isinstance(ours, pd.DataFrame):
        pd.testing.assert_frame_equal(ours, theirs, check_exact=True)
    elif isinstance(ours, BaseEstimator):
        assert_same_model(ours, theirs)
    elif isinstance(ours, dict):
        assert list(ours) == list(theirs), where
        for key in ours:
            assert_bitwise(ours[key], theirs[key], f"{where}/{key}")
    elif isinstance(ours, (list, tuple)):
        assert len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(ours, theirs)):
            assert_bitwise(a, b, f"{where}/{i}")
    elif isinstance(ours, (float, np.floating)) and np.isnan(ours):
        assert np.isnan(theirs), where
    else:
        assert ours == theirs, where


def assert_same_model(original, loaded):
    assert type(loaded) is type(original)
    assert loaded.get_params() == original.get_params()
    saved = {key for key in vars(original) if FITTED_NAME.fullmatch(key) or key in original._fitted_private}
    assert saved == {key for key in vars(loaded) if key not in loaded.get_params()}
    for key in saved:
        value = getattr(original, key)
        if dataclasses.is_dataclass(value):
            assert getattr(loaded, key) == value and type(getattr(loaded, key)) is type(value), key
        else:
            assert_bitwise(value, getattr(loaded, key), key)


@pytest.fixture(scope="module", params=ESTIMATORS)
def model(request):
    return request.param, fitted(request.param)


def test_a_saved_model_comes_back_bitwise(model, tmp_path):
    name, original = model
    path = tmp_path / "model.npz"
    original.save(path)
    assert sorted(os.listdir(tmp_path)) == ["model.npz"]  # nothing left aside
    loaded = distfact.load(path)
    assert_same_model(original, loaded)
    assert_bitwise(outputs(name, original), outputs(name, loaded))
    if name == "wl1-nmf":  # the all-zero group's relative loss is 0 (0 / 0 was NaN)
        assert loaded.group_losses_[loaded.group_names_.index("zero")] == 0.0
    loaded.save(tmp_path / "again.npz")  # a loaded model saves to the same content
    assert_same_model(original, distfact.load(tmp_path / "again.npz"))


def test_parameters_round_trip_callables_are_dropped_paths_become_strings(tmp_path):
    model = distfact.NMF(2, solver="hals", beta_loss="frobenius", init="nndsvda", tol=0.0, max_iter=3,
                         random_state=7, block_rows=30, checkpoint_dir=pathlib.Path(tmp_path / "run"),
                         checkpoint_every=2, callback=print, n_threads=1, local_memory_budget=10 ** 9)
    model.fit(X, groups=GROUPS)
    model.save(tmp_path / "model.npz")
    params = distfact.load(tmp_path / "model.npz").get_params()
    assert params == {**model.get_params(), "callback": None, "checkpoint_dir": str(tmp_path / "run")}
    with pytest.raises(ValueError, match="not fitted yet"):
        distfact.NMF(2).save(tmp_path / "unfitted.npz")
    assert not (tmp_path / "unfitted.npz").exists()


# -- damaged and edited files -------------------------------------------------------------------------------

def read_members(path) -> tuple[dict, dict]:
    """(skeleton, arrays) of a model file, read as any user could (no pickle)."""
    with np.load(path, allow_pickle=False) as npz:
        arrays = {name: npz[name] for name in npz.files}
    return json.loads(str(arrays.pop("skeleton"))), arrays


def write_members(path, skeleton, arrays):
    """A valid .npz of ``arrays`` and ``skeleton``: edits that a zip or npy check cannot see."""
    with open(path, "wb") as f:
        np.savez(f, skeleton=np.array(json.dumps(skeleton)), **arrays)


def attribute_node(skeleton, name) -> dict:
    return skeleton["tree"]["items"]["attributes"]["items"][name]


@pytest.fixture(scope="module")
def nmf_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("saved") / "nmf.npz"
    fitted("nmf").save(path)
    return path


def edited(nmf_file, tmp_path, edit):
    skeleton, arrays = read_members(nmf_file)
    edit(skeleton, arrays)
    path = tmp_path / "edited.npz"
    write_members(path, skeleton, arrays)
    return path


def test_a_newer_format_version_is_refused_by_name(nmf_file, tmp_path):
    def newer(skeleton, arrays):
        skeleton["meta"]["format_version"] = 2
    path = edited(nmf_file, tmp_path, newer)
    with pytest.raises(ValueError, match=rf"{path}: model format version 2 .*reads model format versions up to 1"):
        distfact.load(path)


def _components(edit):
    def apply(skeleton, arrays):
        member = attribute_node(skeleton, "components_")["member"]
        arrays[member] = edit(arrays[member])
    return apply


def _set_node(name, **fields):
    def apply(skeleton, arrays):
        attribute_node(skeleton, name).update(fields)
    return apply


def _remove_member(skeleton, arrays):
    del arrays[attribute_node(skeleton, "components_")["member"]]


def _unknown_class(skeleton, arrays):
    skeleton["meta"]["estimator"] = "os.system"


def _nan_in(name):
    def apply(skeleton, arrays):
        member = attribute_node(skeleton, name)["member"]
        arrays[member] = arrays[member].copy()
        arrays[member].flat[0] = np.nan
    return apply


def _consistently_reshaped(skeleton, arrays):
    node = attribute_node(skeleton, "components_")
    arrays[node["member"]] = arrays[node["member"]][:2]
    node["shape"] = [2, 12]


def _unknown_attribute(skeleton, arrays):
    skeleton["tree"]["items"]["attributes"]["items"]["fit"] = {"kind": "int", "value": 1}


def _unknown_method_class(skeleton, arrays):
    skeleton["tree"]["items"]["methods"]["items"]["_method"]["items"]["class"]["value"] = "Popen"


@pytest.mark.parametrize("edit, words", [
    (_remove_member, ["attributes/components_", "is missing"]),
    (_components(lambda H: H.reshape(H.shape[::-1])), ["attributes/components_", "shape (12, 3)", "records"]),
    (_components(lambda H: H.astype(np.float32)), ["attributes/components_", "dtype float32"]),
    (_nan_in("components_"), ["attributes/components_", "1 non-finite values"]),
    (_nan_in("group_errors_"), ["attributes/group_errors_", "1 non-finite values"]),  # NaN allowed for wL1 only
    (_set_node("n_iter_", value=float("inf"), kind="float"), ["attributes/n_iter_", "not finite"]),
    (_unknown_class, ["field 'estimator'", "'os.system' is not one of distfact's estimators"]),
    (_consistently_reshaped, ["attributes/components_", "shape (2, 12) disagrees with n_components_"]),
    (_unknown_attribute, ["attributes/fit", "not a fitted attribute of NMF"]),
    (_unknown_method_class, ["methods/_method", "not one of distfact's methods"]),
    (_set_node("components_", dtype="|O"), ["attributes/components_", "dtype object is not allowed"]),
])
def test_an_edited_file_is_refused_naming_the_field(nmf_file, tmp_path, edit, words):
    path = edited(nmf_file, tmp_path, edit)
    with pytest.raises(ValueError) as error:
        distfact.load(path)
    message = str(error.value)
    assert message.startswith(str(path)) and all(word in message for word in words), message


def test_a_truncated_or_garbled_file_is_refused_by_name(nmf_file, tmp_path):
    content = nmf_file.read_bytes()
    (tmp_path / "cut.npz").write_bytes(content[: len(content) // 2])
    with pytest.raises(ValueError, match=rf"{tmp_path / 'cut.npz'}: not a readable distfact array file"):
        distfact.load(tmp_path / "cut.npz")
    skeleton, arrays = read_members(nmf_file)
    with open(tmp_path / "json.npz", "wb") as f:
        np.savez(f, skeleton=np.array(json.dumps(skeleton)[:-5]), **arrays)
    with pytest.raises(ValueError, match="not a readable distfact array file.*JSONDecodeError"):
        distfact.load(tmp_path / "json.npz")
    flipped = bytearray(content)
    flipped[len(content) // 3] ^= 0xFF  # inside an array: the zip member's CRC-32 catches it
    (tmp_path / "flipped.npz").write_bytes(bytes(flipped))
    with pytest.raises(ValueError, match="flipped.npz"):
        distfact.load(tmp_path / "flipped.npz")
