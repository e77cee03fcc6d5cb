"""distfact.SSNMF and SSNMFClassifier: iterates against a direct transcription of the paper's updates
(tests/oracles.py: ssnmf_reference, the paper's orientation), masks, sparse input, passes, bad input."""

import numpy as np
import pytest
import scipy.sparse as sp

import distfact
from conftest import grouped_data
from oracles import ssnmf_reference

M, N, K, R = 60, 25, 3, 4


def problem(seed=0, density=None, masks=False):
    """X (rows = samples), class labels, optional data / label masks: binary (``masks=True``: 80% of the entries
    observed, each block's mask in the complement form; ``masks="few observed"``: 20%, the observed form) or
    certainty weights (``masks="weighted"``: 0, 0.5 or 2, the observed form; ``masks="mostly one"``: 1 at 80% of
    the entries, else 0, 0.5 or 2, the complement form)."""
    X, groups = grouped_data(m=M, n=N, density=density, seed=seed)
    rng = np.random.default_rng(seed + 100)
    y = rng.integers(0, K, size=M)
    data_mask = (rng.random((M, N)) < (0.2 if masks == "few observed" else 0.8)).astype(float) if masks else None
    label_mask = (rng.random((M, K)) < 0.9).astype(float) if masks else None
    if masks == "weighted":
        data_mask *= rng.choice([0.5, 2.0], size=(M, N))
        label_mask *= rng.choice([0.5, 2.0], size=(M, K))
    if masks == "mostly one":  # 1 but at 20% of the entries 0, 0.5 or 2: the complement form, p = 1 - weight 1, 0.5, -1
        data_mask = np.where(data_mask == 1.0, 1.0, rng.choice([0.0, 0.5, 2.0], size=(M, N)))
    W0, H0, B0 = rng.random((M, R)), rng.random((R, N)), rng.random((R, K))
    return X, groups, y, data_mask, label_mask, (W0, H0, B0)


def reference(X, Y, start, model, lam, data_mask=None, label_mask=None, n_iter=6):
    """The oracle in the paper's orientation: X_p = X^T, A = H^T, S = W^T, B_p = B^T."""
    W0, H0, B0 = start
    A, B, S, history = ssnmf_reference(
        X.T, H0.T, W0.T, lam=lam, model=model, Y=None if Y is None else Y.T, B=None if Y is None else B0.T,
        Wm=None if data_mask is None else data_mask.T, Lm=None if label_mask is None else label_mask.T,
        n_iter=n_iter)
    return S.T, A.T, None if B is None else B.T, history


@pytest.mark.parametrize("layout", ["dense", "csr"])
@pytest.mark.parametrize("model", ["FF", "FD", "DF", "DD"])
@pytest.mark.parametrize("masks", [False, True, "few observed", "weighted", "mostly one"])
def test_iterates_equal_the_papers_updates(model, masks, layout):
    """Both sparse forms of a mask (kernels/masked.py), on dense and CSR X, against the paper's updates."""
    X, groups, y, data_mask, label_mask, start = problem(1, density=0.4 if layout == "csr" else None, masks=masks)
    Y = np.eye(K)[y]
    est = distfact.SSNMF(R, model=model, lam=0.7, init="custom", max_iter=6, tol=0, block_rows=9)
    W = est.fit_transform(sp.csr_matrix(X) if layout == "csr" else X, Y=Y, mask=data_mask, label_mask=label_mask,
                          W=start[0], H=start[1], B=start[2], groups=groups)
    W_ref, H_ref, B_ref, history = reference(X, Y, start, model, 0.7, data_mask, label_mask)
    np.testing.assert_allclose(W, W_ref, rtol=1e-10)
    np.testing.assert_allclose(est.components_, H_ref, rtol=1e-10)
    np.testing.assert_allclose(est.B_, B_ref, rtol=1e-10)
    np.testing.assert_allclose(est.loss_history_[1:, 0], history, rtol=1e-10)
    assert est.n_passes_ == est.n_iter_ + 1 == 7  # one read of X per iteration


