import numpy as np
import pytest
import scipy.sparse as sp


def grouped_data(m=120, n=30, n_groups=3, density=None, seed=0, dtype=np.float64):
    """Non-negative X with scattered group labels (so the store has to reorder rows)."""
    rng = np.random.default_rng(seed)
    X = rng.random((m, n))
    if density is not None:
        X = X * (rng.random((m, n)) < density)
    groups = rng.choice([f"g{i}" for i in range(n_groups)], size=m)
    return X.astype(dtype), groups


@pytest.fixture
def dense_data():
    return grouped_data()


@pytest.fixture
def sparse_data():
    X, groups = grouped_data(density=0.3)
    return sp.csr_matrix(X), groups


@pytest.fixture(scope="session")
def local_cluster_client():
    """A real LocalCluster: a scheduler and two single-threaded worker processes on loopback."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        yield client
