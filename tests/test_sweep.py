"""Many models in the same passes (issue 19): ``distfact.fit_many`` against each model fitted alone (the oracle: the
estimator's own ``fit``, a second code path), passes and store reads counted. NMF's shared products (one product of
a block for all the models, ``shared_products=True``) against the fits alone to rounding, and bitwise without them."""

import inspect
import os
import threading
import warnings

import numpy as np
import pytest
import scipy.sparse as sp

import distfact.store.reading as reading
from distfact import (NMF, SSNMF, FairerNMF, MultigroupSVD, StratifiedNMF, WeightedL1NMF, fit_many, from_arrays,
                      open as open_store)
from distfact.engine.executor.spill import load_local
from distfact.estimators.tables import make_tables

from conftest import grouped_data

SWEEP_ONLY = ("sweep_passes_",)


def fitted_attributes(model) -> dict:
    make_tables(model)  # the tables made when first read are compared too
    return {name: value for name, value in vars(model).items()
            if name.endswith("_") and not name.startswith("__") and name not in SWEEP_ONLY}


def assert_bitwise_equal(swept, alone):
    """Every fitted attribute of the model fitted in the sweep is the one of its fit alone, to the last bit."""
    mine, theirs = fitted_attributes(swept), fitted_attributes(alone)
    assert mine.keys() == theirs.keys()
    for name, value in theirs.items():
        other = mine[name]
        if isinstance(value, np.ndarray):
            assert other.dtype == value.dtype and np.array_equal(other, value), name
        elif hasattr(value, "equals"):
            assert value.equals(other), name
        else:
            assert other == value, name


def assert_equal_to_rounding(swept, alone, rtol=1e-10):
    """Every fitted attribute of the swept model is its fit alone's: the same iterations, passes, names and flags,
    and every float (factors, histories, errors, metrics) within ``rtol`` of the fit alone's, relative to the
    largest magnitude of its array (an entry of H at 0 in one fit may be 1e-300 in the other)."""
    mine, theirs = fitted_attributes(swept), fitted_attributes(alone)
    assert mine.keys() == theirs.keys()
    for name, value in theirs.items():
        other = mine[name]
        if hasattr(value, "equals"):  # a metrics table: its labels equal, its values close
            assert value.drop(columns="value").equals(other.drop(columns="value")), name
            value, other = value["value"].to_numpy(), other["value"].to_numpy()
        if isinstance(value, (np.ndarray, float)) and np.asarray(value).dtype.kind == "f":
            value, other = np.asarray(value), np.asarray(other)
            assert other.dtype == value.dtype and other.shape == value.shape, name
            np.testing.assert_allclose(other, value, rtol=rtol, atol=rtol * np.abs(value).max(initial=0.0),
                                       err_msg=name)
        else:
            assert other == value, name


def alone_like(template, model):
    return type(template)(**{**template.get_params(), "n_components": model.n_components,
                             "random_state": model.random_state})


X, GROUPS = grouped_data(m=150, n=24, n_groups=3)
Y = np.random.default_rng(1).random((150, 2))

#: the cases whose method shares its products between the models by default (compared bitwise without them)
SHARED_PRODUCTS = ("nmf-mu", "nmf-hals", "nmf-nndsvda")

