"""MultigroupSVD (Matakos, Ciaperoni and Mannila, 2025) against independent oracles: numpy's SVD, brute force over
the unit circle and over the dual simplex, losses recomputed from the data, a second code path."""

import numpy as np
import pytest
import scipy.sparse as sp

import distfact
from distfact.datasets import load_heart_multigroup
from distfact.kernels.gram import deflate, solve_on_complement, top_eigenpairs, top_eigenvalue
from distfact.methods.multigroup_svd import solvers as mg


def groups_data(sizes=(60, 40), n=8, seed=0, shift=3.0):
    """Groups with different covariances and means (so centring and the groups matter)."""
    rng = np.random.default_rng(seed)
    blocks = [rng.standard_normal((m, n)) @ rng.standard_normal((n, n)) + shift * rng.standard_normal(n)
              for m in sizes]
    labels = np.concatenate([[f"g{i}"] * m for i, m in enumerate(sizes)])
    X = np.concatenate(blocks)
    order = rng.permutation(len(X))  # groups interleaved in the input
    return X[order], labels[order]


def standardised_groups(X, labels):
    """Section 8.1's standardisation, directly: columns centred and divided by their population std."""
    Z = (X - X.mean(axis=0)) / X.std(axis=0)
    return [Z[labels == g] for g in np.unique(labels)]


def primal(groups, v):
    """f(v) = max_l sigma_1^2(A_l) - ||A_l v||^2, from the data."""
    return max(np.linalg.norm(A, 2) ** 2 - np.linalg.norm(A @ v) ** 2 for A in groups)


def test_one_group_is_the_svd():
    X, _ = groups_data((90,), n=7)
    for data in (X, sp.csr_matrix(X)):
        model = distfact.MultigroupSVD(5, center=False, scale=False).fit(data)
        _, S, Vt = np.linalg.svd(X, full_matrices=False)
        signs = np.sign(np.sum(model.components_ * Vt[:5], axis=1))
        np.testing.assert_allclose(model.components_ * signs[:, None], Vt[:5], atol=1e-9)
        np.testing.assert_allclose(model.singular_values_[0], S[:5], rtol=1e-10)
        np.testing.assert_allclose(model.duality_gap_, 0, atol=1e-9 * S[0] ** 2)


def test_two_groups_equal_incremental_losses_and_zero_gap():
    X, labels = groups_data((70, 30), n=9)
    model = distfact.MultigroupSVD(8, center=True, scale=True).fit(X, groups=labels)
    assert model.solver_ == "brent" and model.n_passes_ == 1
    losses = model.group_losses_.pivot(index="rank", columns="group", values="incremental").to_numpy()
    np.testing.assert_allclose(losses[:, 0], losses[:, 1], rtol=1e-9, atol=1e-9)  # Lemma 7.3
    assert np.all(np.abs(model.duality_gap_) < 1e-8)
    np.testing.assert_allclose(model.components_ @ model.components_.T, np.eye(8), atol=1e-12)


def incremental_losses(groups, V):
    """Each group's incremental loss at ranks 1..len(V) (Section 4), from the data: the running sum of
    sigma_1^2(A_l P) - ||A_l P v_r||^2, P the projection off v_1..v_{r-1}."""
    losses = []
    for A in groups:
        P, total, row = np.eye(A.shape[1]), 0.0, []
        for v in V:
            deflated = A @ P
            total += np.linalg.norm(deflated, 2) ** 2 - np.linalg.norm(deflated @ v) ** 2
            row.append(total)
            P = P - np.outer(v, v)
        losses.append(row)
    return np.array(losses)


