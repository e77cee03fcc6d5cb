"""One result shape for every estimator: ``objective_history_``, ``group_metrics_`` (names from
``distfact.metrics.METRICS``, the glossary of docs/metrics.md) and the run facts, each checked against the
definitions recomputed in numpy from the fitted factors, and kept by save/load."""

import os
import re

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

import distfact
from distfact.metrics import METRICS
from conftest import grouped_data

RUN_FACTS = ("objective_history_", "group_metrics_", "group_names_", "n_iter_", "n_passes_", "converged_",
             "n_features_in_")
EPS = 1e-10  # SSNMF's default, inside the I-divergence's log


def metric(model, name, group, rank=None) -> float:
    table = model.group_metrics_
    rows = table[(table["metric"] == name) & (table["group"] == group)]
    if rank is not None:
        rows = rows[rows["rank"] == rank]
    assert len(rows) == 1, (name, group, rank)
    return float(rows["value"].iloc[0])


def frobenius_ratio(X_l, reconstruction) -> float:
    return np.linalg.norm(X_l - reconstruction) / np.linalg.norm(X_l)


def i_divergence(X, WH) -> float:
    return float(np.sum(X * np.log((X + EPS) / (WH + EPS)) - X + WH))


def labels_of(groups):
    return (np.asarray(groups) == "g0").astype(int)


def fit(name):
    """(model, X, groups, W, objective recomputed in numpy at the end, reconstruction per group)."""
    X, groups = grouped_data(m=60, n=10, n_groups=3, seed=3)
    if name == "NMF":
        model = distfact.NMF(3, max_iter=30, random_state=0)
        W = model.fit_transform(X, groups=groups)
        return model, X, groups, 0.5 * np.linalg.norm(X - W @ model.components_) ** 2, W @ model.components_
    if name == "NMF-kl":
        model = distfact.NMF(3, beta_loss="kullback-leibler", max_iter=30, random_state=0)
        W = model.fit_transform(X, groups=groups)
        WH = W @ model.components_
        return model, X, groups, float(np.sum(X * np.log(X / WH) - X + WH)), WH
    if name == "FairerNMF":
        model = distfact.FairerNMF(2, n_estimates=2, max_iter=20, estimate_max_iter=30, random_state=0)
        W = model.fit_transform(X, groups=groups)
        WH = W @ model.components_
        names = model.group_names_
        losses = [(np.linalg.norm(X[groups == g] - WH[groups == g]) - model.E_[i]) / np.linalg.norm(X[groups == g])
                  for i, g in enumerate(names)]
        return model, X, groups, max(losses), WH
    if name == "StratifiedNMF":
        model = distfact.StratifiedNMF(2, max_iter=20, random_state=0)
        W = model.fit_transform(X, groups=groups)
        shift = model.strata_features_[pd.Index(model.strata_names_).get_indexer(groups)]
        reconstruction = W @ model.components_ + shift
        return model, X, groups, np.linalg.norm(X - reconstruction) ** 2, reconstruction
    if name == "WeightedL1NMF":
        X = X * (np.random.default_rng(4).random(X.shape) < 0.6)
        model = distfact.WeightedL1NMF(2, lam=0.5, max_iter=5, hals_iter=2, random_state=0)
        W = model.fit_transform(sp.csr_matrix(X), groups=groups)
        WH = W @ model.components_
        objective = np.abs(X - WH)[X > 0].sum() + 0.5 * WH[X == 0].sum()
        return model, X, groups, objective, WH
    if name in ("SSNMF-FF-masked", "SSNMF-DD", "SSNMF-D"):
        model_name = name.split("-")[1]  # 'D': 'DD' fitted without labels, plain I-divergence NMF
        model = distfact.SSNMF(2, model=model_name * (3 - len(model_name)), lam=1.0, max_iter=20, tol=0,
                               random_state=0)
        mask = data_mask(name, X.shape)
        y = labels_of(groups) if len(model_name) == 2 else None
        W = model.fit_transform(X, y=y, groups=groups, mask=mask)
        WH = W @ model.components_
        if model_name == "FF":
            Y = np.eye(2)[y]
            objective = np.linalg.norm(mask * (X - WH)) ** 2 + np.linalg.norm(Y - W @ model.B_) ** 2
        elif model_name == "DD":
            objective = i_divergence(X, WH) + i_divergence(np.eye(2)[y], W @ model.B_)
        else:
            objective = i_divergence(X, WH)
        return model, X, groups, objective, WH
    raise KeyError(name)