@pytest.mark.parametrize("loss", ["F", "D"])
@pytest.mark.parametrize("masks", [False, True, "weighted", "mostly one"])
def test_without_targets_it_is_nmf_with_a_data_mask(loss, masks):
    X, groups, _, data_mask, _, start = problem(2, masks=masks)
    est = distfact.SSNMF(R, model=loss * 2, init="custom", max_iter=5, tol=0, block_rows=11)
    W = est.fit_transform(X, mask=data_mask, W=start[0], H=start[1])
    W_ref, H_ref, _, history = reference(X, None, start, loss + "?", 1.0, data_mask, n_iter=5)
    np.testing.assert_allclose(W, W_ref, rtol=1e-10)
    np.testing.assert_allclose(est.components_, H_ref, rtol=1e-10)
    np.testing.assert_allclose(est.loss_history_[1:, 0], history, rtol=1e-10)
    assert est.B_ is None


@pytest.mark.parametrize("model", ["FF", "DD", "FD"])
def test_sparse_dense_and_implicit_explicit_masks_agree(model):
    X, groups, y, _, _, start = problem(3, density=0.3)
    kwargs = dict(model=model, init="custom", max_iter=5, tol=0, block_rows=13)
    fits = []
    for data, mask in ((X, None), (sp.csr_matrix(X), None), (sp.csr_matrix(X), np.ones_like(X)),
                       (X, sp.csr_matrix(np.ones_like(X)))):
        est = distfact.SSNMF(R, **kwargs)
        W = est.fit_transform(data, y=y, mask=mask, W=start[0], H=start[1], B=start[2])
        fits.append((W, est.components_, est.B_, est.loss_history_))
    for other in fits[1:]:
        for ours, theirs in zip(fits[0], other):
            np.testing.assert_allclose(ours, theirs, rtol=1e-10)


def test_data_mask_is_the_former_name_of_mask():
    X, groups, y, data_mask, _, _ = problem(6, masks=True)
    est = distfact.SSNMF(R, model="FF", max_iter=4, tol=0, random_state=2)
    W = est.fit_transform(X, y=y, mask=data_mask)
    with pytest.warns(FutureWarning, match="data_mask is now called mask"):
        W_old = est.fit_transform(X, y=y, data_mask=data_mask)
    assert np.array_equal(W, W_old)
    with pytest.warns(FutureWarning, match="called mask"):
        assert np.array_equal(est.transform(X, data_mask=data_mask), est.transform(X, mask=data_mask))
    with pytest.raises(ValueError, match="as mask only"):
        est.fit(X, y=y, mask=data_mask, data_mask=data_mask)


def test_ff_objective_is_non_increasing_and_random_start_is_reproducible():
    X, groups, y, data_mask, label_mask, _ = problem(4, masks=True)
    fits = [distfact.SSNMF(R, model="FF", lam=1.0, max_iter=40, tol=0, random_state=5).fit(
        X, y=y, mask=data_mask, label_mask=label_mask, groups=groups) for _ in range(2)]
    F = fits[0].loss_history_[:, 0]
    assert np.all(np.diff(F) <= 1e-12 * F[:-1]) and F[-1] < F[0]
    assert np.array_equal(fits[0].components_, fits[1].components_)
    assert np.allclose(fits[0].loss_history_[:, 0], fits[0].loss_history_[:, 1] + fits[0].loss_history_[:, 2])


def test_unlabelled_rows_only_enter_the_reconstruction():
    X, groups, y, _, _, start = problem(5)
    y_partial = np.where(np.arange(M) % 4 == 0, -1, y)
    est = distfact.SSNMF(R, model="FD", lam=1.0, init="custom", max_iter=4, tol=0)
    W = est.fit_transform(X, y=y_partial, W=start[0], H=start[1], B=start[2])
    Y = np.eye(K)[y]
    L = np.ones((M, K)) * (y_partial != -1)[:, None]
    W_ref, _, B_ref, _ = reference(X, Y, start, "FD", 1.0, label_mask=L, n_iter=4)
    np.testing.assert_allclose(W, W_ref, rtol=1e-10)
    np.testing.assert_allclose(est.B_, B_ref, rtol=1e-10)
    assert list(est.classes_) == [0, 1, 2]


