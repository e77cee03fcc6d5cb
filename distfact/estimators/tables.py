"""Fitted attributes that are pandas DataFrames, made when first read (issue 19)."""

from __future__ import annotations


class FittedTable:
    """A fitted attribute that is a pandas DataFrame, made when first read from what ``fit`` gave
    :meth:`FactorEstimator._set_table`, then kept as the estimator's own attribute. pandas takes 0.4 ms or more to
    make a table of a few rows, a sizeable share of a small fit's fixed costs (BENCHMARKS.md, "Small fits' fixed
    costs"), which every fit of a rank sweep or of the papers' thousands of small fits paid, read or not."""

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, model, owner=None):
        if model is None:
            return self
        make = model.__dict__.get("_table_makers", {}).get(self.name)
        if make is None:
            raise AttributeError(f"'{type(model).__name__}' object has no attribute '{self.name}'")
        table = model.__dict__[self.name] = make()  # an instance attribute: read as any other from now on
        return table


def make_tables(model) -> None:
    """Make every :class:`FittedTable` of ``model`` not read yet (what reads the fitted attributes from
    ``vars(model)``, e.g. ``save``, sees them all)."""
    for name in model.__dict__.get("_table_makers", ()):
        getattr(model, name)
