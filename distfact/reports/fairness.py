"""The fairness report of Fairer-NMF's paper (Kassab et al., 2024, Section 6): for each rank, standard NMF
against Fairer-NMF, group by group.

Views (as the paper's figures; both measures are fractions, as the metrics ``relative_error`` and
``relative_loss`` of docs/metrics.md, where the paper plots R-Error in percent):
  Fig. 2  R-Error per group, ||X_l - W_l H||_F / ||X_l||_F, of standard NMF fitted on all the data, and of
          standard NMF fitted on each group alone (the mean of Algorithm 1's runs, E_l / ||X_l||).
  Fig. 3  R-Loss per group of standard NMF: (||X_l - W_l H||_F - E_l) / ||X_l||_F (Definition 4.1).
  Fig. 5  R-Loss per group of Fairer-NMF.
"""

from __future__ import annotations

import csv
import os

import numpy as np

from ..estimators import FairerNMF, NMF
from ..estimators.base import check_rank
from ..estimators.sweep import fit_many
from ..outputs import write_json
from ..store.coerce import as_grouped
from .page import html_figures, html_page, html_table, integer_ranks

COLUMNS = ("rank", "group", "rows", "r_error_standard_all", "r_error_standard_alone", "r_loss_standard",
           "r_loss_fairer", "r_error_fairer")


def fairness_table(X, groups=None, ranks=range(1, 11), *, random_state=0, client=None, progress=None,
                   **params) -> list[dict]:
    """One row per (rank, group) with the R-Error and R-Loss figures of standard NMF and Fairer-NMF, all
    fractions (``r_error_*``: ||X_l - W_l H||_F / ||X_l||_F; ``r_loss_*``: Definition 4.1's relative loss).

    X and groups as for the estimators (arrays with labels, a GroupedMatrix or a store path). ``params`` are
    FairerNMF's (its defaults, the paper's, otherwise); standard NMF takes its own defaults but for ``tol``
    and ``max_iter``, which, when given, both methods share. Each method's ranks are fitted in the same passes
    over X (``distfact.fit_many``: each model its fit alone, to rounding where NMF's products are shared);
    ``progress(done, message)`` hears of each sweep's end (``done``: the sweeps done, of two).
    """
    data = as_grouped(X, groups)
    norms = np.sqrt(data.group_sq_norms)
    ranks = [int(r) for r in ranks]
    shared = {key: params[key] for key in ("tol", "max_iter") if params.get(key) is not None}
    sweeps = []
    for template in (FairerNMF(ranks[0], random_state=random_state, **params),
                     NMF(ranks[0], random_state=random_state, **shared)):
        sweeps.append(fit_many(template, data, ranks=ranks, client=client))
        if progress is not None:
            progress(len(sweeps), f"{type(template).__name__} at ranks {ranks[0]}..{ranks[-1]}: "
                                  f"{sweeps[-1][0].sweep_passes_} passes over X")
    rows = []
    for r, fair, standard in zip(ranks, *sweeps):
        std_errors = standard.group_errors_ * norms
        for g, name in enumerate(data.group_names):
            rows.append({
                "rank": r, "group": name, "rows": int(data.group_sizes[g]),
                "r_error_standard_all": float(standard.group_errors_[g]),
                "r_error_standard_alone": float(fair.E_[g] / norms[g]),
                "r_loss_standard": float((std_errors[g] - fair.E_[g]) / norms[g]),
                "r_loss_fairer": float(fair.group_losses_[g]),
                "r_error_fairer": float(fair.group_errors_[g]),
            })
    return rows


def _plot(rows, panels, title, log=False):
    """One panel per (column, label) of ``panels``, a line per group across ranks. ``log``: R-Error falls by an
    order of magnitude over the ranks while the groups differ by a few percent of it, which a log axis shows;
    R-Loss crosses 0, marked by a line."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys(row["group"] for row in rows))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.6), squeeze=False, sharey=True)
    for ax, (column, label) in zip(axes[0], panels):
        for name in groups:
            mine = [row for row in rows if row["group"] == name]
            ax.plot([row["rank"] for row in mine], [row[column] for row in mine], marker="o", label=name)
        if log:
            ax.set_yscale("log")
        else:
            ax.axhline(0, color="0.8", lw=0.8)
        ax.set_xlabel("rank")
        integer_ranks(ax)
        ax.set_title(label, fontsize=10)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel(title)
    fig.tight_layout()
    return fig


FIGURES = {
    "fig2_r_error_standard.png": ([("r_error_standard_all", "Standard NMF on all data"),
                                   ("r_error_standard_alone", "Standard NMF on each group alone")],
                                  "R-Error (fraction, log scale)", True),
    "fig3_r_loss_standard.png": ([("r_loss_standard", "Standard NMF")], "R-Loss", False),
    "fig5_r_loss_fairer.png": ([("r_loss_fairer", "Fairer-NMF")], "R-Loss", False),
}


def write_fairness_report(rows: list[dict], out_dir, title="Fairer-NMF fairness report") -> dict:
    """Write ``fairness.csv``, ``fairness.json``, the three figures and ``fairness.html`` (images embedded)."""
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    paths = {"csv": os.path.join(out_dir, "fairness.csv"), "json": os.path.join(out_dir, "fairness.json"),
             "html": os.path.join(out_dir, "fairness.html")}
    with open(paths["csv"], "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    write_json(paths["json"], rows, indent=1)
    images = []
    for name, (panels, ylabel, log) in FIGURES.items():
        fig = _plot(rows, panels, ylabel, log)
        paths[name] = os.path.join(out_dir, name)
        fig.savefig(paths[name], dpi=110)
        plt.close(fig)
        with open(paths[name], "rb") as f:
            images.append((name, f.read()))
    summary = []
    for r in sorted({row["rank"] for row in rows}):
        std = [row["r_loss_standard"] for row in rows if row["rank"] == r]
        fair = [row["r_loss_fairer"] for row in rows if row["rank"] == r]
        summary.append([r, max(std), max(fair), max(std) - min(std), max(fair) - min(fair)])
    table = html_table(["rank", "max R-Loss, standard", "max R-Loss, Fairer", "spread, standard", "spread, Fairer"],
                       summary)
    page = html_page(title, f"<h2>Worst group and spread of R-Loss by rank</h2>{table}<h2>Figures</h2>"
                            f"{html_figures(images)}<p>Full table: fairness.csv / fairness.json.</p>")
    with open(paths["html"], "w") as f:
        f.write(page)
    return paths


def paper_report(data, options: dict, client, out_dir: str, title: str) -> dict:
    """``distfact report STORE --fairness``: the table and figures at each of ``options["ranks"]``, with the
    estimator parameters the user gave (``options["params"]``) for Fairer-NMF and, those NMF takes too (tol,
    max_iter), for standard NMF."""
    from ..engine.progress import Progress

    ranks = options["ranks"]
    check_rank(ranks[-1], data.shape)  # before any fit, not after the smaller ranks' fits
    small = [(g, int(n)) for g, n in zip(data.group_names, data.group_sizes) if n < ranks[-1]]
    if small:
        raise ValueError(f"ranks up to {ranks[-1]}: group {small[0][0]!r} has {small[0][1]} rows, fewer than the "
                         "rank (Fairer-NMF's E_l needs a rank-r NMF of every group)")
    params = options["params"]
    progress = Progress(2, "sweep", "sweeps", shown=options["progress"])  # Fairer-NMF's ranks, then NMF's
    rows = fairness_table(data, ranks=ranks, random_state=options["seed"], client=client,
                          progress=progress.update, **params)
    progress.close()
    return write_fairness_report(rows, out_dir, title=title)