def test_stopping_rule_is_the_packages():
    X, groups, y, _, _, _ = problem(6)
    est = distfact.SSNMF(R, model="FF", max_iter=500, tol=1e-3, random_state=0).fit(X, y=y)
    F = est.loss_history_[:, 0]
    assert est.converged_ and est.n_iter_ < 500
    assert (F[-2] - F[-1]) / F[1] < 1e-3 and np.all((F[1:-2] - F[2:-1]) / F[1] >= 1e-3)


def test_classifier_on_separable_data():
    rng = np.random.default_rng(7)
    topics = rng.random((3, 40)) * (rng.random((3, 40)) < 0.3)
    y = rng.integers(0, 3, size=300)
    X = topics[y] * rng.uniform(0.5, 1.5, size=(300, 1)) + 0.01 * rng.random((300, 40))
    train, test = np.arange(200), np.arange(200, 300)
    for model in ("FF", "DD"):
        clf = distfact.SSNMFClassifier(6, model=model, max_iter=300, tol=0, random_state=0).fit(X[train], y[train])
        assert clf.score(X[test], y[test]) > 0.9
        proba = clf.predict_proba(X[test])
        np.testing.assert_allclose(proba.sum(axis=1), 1.0)
        assert np.array_equal(clf.predict(X[test]), clf.classes_[proba.argmax(axis=1)])
    with pytest.raises(ValueError, match="not seen in fit"):
        clf.score(X[test], np.full(100, 7))