def test_defaults_reproduce_the_paper():
    """Issue 18: MultigroupSVD(rank) with nothing else reproduces the paper's headline (Matakos, Ciaperoni and
    Mannila, 2025, Section 8.2, heart by sex): on Section 8.1's standardised columns the multigroup vectors give
    both groups the same incremental loss at every rank 1..8 (Lemma 7.3), the standard SVD does not. Measured:
    equal to 4e-14 (relative); the SVD's loss is 2.3x to 3.9x larger for women than for men (620.5 vs 204.5
    at rank 8)."""
    X, sex, _ = load_heart_multigroup()
    model = distfact.MultigroupSVD(8).fit(X, groups=sex)
    assert model.center and model.scale and model.solver_ == "brent"
    Z = (X - X.mean(axis=0)) / X.std(axis=0)  # Section 8.1, independently of the estimator
    groups = [Z[sex == g] for g in ("Female", "Male")]
    multigroup = incremental_losses(groups, model.components_)
    np.testing.assert_allclose(multigroup[0], multigroup[1], rtol=1e-8)  # every rank 1..8
    reported = model.group_losses_.pivot(index="rank", columns="group", values="incremental")
    np.testing.assert_allclose(reported[["Female", "Male"]].to_numpy().T, multigroup, rtol=1e-8)
    svd = incremental_losses(groups, np.linalg.svd(Z, full_matrices=False)[2][:8])
    assert np.all(svd[0] / svd[1] > 2)  # measured 2.31 (rank 1) to 3.89 (rank 3)
    assert svd[0, -1] == pytest.approx(620.48, abs=0.01) and svd[1, -1] == pytest.approx(204.48, abs=0.01)


def test_losses_recomputed_from_the_standardised_data():
    X, labels = groups_data((50, 40, 30), n=6)
    model = distfact.MultigroupSVD(4, center=True, scale=True).fit(X, groups=labels)
    groups = standardised_groups(X, labels)
    V = model.components_
    for l, A in enumerate(groups):
        sigma2 = np.linalg.svd(A, compute_uv=False) ** 2
        rows = model.group_losses_[model.group_losses_.group == f"g{l}"]
        for r in range(1, 5):
            captured = np.linalg.norm(A @ V[:r].T) ** 2
            assert rows.reconstruction.iloc[r - 1] == pytest.approx(np.linalg.norm(A - A @ V[:r].T @ V[:r]) ** 2,
                                                                    rel=1e-10)
            assert rows.marginal.iloc[r - 1] == pytest.approx(sigma2[:r].sum() - captured, rel=1e-9, abs=1e-9)
        # incremental: the sum of the rank-1 losses on the data deflated by the earlier vectors
        incremental, P = 0.0, np.eye(6)
        for r in range(4):
            Ad = A @ P
            incremental += np.linalg.norm(Ad, 2) ** 2 - np.linalg.norm(Ad @ V[r]) ** 2
            assert rows.incremental.iloc[r] == pytest.approx(incremental, rel=1e-9, abs=1e-9)
            P = P - np.outer(V[r], V[r])
        np.testing.assert_allclose(model.explained_variance_[l], np.linalg.norm(A @ V.T, axis=0) ** 2 / len(A),
                                   rtol=1e-10)


@pytest.mark.parametrize("solver", ["brent", "fw", "sdp"])
def test_rank_one_optimum_by_brute_force_on_the_unit_circle(solver):
    X, labels = groups_data((40, 25), n=2, seed=3)
    groups = [X[labels == g] for g in ("g0", "g1")]
    model = distfact.MultigroupSVD(1, solver=solver, tol=1e-10, center=False, scale=False).fit(X, groups=labels)
    theta = np.linspace(0, np.pi, 200_001)
    circle = np.stack([np.cos(theta), np.sin(theta)])
    values = np.max([np.linalg.norm(A, 2) ** 2 - np.sum((A @ circle) ** 2, axis=0) for A in groups], axis=0)
    best = values.min()
    found = primal(groups, model.components_[0])
    assert found <= best + 1e-9 * max(1.0, abs(best))
    assert found >= best - 1e-4 * max(1.0, abs(best))  # the grid's resolution
    assert model.primal_objective_[0] == pytest.approx(found, rel=1e-9, abs=1e-9)


def test_frank_wolfe_dual_is_the_simplex_maximum_on_three_groups():
    X, labels = groups_data((40, 30, 35), n=5, seed=1)
    model = distfact.MultigroupSVD(1, solver="fw", tol=1e-12, center=False, scale=False).fit(X, groups=labels)
    grams = np.stack([X[labels == g].T @ X[labels == g] for g in ("g0", "g1", "g2")])
    s = np.array([np.linalg.eigvalsh(G)[-1] for G in grams])
    grid = np.linspace(0, 1, 301)
    duals = [mu1 * s[0] + mu2 * s[1] + (1 - mu1 - mu2) * s[2]
             - np.linalg.eigvalsh(mu1 * grams[0] + mu2 * grams[1] + (1 - mu1 - mu2) * grams[2])[-1]
             for mu1 in grid for mu2 in grid if mu1 + mu2 <= 1]
    assert model.dual_objective_[0] >= max(duals) - 1e-9 * s.max()
    assert model.dual_objective_[0] <= model.primal_objective_[0] + 1e-9 * s.max()  # weak duality
    assert np.isclose(model.mu_[0].sum(), 1) and (model.mu_[0] >= 0).all()


