"""Fitted tables made when first read (``estimators/tables.py``, issue 19): the same tables as before, each fit's
own, and saved, copied and pickled like any fitted attribute."""

import copy
import pickle

import numpy as np
import pandas as pd
import pytest

import distfact
from conftest import grouped_data


def expected_metrics(model, names) -> pd.DataFrame:
    """group_metrics_ built by hand from the fitted per-group arrays: one row per group and metric."""
    values = {"relative_error": model.group_errors_, "objective": model.group_losses_}
    rows = [(group, name, float(values[name][g])) for g, group in enumerate(names) for name in values]
    return pd.DataFrame(rows, columns=["group", "metric", "value"])


def assert_same_table(table, expected):
    assert list(table.columns) == list(expected.columns)
    for column in expected.columns:
        assert table[column].tolist() == expected[column].tolist(), column


def test_a_fit_makes_its_tables_when_first_read():
    X, groups = grouped_data(seed=1)
    model = distfact.NMF(3, max_iter=5, random_state=0).fit(X, groups=groups)
    assert "group_metrics_" not in vars(model)
    table = model.group_metrics_
    assert_same_table(table, expected_metrics(model, model.group_names_))
    assert vars(model)["group_metrics_"] is table and model.group_metrics_ is table  # made once
    assert "_table_makers" not in vars(model)  # nor kept once made
    later = copy.copy(model)  # a copy taken after the read has the same table
    assert later.group_metrics_ is table


def test_an_unfitted_estimator_has_no_table():
    model = distfact.NMF(3)
    assert not hasattr(model, "group_metrics_")
    with pytest.raises(AttributeError, match="'NMF' object has no attribute 'group_metrics_'"):
        model.group_metrics_


def test_a_refit_replaces_a_table_read_before_and_a_later_change_of_the_arrays_is_not_the_tables():
    X, groups = grouped_data(seed=2)
    model = distfact.NMF(3, max_iter=5, random_state=0).fit(X, groups=groups)
    first = model.group_metrics_
    model.fit(X[:60], groups=groups[:60])
    names = model.group_names_
    expected = expected_metrics(model, names)
    model.group_errors_[:] = -1.0  # in place, before the new table is read
    assert_same_table(model.group_metrics_, expected)
    assert not model.group_metrics_.equals(first)


def test_copies_pickles_and_saved_models_have_the_tables(tmp_path):
    X, groups = grouped_data(seed=3)
    model = distfact.MultigroupSVD(2).fit(X, groups=groups)
    shallow, pickled = copy.copy(model), pickle.loads(pickle.dumps(model))
    model.save(tmp_path / "model.npz")  # unread tables are made and saved
    loaded = distfact.load(tmp_path / "model.npz")
    for name in ("group_metrics_", "group_losses_"):
        table = getattr(model, name)
        for other in (shallow, pickled, loaded):
            assert getattr(other, name).equals(table), name
    # group_losses_ against the fitted losses of the standard SVD's own path (losses_of, a second call)
    direct = model.losses_of(model.components_)
    np.testing.assert_allclose(model.group_losses_[["marginal", "incremental", "reconstruction"]].to_numpy(),
                               direct[["marginal", "incremental", "reconstruction"]].to_numpy(), rtol=1e-9,
                               atol=1e-12)
