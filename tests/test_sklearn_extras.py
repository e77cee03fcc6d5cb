"""scikit-learn conventions beyond check_estimator: feature names out and pandas output, metadata routing of
``groups`` through Pipeline and GridSearchCV, clone and pickle of fitted models, read-only memory-mapped input,
FairerNMF.transform, and ConvergenceWarnings that point at the user's call."""

import pickle
import warnings

import numpy as np
import pandas as pd
import pytest
import sklearn
from scipy.optimize import nnls
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.model_selection import GridSearchCV, GroupKFold, cross_validate
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import MaxAbsScaler

import distfact
from conftest import grouped_data

# small iteration counts: these tests are about the plumbing, not the optima
ESTIMATORS = {
    "NMF": lambda: distfact.NMF(3, random_state=0, max_iter=30),
    "FairerNMF": lambda: distfact.FairerNMF(3, n_estimates=1, max_iter=30, estimate_max_iter=30, random_state=0),
    "StratifiedNMF": lambda: distfact.StratifiedNMF(3, random_state=0, max_iter=30),
    "WeightedL1NMF": lambda: distfact.WeightedL1NMF(3, random_state=0, max_iter=5),
    "SSNMF": lambda: distfact.SSNMF(3, random_state=0, max_iter=30),
    "MultigroupSVD": lambda: distfact.MultigroupSVD(3),
    "SSNMFClassifier": lambda: distfact.SSNMFClassifier(3, random_state=0, max_iter=30),
}


def fit_args(name, groups, y):
    """What each estimator's fit takes besides X: the rows' groups, or (the classifier) their labels."""
    return ((y,), {}) if name == "SSNMFClassifier" else ((), {"groups": groups})


def transform_kwargs(name, groups):
    """StratifiedNMF needs the new rows' strata; the others read W from X alone."""
    return {"groups": groups} if name == "StratifiedNMF" else {}


@pytest.fixture
def data():
    X, groups = grouped_data(m=90, n=12)
    y = (X[:, 0] > X[:, 1]).astype(int)
    return X, groups, y


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("name", ESTIMATORS)
def test_feature_names_out_and_pandas_output(name, data):
    """Columns named as scikit-learn's decompositions name them (nmf0, nmf1, ...), X's index kept, the values
    those of the default (ndarray) output; fitted on a DataFrame, the estimator keeps its column names."""
    X, groups, y = data
    frame = pd.DataFrame(X, columns=[f"word{j}" for j in range(X.shape[1])], index=np.arange(1000, 1000 + len(X)))
    args, kwargs = fit_args(name, groups, y)
    with pytest.raises(NotFittedError):
        ESTIMATORS[name]().get_feature_names_out()
    estimator = ESTIMATORS[name]().set_output(transform="pandas")
    W_fit = estimator.fit_transform(frame, *args, **kwargs)
    expected = [f"{name.lower()}{i}" for i in range(3)]
    assert list(estimator.get_feature_names_out()) == expected
    assert list(estimator.get_feature_names_out(frame.columns)) == expected  # input names checked against fit's
    fitted = estimator.ssnmf_ if name == "SSNMFClassifier" else estimator  # the classifier's SSNMF holds them
    assert list(fitted.feature_names_in_) == list(frame.columns)
    W = estimator.transform(frame, **transform_kwargs(name, groups))
    for out in (W_fit, W):
        assert isinstance(out, pd.DataFrame)
        assert list(out.columns) == expected and out.index.equals(frame.index)
    plain = estimator.set_output(transform="default").transform(frame, **transform_kwargs(name, groups))
    assert isinstance(plain, np.ndarray)
    np.testing.assert_array_equal(W.to_numpy(), plain)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("name", ESTIMATORS)
def test_clone_and_pickle_of_fitted_models(name, data):
    """clone gives the unfitted estimator with the same parameters; a pickled fitted model transforms as the
    original does, bitwise."""
    X, groups, y = data
    args, kwargs = fit_args(name, groups, y)
    fitted = ESTIMATORS[name]().fit(X, *args, **kwargs)
    copy = clone(fitted)
    assert copy.get_params() == fitted.get_params() and not hasattr(copy, "n_features_in_")
    restored = pickle.loads(pickle.dumps(fitted))
    np.testing.assert_array_equal(restored.transform(X, **transform_kwargs(name, groups)),
                                  fitted.transform(X, **transform_kwargs(name, groups)))


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("name", ESTIMATORS)
def test_read_only_memory_mapped_input(name, data, tmp_path):
    """fit and transform take an .npy memory-mapped read-only, with the results of the array in memory."""
    X, groups, y = data
    np.save(tmp_path / "X.npy", X)
    mapped = np.load(tmp_path / "X.npy", mmap_mode="r")
    assert not mapped.flags.writeable
    args, kwargs = fit_args(name, groups, y)
    from_map = ESTIMATORS[name]().fit(mapped, *args, **kwargs)
    in_memory = ESTIMATORS[name]().fit(X, *args, **kwargs)
    np.testing.assert_array_equal(from_map.components_ if hasattr(from_map, "components_")
                                  else from_map.ssnmf_.components_,
                                  in_memory.components_ if hasattr(in_memory, "components_")
                                  else in_memory.ssnmf_.components_)
    np.testing.assert_array_equal(from_map.transform(mapped, **transform_kwargs(name, groups)),
                                  in_memory.transform(X, **transform_kwargs(name, groups)))
    np.testing.assert_array_equal(mapped, X)  # untouched


