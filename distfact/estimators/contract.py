"""The method contract: what a method declares once, beside its estimator, for every surface to read.

``distfact fit``, ``distfact report``, pipeline specs and reports name no method: they read a
:class:`MethodDeclaration` (found by name in ``distfact.registry``) and the estimator it names. Its parameters,
their types, choices and defaults come from the estimator itself: ``_parameter_constraints`` (scikit-learn's
declarative style, ``sklearn.utils._param_validation``) and ``__init__``'s defaults, with the help of each
from the class docstring's numpydoc *Parameters* section. So a default lives in one place, the estimator's
signature, and the command line and the specs only pass on what a user gave.

A declaration's callables may be given as ``"module:function"`` strings, imported when used, so that an
estimator's module does not import the plotting code of its report.
"""

from __future__ import annotations

import importlib
import inspect
import numbers
import os
import re
from dataclasses import dataclass
from typing import Callable

from sklearn.utils._param_validation import Interval, StrOptions, validate_parameter_constraints

#: parameters the surfaces set themselves (the rank, the seed, where checkpoints go, the progress bar, the
#: threads and memory of this process); they are not options of ``distfact fit`` nor keys of a [[fit]] table
SURFACE_PARAMETERS = frozenset({"n_components", "random_state", "checkpoint_dir", "checkpoint_every", "resume",
                                "callback", "n_threads", "local_memory_budget", "block_rows"})


class Number(Interval):
    """scikit-learn's ``Interval`` refusing booleans. Python counts ``True`` as the int 1 and scikit-learn's
    constraint takes it (``sklearn.decomposition.NMF(n_components=True)`` fits at rank 1), but no parameter here is
    a number given as a boolean: ``checkpoint_every=True`` or ``max_iter = true`` in a spec is a mistake to name."""

    def is_satisfied_by(self, val):
        return not isinstance(val, bool) and super().is_satisfied_by(val)


#: their constraints, and those of the iteration parameters most estimators share
POSITIVE_INT, COUNT, NON_NEGATIVE = (Number(numbers.Integral, 1, None, closed="left"),
                                     Number(numbers.Integral, 0, None, closed="left"),
                                     Number(numbers.Real, 0, None, closed="left"))
SURFACE_CONSTRAINTS = {
    "n_components": [POSITIVE_INT], "random_state": [COUNT, None], "checkpoint_dir": [str, os.PathLike, None],
    "checkpoint_every": [POSITIVE_INT, StrOptions({"auto"})], "resume": ["boolean"], "callback": [callable, None],
    "n_threads": [POSITIVE_INT, None], "local_memory_budget": [COUNT, None], "block_rows": [POSITIVE_INT, None],
    "max_iter": [COUNT], "tol": [NON_NEGATIVE]}


def resolve(ref):
    """A callable given as itself or as ``"module:attribute"`` (imported now)."""
    if not isinstance(ref, str):
        return ref
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class FitInput:
    """An input of ``fit`` besides X and the groups, given as text: ``--NAME`` on the command line and ``NAME``
    in a [[fit]] table. ``to_fit(value, data)`` turns the text into ``fit``'s keyword arguments (paths in a
    spec are resolved against its directory first when ``is_path(value)``)."""

    name: str
    help: str
    default: str
    to_fit: Callable | str
    is_path: Callable[[str], bool] = lambda value: False


@dataclass(frozen=True)
class PaperReport:
    """The paper's report of a method (``distfact report STORE --FLAG``): ``run(data, options, client, out_dir,
    title)`` fits what it needs and writes its tables, figures and page into ``out_dir``, returning their
    paths (``{"html": ..., "csv": ..., <figure>: ...}``). ``options`` holds the report's options (rank, ranks,
    seed, top, image_shape; progress, False for ``--no-progress``), the estimator parameters the user gave
    (``params``) and the fit inputs (``inputs``)."""

    flag: str
    help: str
    run: Callable | str