def test_paper_step_rule_reaches_the_line_search_dual(monkeypatch):
    """Algorithm 2's own iterations, the eigenspace refinement switched off (it closes the gap at the first
    iteration here): both step rules reach the dual optimum the refinement finds."""
    X, labels = groups_data((40, 30, 35), n=5, seed=1)
    refined = distfact.MultigroupSVD(1, solver="fw", tol=1e-10, center=False, scale=False).fit(X, groups=labels)
    monkeypatch.setattr(mg, "eigenspace_primal", lambda grams, s, mu, tol: (mg.RankOne(None, mu, np.inf, -np.inf, 0),
                                                                            False))
    line = distfact.MultigroupSVD(1, solver="fw", tol=1e-10, center=False, scale=False).fit(X, groups=labels)
    paper = distfact.MultigroupSVD(1, solver="fw", fw_step="2/(t+2)", tol=1e-6, max_iter=20000, center=False,
                                   scale=False).fit(X, groups=labels)
    assert refined.n_iter_[0] == 1 and line.n_iter_[0] > 10 and paper.n_iter_[0] > 1000
    np.testing.assert_allclose(paper.dual_objective_[0], line.dual_objective_[0], rtol=1e-5)
    np.testing.assert_allclose(line.dual_objective_[0], refined.dual_objective_[0], rtol=1e-7)


@pytest.mark.parametrize("seed", [1, 5])
def test_sdp_gap_no_larger_than_frank_wolfe_on_three_groups(seed):
    """Seed 5 has a true duality gap (the relaxation is not tight: lambda_max(A(mu*)) is double and no unit
    vector reaches g); both solvers then stop at the same dual and primals within 1e-4 of each other."""
    X, labels = groups_data((40, 30, 35), n=6, seed=seed)
    fw = distfact.MultigroupSVD(3, solver="fw", tol=1e-8, center=False, scale=False).fit(X, groups=labels)
    sdp = distfact.MultigroupSVD(3, solver="sdp", tol=1e-9, center=False, scale=False).fit(X, groups=labels)
    assert np.all(np.isfinite(fw.duality_gap_)) and np.all(np.isfinite(sdp.duality_gap_))
    # the first component solves the same problem on the same data
    f = fw.primal_objective_[0]
    assert sdp.duality_gap_[0] <= fw.duality_gap_[0] + 1e-4 * f
    assert sdp.primal_objective_[0] <= fw.primal_objective_[0] + 1e-4 * f
    assert sdp.dual_objective_[0] >= fw.dual_objective_[0] - 1e-6 * f  # the SDP's dual is the exact optimum


def test_sdp_is_tight_for_two_groups():
    X, labels = groups_data((40, 30), n=5, seed=2)
    exact = distfact.MultigroupSVD(2, solver="brent", center=False, scale=False).fit(X, groups=labels)
    # rank 2 is deflated by rank 1's vector, which an interior point method stopped at a gap tol gets to
    # about sqrt(tol) only (f is quadratic about its minimum): 2e-6 at tol=1e-10, 1.4e-5 on rank 2's f
    sdp = distfact.MultigroupSVD(2, solver="sdp", tol=1e-12, center=False, scale=False).fit(X, groups=labels)
    np.testing.assert_allclose(sdp.primal_objective_, exact.primal_objective_, rtol=1e-5)  # Lemma 7.2


@pytest.mark.parametrize("solver", ["brent", "fw"])
def test_consistency_prefixes_equal_lower_rank_fits(solver):
    sizes = (50, 40) if solver == "brent" else (50, 40, 45)
    X, labels = groups_data(sizes, n=10, seed=4)
    full = distfact.MultigroupSVD(8, solver=solver, center=True, scale=False, tol=1e-12).fit(X, groups=labels)
    for d in (1, 3, 5):
        part = distfact.MultigroupSVD(d, solver=solver, center=True, scale=False, tol=1e-12).fit(X, groups=labels)
        np.testing.assert_allclose(part.components_, full.components_[:d], atol=1e-9)
        np.testing.assert_allclose(part.group_losses_.set_index(["group", "rank"]).to_numpy(),
                                   full.group_losses_[full.group_losses_["rank"] <= d]
                                   .set_index(["group", "rank"]).to_numpy(), rtol=1e-9, atol=1e-9)


