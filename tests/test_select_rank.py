"""``distfact.select_rank`` (issue 20): held-out entries independent of the blocks, the errors against a numpy
recomputation from each (rank, fold) model fitted alone with its mask, the rules against brute force on hand-made
tables, the known rank of synthetic data found, bad input, and ``distfact select-rank`` end to end."""

import inspect
import itertools

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

import distfact
from distfact import NMF, SSNMF, StratifiedNMF, WeightedL1NMF, select_rank
from distfact.datasets import make_fairer_synthetic
from distfact.estimators.select import RULES, choose_rank, fold_masks, rank_summary
from distfact.store.coerce import as_grouped
from distfact.store.masks import ComplementMask, block_form
from distfact.store.append import append_arrays
from distfact.store.subset import GroupRows

from conftest import cli_in_process, grouped_data

X, GROUPS = grouped_data(m=90, n=16, n_groups=3)
XS, _ = grouped_data(m=90, n=16, n_groups=3, density=0.4)
XS = sp.csr_matrix(XS)


@pytest.mark.parametrize("sparse", [False, True])
def test_held_out_entries_do_not_depend_on_the_blocks(sparse):
    """Two block sizes (and the store's row order for scattered groups): the same held-out entries, folds
    disjoint, about ``holdout`` of the candidates each; a sparse X holds out stored entries only."""
    data = XS if sparse else X
    masks = [dense_folds(as_grouped(data, GROUPS, block_rows=rows), None, 11, 0.15, 4) for rows in (7, 50)]
    # without observed weights, a fold holds its held-out entries only, never an array of X's shape
    assert all(isinstance(mask, ComplementMask) for mask in fold_masks(as_grouped(data, GROUPS), None, 11, 0.15, 4))
    for a, b in zip(*masks):
        assert np.array_equal(a, b)
    held = np.stack([mask == 0 for mask in masks[0]])
    assert held.sum(axis=0).max() == 1  # disjoint folds
    candidates = XS.toarray() != 0 if sparse else np.ones(X.shape, dtype=bool)
    assert not held[:, ~candidates].any()
    share = held.sum(axis=(1, 2)) / candidates.sum()
    assert np.all(np.abs(share - 0.15) < 0.05), share
    other = dense_folds(as_grouped(data, GROUPS, block_rows=7), None, 12, 0.15, 4)  # another seed, other entries
    assert not np.array_equal(other[0], masks[0][0])


def dense_folds(data, base, seed, holdout, n_splits) -> list:
    """``fold_masks`` as weight arrays (a fold of X without a mask is a ComplementMask of its held-out entries),
    checked to cut into blocks exactly as those arrays do: what a fit and the numpy oracles take."""
    out = []
    for mask in fold_masks(data, base, seed, holdout, n_splits):
        if isinstance(mask, ComplementMask):
            weights = 1.0 - mask.matrix.toarray()
            for block in data.blocks:
                rows = data.row_index()[block.row_start:block.row_stop]
                (form, P), (same_form, Q) = block_form(mask, rows), block_form(weights, rows)
                assert form == same_form and (P != Q).nnz == 0 and np.array_equal(P.indices, Q.indices)
            mask = weights
        out.append(mask)
    return out


def numpy_errors(X, groups, mask, base, reconstruction):
    """Per group (sorted names): the held-out and train errors of one model (its ``reconstruction`` of X), by
    dense numpy."""
    Xd = X.toarray() if sp.issparse(X) else X
    O = np.ones(X.shape) if base is None else (base.toarray() if sp.issparse(base) else base)
    M = mask.toarray() if sp.issparse(mask) else mask
    held = O * ((M == 0) & (O > 0))
    train = O * (M > 0)
    sq = (Xd - reconstruction) ** 2
    out = {}
    for g in sorted(set(groups)):
        rows = groups == g
        out[g] = ((train[rows] * sq[rows]).sum() / (train[rows] * Xd[rows] ** 2).sum(),
                  (held[rows] * sq[rows]).sum() / (held[rows] * Xd[rows] ** 2).sum())
    return out


