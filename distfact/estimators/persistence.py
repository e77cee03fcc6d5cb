"""Fitted estimators saved and loaded without pickle: ``model.save(path)`` and ``distfact.load(path)``.

A model file is one array-tree file (``engine/arraytree.py``): an ``.npz`` of arrays plus a JSON skeleton,
read with ``allow_pickle=False``; nothing in it is unpickled, and no class is imported by a name read from
it. ``save`` writes exactly ``path`` (``.npz`` is the usual suffix; none is added), under a temporary name
renamed into place. The skeleton's header records

- ``format`` (``"distfact.model"``) and ``format_version`` (:data:`FORMAT_VERSION`): a file of a newer
  version is refused, naming the file, its version and the one this distfact reads;
- ``distfact_version``, the version that wrote it;
- ``estimator``, the class name, looked up in the fixed registry of distfact's estimators, and the same for
  every fitted attribute that is an estimator itself (``SSNMFClassifier.ssnmf_``).

The tree holds, per estimator:

- ``params``: ``get_params(deep=False)``. A callable parameter (``callback``) is not saved: the loaded model
  has ``callback=None``. A path-like one (``checkpoint_dir``) is saved as a string. Any other value that is
  not a number, string, bool, None or a tuple or list of them is refused (TypeError naming it).
- ``attributes``: the fitted attributes (names ending in ``_``) and the private ones the estimator's methods
  use (its ``_fitted_private``, e.g. the Gram matrices of ``MultigroupSVD``), as arrays, numbers, strings,
  and dicts, lists and tuples of them;
- ``frames``: fitted attributes that are pandas DataFrames, column by column with their dtypes;
- ``methods``: fitted attributes that are method objects (the dataclasses of ``distfact.methods`` that
  ``transform`` calls), as their class name, looked up in :data:`METHODS`, and fields;
- ``estimators``: fitted attributes that are estimators, each a tree like this one.

Loading checks every array's dtype and shape against the skeleton, that float values are finite, that the
parameters and attribute names are the estimator's, that the estimator is fitted, and that
``components_`` agrees with ``n_components_`` and ``n_features_in_``; a damaged or edited file raises
ValueError naming the file and the field. Everything a fitted estimator's public methods use is saved, so
``transform``, ``inverse_transform``, ``predict``, ``score``, ``top_features``, ... give bitwise what they gave
before saving.
"""

from __future__ import annotations

import dataclasses
import os
import re

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator

from .._version import __version__
from ..engine import arraytree
from ..methods.fairer_nmf import FairerAM, FairerMU
from ..methods.nmf import NMFMethod
from ..methods.ssnmf import SSNMFMethod
from ..methods.stratified_nmf import StratifiedMU
from ..methods.wl1_nmf import MaskedWeightedL1SCD, WeightedL1SCD
from .tables import make_tables

FORMAT = "distfact.model"
FORMAT_VERSION = 1
METHODS = {cls.__name__: cls for cls in (NMFMethod, FairerMU, FairerAM, StratifiedMU, WeightedL1SCD, MaskedWeightedL1SCD,
                                          SSNMFMethod)}
FITTED_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*_")
SECTIONS = ("params", "attributes", "frames", "methods", "estimators")
FRAME_DTYPES = ("str", "object", "bool", "int64", "float64")


ESTIMATORS: dict = {}  # the registry of the classes a model file may name: distfact.estimators registers its own


def register_estimators(*classes) -> None:
    """Add ``classes`` to :data:`ESTIMATORS` (``distfact/estimators/__init__.py`` does, for all of distfact's
    estimators: it runs before any of its modules, this one included, is used)."""
    ESTIMATORS.update({cls.__name__: cls for cls in classes})


def save_model(model, path) -> None:
    """Write the fitted ``model`` to ``path`` (see the module docstring for the format)."""
    classes, tree = _encode_model(model)
    arraytree.save(path, tree, {"format": FORMAT, "format_version": FORMAT_VERSION, "distfact_version": __version__,
                                **classes})


def _encode_model(model) -> tuple[dict, dict]:
    """(the class names of ``model`` and of its estimator attributes, its tree)."""
    name = type(model).__name__
    if ESTIMATORS.get(name) is not type(model):
        raise TypeError(f"a {name} is not one of distfact's estimators; only those are saved")
    model._check_fitted()
    make_tables(model)
    classes = {"estimator": name, "estimators": {}}
    tree = {"params": {key: _param(value) for key, value in model.get_params(deep=False).items()},
            **{section: {} for section in SECTIONS[1:]}}
    for key, value in vars(model).items():
        if not (FITTED_NAME.fullmatch(key) or key in model._fitted_private):
            continue
        if isinstance(value, pd.DataFrame):
            tree["frames"][key] = _encode_frame(key, value)
        elif isinstance(value, BaseEstimator):
            classes["estimators"][key], tree["estimators"][key] = _encode_model(value)
        elif dataclasses.is_dataclass(value):
            if METHODS.get(type(value).__name__) is not type(value):
                raise TypeError(f"attribute {key!r}: a {type(value).__name__} is not one of distfact's methods")
            tree["methods"][key] = {"class": type(value).__name__, "fields": {
                field.name: getattr(value, field.name) for field in dataclasses.fields(value)}}
        else:
            tree["attributes"][key] = value
    return classes, tree


def _param(value):
    """A parameter as saved: callables (``callback``) are not, paths are strings."""
    if callable(value):
        return None
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def _encode_frame(name: str, frame: pd.DataFrame) -> dict:
    dtypes = [str(dtype) for dtype in frame.dtypes]
    if (not isinstance(frame.index, pd.RangeIndex) or frame.index.start != 0 or frame.index.step != 1
            or not all(isinstance(column, str) for column in frame.columns) or not set(dtypes) <= set(FRAME_DTYPES)):
        raise TypeError(f"attribute {name!r}: only DataFrames with string column names, columns of dtypes "
                        f"{FRAME_DTYPES} and a default index are saved")
    return {"columns": list(frame.columns), "dtypes": dtypes, "values": [frame[c].to_numpy() for c in frame.columns]}