def test_one_read_of_x_on_the_gram_path(tmp_path):
    X, labels = groups_data((300, 200, 100), n=12)
    store = distfact.from_arrays(X, labels, tmp_path / "x.zarr", block_rows=64, signed=True)
    reads = []
    reader = store.reader()
    store.reader = lambda: (lambda block: reads.append(block.index) or reader(block))
    model = distfact.MultigroupSVD(4, center=True, scale=True, n_threads=2).fit(store)
    assert sorted(reads) == list(range(store.n_blocks)) and model.n_passes_ == 1
    in_memory = distfact.MultigroupSVD(4, center=True, scale=True).fit(X, groups=labels)
    np.testing.assert_allclose(model.components_, in_memory.components_, atol=1e-10)


def test_sparse_equals_dense():
    rng = np.random.default_rng(7)
    X = sp.random(200, 15, density=0.2, random_state=7, format="csr") * 3
    labels = rng.choice(["a", "b"], 200)  # two groups: a unique optimum, so the vectors can be compared
    for center, scale in ((False, False), (True, True)):
        sparse = distfact.MultigroupSVD(4, center=center, scale=scale, tol=1e-12).fit(X, groups=labels)
        dense = distfact.MultigroupSVD(4, center=center, scale=scale, tol=1e-12).fit(X.toarray(), groups=labels)
        np.testing.assert_allclose(sparse.components_, dense.components_, atol=1e-8)
        np.testing.assert_allclose(sparse.transform(X), dense.transform(X.toarray()), atol=1e-8)


def test_transform_and_inverse_transform():
    X, labels = groups_data((60, 50), n=6)
    model = distfact.MultigroupSVD(6, center=True, scale=True).fit(X, groups=labels)
    Z = model.transform(X)
    np.testing.assert_allclose(Z, ((X - X.mean(0)) / X.std(0)) @ model.components_.T, atol=1e-10)
    np.testing.assert_allclose(model.inverse_transform(Z), X, atol=1e-9)  # d = n: exact
    data = distfact.from_arrays(X, labels, block_rows=16, signed=True)
    np.testing.assert_allclose(model.transform(data), Z, atol=1e-10)  # block by block, input row order
    with pytest.raises(ValueError, match="5 features"):
        model.transform(X[:, :5])


def test_wide_sketch_equals_the_gram_path_on_low_rank_groups():
    rng = np.random.default_rng(11)
    n = 400
    blocks = [rng.standard_normal((m, 4)) @ rng.standard_normal((4, n)) for m in (80, 60)]
    X = np.concatenate(blocks)
    labels = np.repeat(["a", "b"], [80, 60])
    gram = distfact.MultigroupSVD(3, center=True, scale=True).fit(X, groups=labels)
    wide = distfact.MultigroupSVD(3, center=True, scale=True, max_gram_features=100, sketch_size=12,
                                  random_state=0).fit(X, groups=labels)
    assert wide.sketched_ and not gram.sketched_
    assert wide.n_passes_ == 3 + wide.power_iterations and gram.n_passes_ == 1
    signs = np.sign(np.sum(wide.components_ * gram.components_, axis=1))
    np.testing.assert_allclose(wide.components_ * signs[:, None], gram.components_, atol=1e-7)
    np.testing.assert_allclose(wide.group_losses_.iloc[:, 2:].to_numpy(), gram.group_losses_.iloc[:, 2:].to_numpy(),
                               rtol=1e-7, atol=1e-6)


@pytest.mark.cluster
def test_same_result_on_a_local_cluster(local_cluster_client, tmp_path):
    X, labels = groups_data((300, 200, 150), n=10)
    store = distfact.from_arrays(X, labels, tmp_path / "x.zarr", block_rows=50, signed=True)
    here = distfact.MultigroupSVD(5, center=True, scale=True, n_threads=2).fit(store)
    there = distfact.MultigroupSVD(5, center=True, scale=True).fit(store, client=local_cluster_client)
    assert np.array_equal(here.components_, there.components_)
    assert there.scheduler_["scheduler"] != "in-process"