WEIGHTS = np.random.default_rng(3).choice([0.0, 0.5, 1.0, 2.0], size=X.shape, p=[0.2, 0.2, 0.4, 0.2])
SCORED = {"dense": (X, None), "sparse": (XS, None), "sparse-nonzero": (XS, "nonzero"),
          "dense-weights": (X, WEIGHTS), "dense-sparse-weights": (X, sp.csr_matrix(WEIGHTS)),
          "sparse-weights": (XS, WEIGHTS)}


@pytest.mark.parametrize("case", list(SCORED))
def test_errors_equal_a_numpy_recomputation_from_each_model_fitted_alone(case):
    data, mask = SCORED[case]
    template = SSNMF(1, model="FF", max_iter=15, tol=0, random_state=4, block_rows=20)
    result = select_rank(template, data, groups=GROUPS, ranks=[2, 3], n_splits=3, holdout=0.2, random_state=9,
                         mask=mask)
    assert len(result.table) == 2 * 3 * 3
    base = (XS != 0).astype(float) if isinstance(mask, str) else mask
    folds = dense_folds(as_grouped(data, GROUPS), None if base is None else
                       (sp.csr_matrix(base) if sp.issparse(base) else base), 9, 0.2, 3)
    for fold, fold_mask in enumerate(folds):
        for rank in (2, 3):
            alone = SSNMF(rank, model="FF", max_iter=15, tol=0, random_state=4, block_rows=20)
            W = alone.fit_transform(data, groups=GROUPS, mask=fold_mask)
            expected = numpy_errors(data, GROUPS, fold_mask, base, W @ alone.components_)
            rows = result.table[(result.table["rank"] == rank) & (result.table["fold"] == fold)]
            for _, row in rows.iterrows():
                np.testing.assert_allclose((row.train_error, row.heldout_error), expected[row.group], rtol=1e-9)


def brute_force(table: pd.DataFrame, rule: str) -> int:
    """The rule, by loops over the table's rows."""
    ranks, folds, groups = (sorted(set(table[c])) for c in ("rank", "fold", "group"))
    cell = {(r, f, g): e for r, f, g, e in zip(table["rank"], table["fold"], table["group"], table["heldout_error"])}
    fold_means = {r: [sum(cell[r, f, g] for g in groups) / len(groups) for f in folds] for r in ranks}
    mean = {r: sum(v) / len(v) for r, v in fold_means.items()}
    se = {r: (sum((v - mean[r]) ** 2 for v in fold_means[r]) / (len(folds) - 1)) ** 0.5 / len(folds) ** 0.5
          for r in ranks}
    worst = {r: max(sum(cell[r, f, g] for f in folds) / len(folds) for g in groups) for r in ranks}
    if rule == "worst_group":
        return min(ranks, key=lambda r: (worst[r], r))
    best = min(ranks, key=lambda r: (mean[r], r))
    if rule == "min":
        return best
    return min(r for r in ranks if mean[r] <= mean[best] + se[best])


@pytest.mark.parametrize("seed", range(25))
def test_rules_equal_brute_force_on_hand_made_tables(seed):
    rng = np.random.default_rng(seed)
    ranks, folds, groups = list(range(2, 2 + rng.integers(2, 7))), range(rng.integers(2, 5)), ["x", "y", "z"]
    rows = list(itertools.product(ranks, folds, groups))
    curve = {r: rng.random() for r in ranks}  # a per-rank level, noise per fold and group on top
    table = pd.DataFrame(rows, columns=["rank", "fold", "group"])
    table["heldout_error"] = [curve[r] + 0.3 * rng.random() for r, _, _ in rows]
    table["train_error"] = 0.0
    summary = rank_summary(table)
    for rule in RULES:
        assert choose_rank(summary, rule) == brute_force(table, rule), rule


def test_the_rules_on_a_table_where_they_differ():
    """Groups x (large) and y (small): the mean is lowest at rank 3, rank 2 is within one standard error, the
    small group is best served at rank 5."""
    heldout = {2: [(0.29, 0.58), (0.30, 0.58)], 3: [(0.28, 0.58), (0.29, 0.59)], 5: [(0.42, 0.50), (0.43, 0.51)]}
    table = pd.DataFrame([(r, f, g, 0.0, e[f][k]) for r, e in heldout.items() for f in (0, 1)
                          for k, g in enumerate("xy")], columns=["rank", "fold", "group", "train_error", "heldout_error"])
    summary = rank_summary(table)
    assert [choose_rank(summary, rule) for rule in RULES] == [3, 2, 5]
    assert summary.set_index("rank").loc[3, "worst_group"] == "y"


