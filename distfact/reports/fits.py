"""The sections every report of fits shares, whatever the method: a table of the fits (those that stopped at
their iteration cap marked), each per-group metric across ranks (table and plot), the objective curves, the
top features per component of the largest rank, and the method's own figures (its declaration's ``views``).

A fit is a dict: ``name``, ``method`` (its declaration), ``rank``, ``model`` (fitted) and ``facts`` (seconds,
n_iter, n_passes as ``fit.json`` / ``metrics.json`` hold them). Per-group metrics are the tidy rows (fit,
method, rank, group, metric, value) of :func:`group_metric_rows`.
"""

from __future__ import annotations

import html
import json
import os

import numpy as np
import pandas as pd

from ..estimators.contract import resolve
from ..features import feature_names_of, top_feature_names
from .page import figure_png, html_table, integer_ranks


def read_fit_facts(path: str, required) -> dict:
    """A fit's facts (a pipeline's ``fit.json``, ``distfact fit``'s ``metrics.json``), checked: a ValueError
    naming the file and the field when it is not JSON or a ``required`` field is missing or not a number."""
    try:
        with open(path) as f:
            facts = json.load(f)
    except ValueError as exc:
        raise ValueError(f"{path}: not readable JSON ({exc})") from None
    kinds = {"seconds": (int, float), "n_passes": int, "n_iter": (int, list), "rank": int}
    wrong = [key for key in required if not isinstance(facts, dict) or isinstance(facts.get(key), bool)
             or not isinstance(facts.get(key), kinds.get(key, str))]
    if wrong:
        kind = "a number" if wrong[0] in kinds else "a string"
        raise ValueError(f"{path}: field {wrong[0]!r} is missing or not {kind}")
    return facts


def group_metric_rows(name: str, declaration, rank: int, model, metrics, ranks=None) -> list[dict]:
    """Tidy rows of a fit's per-group metrics (its ``group_metrics_``) named in ``metrics``: at ``rank``, or,
    for a method whose one fit gives every rank (``nested_ranks``), at each of ``ranks``."""
    table = model.group_metrics_
    table = table[table["metric"].isin(list(metrics))]
    if declaration.nested_ranks:
        table = table[table["rank"].isin(list(ranks or [rank]))]
        fit_ranks = table["rank"].astype(int).tolist()
    else:
        fit_ranks = [int(rank)] * len(table)
    return [{"fit": name, "method": declaration.name, "rank": r, "group": str(group), "metric": metric,
             "value": float(value)}
            for r, group, metric, value in zip(fit_ranks, table["group"], table["metric"], table["value"])]


def _metric_plot(table: pd.DataFrame, title: str, metric: str) -> bytes:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for group, rows in table.groupby("group", sort=False):
        ax.plot(rows["rank"], rows["value"], marker="o", label=str(group))
    ax.set_xlabel("rank")
    integer_ranks(ax)
    ax.set_ylabel(metric)
    ax.set_title(f"{title}: {metric} per group")
    if table["group"].nunique() <= 12:
        ax.legend(fontsize=7, ncol=2)
    png = figure_png(fig)
    plt.close(fig)
    return png


def _objective_curves(fits: list[dict]) -> bytes | None:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    curves = [(f["name"], np.asarray(f["model"].objective_history_)) for f in fits]
    curves = [(name, history) for name, history in curves if history.size > 1]
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for name, history in curves:
        ax.plot(history, label=name)
    ax.set_xlabel("iteration")
    ax.set_ylabel("objective")
    if all((history > 0).all() for _, history in curves):
        ax.set_yscale("log")
    ax.legend(fontsize=7)
    png = figure_png(fig)
    plt.close(fig)
    return png


def component_table(model, k: int) -> list[list]:
    """Per component (numbered from 1, as in every table and figure), its ``k`` largest-weighted features (by
    absolute weight for signed components)."""
    H = np.asarray(model.components_)
    weights = np.abs(H) if (H < 0).any() else H
    return [[i + 1, *words] for i, words in enumerate(top_feature_names(weights, feature_names_of(model), k))]


def stopped_at_cap(model) -> bool:
    """Whether the fit ended at its iteration cap before its stopping rule held (``converged_`` false)."""
    return not bool(np.all(getattr(model, "converged_", True)))


def fits_table(fits: list[dict]) -> str:
    """The fits: method, rank, iterations, passes, seconds and whether each converged."""
    rows = [[f["name"], f["method"].name, f["rank"], int(np.sum(f["facts"]["n_iter"])), f["facts"]["n_passes"],
             round(float(f["facts"].get("seconds", float("nan"))), 3),
             "no: stopped at max_iter" if stopped_at_cap(f["model"]) else "yes"] for f in fits]
    return html_table(["fit", "method", "rank", "iterations", "passes over X", "seconds", "converged"], rows)


def method_sections(fits: list[dict], table: pd.DataFrame, metrics: dict, top: int, out_dir: str,
                    image_shape=None) -> tuple[list[str], list[tuple[str, bytes]]]:
    """HTML sections and figures (name, PNG) for ``fits``, method by method, each table also written as CSV
    into ``out_dir``: ``metrics`` names each method's metrics to show (method name -> list)."""
    body, images = [], []
    for method in dict.fromkeys(f["method"].name for f in fits):
        mine = [f for f in fits if f["method"].name == method]
        declaration = mine[0]["method"]
        body.append(f"<h2>{html.escape(method)}</h2>")
        for metric in metrics[method]:
            rows = table[(table["method"] == method) & (table["metric"] == metric)]
            if rows.empty:
                continue
            wide = rows.pivot_table(index="group", columns=["fit", "rank"], values="value", sort=False)
            body.append(f"<h3>{html.escape(metric)} per group</h3>" + html_table(
                ["group", *[f"{fit} (r={rank})" for fit, rank in wide.columns]],
                [[group, *map(float, values)] for group, values in zip(wide.index, wide.to_numpy())]))
            wide.to_csv(os.path.join(out_dir, f"{method}-{metric}.csv"))
            # one plot per [[fit]] table across its ranks (its fits are named <method>[-i]-r<rank>)
            for base, across_ranks in rows.groupby(rows["fit"].str.rsplit("-r", n=1).str[0], sort=False):
                if across_ranks["rank"].nunique() > 1:
                    images.append((f"{base}-{metric}-by-rank.png", _metric_plot(across_ranks, base, metric)))
        curves = _objective_curves(mine)
        if curves is not None:
            images.append((f"{method}-objective.png", curves))
        largest = max(mine, key=lambda f: f["rank"])
        components = component_table(largest["model"], top)
        header = ["component", *range(1, len(components[0]))]
        body.append(f"<h3>Top features per component: {html.escape(largest['name'])}</h3>"
                    + html_table(header, components))
        pd.DataFrame(components, columns=header).to_csv(os.path.join(out_dir, f"{largest['name']}-top_features.csv"),
                                                        index=False)
        if declaration.views is not None:
            images += resolve(declaration.views)(largest["model"], largest["name"])
        if image_shape is not None:
            from .stratified_nmf import image_grid

            H = np.asarray(largest["model"].components_)
            images.append((f"{largest['name']}-components.png",
                           image_grid(H, [f"{i + 1}" for i in range(len(H))], image_shape,
                                      f"{largest['name']}: components")))
    return body, images
