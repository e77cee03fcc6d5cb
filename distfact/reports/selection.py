"""Rank selection (``distfact.select_rank``) in files and reports: its table and choice written and read back,
and its figure, the held-out error against rank per group (mean over folds, standard error bars) with the chosen
rank marked and the rule named. Used by ``distfact select-rank --report`` and by pipeline reports (fits with
``ranks = "auto"``)."""

from __future__ import annotations

import html
import json
import os

import numpy as np
import pandas as pd

from ..estimators.select import RankSelection
from ..outputs import write_json, write_text
from .page import figure_png, html_table, integer_ranks, write_page

SELECTION_CSV, SELECTION_JSON = "selection.csv", "selection.json"


def write_selection(directory: str, result: RankSelection, settings: dict) -> None:
    """``selection.csv`` (the tidy table: rank, fold, group, train_error, heldout_error) then, last,
    ``selection.json`` (``settings``: the ranks compared, n_splits, holdout; the rule, the fits ("joint" or
    "per_group"), the chosen rank, every rule's choice, the root seed and the per-rank summary), each written
    aside and renamed into place."""
    write_text(os.path.join(directory, SELECTION_CSV), result.table.to_csv(index=False))
    summary = result.summary.assign(worst_group=result.summary["worst_group"].astype(str))
    write_json(os.path.join(directory, SELECTION_JSON), {
        **settings, "rule": result.rule, "fit": result.fit, "rank": result.rank_, "choices": result.choices,
        "random_state": result.random_state_, "summary": summary.to_dict(orient="records")}, indent=1)


def read_selection(directory: str) -> tuple[RankSelection, dict]:
    """The selection :func:`write_selection` wrote into ``directory``, and its JSON; a ValueError naming the file
    when they disagree (the rank the table gives under the rule is not the one recorded)."""
    path = os.path.join(directory, SELECTION_JSON)
    try:
        with open(path) as f:
            facts = json.load(f)
        result = RankSelection(pd.read_csv(os.path.join(directory, SELECTION_CSV), keep_default_na=False,
                                           dtype={"group": str}), facts["rule"], facts["random_state"],
                                  facts.get("fit", "joint"))  # written before the fits were recorded: joint
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a readable selection ({type(exc).__name__}: {exc})") from None
    if result.rank_ != facts.get("rank"):
        raise ValueError(f"{path}: records rank {facts.get('rank')!r}, but {SELECTION_CSV} gives {result.rank_} "
                         f"under rule {result.rule!r}")
    return result, facts


def per_group(table: pd.DataFrame) -> pd.DataFrame:
    """Per (group, rank): the mean over folds of the held-out error and its standard error (standard deviation
    over folds, ddof 1, over sqrt(folds)); groups in the table's order."""
    grouped = table.groupby(["group", "rank"], sort=False)["heldout_error"]
    out = pd.DataFrame({"mean": grouped.mean(), "se": grouped.std(ddof=1) / np.sqrt(grouped.count())})
    return out.reset_index().sort_values("rank", kind="stable")


def heldout_figure(result: RankSelection, title: str) -> bytes:
    """Held-out error against rank, one line per group with standard-error bars, the mean over groups (what
    "min" and "one_se" compare) dashed, and the chosen rank marked with the rule named; a log scale when the
    errors span more than a factor 30."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    curves = per_group(result.table)
    fig, ax = plt.subplots(figsize=(5.8, 3.6))
    for group, rows in curves.groupby("group", sort=False):
        ax.errorbar(rows["rank"], rows["mean"], yerr=rows["se"], marker="o", capsize=3, label=str(group))
    summary = result.summary.sort_values("rank")
    ax.errorbar(summary["rank"], summary["mean_heldout"], yerr=summary["se_heldout"], color="black", linestyle="--",
                capsize=3, label="mean over groups")
    ax.axvline(result.rank_, color="tab:red", linewidth=1.5, alpha=0.7)
    ax.annotate(f"chosen: rank {result.rank_} ({result.rule})", xy=(result.rank_, 1.0),
                xycoords=("data", "axes fraction"), xytext=(4, -12), textcoords="offset points", color="tab:red",
                fontsize=8)
    ax.set_xlabel("rank")
    integer_ranks(ax)
    low, high = curves["mean"].min(), curves["mean"].max()
    if low > 0 and high / low > 30:  # errors over orders of magnitude (an overfitting rank): the low ones stay legible
        ax.set_yscale("log")
    ax.set_ylabel("held-out error (mean over folds ± SE)")
    ax.set_title(title, fontsize=10)
    if curves["group"].nunique() <= 12:
        ax.legend(fontsize=7, ncol=2)
    png = figure_png(fig)
    plt.close(fig)
    return png


def selection_section(name: str, result: RankSelection, facts: dict, out_dir: str) -> tuple[str, list]:
    """HTML for one selection (the settings, the per-rank summary with the chosen rank marked) and its figure
    ``<name>-heldout-by-rank.png``; the summary also written as ``<name>-selection.csv`` into ``out_dir``."""
    settings = [["rule", result.rule], ["fits", result.fit], ["chosen rank", result.rank_],
                ["every rule's choice", ", ".join(f"{rule}: {rank}" for rule, rank in result.choices.items())],
                ["ranks compared", ", ".join(str(r) for r in sorted(result.table["rank"].unique()))],
                ["folds", facts.get("n_splits")], ["held out per fold", facts.get("holdout")],
                ["root seed of the held-out entries", result.random_state_]]
    summary = result.summary.sort_values("rank")
    summary.to_csv(os.path.join(out_dir, f"{name}-selection.csv"), index=False)
    rows = [[int(r.rank), float(r.mean_heldout), float(r.se_heldout), float(r.worst_group_heldout),
             str(r.worst_group), "<- chosen" if r.rank == result.rank_ else ""] for r in summary.itertuples()]
    body = (f"<h3>Rank selection: {html.escape(name)}</h3>" + html_table(["setting", "value"], settings)
            + html_table(["rank", "mean held-out error", "standard error", "worst group's held-out error",
                          "worst group", ""], rows))
    figure = (f"{name}-heldout-by-rank.png",
              heldout_figure(result, f"{name}: held-out error by rank (rule {result.rule})"))
    return body, [figure]


def write_selection_report(out_dir: str, result: RankSelection, facts: dict, name: str, title: str) -> dict:
    """``distfact select-rank --report``: the selection's files (:func:`write_selection`), its section and
    figure, in the self-contained ``report.html`` of ``out_dir``."""
    write_selection(out_dir, result, facts)
    body, images = selection_section(name, result, facts, out_dir)
    return write_page({"html": os.path.join(out_dir, "report.html"), "csv": os.path.join(out_dir, SELECTION_CSV)},
                      out_dir, title, body, images)
