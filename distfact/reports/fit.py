"""The report of one ``distfact fit`` output, read back without fitting again: the fit's facts, then the
sections every report of fits has (``fits.py``)."""

from __future__ import annotations

import os

import pandas as pd

from ..registry import get_method
from ..estimators.persistence import load as load_model
from .fits import fits_table, group_metric_rows, method_sections, read_fit_facts
from .page import html_table, parse_image_shape, write_page


def write_fit_report(fit_dir: str, out_dir: str, *, top: int = 10, image_shape: str | None = None) -> dict:
    """Write ``report.html``, its figures and tables into ``out_dir`` for the fit output ``fit_dir`` (its
    ``metrics.json`` and ``model.npz``, both checked as they are read)."""
    facts = read_fit_facts(os.path.join(fit_dir, "metrics.json"), ("method", "rank", "n_passes", "n_iter"))
    declaration = get_method(facts["method"])
    model = load_model(os.path.join(fit_dir, "model.npz"))
    if not isinstance(model, declaration.estimator):
        raise ValueError(f"{fit_dir}: model.npz holds a {type(model).__name__}, metrics.json says "
                         f"{facts['method']!r} ({declaration.estimator.__name__})")
    image_shape = parse_image_shape(image_shape, model.n_features_in_)
    name = f"{declaration.name}-r{facts['rank']}"
    fit = {"name": name, "method": declaration, "rank": facts["rank"], "model": model, "facts": facts}
    table = pd.DataFrame(group_metric_rows(name, declaration, facts["rank"], model, declaration.metrics,
                                           range(1, facts["rank"] + 1)))
    rows = [["fit output", os.path.abspath(fit_dir)], ["store", str(facts.get("store"))],
            ["parameters", ", ".join(f"{k}={v!r}" for k, v in facts.get("params", {}).items())],
            ["scheduler", str(facts.get("scheduler"))]]
    body = ["<h2>Fit</h2>" + html_table(["fact", "value"], rows), "<h2>Fits</h2>" + fits_table([fit])]
    sections, images = method_sections([fit], table, {declaration.name: list(declaration.metrics)}, top, out_dir,
                                       image_shape)
    return write_page({"html": os.path.join(out_dir, "report.html")}, out_dir, f"{declaration.name}, rank "
                      f"{facts['rank']}: {os.path.basename(os.path.normpath(fit_dir))}", "".join(body + sections),
                      images)