def low_rank(seed: int, m=200, n=50, rank=4, noise=0.05):
    """Sparse non-negative factors (distinct components) times each other, plus Gaussian noise, clipped at 0."""
    rng = np.random.default_rng(seed)
    W = rng.random((m, rank)) * (rng.random((m, rank)) < 0.5)
    H = rng.random((rank, n)) * (rng.random((rank, n)) < 0.5)
    return np.maximum(W @ H + noise * rng.standard_normal((m, n)), 0), rng.choice(["a", "b", "c"], size=m)


ESTIMATORS = [SSNMF(1, model="FF", max_iter=300, tol=0, random_state=0),  # MU: 300 iterations converge the true rank
              pytest.param(NMF(max_iter=300, tol=0, random_state=0), marks=pytest.mark.skipif(
                  "mask" not in inspect.signature(NMF.fit).parameters, reason="NMF.fit takes no mask yet"))]


@pytest.mark.parametrize("estimator", ESTIMATORS, ids=["ssnmf-F", "nmf"])
@pytest.mark.parametrize("seed", [0, 1, 4])
def test_min_picks_the_known_rank_of_low_rank_data_plus_noise(estimator, seed):
    X_known, groups = low_rank(seed)
    result = select_rank(estimator, X_known, groups=groups, ranks=range(2, 7), random_state=seed)
    assert result.rank_ == result.choices["min"] == 4, result.summary
    assert result.rule == "min" and result.random_state_ == seed
    by_rank = result.table.groupby("rank")
    assert np.all(np.diff(by_rank["train_error"].mean().to_numpy()) < 0)  # training always improves with rank


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(ranks=[0, 2]), ValueError, "ranks must be integers in \\[1, min"),
    (dict(ranks=[2, 17]), ValueError, "\\[1, 16\\], got 17"),
    (dict(ranks=[]), ValueError, "got 'none'"),
    (dict(ranks=[2], holdout=1.0), ValueError, "holdout must be a fraction in \\(0, 1\\)"),
    (dict(ranks=[2], holdout=0), ValueError, "holdout must be"),
    (dict(ranks=[2], n_splits=1), ValueError, "n_splits must be an integer >= 2"),
    (dict(ranks=[2], n_splits=5, holdout=0.3), ValueError, "n_splits \\* holdout must be <= 1"),
    (dict(ranks=[2], rule="best"), ValueError, "rule must be one of"),
    (dict(ranks=[2], fit="both"), ValueError, "fit must be one of"),
    (dict(ranks=[2], mask="nonzero"), ValueError, "needs a sparse X"),
    (dict(ranks=[2], mask=np.ones((3, 3))), ValueError, "mask has shape"),
])
def test_bad_input_is_refused_before_any_fit(kwargs, error, message):
    with pytest.raises(error, match=message):
        select_rank(SSNMF(1, model="FF"), X, groups=GROUPS, **kwargs)


class MasklessNMF(NMF):
    """An estimator whose fit takes no mask (as a plug-in's may: every NMF-family estimator of distfact takes one)."""

    def fit(self, X, y=None, *, groups=None, client=None):
        return super().fit(X, y, groups=groups, client=client)


def test_an_estimator_without_a_mask_is_refused_by_name():
    with pytest.raises(ValueError, match="MasklessNMF takes no mask"):
        select_rank(MasklessNMF(2), X, groups=GROUPS, ranks=[2])
    # an estimator that says why it cannot take the folds' masks (wL1-NMF's start reads X unmasked)
    with pytest.raises(ValueError, match="select_rank cannot use WeightedL1NMF"):
        select_rank(WeightedL1NMF(2), X, groups=GROUPS, ranks=[2])


