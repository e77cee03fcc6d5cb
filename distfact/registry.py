"""The methods every surface knows, by name: distfact's own and those of plug-ins.

distfact's methods are declared beside their estimators (``distfact.estimators.DECLARATIONS``). A plug-in
declares its method with a :class:`~distfact.estimators.contract.MethodDeclaration` and makes it known in one
of three ways: :func:`register` (in the process that runs it), or a module named in the environment variable
``DISTFACT_METHODS`` (comma-separated module names, each imported once, that call :func:`register`), or a
``distfact.methods`` entry point of an installed package (an object that is a declaration; the installed packages'
entry points are read once per process, at the first lookup). Nothing else in distfact needs to change: the
command line, pipeline specs and reports read the declaration.
"""

from __future__ import annotations

import difflib
import importlib
import os
from importlib.metadata import entry_points

from .estimators import DECLARATIONS
from .estimators.contract import MethodDeclaration

PLUGINS_VARIABLE = "DISTFACT_METHODS"
_registered: dict[str, MethodDeclaration] = {d.name: d for d in DECLARATIONS}
_loaded_plugins: set[str] = set()
_read_entry_points = False


def register(declaration: MethodDeclaration) -> MethodDeclaration:
    """Make ``declaration`` known to every surface (again for the same declaration is harmless; another
    method by a taken name is a ValueError)."""
    if not isinstance(declaration, MethodDeclaration):
        raise TypeError(f"register takes a MethodDeclaration, got {type(declaration).__name__}")
    known = _registered.get(declaration.name)
    if known is not None and known != declaration:
        raise ValueError(f"a method named {declaration.name!r} is already registered ({known.estimator.__name__})")
    _registered[declaration.name] = declaration
    return declaration


def _load_plugins() -> None:
    for module in filter(None, (m.strip() for m in os.environ.get(PLUGINS_VARIABLE, "").split(","))):
        if module not in _loaded_plugins:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                raise ValueError(f"{PLUGINS_VARIABLE}: cannot import {module!r} ({exc})") from exc
            _loaded_plugins.add(module)
    global _read_entry_points
    if _read_entry_points:  # once: reading every installed package's metadata takes 10 ms or more, at every lookup
        return
    for entry in entry_points(group="distfact.methods"):
        if entry.value not in _loaded_plugins:
            register(entry.load())
            _loaded_plugins.add(entry.value)
    _read_entry_points = True


def methods() -> dict[str, MethodDeclaration]:
    """Every known method, by name, distfact's first in their order."""
    _load_plugins()
    return dict(_registered)


def get_method(name: str) -> MethodDeclaration:
    """The method called ``name`` (a ValueError listing the known ones, with the closest, if none is)."""
    known = methods()
    if name not in known:
        close = difflib.get_close_matches(name, list(known), n=1)
        raise ValueError(f"unknown method {name!r}" + (f"; did you mean {close[0]!r}?" if close else "")
                         + f" (methods: {', '.join(known)})")
    return known[name]
