"""The pipeline's report: one self-contained HTML page (PNGs embedded), the PNGs, and CSV/JSON tables.

Sections: run facts (data, groups, scheduler, workers, seconds per stage, passes over X); per method, each
per-group metric across ranks (table and plot) and the loss curves of its fits; top features per component
(topic) of its largest rank; the method's own views (Fairer-NMF: relative loss per group; Stratified-NMF:
strata features; SSNMF: B; multigroup SVD: the paper's Figs. 2 and 3).
"""

from __future__ import annotations

import html
import json
import os

import numpy as np
import pandas as pd

from ..features import feature_names_of, top_feature_names
from .page import figure_png, html_table, write_page


def _metric_plot(table: pd.DataFrame, method: str, metric: str) -> bytes:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for group, rows in table.groupby("group", sort=False):
        ax.plot(rows["rank"], rows["value"], marker="o", label=str(group))
    ax.set_xlabel("rank")
    ax.set_ylabel(metric)
    ax.set_title(f"{method}: {metric} per group")
    if table["group"].nunique() <= 12:
        ax.legend(fontsize=7, ncol=2)
    png = figure_png(fig)
    plt.close(fig)
    return png


def objective_history(method: str, model) -> np.ndarray:
    """The objective by iteration from ``loss_history_``: a vector for NMF and wL1-NMF; its first column
    (the objective) for Stratified-NMF and SSNMF; for Fairer-NMF, whose columns are the groups' relative
    losses, their maximum (the quantity it minimises)."""
    history = np.asarray(model.loss_history_)
    if history.ndim == 1:
        return history
    return history.max(axis=1) if method == "fairer-nmf" else history[:, 0]


def _loss_curves(entries: list[dict]) -> bytes | None:
    import matplotlib.pyplot as plt

    curves = [(e["name"], objective_history(e["fit"].method, e["model"])) for e in entries
              if hasattr(e["model"], "loss_history_")]
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for name, history in curves:
        ax.plot(history, label=name)
    ax.set_xlabel("iteration")
    ax.set_ylabel("objective")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    png = figure_png(fig)
    plt.close(fig)
    return png


def component_table(model, k: int) -> list[list]:
    """Per component (numbered from 1), its ``k`` largest-weighted features (by absolute weight for signed
    components)."""
    H = np.asarray(model.components_)
    weights = np.abs(H) if (H < 0).any() else H
    return [[i + 1, *words] for i, words in enumerate(top_feature_names(weights, feature_names_of(model), k))]


def _method_views(entry: dict, report: dict) -> list[tuple[str, bytes]]:
    model, method, name = entry["model"], entry["fit"].method, entry["name"]
    if method == "multigroup-svd":
        from .multigroup_svd import comparison_table, duality_figure, losses_figure

        return [(f"{name}-fig2_losses.png", losses_figure(comparison_table(model), f"{name}: multigroup (solid), SVD "
                                                                                  "(dashed)")),
                (f"{name}-fig3_duality.png", duality_figure(model, name))]
    if method == "stratified-nmf":
        from .stratified_nmf import strata_features_plot

        return [(f"{name}-strata_features.png", strata_features_plot(model))]
    if method == "ssnmf" and getattr(model, "B_", None) is not None:
        from .ssnmf import b_heatmap

        return [(f"{name}-B.png", b_heatmap(model, f"{name}: normalised B"))]
    if report.get("image_shape") is not None:
        from .stratified_nmf import image_grid

        return [(f"{name}-components.png", image_grid(np.asarray(model.components_),
                                                      [f"{i + 1}" for i in range(len(model.components_))],
                                                      report["image_shape"], f"{name}: components"))]
    return []


