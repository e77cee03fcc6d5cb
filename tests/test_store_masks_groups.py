"""A store's own mask (written at ingest) in the group-aware methods (issue 20): FairerNMF (MU) and StratifiedNMF
fit a store with a mask bitwise as they fit X in memory with the same mask cut into the same blocks; Fairer-NMF's
transform of a store with a mask solves the rows over their observed entries; the surfaces that do not read a
stored mask refuse it rather than fit or solve as if every entry were observed.

The oracle of every fit is a second code path, the in-memory masked fit (tests/test_masks_groups.py checks it
against numpy transcriptions of the weighted Algorithms); the oracle of transform is an NNLS per row over its
observed entries (scipy.optimize.nnls)."""

import json
import re

import numpy as np
import pytest
from scipy.optimize import nnls

import distfact
from distfact import FairerNMF, MultigroupSVD, StratifiedNMF, WeightedL1NMF
from distfact.cli import main as cli_main
from distfact.estimators.multigroup_svd import MASK_REFUSAL
from distfact.estimators.masks import resolve_mask
from test_store_masks import BLOCK_ROWS, weights, with_holes


def fairer(**params):
    return FairerNMF(3, **{"n_estimates": 2, "estimate_max_iter": 15, "max_iter": 10, "tol": 0, "random_state": 3,
                           **params})


def stratified(**params):
    return StratifiedNMF(3, **{"max_iter": 10, "tol": None, "random_state": 0, **params})


MAKERS = {"fairer": fairer, "stratified": stratified}


def assert_same_fit(ours, theirs):
    for name in ("components_", "objective_history_", "group_errors_", "E_", "E_runs_", "c_", "strata_features_"):
        if hasattr(theirs, name):
            np.testing.assert_array_equal(getattr(ours, name), getattr(theirs, name), err_msg=name)


def stored_and_given(tmp_path, layout, kind, seed=0):
    """(the store with its mask, X, groups, the mask as fit takes it in memory): "nan" (X's NaN entries) or dense
    weights (0, fractional and 1; blocks of both sparse forms)."""
    X, groups = with_holes(layout, seed=seed)
    if kind == "nan":
        return distfact.from_arrays(X, groups, tmp_path / "x.zarr", block_rows=BLOCK_ROWS, missing="nan"), X, groups, "nan"
    X = resolve_mask(X, "nan")[0]  # no NaN: the weights say what is missing
    M = weights(X.shape, seed=seed)
    stored = distfact.from_arrays(X, groups, tmp_path / "x.zarr", block_rows=BLOCK_ROWS, mask=M)
    assert {b.mask.form for b in stored.blocks} == {"complement", "observed"}
    return stored, X, groups, M


def stored_and_given_once_each(tmp_path_factory):
    """:func:`stored_and_given` with each store written once (writing one takes 0.3-0.6 s; the fits and transforms
    only read it): each call gets the store opened afresh (as from_arrays returns it: open) and its own copies of X
    and the mask."""
    made = {}

    def stored_and_given_once(layout, kind, seed=0):
        if (layout, kind, seed) not in made:
            made[layout, kind, seed] = stored_and_given(tmp_path_factory.mktemp("stored"), layout, kind, seed)
        stored, X, groups, mask = made[layout, kind, seed]
        return distfact.open(stored.path), X.copy(), groups.copy(), mask if isinstance(mask, str) else mask.copy()
    return stored_and_given_once


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """:func:`stored_and_given_once_each` for the module."""
    return stored_and_given_once_each(tmp_path_factory)


# ------------------------------------------------------------------ fits: the store's mask is fit's mask
@pytest.mark.parametrize("kind", ["nan", "weights"])
@pytest.mark.parametrize("layout", ["dense", "csr"])
@pytest.mark.parametrize("make", list(MAKERS))
def test_a_stored_mask_fits_as_the_in_memory_mask(stores, make, layout, kind):
    stored, X, groups, mask = stores(layout, kind)
    ours = MAKERS[make]().fit(stored)
    theirs = MAKERS[make](block_rows=BLOCK_ROWS).fit(X, groups=groups, mask=mask)
    assert_same_fit(ours, theirs)
    assert_same_fit(MAKERS[make]().fit(str(stored.path)), theirs)  # the store opened from its path


def test_a_stored_mask_fits_the_same_on_a_local_cluster(stores, local_cluster_client):
    stored, X, groups, mask = stores("csr", "nan", seed=2)
    for make in MAKERS.values():
        ours = make().fit(stored, client=local_cluster_client)
        assert ours.scheduler_["mode"] == "distributed"
        assert_same_fit(ours, make(block_rows=BLOCK_ROWS).fit(X, groups=groups, mask=mask))


