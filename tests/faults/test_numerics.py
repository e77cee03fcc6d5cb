"""No NaN in an output with exit status 0 (issue 17, cases 1 and 2): a fit stops at the first non-finite value,
naming the iteration, the block and its group; a group that a method cannot divide by is refused; JSON outputs
are strict JSON."""

import json
import os

import numpy as np
import pytest

import distfact
from conftest import grouped_data
from damage import assert_refused, cli, snapshot
from distfact.engine.finite import NonFiniteError
from distfact.kernels.memory import aligned_copy


@pytest.fixture
def zero_group(tmp_path):
    X, groups = grouped_data(m=90, n=6, n_groups=3, seed=8)
    X[groups == "g1"] = 0.0
    return X, groups, distfact.from_arrays(X, groups, tmp_path / "z.zarr", block_rows=15).path


def test_fairer_nmf_refuses_a_group_of_zeros(zero_group, tmp_path):
    """Case 2: Fairer-NMF with one group all zeros gave NaN factors and errors, exit 0."""
    X, groups, store = zero_group
    with pytest.raises(ValueError, match=r"group 'g1' is all zeros: Fairer-NMF measures each group's loss relative "
                                         r"to \|\|X_l\|\|_F"):
        distfact.FairerNMF(2, max_iter=5).fit(X, groups=groups)
    before = snapshot(tmp_path)
    out = cli("fit", store, "--method", "fairer-nmf", "--rank", 2, "--no-progress", "--output", tmp_path / "fit",
              cwd=tmp_path)
    assert_refused(out, "group 'g1' is all zeros")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("cls", [distfact.NMF, distfact.StratifiedNMF, distfact.SSNMF, distfact.WeightedL1NMF])
def test_methods_that_allow_a_group_of_zeros_give_finite_results(cls, zero_group):
    """The other NMF methods divide by a group's norm only with a floor: a group of zeros has error 0."""
    X, groups, store = zero_group
    model = cls(2, max_iter=5, random_state=0).fit(store)
    assert np.isfinite(model.components_).all() and np.isfinite(model.group_errors_).all()
    assert model.group_errors_[model.group_names_.index("g1")] == 0.0


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")  # numpy says so too; the fit must stop
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_non_finite_global_state_stops_the_fit(dtype):
    X, groups = grouped_data(m=60, n=5, n_groups=3, seed=9, dtype=dtype)
    H = np.full((2, 5), np.sqrt(np.finfo(dtype).max), dtype=dtype)  # finite; H H^T is not
    with pytest.raises(NonFiniteError, match=r"^pass 0 \(the start\): the initial global state produced a "
                                             r"non-finite value \(NaN or infinity\) in 'HHt'; the fit stopped"):
        distfact.NMF(2, init="custom", max_iter=5).fit(X, groups=groups, W=np.ones((60, 2), dtype=dtype), H=H)


BLOCK_ERROR = (r"^pass 0 \(the start\): block \d+ \(group 'g\d', stored rows \d+:\d+\) produced a non-finite value "
               r"\(NaN or infinity\) in statistic 'WtW'")


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")
def test_a_non_finite_statistic_stops_the_fit_naming_the_block_and_group():
    X, groups = grouped_data(m=60, n=5, n_groups=3, seed=9)
    W = np.full((60, 2), 1e160)  # finite, but W_b^T W_b, made by each block in pass 0, overflows
    with pytest.raises(NonFiniteError, match=BLOCK_ERROR):
        distfact.NMF(2, init="custom", max_iter=5, block_rows=20).fit(X, groups=groups, W=W, H=np.ones((2, 5)))


@pytest.mark.cluster
def test_a_non_finite_statistic_on_a_worker_reaches_the_driver_named(local_cluster_client):
    X, groups = grouped_data(m=60, n=5, n_groups=3, seed=9)
    W = np.full((60, 2), 1e160)
    with pytest.raises(NonFiniteError, match=BLOCK_ERROR):
        distfact.NMF(2, init="custom", max_iter=5, block_rows=20).fit(X, groups=groups, W=W, H=np.ones((2, 5)),
                                                                       client=local_cluster_client)