def write_pipeline_report(out_dir: str, context: dict, fits: list[dict], table: pd.DataFrame) -> dict:
    """The report of the run in ``context`` into ``out_dir``: ``fits`` its committed fits (``run.py: load_fits``),
    ``table`` the evaluate stage's per-group metrics (``run.py: read_group_metrics``)."""
    spec, run_dir = context["spec"], context["run_dir"]
    with open(os.path.join(run_dir, "ingest", "input.json")) as f:
        data = json.load(f)
    shape = spec.report.get("image_shape")
    if shape is not None and shape[0] * shape[1] != data["shape"][1]:
        raise ValueError(f"[report] image_shape {shape[0]}x{shape[1]} has {shape[0] * shape[1]} pixels, the data "
                         f"have {data['shape'][1]} features")
    stage_seconds = {}
    for stage in ("ingest", "fit", "evaluate"):
        with open(os.path.join(run_dir, stage, "COMMITTED")) as f:
            marker = json.load(f)
        stage_seconds[stage] = round(marker["seconds"], 3)
        if stage == "fit":
            where = {"scheduler": marker.get("scheduler"), "workers": marker.get("workers")}
    images, body = [], []
    facts = [["pipeline", spec.name], ["date", context["date"]], ["input", f"{spec.input['kind']}: {spec.input['value']}"],
             ["data", f"{data['shape'][0]} x {data['shape'][1]} ({data['layout']}, {data['nnz']} non-zeros)"],
             ["groups", ", ".join(f"{g}: {n}" for g, n in data["groups"].items())],
             ["scheduler", where["scheduler"] if not where["workers"] else f"{where['scheduler']} ({where['workers']} "
                           "workers)"],
             *([f"seconds: {s}", v] for s, v in stage_seconds.items())]
    body.append("<h2>Run</h2>" + html_table(["fact", "value"], facts))
    fit_rows = [[e["name"], e["fit"].method, e["rank"], e["facts"]["n_iter"] if np.isscalar(e["facts"]["n_iter"])
                 else sum(e["facts"]["n_iter"]), e["facts"]["n_passes"], round(e["facts"]["seconds"], 3)] for e in fits]
    body.append("<h2>Fits</h2>" + html_table(["fit", "method", "rank", "iterations", "passes over X", "seconds"], fit_rows))
    for method in dict.fromkeys(e["fit"].method for e in fits):
        entries = [e for e in fits if e["fit"].method == method]
        body.append(f"<h2>{html.escape(method)}</h2>")
        for metric in spec.metrics[method]:
            rows = table[(table["method"] == method) & (table["metric"] == metric)]
            wide = rows.pivot_table(index="group", columns=["fit", "rank"], values="value", sort=False)
            body.append(f"<h3>{html.escape(metric)} per group</h3>" + html_table(
                ["group", *[f"{fit} (r={rank})" for fit, rank in wide.columns]],
                [[group, *map(float, values)] for group, values in zip(wide.index, wide.to_numpy())]))
            wide.to_csv(os.path.join(out_dir, f"{method}-{metric}.csv"))
            # one plot per [[fit]] table across its ranks (its fits are named <method>[-i]-r<rank>)
            for base, across_ranks in rows.groupby(rows["fit"].str.rsplit("-r", n=1).str[0], sort=False):
                if across_ranks["rank"].nunique() > 1:
                    images.append((f"{base}-{metric}-by-rank.png", _metric_plot(across_ranks, base, metric)))
        curves = _loss_curves(entries)
        if curves is not None:
            images.append((f"{method}-loss-curves.png", curves))
        largest = max(entries, key=lambda e: e["rank"])
        top = component_table(largest["model"], spec.report["top"])
        body.append(f"<h3>Top features per component: {html.escape(largest['name'])}</h3>"
                    + html_table(["component", *range(1, len(top[0]))], top))
        pd.DataFrame(top).to_csv(os.path.join(out_dir, f"{largest['name']}-top_features.csv"), index=False,
                                 header=["component", *range(1, len(top[0]))])
        images += _method_views(largest, spec.report)
    assert len({name for name, _ in images}) == len(images), "report images need distinct names"
    title = spec.report.get("title") or f"{spec.name}: {context['date']}"
    if spec.description:
        body.insert(0, f"<p>{html.escape(spec.description)}</p>")
    return write_page({"html": os.path.join(out_dir, "report.html")}, out_dir, title, "".join(body), images)
