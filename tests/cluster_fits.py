"""One small fit per method for the cluster tests, and the driver they kill (in a child of the tests' forkserver)."""

import numpy as np

import distfact
from conftest import grouped_data

METHODS = ("nmf", "fairer-nmf", "stratified-nmf", "wl1-nmf", "ssnmf", "multigroup-svd")
ITERATIVE = METHODS[:-1]


def estimator(method: str, n_components: int = 3, **overrides):
    """The estimator of ``method`` with the tests' settings; ``overrides`` replace or add parameters."""
    classes = {"nmf": (distfact.NMF, dict(solver="hals", max_iter=8, tol=0, random_state=0)),
               "fairer-nmf": (distfact.FairerNMF, dict(n_estimates=2, max_iter=6, estimate_max_iter=6,
                                                       random_state=0)),
               "stratified-nmf": (distfact.StratifiedNMF, dict(max_iter=6, random_state=0)),
               "wl1-nmf": (distfact.WeightedL1NMF, dict(lam=0.5, max_iter=3, random_state=0)),
               "ssnmf": (distfact.SSNMF, dict(model="DF", max_iter=6, random_state=0)),
               "multigroup-svd": (distfact.MultigroupSVD, dict(center=True, scale=True))}
    cls, params = classes[method]
    return cls(n_components, **{**params, **overrides})


def method_store(method: str, path):
    """A 240 x 20 store of 6 row blocks in 3 groups (signed for the multigroup SVD)."""
    X, groups = grouped_data(m=240, n=20, n_groups=3, density=0.4)
    return distfact.from_arrays(X, groups, path, block_rows=40, signed=method == "multigroup-svd")


def fit_inputs(method: str, store) -> dict:
    """What ``fit`` needs besides the store: SSNMF's labels (each row's group)."""
    if method != "ssnmf":
        return {}
    labels = np.empty(store.shape[0], dtype=object)
    labels[store.row_index()] = np.repeat(store.group_names, store.group_sizes)
    return {"y": labels}


def fit_on_the_cluster(method: str, params: dict, store_path: str, scheduler_file: str) -> None:
    """The driver of a fit that test_cluster_faults.py kills: ``estimator(method, **params)`` fitted on the store at
    ``store_path`` on the cluster of ``scheduler_file``."""
    from distributed import Client

    store = distfact.open(store_path)
    with Client(scheduler_file=scheduler_file) as client:
        estimator(method, **params).fit(store, client=client, **fit_inputs(method, store))