def test_a_constant_column_keeps_scale_one_and_no_weight():
    """Standardising (the default) leaves a constant column at scale 1, as scikit-learn's StandardScaler does:
    centred it is zero, so the components are those of the other columns with a 0 inserted."""
    X, labels = groups_data((30, 20), n=5)
    Xc = np.insert(X, 3, 7.0, axis=1)
    with_constant = distfact.MultigroupSVD(2).fit(Xc, groups=labels)
    without = distfact.MultigroupSVD(2).fit(X, groups=labels)
    assert np.all(np.isfinite(with_constant.components_))
    np.testing.assert_allclose(np.abs(with_constant.components_), np.abs(np.insert(without.components_, 3, 0.0, axis=1)),
                               atol=1e-10)


def test_bad_input():
    X, labels = groups_data((30, 20), n=5)
    with pytest.raises(ValueError, match="group 'lonely' has 1 row"):
        distfact.MultigroupSVD(2).fit(np.vstack([X, X[:1]]), groups=np.append(labels, "lonely"))
    with pytest.raises(ValueError, match="n_components=6 is larger than the number of features n=5"):
        distfact.MultigroupSVD(6).fit(X, groups=labels)
    with pytest.raises(ValueError, match="exactly two groups"):
        distfact.MultigroupSVD(2, solver="brent").fit(*groups_data((20, 20, 20), n=4))
    for bad in ({"tol": 0}, {"max_iter": 0}):
        with pytest.raises(ValueError, match="max_iter must be at least 1 and tol positive"):
            distfact.MultigroupSVD(2, **bad).fit(X, groups=labels)
    with pytest.raises(ValueError, match="NaN"):
        Xn = X.copy()
        Xn[4, 2] = np.nan
        distfact.MultigroupSVD(2).fit(Xn, groups=labels)


@pytest.mark.parametrize("make", [lambda: distfact.NMF(2), lambda: distfact.FairerNMF(2),
                                  lambda: distfact.StratifiedNMF(2), lambda: distfact.WeightedL1NMF(2),
                                  lambda: distfact.SSNMF(2)])
def test_signed_stores_are_refused_by_the_nmf_methods(tmp_path, make):
    X, labels = groups_data((30, 20), n=5)
    with pytest.raises(ValueError, match="negative value"):
        distfact.from_arrays(X, labels)
    store = distfact.from_arrays(X, labels, tmp_path / "signed.zarr", signed=True)
    reopened = distfact.open(tmp_path / "signed.zarr")
    assert reopened.meta.signed and reopened.meta.to_json()["signed"] is True
    for data in (store, str(tmp_path / "signed.zarr"), distfact.from_arrays(X, labels, signed=True)):
        with pytest.raises(ValueError, match="signed=True"):
            make().fit(data)
    assert distfact.MultigroupSVD(2).fit(store).components_.shape == (2, 5)


def block_disjoint(sizes, n_per_group=3, seed=4):
    """Groups on disjoint columns: their Grams commute and lambda_max(A(mu*)) is repeated at the optimum.
    The rank-1 optimum is then known: v = sum_l sqrt(t_l) e_l over the groups' top vectors e_l, with every
    h_l equal to z = (k - 1) / sum_l 1/s_l (all groups active) when that is below min s_l."""
    rng = np.random.default_rng(seed)
    k = len(sizes)
    parts = []
    for l, m in enumerate(sizes):
        part = np.zeros((m, k * n_per_group))
        part[:, l * n_per_group:(l + 1) * n_per_group] = rng.standard_normal((m, n_per_group)) * [2 + l, 1, 0.5]
        parts.append(part)
    s = np.array([np.linalg.norm(p, 2) ** 2 for p in parts])
    return np.vstack(parts), np.repeat([f"g{l}" for l in range(k)], sizes), s


@pytest.mark.parametrize("solver", ["brent", "fw", "sdp"])
def test_repeated_top_eigenvalue_two_groups(solver):
    X, labels, s = block_disjoint((50, 50))
    model = distfact.MultigroupSVD(1, solver=solver, center=False, scale=False).fit(X, groups=labels)
    optimum = s[0] * s[1] / (s[0] + s[1])
    assert model.primal_objective_[0] == pytest.approx(optimum, rel=1e-7)
    assert abs(model.duality_gap_[0]) <= 1e-6 * optimum
    losses = model.group_losses_.incremental.to_numpy()
    assert losses[0] == pytest.approx(losses[1], rel=1e-7)  # Lemma 7.3 holds here too


