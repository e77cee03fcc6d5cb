"""The method contract: every surface reads each method's declaration, so a method added in its own file (the
test-only projected-gradient NMF of plugin_pgnmf.py) runs through `distfact fit`, a pipeline and `distfact
report` with no other file touched; and the command line and pipeline specs take every default from the
estimators."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from sklearn.utils._param_validation import InvalidParameterError, validate_parameter_constraints

from conftest import cli_here, cli_in_process, grouped_data
from distfact.estimators.contract import Number

TESTS = pathlib.Path(__file__).resolve().parent
SOURCE = TESTS.parent / "distfact"


def distfact(*args, cwd, plugin=True):
    env = {**os.environ}
    if plugin:
        env.update(DISTFACT_METHODS="plugin_pgnmf", PYTHONPATH=os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "distfact.cli", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def store(tmp_path):
    from distfact.store import from_arrays

    X, groups = grouped_data(m=90, n=14)
    from_arrays(X, groups, tmp_path / "x.zarr", block_rows=30)
    return tmp_path / "x.zarr", X, groups


def test_no_file_of_distfact_names_the_test_only_method():
    named = [path for path in SOURCE.rglob("*.py") if "pg-nmf" in path.read_text() or "PGNMF" in path.read_text()]
    assert named == []


def test_a_method_in_its_own_file_runs_through_fit_report_and_a_pipeline(store, tmp_path):
    path, X, groups = store
    fit = distfact("fit", path, "--method", "pg-nmf", "--rank", "3", "--max-iter", "40", "--no-progress",
                   "-o", tmp_path / "fit", cwd=tmp_path)
    assert fit.returncode == 0, fit.stderr
    assert "relative_error" in fit.stdout and "g1" in fit.stdout  # the per-group table
    metrics = json.loads((tmp_path / "fit" / "metrics.json").read_text())
    assert metrics["method"] == "pg-nmf" and metrics["params"] == {"max_iter": 40, "step": "lipschitz", "tol": 1e-6}
    assert metrics["n_passes"] == metrics["n_iter"] + 1 and len(metrics["objective_history"]) == metrics["n_iter"] + 1

    # its objective falls and its relative errors are the Frobenius ratio: checked against numpy, with W
    # solved for the fitted H by nonnegative least squares row by row (the projected gradient's fixed point
    # is close to it after 40 iterations, hence the loose tolerance)
    history = np.asarray(metrics["objective_history"])
    assert history[-1] < history[0] and np.all(np.diff(history) <= 1e-9 * history[0])
    H = np.load(tmp_path / "fit" / "components.npy")
    table = __import__("pandas").read_csv(tmp_path / "fit" / "group_metrics.csv")
    from scipy.optimize import nnls

    W = np.array([nnls(H.T, row)[0] for row in X])
    for name in ("g0", "g1", "g2"):
        rows = groups == name
        best = np.linalg.norm(X[rows] - W[rows] @ H) / np.linalg.norm(X[rows])
        reported = table[(table.group == name) & (table.metric == "relative_error")].value.item()
        assert best <= reported <= best * 1.05

    report = distfact("report", tmp_path / "fit", "-o", tmp_path / "report", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    page = (tmp_path / "report" / "report.html").read_text()
    assert "pg-nmf" in page and "relative_error per group" in page and "stopped at max_iter" in page

    spec = tmp_path / "spec.toml"
    spec.write_text(f'name = "pg"\n[input]\nstore = "{path}"\n[[fit]]\nmethod = "pg-nmf"\nranks = [2, 3]\n'
                    f'max_iter = 30\n[output]\ncheckpoint_every = 0\n')
    run = distfact("run", spec, "--output", tmp_path / "runs", "--date", "2026-11-24", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    run_dir = tmp_path / "runs" / "pg" / "2026-11-24"
    rows = __import__("pandas").read_csv(run_dir / "evaluate" / "group_metrics.csv")
    assert set(rows.fit) == {"pg-nmf-r2", "pg-nmf-r3"} and set(rows.metric) == {"relative_error", "objective"}
    assert "pg-nmf" in (run_dir / "report" / "report.html").read_text()


def test_an_unknown_method_or_another_methods_option_is_refused(store, tmp_path, capsys):
    path, _, _ = store
    out = distfact("fit", path, "--method", "pg-nmf", "--rank", "2", "--lam", "0.5", cwd=tmp_path)
    assert out.returncode == 2 and "--lam does not apply to pg-nmf" in out.stderr
    out = distfact("fit", path, "--method", "pg-nmf", "--rank", "2", cwd=tmp_path, plugin=False)
    assert out.returncode == 2 and "invalid choice: 'pg-nmf'" in out.stderr
    out = cli_here(capsys, "fit", path, "--method", "nmf", "--rank", "2", "--solver", "am", cwd=tmp_path)
    assert out.returncode == 2 and "The 'solver' parameter of NMF must be a str among" in out.stderr


def test_a_method_of_an_installed_package_is_found_through_its_entry_point_read_once(tmp_path):
    """The third way (registry.py): a ``distfact.methods`` entry point of an installed package (here a dist-info
    directory on the path), in a fresh process; the installed packages' entry points are read at the first lookup
    only (each read takes 10 ms or more)."""
    info = tmp_path / "site" / "pgnmf_plugin-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pgnmf-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[distfact.methods]\npg-nmf = plugin_pgnmf:DECLARATION\n")
    probe = ("import distfact.registry as registry\n"
             "reads = []\n"
             "read = registry.entry_points\n"
             "registry.entry_points = lambda **kwargs: reads.append(kwargs) or read(**kwargs)\n"
             "names = [registry.get_method('pg-nmf').name, *registry.methods(), registry.get_method('nmf').name]\n"
             "print(names.count('pg-nmf'), reads)")
    env = {key: value for key, value in os.environ.items() if key != "DISTFACT_METHODS"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "site"), str(TESTS)])
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split(maxsplit=1) == ["2", "[{'group': 'distfact.methods'}]\n"]


def _builtin_methods():
    from distfact.estimators import DECLARATIONS

    return DECLARATIONS


@pytest.mark.parametrize("declaration", _builtin_methods(), ids=lambda d: d.name)
def test_every_parameter_is_declared_with_its_constraints_and_help(declaration):
    parameters = declaration.parameters()
    assert parameters, declaration.name
    defaults = declaration.estimator(2).get_params(deep=False)
    validate_parameter_constraints(declaration.estimator._parameter_constraints, defaults,
                                   caller_name=declaration.name)
    assert all(p.help for p in parameters.values()), [p.name for p in parameters.values() if not p.help]


@pytest.mark.parametrize("declaration", _builtin_methods(), ids=lambda d: d.name)
def test_a_boolean_is_refused_where_a_number_is_meant(declaration):
    """scikit-learn's Interval takes True as the int 1; no number here may be given as a boolean (a spec's
    ``checkpoint_every = true``), whatever else the parameter allows."""
    constraints = declaration.estimator._parameter_constraints
    numbers_meant = sorted(name for name, allowed in constraints.items()
                           if any(isinstance(c, Number) for c in allowed) and "boolean" not in allowed)
    assert {"n_components", "max_iter", "checkpoint_every"} <= set(numbers_meant), numbers_meant
    for name in numbers_meant:
        with pytest.raises(InvalidParameterError, match=f"'{name}' parameter .* Got True instead"):
            validate_parameter_constraints(constraints, {**declaration.estimator(2).get_params(deep=False),
                                                         name: True}, caller_name=declaration.name)


@pytest.mark.parametrize("declaration", _builtin_methods(), ids=lambda d: d.name)
def test_the_command_line_and_pipeline_defaults_are_the_estimators(declaration, store, tmp_path, capsys):
    """`distfact fit` with nothing but the method and the rank fits with every parameter at the estimator's own
    default (the parameters it records are ``Estimator(rank)``'s), and a [[fit]] table with nothing but the
    method and the rank gives the pipeline no parameter to pass (``run.py`` builds ``Estimator(rank,
    **params)``)."""
    from distfact.pipeline.spec import load_spec

    path, _, _ = store
    code, _, err = cli_in_process(capsys, "fit", path, "--method", declaration.name, "--rank", "2", "--no-progress",
                                  "-o", tmp_path / "f")
    assert code == 0, err
    recorded = json.loads((tmp_path / "f" / "metrics.json").read_text())["params"]
    own = declaration.estimator(2).get_params()
    assert recorded == {name: own[name] for name in declaration.parameters()}
    spec = tmp_path / "spec.toml"
    spec.write_text(f'name = "d"\n[input]\nstore = "{path}"\n[[fit]]\nmethod = "{declaration.name}"\nrank = 2\n')
    fit = load_spec(spec).fits[0]
    assert fit.params == {} and fit.inputs == {i.name: i.default for i in declaration.fit_inputs}
    assert declaration.make(2, fit.params, random_state=0).get_params() == declaration.estimator(
        2, random_state=0).get_params()


@pytest.mark.parametrize("declaration", _builtin_methods(), ids=lambda d: d.name)
def test_declared_metrics_are_the_glossarys_and_the_fits(declaration, store):
    """Each declared metric is defined in the glossary (one meaning for every method), and a fit's
    group_metrics_ holds relative_error and only declared metrics."""
    from distfact.metrics import METRICS

    assert set(declaration.metrics) <= set(METRICS) and "relative_error" in declaration.metrics
    path, _, groups = store
    model = declaration.make(2, {}, random_state=0)
    model.set_params(**{k: 5 for k in ("max_iter",) if k in declaration.parameters()})
    model.fit(str(path), **declaration.fit_arguments(model, {}, model._grouped(str(path), None), None))
    reported = set(model.group_metrics_["metric"])
    assert "relative_error" in reported and reported <= set(declaration.metrics)
    assert set(model.group_metrics_["group"]) == set(groups)
