"""A nightly run's look back, on its report: the alerts crossed, per fit the per-group metric over the last runs
(a table and a plot), and the components' ids, their similarity to the night before and their drift.

Reads what the evaluate stage wrote (``pipeline/alerts.py``): ``trends.csv``, ``drift.csv``,
``components.json``, ``alerts.json``.
"""

from __future__ import annotations

import html
import json
import os

import pandas as pd

from .page import figure_png, html_table


def trend_sections(run_dir: str, metric: str, out_dir: str) -> tuple[list[str], list[tuple[str, bytes]]]:
    """HTML sections and figures for the run in ``run_dir``: ``metric`` is the one the trends show (the
    [alerts] metric); the tables are also written as CSV into ``out_dir``."""
    evaluate = os.path.join(run_dir, "evaluate")
    with open(os.path.join(evaluate, "alerts.json")) as f:
        alerts = json.load(f)
    with open(os.path.join(evaluate, "components.json")) as f:
        components = json.load(f)
    trends = pd.read_csv(os.path.join(evaluate, "trends.csv"), keep_default_na=False,
                         dtype={"group": str, "fit": str, "metric": str, "date": str})
    drift = pd.read_csv(os.path.join(evaluate, "drift.csv"), dtype={"fit": str, "date": str})
    body = ["<h2>Alerts</h2>" + ("<ul>" + "".join(f"<li>{html.escape(a['message'])}</li>" for a in alerts) + "</ul>"
                                 if alerts else "<p>No alert threshold crossed.</p>")]
    images = []
    shown = trends[trends["metric"] == metric]
    # a nested-rank fit: its own rank, the largest of the night's (an auto-ranked fit has one, chosen that night)
    shown = shown[shown["rank"] == shown.groupby(["fit", "date"])["rank"].transform("max")]
    body.append(f"<h2>Trends: {html.escape(metric)} per group over the last {shown['date'].nunique()} runs</h2>")
    for fit, rows in shown.groupby("fit", sort=False):
        wide = rows.pivot_table(index=["date", "rank"], columns="group", values="value", sort=False)
        wide.to_csv(os.path.join(out_dir, f"{fit}-trend.csv"))
        nights = [[date, int(rank), *("" if pd.isna(v) else float(v) for v in values)]  # "": a group not there
                  for (date, rank), values in zip(wide.index, wide.to_numpy())]      # that night
        body.append(f"<h3>{html.escape(fit)}</h3>" + html_table(["date", "rank", *wide.columns], nights))
        wide.index = wide.index.get_level_values("date")  # the plot's x axis
        images.append((f"{fit}-trend.png", _lines(wide, f"{fit}: {metric} per group", metric)))
    body.append(f"<h2>Components (matched to {html.escape(str(components['previous']))}, cosine similarity "
                f"threshold {components['threshold']})</h2>")
    for fit, entry in components["fits"].items():
        rows = [[i, "new" if s is None or i in entry["new"] else float(s)] for i, s in zip(entry["ids"],
                                                                                       entry["similarity"])]
        body.append(f"<h3>{html.escape(fit)}</h3>" + html_table(["id", "similarity to the previous run"], rows)
                    + (f"<p>Vanished: {', '.join(map(str, entry['vanished']))}</p>" if entry["vanished"] else "")
                    + (f"<p>New: {', '.join(map(str, entry['new']))}</p>" if entry["new"] else ""))
        mine = drift[(drift["fit"] == fit) & drift["similarity"].notna()]
        if mine["date"].nunique() > 1:
            wide = mine.pivot_table(index="date", columns="id", values="similarity", sort=False)
            images.append((f"{fit}-drift.png", _lines(wide, f"{fit}: each component's similarity to the night before",
                                                      "cosine similarity", label="component ")))
    return body, images


def _lines(wide: pd.DataFrame, title: str, ylabel: str, label: str = "") -> bytes:
    """One line per column of ``wide`` (index: dates)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    for column in wide.columns:
        ax.plot(list(wide.index), wide[column].to_numpy(), marker="o", label=f"{label}{column}")
    ax.set_title(title, fontsize=10)
    ax.set_ylabel(ylabel)
    ax.tick_params(axis="x", labelrotation=45, labelsize=8)
    ax.legend(fontsize=8)
    png = figure_png(fig)
    plt.close(fig)
    return png