def test_json_outputs_are_strict(tmp_path):
    """Case 1's metrics.json held NaN: the writer refuses non-finite numbers instead of writing invalid JSON."""
    from distfact.outputs import write_json

    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        write_json(tmp_path / "m.json", {"loss": [1.0, float("nan")]})
    assert os.listdir(tmp_path) == []  # nothing half-written
    write_json(tmp_path / "m.json", {"loss": np.float32(0.5), "n": np.int64(3), "h": np.arange(2.0)})
    strict = json.loads((tmp_path / "m.json").read_text(), parse_constant=lambda token: pytest.fail(token))
    assert strict == {"loss": 0.5, "n": 3, "h": [0.0, 1.0]}


class Exploding:
    """A method for the engine alone (test only): every step is a no-op, except that at iteration ``at`` the
    step named ``where`` makes a NaN or an infinity: a block's statistic ('local', in block 1), the global state
    ('global') or a column block's piece ('column')."""

    def __init__(self, at: int, where: str, make_stat=np.array):
        self.at, self.where, self.make_stat = at, where, make_stat

    def initial_global(self, data, rng):
        return {"k": np.zeros(1)}

    def initial_local(self, block, G, rows):
        return np.ones((block.n_rows, 1))

    def block_stats(self, X_b, W_b, block, G):
        return {"s": np.ones(2)}

    def local_step(self, X_b, W_b, block, G):
        bad = self.where == "local" and G["k"][0] == self.at and block.index == 1
        return W_b, {"s": self.make_stat([1.0, np.nan if bad else 1.0])}

    def global_step(self, G, stats, data):
        k = G["k"] + 1
        return {"k": k, "h": np.array([np.inf if self.where == "global" and k[0] == self.at else 0.0])}

    def column_step(self, Xc, W, column_block, G):
        bad = self.where == "column" and G["k"][0] == self.at and column_block.index == 0
        return np.array([-np.inf if bad else 0.0]), {"c": np.zeros(3)}

    def assemble_columns(self, G, pieces):
        return G

    def objective(self, G, stats, data):
        return 0.0, np.zeros(data.n_groups)

    def converged(self, objectives, group_objectives):
        return False


@pytest.mark.parametrize("where, message", [
    ("local", r"^iteration 3: block 1 \(group 'g\d', stored rows \d+:\d+\) produced a non-finite value \(NaN or "
              r"infinity\) in statistic 's'"),
    ("global", r"^iteration 3: the global step produced a non-finite value \(NaN or infinity\) in 'h'"),
    ("column", r"^iteration 3: column block 0 \(columns 0:\d+\) produced a non-finite value \(NaN or infinity\) in "
               r"its part of the global factor"),
])
def test_the_engine_names_the_iteration_and_the_step_of_a_non_finite_value(where, message):
    from distfact.engine import InProcessExecutor, fit, initialise

    X, groups = grouped_data(m=60, n=6, n_groups=3, seed=4)
    data = distfact.from_arrays(X, groups, block_rows=10).with_column_blocks(n_blocks=2)
    method, executor = Exploding(3, where), InProcessExecutor(data, n_threads=2)
    seen = []
    try:
        with pytest.raises(NonFiniteError, match=message):
            fit(method, data, executor, max_iter=10, start=lambda: initialise(method, data, executor, 0),
                callback=lambda info: seen.append(info.iteration))
    finally:
        executor.close()
    assert seen == [1, 2]  # stopped at once: iteration 3 never completed


@pytest.mark.parametrize("make_stat", [np.array, lambda values: aligned_copy(np.array(values))],
                         ids=["copied into the kept allocation", "aligned already: checked alone"])
def test_a_pass_of_one_block_per_group_in_turn_names_the_block_of_a_non_finite_value(make_stat):
    """The in-process executor runs such a pass without tasks and checks its new local factors and statistics by one
    test over its kept allocations (and the arrays it did not copy); the blocks' own checks then name where."""
    from distfact.engine import InProcessExecutor, fit, initialise

    X, groups = grouped_data(m=60, n=6, n_groups=3, seed=4)
    data = distfact.from_arrays(X, groups).with_column_blocks(n_blocks=2)  # Exploding sweeps columns too
    method, executor = Exploding(3, "local", make_stat), InProcessExecutor(data, n_threads=1)
    assert executor._direct  # the path this test is about
    seen = []
    try:
        with pytest.raises(NonFiniteError, match=r"^iteration 3: block 1 \(group 'g1', stored rows \d+:\d+\) produced "
                                                 r"a non-finite value \(NaN or infinity\) in statistic 's'"):
            fit(method, data, executor, max_iter=10, start=lambda: initialise(method, data, executor, 0),
                callback=lambda info: seen.append(info.iteration))
    finally:
        executor.close()
    assert seen == [1, 2]
