"""Feature names and the top features of components, shared by the estimators and the reports."""

from __future__ import annotations

import numpy as np


def feature_names_of(model, feature_names=None) -> np.ndarray:
    """``feature_names`` if given, else ``model``'s ``feature_names_in_`` (the data's), else "x0", "x1", ...:
    as an object array."""
    if feature_names is None:
        feature_names = getattr(model, "feature_names_in_", None)
    if feature_names is None:
        feature_names = [f"x{j}" for j in range(model.n_features_in_)]
    return np.asarray(feature_names, dtype=object)


def top_feature_names(weights, feature_names: np.ndarray, k: int) -> list[list[str]]:
    """For each row of ``weights`` (components, strata features, ...), the names of its ``k`` largest entries,
    largest first (equal weights in feature order)."""
    return [[str(f) for f in feature_names[np.argsort(-row, kind="stable")[:k]]] for row in weights]