def test_defaults_reproduce_the_paper():
    """Section 3.2's finding with defaults only (SSNMFClassifier(13) and one seed) on scikit-learn's bundled digits
    (20 Newsgroups is not bundled): the default (D,F) model, the paper's best, classifies far better than (F,F) with
    the paper's Table 6 setting (lam 100, tol 1e-4; 0.708 against 0.875), and as well as (D,D) (lam 1000, tol 1e-3;
    0.892); accuracies counted here from predict."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    X, y = load_digits(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.2, random_state=0, stratify=y)
    accuracy = {}
    for name, clf in [("default", distfact.SSNMFClassifier(13, random_state=0)),
                      ("FF", distfact.SSNMFClassifier(13, model="FF", lam=100.0, tol=1e-4, random_state=0)),
                      ("DD", distfact.SSNMFClassifier(13, model="DD", lam=1000.0, tol=1e-3, random_state=0))]:
        accuracy[name] = np.mean(clf.fit(X_train, y_train).predict(X_test) == y_test)
    assert accuracy["default"] >= 0.85, accuracy
    assert accuracy["default"] >= accuracy["FF"] + 0.1, accuracy
    assert accuracy["default"] >= accuracy["DD"] - 0.03, accuracy


def test_transform_f_is_exact_nnls_per_row():
    from scipy.optimize import nnls

    X, groups, y, _, _, _ = problem(8)
    est = distfact.SSNMF(R, model="FF", max_iter=30, tol=0, random_state=1).fit(X, y=y)
    W = est.transform(X[:10])
    for i in range(10):
        np.testing.assert_allclose(W[i], nnls(est.components_.T, X[i])[0], rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("kwargs, message", [
    (dict(Y=-np.ones((M, 2))), "Y has negative values"),
    (dict(Y=np.ones((M, 2)), y=np.zeros(M)), "either Y .* or y"),
    (dict(y=np.zeros(M - 1)), "one label per row"),
    (dict(y=np.full(M, -1)), "no labelled row"),
    (dict(y=np.zeros(M), mask=np.ones((M, N + 1))), "mask has shape"),
    (dict(y=np.zeros(M), label_mask=np.ones((M, 3))), "label_mask has shape"),
    (dict(label_mask=np.ones((M, 1))), "label_mask needs Y or y"),
])
def test_bad_input_is_refused(kwargs, message):
    X, *_ = problem(9)
    with pytest.raises(ValueError, match=message):
        distfact.SSNMF(R).fit(X, **kwargs)


def test_bad_parameters_are_refused():
    X, *_ = problem(9)
    with pytest.raises(ValueError, match="model must be one of"):
        distfact.SSNMF(R, model="FX").fit(X)
    with pytest.raises(ValueError, match="lam must be"):
        distfact.SSNMF(R, lam=-1).fit(X)


def _fit_ssnmf(data, y, data_mask, client=None, **kwargs):
    est = distfact.SSNMF(R, model="DF", max_iter=6, tol=0, random_state=3, **kwargs)
    W = est.fit_transform(data, y=y, mask=data_mask, client=client)
    return W, est.components_, est.B_, est.loss_history_


def test_out_of_core_local_state_and_resume_give_the_same_result(tmp_path):
    """Targets and masks travel with W: spilled to Zarr (sparse mask included) and checkpointed."""
    X, groups, y, data_mask, _, _ = problem(10, density=0.4, masks=True)
    store = distfact.from_arrays(sp.csr_matrix(X), groups, tmp_path / "x.zarr", block_rows=14)
    reference = _fit_ssnmf(store, y, sp.csr_matrix(data_mask))
    spilled = _fit_ssnmf(store, y, sp.csr_matrix(data_mask), local_memory_budget=1)
    for ours, theirs in zip(reference, spilled):
        assert np.array_equal(ours, theirs)

    def crash(info):
        if info.iteration == 4:
            raise KeyboardInterrupt("simulated crash")
    with pytest.raises(KeyboardInterrupt):
        _fit_ssnmf(store, y, data_mask, checkpoint_dir=tmp_path / "run", checkpoint_every=2, callback=crash)
    resumed = _fit_ssnmf(store, y, data_mask, checkpoint_dir=tmp_path / "run", checkpoint_every=2, resume=True)
    for ours, theirs in zip(reference, resumed):
        assert np.array_equal(ours, theirs)


@pytest.mark.cluster
def test_bitwise_identical_on_threads_and_on_a_local_cluster(local_cluster_client, tmp_path):
    X, groups, y, data_mask, _, _ = problem(11, density=0.4, masks=True)
    store = distfact.from_arrays(sp.csr_matrix(X), groups, tmp_path / "x.zarr", block_rows=14)
    threads = _fit_ssnmf(store, y, data_mask, n_threads=2)
    cluster = _fit_ssnmf(store, y, data_mask, client=local_cluster_client)
    for ours, theirs in zip(threads, cluster):
        assert np.array_equal(ours, theirs)


def test_transform_with_a_data_mask_equals_the_masked_updates():
    """Section 2.3 with missing data: the masked reconstruction's updates, H fixed, each block's own mask rows."""
    X, groups, y, data_mask, _, _ = problem(12, masks=True)
    est = distfact.SSNMF(R, model="DF", max_iter=20, tol=0, random_state=2, block_rows=8).fit(X, y=y)
    W = est.transform(X, mask=data_mask, max_iter=7, tol=0)
    H, W_ref = est.components_, np.ones((M, R))
    for _ in range(7):  # the I-divergence S update of Algorithm 2 without the label term, rows as samples
        Q = (data_mask * X) / (1e-10 + data_mask * (W_ref @ H)) * data_mask
        W_ref = W_ref / (1e-10 + data_mask @ H.T) * (Q @ H.T)
    np.testing.assert_allclose(W, W_ref, rtol=1e-10)


def test_resume_refuses_other_labels(tmp_path):
    X, groups, y, _, _, _ = problem(13)
    kwargs = dict(model="FF", max_iter=4, tol=0, random_state=0, checkpoint_dir=tmp_path / "run", checkpoint_every=2)
    distfact.SSNMF(R, **kwargs).fit(X, y=y)
    with pytest.raises(ValueError, match="configuration"):
        distfact.SSNMF(R, resume=True, **kwargs).fit(X, y=(y + 1) % K)


@pytest.mark.parametrize("sparse", [False, True])
def test_a_float32_blocks_squared_norm_is_accumulated_in_float64(sparse):
    """||X_b||^2, a constant of the Frobenius terms' losses: a float32 block's summed in float64 (BLAS's float32
    dot of this dense block is about 2.5e-5 off, relative), equal to a float64 sum of its entries' squares."""
    from distfact.kernels.ssnmf import sq_norm

    rng = np.random.default_rng(0)
    X = (sp.random(2000, 3000, density=0.05, format="csr", random_state=0, dtype=np.float32) if sparse
         else rng.random((2000, 3000), dtype=np.float32))
    values = (X.data if sparse else X.ravel()).astype(np.float64)
    assert sq_norm(X) == pytest.approx(float(np.sum(values * values)), rel=1e-12)