def test_mask_nan_holds_out_observed_entries_only():
    X_nan = X.copy()
    X_nan[np.random.default_rng(2).random(X.shape) < 0.1] = np.nan
    result = select_rank(SSNMF(1, model="FF", max_iter=10, random_state=0), X_nan, groups=GROUPS, ranks=[2], n_splits=2,
                         random_state=1, mask="nan")
    reference = select_rank(SSNMF(1, model="FF", max_iter=10, random_state=0), np.nan_to_num(X_nan), groups=GROUPS, ranks=[2],
                            n_splits=2, random_state=1, mask=(~np.isnan(X_nan)).astype(float))
    pd.testing.assert_frame_equal(result.table, reference.table)


def test_the_command_line_end_to_end(tmp_path, capsys):
    """``distfact select-rank`` (main() as the console script runs it, in this process: the commands' start-up is
    tested in test_cli and test_imports): its table equals the library's."""
    X_known, groups = low_rank(0, m=120, n=30, rank=3)
    distfact.from_arrays(X_known, groups, path=str(tmp_path / "x.zarr"), block_rows=25)
    code, out, err = cli_in_process(capsys, "select-rank", tmp_path / "x.zarr", "--method", "ssnmf", "--labels",
                                    "none", "--model", "FF", "--max-iter", "100", "--tol", "0", "--ranks", "1:5",
                                    "--rule", "one_se", "--seed", "3", "--output", tmp_path / "table.csv")
    assert code == 0, err
    table = pd.read_csv(tmp_path / "table.csv")
    assert list(table.columns) == ["rank", "fold", "group", "train_error", "heldout_error"]
    assert len(table) == 5 * 5 * 3
    expected = select_rank(SSNMF(1, model="FF", max_iter=100, tol=0, random_state=3),
                           distfact.open(str(tmp_path / "x.zarr")), ranks=range(1, 6), rule="one_se", random_state=3)
    np.testing.assert_allclose(table["heldout_error"], expected.table["heldout_error"], rtol=1e-12)
    assert f"chosen rank (one_se): {expected.rank_}" in out and expected.choices["min"] == 3
    code, _, err = cli_in_process(capsys, "select-rank", tmp_path / "x.zarr", "--method", "wl1-nmf", "--ranks", "1:3")
    assert code == 2
    assert "cannot take wl1-nmf: select_rank cannot use WeightedL1NMF" in err


@pytest.mark.parametrize("on_disk", [False, True])
def test_group_rows_fit_bitwise_as_the_groups_rows_ingested_alone(tmp_path, on_disk):
    """``GroupRows``: one group's blocks renumbered, read where they are (no copy), rows numbered in X's order;
    a fit with a mask cut to the group equals, bitwise, the fit of the group's rows ingested by themselves."""
    whole = distfact.from_arrays(X, GROUPS, path=str(tmp_path / "x.zarr") if on_disk else None, block_rows=11)
    if on_disk:
        whole = distfact.open(str(tmp_path / "x.zarr"))
    mask = WEIGHTS
    for group, name in enumerate(whole.group_names):
        part = GroupRows(whole, group)
        rows = np.flatnonzero(GROUPS == name)
        assert np.array_equal(part.source_rows, rows) and part.shape == (len(rows), X.shape[1])
        assert part.n_groups == 1 and part.group_names == [name] and part.in_memory != on_disk
        alone = distfact.from_arrays(X[rows], GROUPS[rows], block_rows=11)
        np.testing.assert_array_equal(part.column_sums, alone.column_sums)
        assert [b.n_rows for b in part.blocks] == [b.n_rows for b in alone.blocks]
        fits = [NMF(3, max_iter=12, tol=0, random_state=5).fit(data, mask=mask[rows]) for data in (part, alone)]
        Ws = [fit.transform(data) for fit, data in zip(fits, (part, alone))]
        assert np.array_equal(fits[0].components_, fits[1].components_) and np.array_equal(*Ws)
        np.testing.assert_array_equal(fits[0].objective_history_, fits[1].objective_history_)