@pytest.mark.parametrize("solver", ["fw", "sdp"])
def test_repeated_top_eigenvalue_three_groups(solver):
    X, labels, s = block_disjoint((50, 50, 50))
    model = distfact.MultigroupSVD(1, solver=solver, center=False, scale=False).fit(X, groups=labels)
    # the smallest group's s_0 is below z = 2 / sum(1/s): group 0 is inactive, the optimum mixes groups 1, 2
    assert s[0] < 2 / np.sum(1 / s)
    optimum = s[1] * s[2] / (s[1] + s[2])
    assert model.primal_objective_[0] == pytest.approx(optimum, rel=1e-6)
    assert abs(model.duality_gap_[0]) <= 1e-5 * optimum


def test_scale_of_a_column_with_a_large_mean():
    """A timestamp-like column (mean 1.7e9, std 500) is not constant, and its scale is exact (no
    cancellation), with or without centring, dense or sparse."""
    rng = np.random.default_rng(0)
    X = np.column_stack([1.7e9 + 500 * rng.standard_normal(200), rng.standard_normal((200, 3))])
    labels = np.repeat(["a", "b"], 100)
    for data in (X, sp.csr_matrix(X)):
        for center in (True, False):
            model = distfact.MultigroupSVD(2, center=center, scale=True).fit(data, groups=labels)
            np.testing.assert_allclose(model.scale_, X.std(axis=0), rtol=1e-10)


def test_wide_sketch_reconstruction_loss_is_exact_on_full_rank_data():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((120, 300)) + 2.0
    labels = np.repeat(["a", "b", "c"], 40)
    model = distfact.MultigroupSVD(3, center=True, scale=True, max_gram_features=100, random_state=0).fit(X, groups=labels)
    assert model.sketched_
    V = model.components_
    np.testing.assert_allclose(V @ V.T, np.eye(3), atol=1e-10)
    for l, A in enumerate(standardised_groups(X, labels)):
        rows = model.group_losses_[model.group_losses_.group == "abc"[l]]
        for r in (1, 3):
            direct = np.linalg.norm(A - A @ V[:r].T @ V[:r]) ** 2
            assert rows.reconstruction.iloc[r - 1] == pytest.approx(direct, rel=1e-10)
    with pytest.raises(ValueError, match="outside the span"):
        model.losses_of(np.eye(300)[:2])


def test_deflation_matches_the_projection():
    rng = np.random.default_rng(0)
    A = rng.standard_normal((20, 6))
    v = rng.standard_normal(6)
    v /= np.linalg.norm(v)
    P = np.eye(6) - np.outer(v, v)
    np.testing.assert_allclose(deflate(A.T @ A, v), (A @ P).T @ (A @ P), atol=1e-12)


def group_grams(X, labels):
    """The groups' Gram matrices (no centring) and their top eigenvalues s_l, with numpy only."""
    grams = np.stack([X[labels == g].T @ X[labels == g] for g in np.unique(labels)])
    return grams, np.array([np.linalg.eigvalsh(G)[-1] for G in grams])


def test_top_eigenpairs_and_the_solve_on_the_complement():
    rng = np.random.default_rng(5)
    for n in (1, 2, 7, 40):
        B = rng.standard_normal((n + 3, n))
        G = B.T @ B
        values, vectors = np.linalg.eigh(G)
        count = min(3, n)
        top_values, top_vectors = top_eigenpairs(G, count)
        np.testing.assert_allclose(top_values, values[::-1][:count], rtol=1e-12)
        np.testing.assert_allclose(np.abs(top_vectors.T @ vectors[:, ::-1][:, :count]), np.eye(count), atol=1e-9)
        assert top_eigenvalue(G) == pytest.approx(values[-1], rel=1e-12)
        if n > 1:  # (lambda_1 I - G)^+ b for b orthogonal to the top eigenvector
            b = rng.standard_normal(n)
            b -= (b @ vectors[:, -1]) * vectors[:, -1]
            np.testing.assert_allclose(solve_on_complement(G, values[-1], vectors[:, -1], b),
                                       np.linalg.pinv(values[-1] * np.eye(n) - G) @ b, rtol=1e-9, atol=1e-12)
    assert solve_on_complement(np.diag([2.0, 2.0, 1.0]), 2.0, np.eye(3)[0], np.eye(3)[1]) is None  # repeated


