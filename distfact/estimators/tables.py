"""Fitted attributes that are pandas DataFrames, made when first read (issue 19)."""

from __future__ import annotations

import copy
import functools


class FittedTable:
    """A fitted attribute that is a pandas DataFrame, made when first read from what ``fit`` gave
    :func:`set_table`, then kept as the estimator's own attribute. pandas takes 0.4 ms or more to
    make a table of a few rows, a sizeable share of a small fit's fixed costs (BENCHMARKS.md, "Small fits' fixed
    costs"), which every fit of a rank sweep or of the papers' thousands of small fits paid, read or not. An error
    in making it is raised where it is first read (or by ``save``), not by ``fit``."""

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, model, owner=None):
        if model is None:
            return self
        makers = model.__dict__.get("_table_makers", {})
        if self.name not in makers:
            raise AttributeError(f"'{type(model).__name__}' object has no attribute '{self.name}'")
        try:
            table = makers[self.name]()
        except AttributeError as exc:  # not to be read as "no such attribute"
            raise RuntimeError(f"making {self.name} of a {type(model).__name__} failed: {exc}") from exc
        model.__dict__[self.name] = table  # an instance attribute: read as any other from now on
        # the maker and its copies of the fit's values go (a new dict: a shallow copy of the model keeps its own)
        rest = {name: maker for name, maker in makers.items() if name != self.name}
        if rest:
            model.__dict__["_table_makers"] = rest
        else:
            del model.__dict__["_table_makers"]
        return table


def set_table(model, name: str, make, *args, **kwargs) -> None:
    """The fitted attribute ``name`` (a :class:`FittedTable` of the model's class) is ``make(*args, **kwargs)``,
    made when first read; the arguments are copied now (a later change to arrays the model also holds, e.g.
    ``group_errors_``, is not the table's)."""
    if not isinstance(getattr(type(model), name, None), FittedTable):
        raise TypeError(f"{type(model).__name__}.{name} is not a FittedTable")
    model.__dict__.pop(name, None)  # an earlier fit's table, read already
    model._table_makers = {**model.__dict__.get("_table_makers", {}),
                           name: functools.partial(make, *copy.deepcopy(args), **copy.deepcopy(kwargs))}


def make_tables(model) -> None:
    """Make every :class:`FittedTable` of ``model`` not read yet (what reads the fitted attributes from
    ``vars(model)``, e.g. ``save``, sees them all)."""
    for name in model.__dict__.get("_table_makers", ()):
        getattr(model, name)