def test_fairer_transform_is_the_nonnegative_least_squares_of_each_row():
    """With H fixed, each new row's W is argmin over w >= 0 of ||x - w H|| (scipy's NNLS, row by row), for
    rows of any group and whatever groups are passed."""
    X, groups = grouped_data(m=90, n=12)
    model = distfact.FairerNMF(3, n_estimates=2, random_state=0).fit(X, groups=groups)
    new, new_groups = grouped_data(m=25, n=12, seed=1)
    H = model.components_
    oracle = np.array([nnls(H.T, row)[0] for row in new])
    W = model.transform(new)
    np.testing.assert_allclose(W, oracle, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(model.transform(new, groups=new_groups), W, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="12 features"):
        model.transform(new[:, :5])


def reconstruction_score(estimator, X, y=None):
    """GridSearchCV's scoring for a factorisation (they have no ``score``): minus ||X - transform(X) H||_F."""
    return -np.linalg.norm(X - estimator.inverse_transform(estimator.transform(X)))


def test_pipeline_routes_groups_to_the_estimator():
    """With metadata routing, Pipeline.fit(X, groups=g) gives the NMF step g: its fit equals a direct fit on the
    scaled X with g, bitwise."""
    X, groups = grouped_data(m=90, n=12)
    with sklearn.config_context(enable_metadata_routing=True):
        pipe = Pipeline([("scale", MaxAbsScaler()),
                         ("nmf", distfact.NMF(3, random_state=0, tol=1e-3).set_fit_request(groups=True))])
        pipe.fit(X, groups=groups)
    direct = distfact.NMF(3, random_state=0, tol=1e-3).fit(MaxAbsScaler().fit_transform(X), groups=groups)
    assert pipe["nmf"].group_names_ == direct.group_names_ == ["g0", "g1", "g2"]
    np.testing.assert_array_equal(pipe["nmf"].components_, direct.components_)
    np.testing.assert_array_equal(pipe["nmf"].group_losses_, direct.group_losses_)


def test_grid_search_routes_groups_to_the_splitter_and_the_estimator():
    """GridSearchCV(..., cv=GroupKFold).fit(X, groups=g): the splitter keeps groups apart and each fold's
    estimator is fitted with its training rows' groups; the refitted best estimator equals a direct fit."""
    X, groups = grouped_data(m=90, n=12)
    splits = list(GroupKFold(n_splits=3).split(X, groups=groups))
    seen = []

    def recording_score(estimator, X_test, y=None):
        seen.append(list(estimator.group_names_))
        return reconstruction_score(estimator, X_test)

    with sklearn.config_context(enable_metadata_routing=True):
        search = GridSearchCV(distfact.NMF(random_state=0, tol=1e-3).set_fit_request(groups=True),
                              {"n_components": [2, 3]}, scoring=recording_score, cv=GroupKFold(n_splits=3))
        search.fit(X, groups=groups)
    per_fold = [sorted(set(groups[train])) for train, _ in splits]
    assert all(len(names) == 2 for names in per_fold)  # each training fold lacks the test fold's group
    assert seen == per_fold * 2  # both candidates, fold by fold
    best = distfact.NMF(search.best_params_["n_components"], random_state=0, tol=1e-3).fit(X, groups=groups)
    np.testing.assert_array_equal(search.best_estimator_.components_, best.components_)
    assert search.cv_results_["mean_test_score"].shape == (2,)


def test_cross_validation_fits_each_fold_on_its_rows_with_their_groups():
    """Each fold's estimator equals a direct fit on its training rows with their groups, bitwise."""
    X, groups = grouped_data(m=90, n=12)
    with sklearn.config_context(enable_metadata_routing=True):
        result = cross_validate(distfact.NMF(3, random_state=0, tol=1e-3).set_fit_request(groups=True), X,
                                params={"groups": groups}, cv=GroupKFold(n_splits=3), scoring=reconstruction_score,
                                return_estimator=True, return_indices=True)
    for estimator, train in zip(result["estimator"], result["indices"]["train"]):
        direct = distfact.NMF(3, random_state=0, tol=1e-3).fit(X[train], groups=groups[train])
        np.testing.assert_array_equal(estimator.components_, direct.components_)


UNCONVERGED = {
    "NMF": lambda: distfact.NMF(3, max_iter=2, random_state=0),
    "WeightedL1NMF": lambda: distfact.WeightedL1NMF(3, max_iter=2, random_state=0),
    "FairerNMF": lambda: distfact.FairerNMF(3, n_estimates=1, max_iter=2, random_state=0),
    "FairerNMF E_l": lambda: distfact.FairerNMF(3, n_estimates=1, estimate_max_iter=2, max_iter=2, random_state=0),
}


@pytest.mark.parametrize("name", UNCONVERGED)
@pytest.mark.parametrize("call", ["fit", "fit_transform"])
def test_convergence_warnings_point_at_the_callers_line(name, call):
    """A fit stopped by an iteration cap warns at the caller's line (not inside distfact or scikit-learn's
    set_output wrapper), naming the parameter to raise."""
    X, groups = grouped_data(m=60, n=10)
    estimator = UNCONVERGED[name]()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        getattr(estimator, call)(X, groups=groups)
    found = [w for w in caught if issubclass(w.category, ConvergenceWarning)]
    assert len(found) == (2 if name == "FairerNMF E_l" else 1)
    for w in found:
        assert w.filename == __file__, (w.filename, w.lineno)
        assert "max_iter=...)" in str(w.message)
    parameter = "estimate_max_iter" if name == "FairerNMF E_l" else "max_iter"
    assert f"({parameter}=...)" in str(found[0].message)