@dataclass(frozen=True)
class MethodDeclaration:
    """One method, as every surface sees it.

    name : its name on the command line and in specs (``--method NAME``, ``method = "NAME"``).
    estimator : its estimator class (``Estimator(rank, **params)``; ``fit(X, groups=..., client=..., **inputs)``).
    summary : one line for ``--help``.
    metrics : the names of its per-group metrics, rows of ``group_metrics_`` (``distfact.metrics.GLOSSARY``
        defines each name once, for every method).
    fit_inputs : inputs of ``fit`` besides X and the groups.
    nested_ranks : one fit at the largest rank gives every smaller rank too (``group_metrics_`` has a ``rank``
        column), so a pipeline fits once per [[fit]] table.
    arrays : ``arrays(model) -> {file name: array}``, what ``distfact fit`` writes besides the components.
    facts : ``facts(model) -> dict``, method facts added to ``metrics.json``.
    views : ``views(model, name) -> [(png name, png bytes)]``, the method's figures in every report of a fit.
    paper_report : its paper's report, if it has one.
    numba_kernels : its fits call numba kernels beyond those every method's fits call (the store's and the engine's).
        The warm-up (``distfact/warmup.py``) runs the fits of a method that does; of one that does not, none, as
        they compile nothing the others' do not (``tests/test_warmup.py`` fits every such method's settings in a
        fresh process after the warm-up and fails on any compilation).
    """

    name: str
    estimator: type
    summary: str
    metrics: tuple[str, ...]
    fit_inputs: tuple[FitInput, ...] = ()
    nested_ranks: bool = False
    arrays: Callable | str | None = None
    facts: Callable | str | None = None
    views: Callable | str | None = None
    paper_report: PaperReport | None = None
    numba_kernels: bool = True

    def parameters(self) -> dict[str, "Parameter"]:
        """The estimator's parameters that a user sets on the surfaces, by name."""
        return estimator_parameters(self.estimator)

    def make(self, rank: int, params: dict, **surface):
        """The estimator of rank ``rank`` with the user's ``params`` (checked against the constraints: a
        ValueError naming the parameter) and the surface's own settings (``random_state``, checkpoints,
        callback), those the estimator does not take being left out."""
        check_params(self.estimator, params)
        accepted = inspect.signature(self.estimator.__init__).parameters
        return self.estimator(rank, **params, **{k: v for k, v in surface.items() if k in accepted})

    def fit_arguments(self, model, inputs: dict, data, client, W_out=None) -> dict:
        """``fit``'s keyword arguments besides X: the client, the fit inputs from their text (``inputs``, name
        -> value; the declared default for those not given) and, if the estimator writes W block by block,
        ``W_out``."""
        out = {"client": client}
        for fit_input in self.fit_inputs:
            out.update(resolve(fit_input.to_fit)(inputs.get(fit_input.name, fit_input.default), data))
        if W_out is not None and "W_out" in inspect.signature(model.fit).parameters:
            out["W_out"] = W_out
        return out


@dataclass(frozen=True)
class Parameter:
    """A parameter of an estimator as a surface offers it: ``kind`` is what a user writes (str, int, float or
    bool), ``choices`` the strings it takes (or None), ``default`` the estimator's."""

    name: str
    kind: type
    choices: tuple | None
    default: object
    help: str


def _kind(constraints: list) -> tuple[type, tuple | None]:
    """What a user writes for a parameter with these constraints."""
    for c in constraints:
        if isinstance(c, StrOptions):
            return str, tuple(sorted(c.options))
    for c in constraints:
        if c == "boolean" or c is bool:
            return bool, None
    for c in constraints:
        if isinstance(c, Interval):
            return (int if c.type is numbers.Integral else float), None
    return str, None


def estimator_parameters(estimator: type) -> dict[str, Parameter]:
    """The user-set parameters of ``estimator`` (every keyword of ``__init__`` but :data:`SURFACE_PARAMETERS`),
    from its ``_parameter_constraints``, defaults and docstring."""
    constraints = getattr(estimator, "_parameter_constraints", None)
    if constraints is None:
        raise TypeError(f"{estimator.__name__} declares no _parameter_constraints")
    helps = docstring_parameters(estimator.__doc__ or "")
    out = {}
    for name, p in inspect.signature(estimator.__init__).parameters.items():
        if name == "self" or name in SURFACE_PARAMETERS or p.kind is not p.KEYWORD_ONLY:
            continue
        if name not in constraints:
            raise TypeError(f"{estimator.__name__}._parameter_constraints has no entry for {name!r}")
        kind, choices = _kind(constraints[name])
        out[name] = Parameter(name, kind, choices, p.default, helps.get(name, ""))
    return out


def check_params(estimator: type, params: dict) -> None:
    """``params`` against ``estimator``'s constraints, in scikit-learn's words (a ValueError naming the
    parameter, the estimator and what it takes)."""
    constraints = {k: v for k, v in estimator._parameter_constraints.items() if k in params}
    validate_parameter_constraints(constraints, params, caller_name=estimator.__name__)


_ENTRY = re.compile(r"^ {4}([A-Za-z_][\w, ]*?)\s*:(.*)$")


def docstring_parameters(doc: str) -> dict[str, str]:
    """``{name: first sentence of its description}`` from a numpydoc *Parameters* section (an entry naming
    several parameters, ``a, b : ...``, describes each)."""
    section = re.search(r"\n\s*Parameters\n\s*-+\n(.*?)(?:\n\s*\n\s*[A-Z][a-z]+\n\s*-+\n|\Z)", doc, re.S)
    if section is None:
        return {}
    out, names, kind, text = {}, [], "", []

    def flush():  # the description's first sentence, else the entry's type ("{'mu', 'hals'}")
        sentence = re.split(r"(?<=[a-z0-9)'])\.\s", " ".join(text).strip(), maxsplit=1)[0].rstrip(".")
        for n in names:
            out[n] = sentence or kind
    for line in section.group(1).splitlines():
        entry = _ENTRY.match(line)
        if entry:
            flush()
            names = [n.strip() for n in entry.group(1).split(",") if n.strip()]
            kind, text = entry.group(2).strip(), []
        elif line.strip():
            text.append(line.strip())
    flush()
    return out
