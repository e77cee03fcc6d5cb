"""The package's plan: no import cycles among distfact's modules, and no module importing the package root.

Read from the source with ast (nothing is imported), counting every import statement, those inside functions
too: an import moved into a function still makes the two modules depend on each other.

`from P import name` depends on P's __init__ (Python runs it first), and on P.name too when that is a module;
`import P.Q` and `from P.Q import name` depend on P.Q. A module that depends on its own package's __init__ (or
an ancestor's) is a cycle on its own: the package contains it. A package's __init__ importing its submodules
is the plan, not a cycle."""

import ast
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "distfact"


def module_names(root):
    """{dotted module name: (path, is a package's __init__)} for every .py file under root."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = (root.name, *path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


def parse(path):
    """The ast of a source file. CPython 3.11's ast constructor can raise a spurious SystemError ("AST constructor
    recursion depth mismatch", python/cpython issue 106905): seen once here on 3.11.7, in an xdist worker where an
    earlier test's Dask cluster still had its threads; the same file then parses. So a SystemError is retried once
    (a file that does not parse raises SyntaxError, never this)."""
    source = path.read_text(encoding="utf-8")
    try:
        return ast.parse(source, str(path))
    except SystemError as exc:
        if "recursion depth mismatch" not in str(exc):
            raise
        return ast.parse(source, str(path))


def import_graph(root):
    """{module: {modules it imports}} among the modules under root (imports of other packages are left out)."""
    modules = module_names(root)
    graph = {}
    for name, (path, is_package) in modules.items():
        package = name if is_package else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(parse(path)):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module
                targets.add(source)
                targets.update(f"{source}.{alias.name}" for alias in node.names)
        graph[name] = {target for target in targets if target in modules and target != name}
    return graph


def strongly_connected(graph):
    """Tarjan's strongly connected components of graph, those of more than one module."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def import_cycles(root):
    """Every import cycle: the groups of modules that import each other, and each module importing an
    __init__ of a package that contains it."""
    graph = import_graph(root)
    cycles = [" <-> ".join(component) for component in strongly_connected(graph)]
    cycles += [f"{name} -> {target} (its own package)" for name, targets in sorted(graph.items())
               for target in sorted(targets) if name.startswith(target + ".")]
    return cycles


def test_no_import_cycles():
    assert import_cycles(SOURCE) == []


def test_no_module_imports_the_package_root():
    graph = import_graph(SOURCE)
    assert sorted(name for name, targets in graph.items() if SOURCE.name in targets) == []


def test_the_cycle_finder_finds_cycles(tmp_path):
    """A package with each kind of cycle (two modules importing each other, one of them lazily inside a
    function; a module importing its own package's __init__; one importing the root) and imports that are not."""
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    files = {"__init__.py": "", "a.py": "from .b import f\n", "b.py": "def f():\n    from .a import g\n",
             "root.py": "import pkg\n", "fine.py": "from .sub.thing import thing\nfrom .sub import other\n",
             "sub/__init__.py": "from .thing import thing\n", "sub/thing.py": "from . import other\n",
             "sub/other.py": "import os\n"}
    for name, text in files.items():
        (root / name).write_text(text)
    assert import_cycles(root) == ["pkg.a <-> pkg.b", "pkg.sub <-> pkg.sub.thing", "pkg.root -> pkg (its own package)",
                                   "pkg.sub.thing -> pkg.sub (its own package)"]
    graph = import_graph(root)
    assert graph["pkg.fine"] == {"pkg.sub", "pkg.sub.thing", "pkg.sub.other"}
    assert sorted(name for name, targets in graph.items() if "pkg" in targets) == ["pkg.root"]