def test_root_function_derivatives_by_finite_differences():
    """q' and q'' of eq. 11 from perturbation theory against central differences of q and of q'."""
    X, labels = groups_data((40, 30), n=7, seed=6)
    grams, s = group_grams(X, labels)
    step = 1e-5
    for mu in (0.1, 0.45, 0.8):
        point = mg.root_function(grams, s, mu)
        assert point.lam == pytest.approx(np.linalg.eigvalsh(mu * grams[0] + (1 - mu) * grams[1])[-1], rel=1e-12)
        assert point.q == pytest.approx(point.h[0] - point.h[1]) and point.dq < 0
        above, below = mg.root_function(grams, s, mu + step), mg.root_function(grams, s, mu - step)
        assert point.dq == pytest.approx((above.q - below.q) / (2 * step), rel=1e-6)
        assert point.d2q == pytest.approx((above.dq - below.dq) / (2 * step), rel=1e-5)


@pytest.mark.parametrize("seed", [0, 3, 8])
def test_two_group_root_equals_brents(seed):
    """The 'brent' solver's safeguarded Halley iteration stops at the root Brent's method finds on an
    independent q (numpy's eigh), to 1e-12, by its own rule (how many eigenproblems that takes depends on
    the BLAS build's rounding near the root: 10 on one machine, 11 on another; the speed is benchmarked)."""
    import scipy.optimize

    X, labels = groups_data((50, 35), n=9, seed=seed)
    grams, s = group_grams(X, labels)

    def q(mu):
        v = np.linalg.eigh(mu * grams[0] + (1 - mu) * grams[1])[1][:, -1]
        return (s[0] - v @ grams[0] @ v) - (s[1] - v @ grams[1] @ v)

    root = scipy.optimize.brentq(q, 0.0, 1.0, xtol=1e-15)
    model = distfact.MultigroupSVD(1, solver="brent", center=False, scale=False).fit(X, groups=labels)
    assert model.mu_[0, 0] == pytest.approx(root, abs=1e-12)
    assert model.n_iter_[0] < model.max_iter
    assert abs(model.duality_gap_[0]) <= 1e-12 * s.max()


def near_commuting_grams(seed):
    """Two Grams sharing eigenvectors up to a small coupling: lambda_1 and lambda_2 of A(mu) nearly cross
    (an avoided crossing) where q does not change sign, a trap for a Newton-type root-finder."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 12))
    Q = np.linalg.qr(rng.standard_normal((n, n)))[0]
    grams = np.stack([Q @ np.diag(rng.uniform(0, 1, n) ** 3) @ Q.T for _ in range(2)])
    E = rng.standard_normal((n, n)) * 10 ** rng.uniform(-12, -3)
    grams[0] += E @ E.T
    grams = (grams + grams.transpose(0, 2, 1)) / 2
    return grams, np.array([np.linalg.eigvalsh(G)[-1] for G in grams])


@pytest.mark.parametrize("seed", [266, 10369])
def test_two_group_root_near_an_avoided_crossing(seed):
    """(A review found the first safeguard stopping at the crossing with q = 0.16, gap 4e-4 of f.) The root
    and its zero gap, against brute force on the circle for n = 2 or else against the dual's maximum over a
    fine grid of mu."""
    grams, s = near_commuting_grams(seed)
    result = mg.brent_two_groups(grams, s, max_iter=200)
    assert result.primal - result.dual <= 1e-9 * s.max()
    assert result.dual == pytest.approx(mg.dual_value(grams, s, result.mu), abs=1e-12 * s.max())
    grid = np.linspace(0, 1, 20001)
    best_on_grid = max(mg.dual_value(grams, s, np.array([m, 1 - m])) for m in grid)
    assert result.dual >= best_on_grid - 1e-9 * s.max()  # the dual's maximum: no mu on the grid does better


def test_two_group_solver_out_of_iterations_reports_the_dual_of_its_own_mu():
    X, labels = groups_data((40, 30), n=6, seed=4)
    grams, s = group_grams(X, labels)
    for max_iter in (1, 2, 3):
        result = mg.brent_two_groups(grams, s, max_iter=max_iter)
        assert result.dual == pytest.approx(mg.dual_value(grams, s, result.mu), abs=1e-12 * s.max())
        assert result.primal >= result.dual - 1e-12 * s.max()


def algorithm_3_by_cvxpy(grams, s):
    """Algorithm 3 written out in cvxpy (the independent oracle): its value and X."""
    import cvxpy as cp

    X = cp.Variable(grams.shape[1:], PSD=True)
    z = cp.Variable()
    problem = cp.Problem(cp.Minimize(z), [s[l] - cp.trace(grams[l] @ X) <= z for l in range(len(s))]
                         + [cp.trace(X) <= 1])
    problem.solve(solver="CLARABEL", tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    return problem.value, X.value


@pytest.mark.parametrize("sizes, n", [((40, 30, 35), 6), ((30, 30, 30, 30), 5), ((40, 35), 4)])
def test_direct_sdp_equals_cvxpy(sizes, n):
    """The direct Clarabel form of Algorithm 3 (its dual in k + 1 variables) against cvxpy's primal form:
    the same value, and X feasible (PSD, trace 1) with that value; mu's g equals it (strong duality)."""
    X, labels = groups_data(sizes, n=n, seed=2)
    grams, s = group_grams(X, labels)
    value, _ = algorithm_3_by_cvxpy(grams, s)
    X_sdp, mu = mg._solve_sdp(grams, s, 1e-10)
    assert np.linalg.eigvalsh(X_sdp)[0] >= -1e-9 and np.trace(X_sdp) == pytest.approx(1, abs=1e-8)
    assert np.all(mu >= 0) and mu.sum() == pytest.approx(1)
    assert (s - np.einsum("lij,ij->l", grams, X_sdp)).max() == pytest.approx(value, rel=1e-8)
    assert mg.dual_value(grams, s, mu) == pytest.approx(value, rel=1e-8)