@pytest.mark.parametrize("store", ["own mask", "own mask, in memory", "appended"])
def test_group_rows_of_a_masked_or_appended_store_fit_as_the_groups_rows_alone(tmp_path, store):
    """A store with its own mask, or one grown by an append (blocks of version 1), gives GroupRows its mask kind
    and version (before, its metadata check refused both: "has a mask, but the store has none", "version 1,
    but the store is at version 0"), and a fit equals the group's rows ingested alone, bitwise."""
    path = str(tmp_path / "x.zarr")
    if store.startswith("own mask"):
        data = X.copy()
        data[np.random.default_rng(2).random(X.shape) < 0.1] = np.nan
        distfact.from_arrays(data, GROUPS, path=path, block_rows=11, missing="nan")
    else:
        data, first = X, len(X) // 2
        distfact.from_arrays(X[:first], GROUPS[:first], path=path, block_rows=11,
                             group_names=sorted(set(GROUPS)))
        append_arrays(path, X[first:], GROUPS[first:], block_rows=11)
    whole = (distfact.from_arrays(data, GROUPS, block_rows=11, missing="nan") if store.endswith("in memory")
             else distfact.open(path))
    assert whole.meta.mask is not None or whole.meta.version == 1
    for group, name in enumerate(whole.group_names):
        part = GroupRows(whole, group)
        rows = np.flatnonzero(GROUPS == name)
        alone = distfact.from_arrays(data[rows], GROUPS[rows], block_rows=11, missing="nan")
        fits = [NMF(3, max_iter=12, tol=0, random_state=5).fit(matrix) for matrix in (part, alone)]
        assert part.shape == alone.shape
        if store.startswith("own mask"):  # same blocks: the same fit to the bit
            assert np.array_equal(fits[0].components_, fits[1].components_)
        else:  # the append cut the group's rows into other blocks: the same fit to rounding
            np.testing.assert_allclose(fits[0].components_, fits[1].components_, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("case", ["dense", "sparse-nonzero", "dense-weights"])
def test_per_group_errors_equal_a_numpy_recomputation_from_each_groups_model_fitted_alone(case):
    """fit="per_group": group l's held-out entries scored by the (rank, fold) model fitted on group l's rows
    alone (its rows ingested by themselves, the fold's mask cut to them); the held-out entries are those of the
    joint fit."""
    data, mask = SCORED[case]
    template = NMF(1, max_iter=15, tol=0, random_state=4, block_rows=20)
    result = select_rank(template, data, groups=GROUPS, ranks=[1, 3], n_splits=2, holdout=0.2, random_state=9,
                         mask=mask, fit="per_group", rule="worst_group")
    joint = select_rank(template, data, groups=GROUPS, ranks=[1, 3], n_splits=2, holdout=0.2, random_state=9,
                        mask=mask)
    assert result.fit == "per_group" and joint.fit == "joint"
    assert list(result.table.columns) == list(joint.table.columns)
    assert result.table[["rank", "fold", "group"]].equals(joint.table[["rank", "fold", "group"]])
    base = (XS != 0).astype(float) if isinstance(mask, str) else mask
    folds = dense_folds(as_grouped(data, GROUPS), None if base is None else
                       (sp.csr_matrix(base) if sp.issparse(base) else base), 9, 0.2, 2)
    for fold, fold_mask in enumerate(folds):
        for rank in (1, 3):
            rows = result.table[(result.table["rank"] == rank) & (result.table["fold"] == fold)]
            for _, row in rows.iterrows():
                mine = np.flatnonzero(GROUPS == row.group)
                alone = NMF(rank, max_iter=15, tol=0, random_state=4, block_rows=20)
                W = alone.fit_transform(data[mine], groups=GROUPS[mine], mask=fold_mask[mine])
                expected = numpy_errors(data[mine], GROUPS[mine], fold_mask[mine],
                                        None if base is None else base[mine], W @ alone.components_)
                np.testing.assert_allclose((row.train_error, row.heldout_error), expected[row.group], rtol=1e-9)
    assert result.rank_ == choose_rank(rank_summary(result.table), "worst_group")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_per_group_curves_bottom_at_the_table1_groups_ranks_and_worst_group_picks_6(seed):
    """The Fairer-NMF paper's Table 1 data (Kassab et al., "Towards a Fairer Non-negative Matrix Factorization",
    2024, Section 6.2) with its groups at 0.6 of their sizes (600, 300 and 150 rows; ranks 3, 3 and 6) and 3%
    noise: each group's mean held-out error is lowest at its own rank, and "worst_group" picks 6, with
    fit="per_group" (each group's models fitted on its rows alone). Without noise every rank
    from r_l on reconstructs group l exactly, so its curve is flat (about 0) from r_l on and its argmin is
    decided by round-off and unconverged iterations; the noise makes the extra components fit noise, which the
    held-out entries see. (Joint fits, the default: docs/select-rank.md.)"""
    X_t1, groups = make_fairer_synthetic(seed, scale=0.6, noise=0.03)
    result = select_rank(NMF(1, solver="hals", max_iter=400, tol=0, random_state=0), X_t1, groups=groups,
                         ranks=range(1, 8), random_state=seed, rule="worst_group", fit="per_group")
    curves = result.table.groupby(["group", "rank"])["heldout_error"].mean().unstack("rank")
    assert curves.idxmin(axis=1).to_dict() == {"A": 3, "B": 3, "C": 6}, curves
    assert result.rank_ == 6, result.summary


def _observed_only(X_in, weights):
    """X with 0 where the weight is 0 (what a store with that mask holds), dense or CSR."""
    if sp.issparse(X_in):
        return sp.csr_matrix(X_in.multiply(sp.csr_matrix(weights) != 0))
    return np.where(np.asarray(weights.toarray() if sp.issparse(weights) else weights) != 0, X_in, 0.0)


X_NAN = np.where(np.random.default_rng(5).random(X.shape) < 0.15, np.nan, X)
SPARSE_WEIGHTS = sp.random(*X.shape, density=0.35, random_state=6, format="csr",
                           data_rvs=lambda k: np.random.default_rng(7).choice([0.5, 1.0, 2.0], size=k))
#: a store's own mask -> (how it is ingested, the in-memory select_rank it must equal: X and mask=)
STORED = {"nan": (dict(X=X_NAN, missing="nan"), (X_NAN, "nan")),
          "dense-weights": (dict(X=X, mask=WEIGHTS), (_observed_only(X, WEIGHTS), WEIGHTS)),
          "sparse-weights": (dict(X=XS, mask=SPARSE_WEIGHTS), (_observed_only(XS, SPARSE_WEIGHTS), SPARSE_WEIGHTS))}


@pytest.mark.parametrize("fit", ["joint", "per_group"])
@pytest.mark.parametrize("case", list(STORED))
def test_a_stores_own_mask_is_the_observed_weights_the_folds_hold_out_from(tmp_path, case, fit):
    """On a store with its own mask (written at ingest) each fold's mask is the stored weights with 0 at its
    held-out entries: the table equals select_rank on X in memory given the same weights as mask= (a second
    path: no stored mask read), and the weights read back equal those given to ingest. A mask given as well
    is refused."""
    from distfact.estimators.masks import stored_weights

    ingest, (X_ref, mask_ref) = STORED[case]
    store = distfact.from_arrays(groups=GROUPS, path=str(tmp_path / "x.zarr"), block_rows=20, **ingest)
    store = distfact.open(str(tmp_path / "x.zarr"))
    assert store.mask_kind is not None
    given = (~np.isnan(X_NAN)).astype(float) if case == "nan" else mask_ref
    read = stored_weights(store)
    assert sp.issparse(read) == sp.issparse(given)
    np.testing.assert_array_equal(read.toarray() if sp.issparse(read) else read,
                                  given.toarray() if sp.issparse(given) else given)
    template = NMF(1, max_iter=15, tol=0, random_state=4, block_rows=20)
    settings = dict(ranks=[1, 3], n_splits=2, holdout=0.2, random_state=9, fit=fit)
    result = select_rank(template, store, **settings)
    expected = select_rank(template, X_ref, groups=GROUPS, mask=mask_ref, **settings)
    pd.testing.assert_frame_equal(result.table, expected.table)
    assert result.rank_ == expected.rank_
    with pytest.raises(ValueError, match="has its own mask"):
        select_rank(template, store, mask=given, **settings)


def shifted_reconstruction(model, W, groups):
    """Stratified-NMF's reconstruction W(i) H + 1 v(i)^T, from its fitted arrays by name (no estimator code)."""
    shift = dict(zip(model.strata_names_, model.strata_features_))
    return W @ model.components_ + np.stack([shift[g] for g in groups])


@pytest.mark.parametrize("fit", ["joint", "per_group"])
@pytest.mark.parametrize("case", ["dense", "sparse-nonzero", "dense-weights"])
def test_stratified_nmf_is_scored_by_its_reconstruction_with_the_shifts(case, fit):
    """Stratified-NMF's held-out and train errors are those of W(i) H + 1 v(i)^T: a numpy recomputation from
    each (rank, fold) model fitted alone with its fold's mask (per group: on the group's rows alone)."""
    data, mask = SCORED[case]
    params = dict(max_iter=15, tol=0, random_state=4, block_rows=20)
    result = select_rank(StratifiedNMF(1, **params), data, groups=GROUPS, ranks=[1, 3], n_splits=2, holdout=0.2,
                         random_state=9, mask=mask, fit=fit)
    base = (XS != 0).astype(float) if isinstance(mask, str) else mask
    folds = dense_folds(as_grouped(data, GROUPS), None if base is None else sp.csr_matrix(base) if sp.issparse(base)
                       else base, 9, 0.2, 2)
    parts = [np.arange(len(GROUPS))] if fit == "joint" else [np.flatnonzero(GROUPS == g) for g in sorted(set(GROUPS))]
    checked = 0
    for fold, fold_mask in enumerate(folds):
        for rank in (1, 3):
            rows = result.table[(result.table["rank"] == rank) & (result.table["fold"] == fold)].set_index("group")
            for mine in parts:
                alone = StratifiedNMF(rank, **params)
                W = alone.fit_transform(data[mine], groups=GROUPS[mine], mask=fold_mask[mine])
                expected = numpy_errors(data[mine], GROUPS[mine], fold_mask[mine], None if base is None else
                                        base[mine], shifted_reconstruction(alone, W, GROUPS[mine]))
                for group, errors in expected.items():
                    np.testing.assert_allclose(rows.loc[group, ["train_error", "heldout_error"]].to_numpy(float),
                                               errors, rtol=1e-9)
                    checked += 1
    assert checked == 2 * 2 * 3


@pytest.mark.parametrize("seed", [0, 1, 4])
def test_stratified_nmf_picks_the_planted_rank_of_shifted_strata(seed):
    """Stratified-NMF's model (Chapman, Yaniv and Needell, 2023, eq. 2): A(i) = W(i) H + 1 v(i)^T per stratum,
    here with the distinct sparse components of ``low_rank`` (rank 4, noise) and a non-negative shift per
    stratum. "min" picks 4. (The paper's Section IV-A set, ``make_stratified_synthetic``, has uniform dense
    factors that MU separates slowly: its rank 5 is picked after 1500 iterations, too slow here; docs/select-rank.md.)"""
    X_known, groups = low_rank(seed)
    rng = np.random.default_rng(50 + seed)
    shifts = {g: 0.5 * rng.random(X_known.shape[1]) for g in sorted(set(groups))}
    X_shifted = X_known + np.stack([shifts[g] for g in groups])
    result = select_rank(StratifiedNMF(1, max_iter=300, tol=0, random_state=0, block_rows=100), X_shifted,
                         groups=groups, ranks=[3, 4, 5], n_splits=3, random_state=seed)
    assert result.rank_ == 4, result.summary


@pytest.mark.parametrize("layout", ["dense", "csr"])
def test_the_train_error_of_float32_data_is_summed_in_float64(layout):
    """The observed error without weights comes from the Gram form ||X||^2 - 2 <X H^T, W> + <W H H^T, W>, which
    cancels: in float32 it was 10% off for a model close to the data; its terms are now float64 (brute force)."""
    from distfact.estimators.select import ObservedBlock

    rng = np.random.default_rng(0)
    W, H = rng.random((2000, 5)), rng.random((5, 300))
    X = np.abs(W @ H * (1 + 5e-4 * rng.standard_normal((2000, 300)))).astype(np.float32)
    W32, H32 = W.astype(np.float32), H.astype(np.float32)
    exact = float(np.sum((X.astype(np.float64) - W32.astype(np.float64) @ H32.astype(np.float64)) ** 2))
    block = X if layout == "dense" else sp.csr_matrix(X)
    assert ObservedBlock(block, None).sq_errors([W32], [H32])[0] == pytest.approx(exact, rel=1e-8)