def data_mask(name, shape):
    """The 0/1 data mask a factorisation is fitted with (None: every entry observed)."""
    return (np.random.default_rng(5).random(shape) < 0.8).astype(float) if "masked" in name else None


FACTORISATIONS = ["NMF", "NMF-kl", "FairerNMF", "StratifiedNMF", "WeightedL1NMF", "SSNMF-FF-masked", "SSNMF-DD",
                  "SSNMF-D"]


@pytest.mark.parametrize("name", FACTORISATIONS)
def test_every_factorisation_reports_the_relative_error_and_its_objective(name, tmp_path):
    model, X, groups, objective, reconstruction = fit(name)
    for attribute in RUN_FACTS:
        assert hasattr(model, attribute), attribute
    assert list(model.group_metrics_.columns) == ["group", "metric", "value"]
    assert not model.group_metrics_.duplicated(["group", "metric"]).any()
    assert set(model.group_metrics_["metric"]) <= set(METRICS)
    assert list(dict.fromkeys(model.group_metrics_["group"])) == list(model.group_names_)
    mask = data_mask(name, X.shape)  # with a mask: over the observed entries
    observed = (X, reconstruction) if mask is None else (mask * X, mask * reconstruction)
    for g in model.group_names_:
        rows = groups == g
        assert metric(model, "relative_error", g) == pytest.approx(frobenius_ratio(*(Z[rows] for Z in observed)),
                                                                   rel=1e-7), g
    history = model.objective_history_
    assert history.ndim == 1 and len(history) == model.n_iter_ + 1
    assert history[-1] == pytest.approx(objective, rel=1e-7, abs=1e-12)

    model.save(tmp_path / "model.npz")
    loaded = distfact.load(tmp_path / "model.npz")
    pd.testing.assert_frame_equal(loaded.group_metrics_, model.group_metrics_)
    np.testing.assert_array_equal(loaded.objective_history_, model.objective_history_)


def test_the_method_specific_metrics_are_their_definitions():
    model, X, groups, _, WH = fit("WeightedL1NMF")
    for g in model.group_names_:
        rows = groups == g
        assert metric(model, "relative_l1_error", g) == pytest.approx(
            np.abs(X[rows] - WH[rows]).sum() / X[rows].sum(), rel=1e-7)
    model, X, groups, _, WH = fit("FairerNMF")
    for i, g in enumerate(model.group_names_):
        rows = groups == g
        loss = (np.linalg.norm(X[rows] - WH[rows]) - model.E_[i]) / np.linalg.norm(X[rows])
        assert metric(model, "relative_loss", g) == pytest.approx(loss, rel=1e-7)
        assert metric(model, "objective", g) == metric(model, "relative_loss", g)
    model, X, groups, _, WH = fit("SSNMF-D")
    for g in model.group_names_:
        rows = groups == g
        divergence = i_divergence(X[rows], WH[rows])
        assert metric(model, "reconstruction_term", g) == pytest.approx(divergence, rel=1e-7)
        assert metric(model, "relative_i_divergence", g) == pytest.approx(divergence / X[rows].sum(), rel=1e-7)