@pytest.mark.parametrize("seed", [1, 5])
def test_eigenspace_refinement_reaches_the_relaxation_of_the_whole_space(seed):
    """From the simplex's centre, the subspace rounds reach the value of Algorithm 3 on the full Grams
    (cvxpy): the dual to 1e-7, and the primal too where the relaxation is tight (seed 1); seed 5 is not
    tight (see below) and must settle at the relaxation's value with its gap."""
    X, labels = groups_data((40, 30, 35), n=6, seed=seed)
    grams, s = group_grams(X, labels)
    value, X_full = algorithm_3_by_cvxpy(grams, s)
    refined, settled = mg.eigenspace_primal(grams, s, np.full(3, 1 / 3), 1e-9)
    assert settled
    assert refined.dual == pytest.approx(value, rel=1e-7) and refined.dual <= value + 1e-9 * s.max()
    tight = np.linalg.eigvalsh(X_full)[-2] < 1e-6
    assert tight == (seed == 1)
    if tight:
        assert refined.primal == pytest.approx(value, rel=1e-7)
    assert refined.primal >= refined.dual - 1e-9 * s.max()


def test_frank_wolfe_with_refinements_that_do_not_settle(monkeypatch):
    """The fallback: one subspace round per refinement (too few to settle here), so Frank-Wolfe iterates from
    the refined weights between refinements; it still reaches the dual optimum and closes the gap."""
    X, labels = groups_data((40, 30, 35), n=8, seed=1)
    full = distfact.MultigroupSVD(1, solver="fw", tol=1e-9, center=False, scale=False).fit(X, groups=labels)
    monkeypatch.setattr(mg, "REFINE_ROUNDS", 1)
    fallback = distfact.MultigroupSVD(1, solver="fw", tol=1e-9, center=False, scale=False).fit(X, groups=labels)
    assert fallback.n_iter_[0] > 1
    assert fallback.dual_objective_[0] == pytest.approx(full.dual_objective_[0], rel=1e-8)
    assert fallback.duality_gap_[0] <= 1e-6 * fallback.primal_objective_[0]


def test_frank_wolfe_when_the_small_sdps_fail(monkeypatch):
    """A refinement whose SDP solver gives up leaves Frank-Wolfe's own iterations to do the work."""
    X, labels = groups_data((40, 30, 35), n=5, seed=1)
    reference = distfact.MultigroupSVD(1, solver="fw", tol=1e-9, center=False, scale=False).fit(X, groups=labels)

    def failing(grams, s, tol):
        raise RuntimeError("the SDP relaxation ended with status NumericalError")

    monkeypatch.setattr(mg, "_solve_sdp", failing)
    model = distfact.MultigroupSVD(1, solver="fw", tol=1e-9, center=False, scale=False).fit(X, groups=labels)
    assert model.n_iter_[0] > 1 and np.isfinite(model.primal_objective_[0])
    assert model.dual_objective_[0] == pytest.approx(reference.dual_objective_[0], rel=1e-6)