CASES = {
    "nmf-mu": (NMF(max_iter=60), {}),
    "nmf-hals": (NMF(solver="hals", max_iter=60), {}),
    "nmf-kl": (NMF(beta_loss="kullback-leibler", max_iter=40), {}),
    "nmf-nndsvda": (NMF(init="nndsvda", max_iter=40), {}),
    "stratified": (StratifiedNMF(2, max_iter=80), {}),
    "wl1-hals-start": (WeightedL1NMF(2, hals_iter=5, max_iter=15, tol=1e-5), {}),
    "wl1-random": (WeightedL1NMF(2, init="random", max_iter=15, tol=1e-5), {}),
    "ssnmf-ff": (SSNMF(2, model="FF", max_iter=30), {"Y": Y}),
    "ssnmf-df": (SSNMF(2, model="DF", max_iter=30), {"Y": Y}),
    "fairer-mu": (FairerNMF(2, n_estimates=2, max_iter=40, estimate_max_iter=150), {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_model_is_bitwise_its_fit_alone(case):
    """Ranks x seeds in one sweep: models stop at different iterations (frozen meanwhile), each equal to its fit
    alone in every fitted attribute (factors, histories, iterations, passes, per-group metrics); NMF's Frobenius
    cases with ``shared_products=False``, the others by default."""
    template, inputs = CASES[case]
    exact = {"shared_products": False} if case in SHARED_PRODUCTS else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        swept = fit_many(template, X, groups=GROUPS, ranks=[1, 3], seeds=[0, 5], **exact, **inputs)
        alone = [alone_like(template, model).fit(X, groups=GROUPS, **inputs) for model in swept]
    assert [(m.n_components, m.random_state) for m in swept] == [(1, 0), (1, 5), (3, 0), (3, 5)]
    for model, oracle in zip(swept, alone):
        assert_bitwise_equal(model, oracle)
    assert len({m.n_iter_ for m in swept}) > 1 or case.startswith("fairer")  # they stopped apart
    assert swept[0].sweep_passes_ < sum(m.n_passes_ for m in swept)


#: X of several blocks (200, 200 and 120 rows), each of several tiles of the dense local step (65 rows of 2,000)
WIDE, WIDE_GROUPS = grouped_data(m=520, n=2_000, n_groups=3, seed=3)


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("solver", ["mu", "hals"])
def test_shared_products_equal_each_fit_alone_to_rounding(solver, n_threads):
    """NMF's models share one product of each tile for all of them (the default): every model, and its W, equals
    its fit alone to 1e-10 relative, with the same iterations (the models stop at different ones) and passes; one
    read of X per iteration for all. A model left running alone goes on with its own products."""
    template = NMF(solver=solver, max_iter=100, tol=1e-3, block_rows=200, n_threads=n_threads, random_state=0)
    ranks = [2, 4, 7]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        swept, Ws = fit_many(template, WIDE, groups=WIDE_GROUPS, ranks=ranks, return_W=True)
        alone = [alone_like(template, model) for model in swept]
        W_alone = [oracle.fit_transform(WIDE, groups=WIDE_GROUPS) for oracle in alone]
    assert [m.n_components for m in swept] == ranks
    assert len({m.n_iter_ for m in swept}) == len(ranks)  # they stopped apart
    assert swept[0].sweep_passes_ == max(m.n_passes_ for m in swept) < sum(m.n_passes_ for m in swept)
    for model, oracle, W, W_oracle in zip(swept, alone, Ws, W_alone):
        assert_equal_to_rounding(model, oracle)
        np.testing.assert_allclose(W, W_oracle, rtol=1e-10, atol=1e-10 * np.abs(W_oracle).max())
    assert not all(np.array_equal(m.components_, o.components_) for m, o in zip(swept, alone))  # products shared


def test_without_shared_products_each_model_is_bitwise_its_fit_alone():
    """``shared_products=False`` on the blocks and tiles where the products are shared by default: bitwise."""
    template = NMF(max_iter=10, tol=0, block_rows=200, random_state=0)
    swept = fit_many(template, WIDE, groups=WIDE_GROUPS, ranks=[2, 5], shared_products=False)
    for model in swept:
        assert_bitwise_equal(model, alone_like(template, model).fit(WIDE, groups=WIDE_GROUPS))


@pytest.fixture
def counted_reads(monkeypatch):
    """Reads of X's blocks from the store (every call of the store's block reader reads one block's arrays), of a
    store read in every pass, as one larger than ``RESIDENT_STORE_BYTES`` is (a smaller one is read once, and held)."""
    from distfact.engine.executor import inprocess

    monkeypatch.setattr(inprocess, "RESIDENT_STORE_BYTES", 0)
    count = {"reads": 0}
    lock = threading.Lock()
    real = reading.read_arrays

    def counting(*args, **kwargs):
        with lock:
            count["reads"] += 1
        return real(*args, **kwargs)
    monkeypatch.setattr(reading, "read_arrays", counting)
    return count


def fold_masks(n_folds: int, seed: int = 7) -> list:
    """Binary masks of X's shape, one per fold (dense, sparse, and one fold without a mask)."""
    rng = np.random.default_rng(seed)
    masks = [(rng.random(X.shape) >= 0.1).astype(float) for _ in range(n_folds)]
    return [sp.csr_matrix(mask) if f % 2 else mask for f, mask in enumerate(masks)]


#: iterations of each counted fit (tol=0): ITERATIONS + 1 passes, pass 0 and one per iteration
ITERATIONS = 10
#: (template, per-model masks or None, (X, groups, block_rows), how each model compares with its fit alone): the 10
#: ranks of issue 19, on blocks of one tile and on blocks of several (where NMF's models share their products), and
#: 10 ranks x 5 folds of issue 20
COUNTED = {"10 ranks": (NMF(max_iter=ITERATIONS, tol=0, n_threads=1), None, (X, GROUPS, 40), assert_bitwise_equal),
           "10 ranks, shared products": (NMF(max_iter=ITERATIONS, tol=0, n_threads=1), None,
                                         (WIDE, WIDE_GROUPS, 200), assert_equal_to_rounding),
           "10 ranks x 5 folds": (SSNMF(1, model="FF", max_iter=ITERATIONS, tol=0, n_threads=1), fold_masks(5),
                                  (X, GROUPS, 40), assert_bitwise_equal)}


@pytest.mark.parametrize("case", list(COUNTED))
def test_a_sweep_of_ten_ranks_reads_X_once_per_iteration(tmp_path, counted_reads, case):
    """10 ranks (x 5 folds, each model with its fold's mask), 10 iterations each (tol=0): 11 passes over the
    store on disk (pass 0 and one per iteration), each reading every block once; the same fits one by one read
    it 10 (50) times as often, and each is its model of the sweep (bitwise, or to rounding with shared products).
    (10 iterations: what is counted is reads per pass; the fits one by one read the store in every pass.)"""
    template, masks, (X_case, groups, block_rows), assert_equal = COUNTED[case]
    folds = [None] if masks is None else masks
    store = from_arrays(X_case, groups, path=str(tmp_path / "x.zarr"), block_rows=block_rows)
    n_blocks = len(store.blocks)
    data = open_store(str(tmp_path / "x.zarr"))
    counted_reads["reads"] = 0
    swept = fit_many(template, data, ranks=range(1, 11), seeds=[0], masks=masks)
    assert len(swept) == 10 * len(folds)
    passes = ITERATIONS + 1
    assert n_blocks > 1
    assert swept[0].sweep_passes_ == passes
    assert counted_reads["reads"] == passes * n_blocks
    assert [m.n_passes_ for m in swept] == [passes] * len(swept)
    counted_reads["reads"] = 0
    mask_inputs = [{} if mask is None else {"mask": mask} for mask in folds]
    alone = [alone_like(template, model).fit(data, **inputs)
             for inputs, model in zip([inputs for inputs in mask_inputs for _ in range(10)], swept)]
    assert counted_reads["reads"] == len(swept) * passes * n_blocks
    assert [(m.n_components, m.random_state) for m in alone] == [(r, 0) for _ in folds for r in range(1, 11)]
    for model, oracle in zip(swept, alone):
        assert_equal(model, oracle)
    if assert_equal is assert_equal_to_rounding:
        assert not all(np.array_equal(m.components_, o.components_) for m, o in zip(swept, alone))


MASKED = [SSNMF(1, model="FF", max_iter=40), SSNMF(1, model="FD", max_iter=20),
          pytest.param(NMF(max_iter=40), marks=pytest.mark.skipif(
              "mask" not in inspect.signature(NMF.fit).parameters, reason="NMF.fit takes no mask yet"))]


@pytest.mark.parametrize("template", MASKED, ids=["ssnmf-F", "ssnmf-D", "nmf"])
def test_each_model_with_its_own_mask_is_bitwise_its_fit_alone(template):
    """Masks x ranks x seeds (masks outermost), W returned: each model, and its W, is bitwise its fit alone
    (``fit_transform``) with its mask; a fold without a mask is the unmasked fit."""
    masks = fold_masks(2) + [None]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        swept, Ws = fit_many(template, X, groups=GROUPS, ranks=[1, 3], seeds=[0, 5], masks=masks, return_W=True)
        alone = [alone_like(template, model) for model in swept]
        W_alone = [oracle.fit_transform(X, groups=GROUPS, **({} if masks[i // 4] is None else
                                                              {"mask": masks[i // 4]}))
                   for i, oracle in enumerate(alone)]
    assert [(m.n_components, m.random_state) for m in swept] == [(1, 0), (1, 5), (3, 0), (3, 5)] * 3
    for model, oracle, W, W_oracle in zip(swept, alone, Ws, W_alone):
        assert_bitwise_equal(model, oracle)
        assert W.dtype == W_oracle.dtype and np.array_equal(W, W_oracle)
    assert not np.array_equal(Ws[0], Ws[8])  # the masks changed the fits


class MasklessNMF(NMF):
    """An estimator whose fit takes no mask (as a plug-in's may: every NMF-family estimator of distfact takes one)."""

    def fit(self, X, y=None, *, groups=None, client=None):
        return super().fit(X, y, groups=groups, client=client)


def test_masks_need_a_fit_that_takes_one():
    with pytest.raises(TypeError, match="MasklessNMF.fit takes no argument 'mask'"):
        fit_many(MasklessNMF(2), X, groups=GROUPS, masks=fold_masks(2))
    with pytest.raises(ValueError, match="one per model"):
        fit_many([SSNMF(2, model="FF"), SSNMF(3, model="FF")], X, groups=GROUPS, masks=fold_masks(1))
    with pytest.raises(ValueError, match="not both"):
        fit_many(SSNMF(2, model="FF"), X, groups=GROUPS, masks=fold_masks(2), mask=fold_masks(1)[0])


def test_a_frozen_model_costs_no_work(tmp_path):
    """Once every model but one has stopped, a pass runs that one only: its callback sees every iteration, the
    stopped ones' no more after they stopped."""
    seen = {}

    def watch(rank):
        return lambda info: seen.setdefault(rank, []).append((info.iteration, info.n_passes))
    models = [NMF(r, max_iter=200, tol=1e-3, random_state=0, callback=watch(r)) for r in (1, 4)]
    fit_many(models, X, groups=GROUPS)
    for model in models:
        iterations = [i for i, _ in seen[model.n_components]]
        assert iterations == list(range(1, model.n_iter_ + 1))
        assert seen[model.n_components][-1][1] == model.n_passes_
    assert models[0].n_iter_ < models[1].n_iter_


def test_W_out_of_each_model_is_its_fit_alone(tmp_path):
    swept = fit_many(NMF(max_iter=20, block_rows=50, random_state=0), X, groups=GROUPS, ranks=[2, 3],
                     W_out=[str(tmp_path / "w2"), str(tmp_path / "w3")], shared_products=False)
    for model in swept:
        NMF(model.n_components, max_iter=20, block_rows=50, random_state=0).fit(X, groups=GROUPS,
                                                                W_out=str(tmp_path / f"alone{model.n_components}"))
        names = sorted(os.listdir(tmp_path / f"alone{model.n_components}"))
        assert names == sorted(os.listdir(tmp_path / f"w{model.n_components}"))
        for name in names:
            block = type("B", (), {"index": int(name)})
            assert np.array_equal(load_local(str(tmp_path / f"w{model.n_components}"), block),
                                  load_local(str(tmp_path / f"alone{model.n_components}"), block))


def test_a_sweep_on_a_cluster_is_its_fits_alone(local_cluster_client):
    """Shared products on the workers: each model equals its fit alone on the cluster to rounding."""
    template = NMF(solver="hals", max_iter=10, tol=0, block_rows=200, random_state=0)
    swept = fit_many(template, WIDE, groups=WIDE_GROUPS, ranks=[2, 4], client=local_cluster_client)
    for model in swept:
        oracle = alone_like(template, model).fit(WIDE, groups=WIDE_GROUPS, client=local_cluster_client)
        assert_equal_to_rounding(model, oracle)
        assert model.n_components == 2 or not np.array_equal(model.components_, oracle.components_)


@pytest.mark.parametrize("models, message", [
    ([MultigroupSVD(2)], "not fitted by iterations"),
    ([NMF(2, checkpoint_dir="somewhere")], "no checkpoints"),
    ([NMF(2, init="custom")], "init='custom'"),
    ([NMF(2, block_rows=10), NMF(3, block_rows=20)], "block_rows must be the same"),
    ([NMF(2), StratifiedNMF(2)], "one estimator class"),
])
def test_what_a_sweep_refuses(models, message):
    with pytest.raises(ValueError, match=message):
        fit_many(models, X, groups=GROUPS)


def test_arguments_fit_does_not_take_are_refused():
    with pytest.raises(TypeError, match="takes no argument 'Y'"):
        fit_many(NMF(2), X, groups=GROUPS, Y=Y)