def test_the_classifier_forwards_its_ssnmf_results(tmp_path):
    X, groups = grouped_data(m=60, n=10, n_groups=3, seed=3)
    clf = distfact.SSNMFClassifier(2, max_iter=20, random_state=0).fit(pd.DataFrame(X, columns=list("abcdefghij")),
                                                                     labels_of(groups))
    for attribute in (*RUN_FACTS, "feature_names_in_"):
        assert getattr(clf, attribute) is getattr(clf.ssnmf_, attribute), attribute
    assert "relative_error" in set(clf.group_metrics_["metric"])
    clf.save(tmp_path / "clf.npz")
    pd.testing.assert_frame_equal(distfact.load(tmp_path / "clf.npz").group_metrics_, clf.group_metrics_)
    assert not hasattr(distfact.SSNMFClassifier(2), "group_metrics_")


@pytest.mark.parametrize("estimator", [distfact.NMF(2, max_iter=5), distfact.FairerNMF(2, n_estimates=1, max_iter=5,
                                                                                         estimate_max_iter=5),
                                       distfact.StratifiedNMF(2, max_iter=5), distfact.WeightedL1NMF(2, max_iter=2),
                                       distfact.SSNMF(2, max_iter=5), distfact.MultigroupSVD(2)],
                         ids=lambda e: type(e).__name__)
def test_feature_names_are_kept(estimator):
    X, groups = grouped_data(m=40, n=6, n_groups=2, seed=1)
    estimator.fit(pd.DataFrame(X, columns=[f"f{j}" for j in range(6)]), groups=groups)
    assert list(estimator.feature_names_in_) == [f"f{j}" for j in range(6)]
    assert estimator.n_features_in_ == 6


@pytest.mark.parametrize("center, scale, n_groups", [(False, False, 2), (True, True, 3)])
def test_the_multigroup_svd_reports_every_rank(center, scale, n_groups, tmp_path):
    rng = np.random.default_rng(7)
    X = rng.standard_normal((90, 6)) * np.linspace(1, 3, 6)
    groups = rng.choice([f"g{i}" for i in range(n_groups)], size=90)
    model = distfact.MultigroupSVD(4, center=center, scale=scale).fit(X, groups=groups)
    for attribute in RUN_FACTS:
        assert hasattr(model, attribute), attribute
    table = model.group_metrics_
    assert list(table.columns) == ["group", "rank", "metric", "value"]
    assert not table.duplicated(["group", "rank", "metric"]).any()
    assert set(table["metric"]) <= set(METRICS)
    assert len(model.objective_history_) == 4
    A = (X - model.mean_) / model.scale_
    V = model.components_
    for g in model.group_names_:
        A_l = A[groups == g]
        for k in range(1, 5):
            V_k = V[:k]
            assert metric(model, "relative_error", g, k) == pytest.approx(
                frobenius_ratio(A_l, A_l @ V_k.T @ V_k), rel=1e-7)
            deflated = A_l - A_l @ V[:k - 1].T @ V[:k - 1]
            h = np.linalg.norm(deflated, 2) ** 2 - np.linalg.norm(A_l @ V[k - 1]) ** 2
            assert metric(model, "objective", g, k) == pytest.approx(h, rel=1e-6, abs=1e-9)
    worst = table[table["metric"] == "objective"].groupby("rank")["value"].max().to_numpy()
    np.testing.assert_allclose(worst, model.objective_history_, rtol=1e-8, atol=1e-10)
    model.save(tmp_path / "svd.npz")
    pd.testing.assert_frame_equal(distfact.load(tmp_path / "svd.npz").group_metrics_, table)


def test_the_docs_glossary_is_the_metrics_dict():
    """docs/metrics.md's glossary table lists exactly ``METRICS``: name, definition and unit."""
    path = os.path.join(os.path.dirname(__file__), os.pardir, "docs", "metrics.md")
    text = open(path, encoding="utf-8").read()
    glossary = text.split("<!-- glossary -->")[1]
    rows = re.findall(r"^\| `([a-z_0-9]+)` \| (.+?) \| (.+?) \|$", glossary, flags=re.M)
    assert {name: (definition, unit) for name, definition, unit in rows} == METRICS
    assert len(rows) == len(METRICS)