@pytest.mark.parametrize("make", list(MAKERS))
def test_fit_many_reads_the_stored_mask(stores, make):
    """A rank sweep in shared passes: each model as its fit alone (whose local states hold the mask its first
    task read; Fairer-NMF's scheme keeps them from the E_l runs)."""
    stored, *_ = stores("csr", "weights", seed=7)
    for rank, model in zip([2, 3], distfact.fit_many(MAKERS[make](), stored, ranks=[2, 3])):
        assert_same_fit(model, MAKERS[make]().set_params(n_components=rank).fit(stored))


@pytest.mark.parametrize("make", list(MAKERS))
def test_checkpoints_carry_the_stored_mask_and_resume_bitwise(stores, tmp_path, make):
    stored, *_ = stores("dense", "nan", seed=4)
    whole = MAKERS[make]().fit(stored)
    # a checkpoint every 4 iterations, not 2 (a save writes every block's local factors: 0.1-0.5 s here): the
    # interrupted fit still checkpoints every phase (Fairer-NMF's E_l runs at 4, 8 and 12 of their 15, its scheme
    # at 4), and the resumed one continues each phase from its newest checkpoint
    params = dict(checkpoint_dir=tmp_path / "run", checkpoint_every=4)
    MAKERS[make](max_iter=4, **params).fit(stored)
    configs = sorted((tmp_path / "run").rglob("iter-*/config.json"))
    phases = {path.relative_to(tmp_path / "run").parts[0] for path in configs}
    assert phases == ({"estimate", "scheme"} if make == "fairer" else {"checkpoints"}), phases
    for path in configs:  # every phase's configuration names the stored mask
        assert json.dumps(json.loads(path.read_text())).count(f"stored:{stored.mask_identity()}") == 1, path
    assert_same_fit(MAKERS[make](resume=True, **params).fit(stored), whole)


def test_fairer_am_refuses_a_stored_mask(stores):
    stored, *_ = stores("dense", "nan")
    pytest.importorskip("clarabel")
    with pytest.raises(ValueError, match=r"solver='am'\) takes no mask \(the store holds one"):
        fairer(solver="am").fit(stored)


# ------------------------------------------------------------------ transform
def test_fairer_transform_of_a_store_with_a_mask_is_nnls_over_the_observed_entries(stores):
    """Fairer-NMF's transform is NMF's row solve: with the store's mask, W over each row's observed entries (the
    weighted MU it runs converges to each row's NNLS over them)."""
    stored, X, groups, _ = stores("dense", "nan", seed=5)
    model = fairer().fit(stored)
    W = model.transform(stored, max_iter=20_000, tol=1e-13)
    H = model.components_
    expected = np.stack([nnls(H[:, ~np.isnan(x)].T, x[~np.isnan(x)])[0] for x in X])
    np.testing.assert_allclose(W, expected, atol=1e-6)
    unmasked = model.transform(resolve_mask(X, "nan")[0], groups=groups, max_iter=20_000, tol=1e-13)
    assert np.abs(unmasked - expected).max() > 1e-2  # what transform gave before: the holes read as zeros


# ------------------------------------------------------------------ what does not read a stored mask refuses it
def test_multigroup_svd_refuses_a_store_with_a_mask(stores):
    stored, X, groups, _ = stores("dense", "nan")
    reason = re.escape(MASK_REFUSAL)
    for data in (stored, str(stored.path)):
        with pytest.raises(ValueError, match=rf"has a mask \(kind 'nan', written at ingest\): {reason}$"):
            MultigroupSVD(2).fit(data)
    model = MultigroupSVD(2).fit(resolve_mask(X, "nan")[0], groups=groups)
    with pytest.raises(ValueError, match=rf"has a mask \(kind 'nan', written at ingest\): {reason}$"):
        model.transform(stored)


def test_the_cli_fit_of_the_multigroup_svd_on_a_store_with_a_mask_exits_2(stores, tmp_path, capsys):
    stored, *_ = stores("dense", "nan")
    status = cli_main(["fit", str(stored.path), "--method", "multigroup-svd", "--rank", "2", "--no-progress",
                       "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert status == 2, err
    assert "has a mask (kind 'nan', written at ingest): the multigroup SVD takes no mask" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("make", ["stratified", "wl1"])  # SSNMF's reads it: tests/test_ssnmf_masks.py
def test_transforms_that_do_not_read_a_stored_mask_refuse_it(stores, make):
    stored, X, groups, _ = stores("dense", "nan")
    X = resolve_mask(X, "nan")[0]
    model = {"stratified": lambda: stratified(),
             "wl1": lambda: WeightedL1NMF(3, max_iter=3, random_state=0)}[make]().fit(X, groups=groups)
    name = type(model).__name__
    with pytest.raises(ValueError, match=rf"has a mask \(kind 'nan', written at ingest\), which {name}.transform "
                                         r"does not read from a store yet; it would treat every entry as observed"):
        model.transform(stored)