def test_the_command_lines_start_imports_only_what_the_command_needs(tmp_path):
    """`distfact --help` builds its parser without numpy, scikit-learn, Dask, pandas or Zarr, `distfact info`
    reads a store's metadata without scikit-learn, Dask's distributed, pandas, numba (the kernels' compiler: about
    0.1 s of a 0.5 s budget), scipy (0.25 s here) or zarr (0.4-0.5 s) (distfact/lazy.py, store/describe.py;
    start-up time: benchmarks/bench_startup.py), and `distfact runs` lists a pipeline's runs without the estimators,
    scikit-learn or Dask's distributed (1.7 s of imports: distfact/pipeline/__init__.py)."""
    import subprocess
    import sys

    import numpy as np

    from distfact.store.ingest import from_arrays

    from_arrays(np.ones((6, 3)), np.array(["a", "b"] * 3), tmp_path / "x.zarr")
    probe = ("import sys, contextlib, io\nfrom distfact.cli import main\n"
             "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
             "    main(sys.argv[1:])\n"
             "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))")
    loaded = {}
    for command in (["--help"], ["info", str(tmp_path / "x.zarr")], ["runs", "nightly", "--root", str(tmp_path)]):
        out = subprocess.run([sys.executable, "-c", probe, *command], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        loaded[command[0]] = set(out.stdout.split())
    assert not loaded["--help"] & {"numpy", "sklearn", "dask", "distributed", "pandas", "zarr", "scipy"}, \
        loaded["--help"]
    assert not loaded["info"] & {"sklearn", "distributed", "pandas", "numba", "scipy", "zarr"}, loaded["info"]
    assert "numpy" in loaded["info"]  # the probe does see what a command imports (the store's modules use numpy)
    assert not loaded["runs"] & {"sklearn", "distributed", "numba"}, loaded["runs"]
    assert "pandas" in loaded["runs"]  # (the runs' table)


def test_the_pipeline_package_gives_its_names_and_modules_when_first_used():
    import distfact.pipeline as pipeline
    from distfact.pipeline.spec import load_spec

    assert pipeline.load_spec is load_spec and pipeline.spec.load_spec is load_spec
    assert pipeline.nightly.__name__ == "distfact.pipeline.nightly"
    assert set(pipeline.__all__) | set(pipeline.MODULES) <= set(dir(pipeline))
    with pytest.raises(AttributeError, match="has no attribute 'stage'"):
        pipeline.stage


def test_a_lazy_module_is_imported_at_its_first_attribute_and_is_the_modules_own():
    """``LazyModule`` imports nothing until an attribute is read, then gives the module's own attributes, also one
    changed after the first read (nothing copied)."""
    import subprocess
    import sys

    probe = ("import sys\nfrom distfact.lazy import LazyModule\nlazy = LazyModule('fractions')\n"
             "before = 'fractions' in sys.modules\nread = lazy.Fraction\nafter = 'fractions' in sys.modules\n"
             "import fractions\nassert read is fractions.Fraction\n"
             "fractions.Fraction = int\nassert lazy.Fraction is int\nprint(before, after, repr(lazy))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split(maxsplit=2) == ["False", "True", "<lazily imported module 'fractions'>\n"]


def test_a_lazy_module_pickles_as_the_module_itself():
    """A function shipped by value to Dask's workers (cloudpickle) carries what it uses: a ``LazyModule`` arrives
    as the module (its own pickle, made without ``__init__``, recursed in ``__getattr__`` when unpickled: a clean
    clone's test_to_dask_gives_numpy_or_sparse_chunks failed on a default Dask client). Here it is a closure's cell;
    a module's global shipped to a cluster: tests/test_store.py::test_to_dask_computes_on_a_local_cluster."""
    import fractions
    import pickle

    import cloudpickle

    from distfact.lazy import LazyModule

    lazy = LazyModule("fractions")
    assert pickle.loads(pickle.dumps(lazy)) is fractions
    third = cloudpickle.loads(cloudpickle.dumps(lambda: lazy.Fraction(1, 3)))
    assert third() == fractions.Fraction(1, 3)
    unmade = LazyModule.__new__(LazyModule)
    with pytest.raises(AttributeError):
        unmade.Fraction  # noqa: B018 (an attribute read is the test)