def load(path):
    """The fitted estimator saved at ``path`` by ``save`` (any of distfact's estimators).

    Nothing in the file is unpickled or imported by name. Raises ValueError naming the file and the field for
    a file that is not a distfact model, of a newer format version, damaged or edited (bad JSON, a missing
    array, a wrong shape or dtype, non-finite values where finite ones are required, an unknown class)."""
    path = os.fspath(path)
    reader = arraytree.TreeFile(path)
    classes = _check_header(path, reader.meta)
    tree = reader.read()
    return _decode_model(path, classes, tree, ())


def _check_header(path: str, meta: dict) -> dict:
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path}: not a distfact model file (format {meta.get('format')!r}, expected {FORMAT!r})")
    version = meta.get("format_version")
    if not isinstance(version, int) or version < 1:
        raise ValueError(f"{path}: field 'format_version': {version!r} is not a format version")
    if version > FORMAT_VERSION:
        raise ValueError(f"{path}: model format version {version} (written by distfact "
                         f"{meta.get('distfact_version')}); this distfact ({__version__}) reads model format versions "
                         f"up to {FORMAT_VERSION}: upgrade distfact to load it")
    _check_classes(path, meta, "estimator")
    return meta


def _check_classes(path: str, classes, field: str) -> None:
    """The estimator class names of a header, recursively: every one in the registry."""
    known = ESTIMATORS
    if not isinstance(classes, dict) or classes.get("estimator") not in known or not isinstance(
            classes.get("estimators"), dict):
        name = classes.get("estimator") if isinstance(classes, dict) else classes
        raise ValueError(f"{path}: field {field!r}: {name!r} is not one of distfact's estimators ({sorted(known)})")
    for key, nested in classes["estimators"].items():
        _check_classes(path, nested, f"{field}/{key}")


def _decode_model(path: str, classes: dict, tree, where: tuple):
    """The estimator of ``tree`` (at ``where`` in the file), every name checked against its class."""
    def error(field, problem):
        return ValueError(f"{path}: field {'/'.join((*where, *field))!r}: {problem}")

    cls = ESTIMATORS[classes["estimator"]]
    if not isinstance(tree, dict) or sorted(tree) != sorted(SECTIONS) or not all(
            isinstance(tree[section], dict) for section in SECTIONS):
        raise error((), f"not a model (the sections must be {SECTIONS})")
    names = set(cls._get_param_names())
    if set(tree["params"]) != names:
        raise error(("params",), f"{sorted(set(tree['params']) ^ names)} are not the parameters of {cls.__name__}")
    try:
        model = cls(**tree["params"])
    except (TypeError, ValueError) as exc:
        raise error(("params",), str(exc)) from None
    if set(tree["estimators"]) != set(classes["estimators"]):
        raise error(("estimators",), "not the estimators the header names")
    fitted = {**tree["attributes"], **{key: _decode_frame(error, key, frame) for key, frame in tree["frames"].items()},
              **{key: _decode_method(error, key, method) for key, method in tree["methods"].items()},
              **{key: _decode_model(path, classes["estimators"][key], nested, (*where, "estimators", key))
                 for key, nested in tree["estimators"].items()}}
    for key, value in fitted.items():
        if not (FITTED_NAME.fullmatch(key) or key in cls._fitted_private) or key in names:
            raise error(("attributes", key), f"not a fitted attribute of {cls.__name__}")
        setattr(model, key, value)
    try:
        model._check_fitted()
    except ValueError as exc:
        raise error((), f"{exc} (its fitted attributes are missing)") from None
    components = getattr(model, "components_", None)
    expected = (getattr(model, "n_components_", None), getattr(model, "n_features_in_", None))
    if components is not None and (np.ndim(components) != 2 or any(
            n is not None and n != size for n, size in zip(expected, np.shape(components)))):
        raise error(("attributes", "components_"), f"shape {np.shape(components)} disagrees with n_components_ and "
                                                   f"n_features_in_ {expected}")
    return model


def _decode_frame(error, key: str, frame) -> pd.DataFrame:
    parts = (frame.get("columns"), frame.get("dtypes"), frame.get("values")) if isinstance(frame, dict) else ()
    if (len(parts) != 3 or not all(isinstance(part, list) for part in parts) or len({len(p) for p in parts}) != 1
            or not set(parts[1]) <= set(FRAME_DTYPES) or len({np.shape(v) for v in parts[2]}) > 1
            or not all(isinstance(v, np.ndarray) and v.ndim == 1 for v in parts[2])):
        raise error(("frames", key), "not a table of equally long columns of known dtypes")
    columns, dtypes, values = parts
    try:
        return pd.DataFrame({name: pd.Series(column, dtype=dtype) for name, dtype, column in zip(columns, dtypes, values)})
    except (TypeError, ValueError) as exc:
        raise error(("frames", key), str(exc)) from None


def _decode_method(error, key: str, method):
    cls = METHODS.get(method.get("class")) if isinstance(method, dict) else None
    fields = method.get("fields") if cls is not None else None
    if cls is None or not isinstance(fields, dict) or set(fields) != {f.name for f in dataclasses.fields(cls)}:
        raise error(("methods", key), f"not one of distfact's methods {sorted(METHODS)} with its fields")
    try:
        return cls(**fields)
    except (TypeError, ValueError) as exc:
        raise error(("methods", key), str(exc)) from None
