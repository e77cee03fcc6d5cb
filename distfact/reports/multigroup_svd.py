"""The views of the multigroup SVD paper (Matakos, Ciaperoni and Mannila, 2025) for a fitted ``MultigroupSVD``.

  Fig. 2   marginal, incremental and reconstruction loss by rank, one marker per group; here the
           standard SVD's losses on the same data are drawn dashed beside them.
  Fig. 3   the primal objective f and the dual objective g of each rank's rank-1 problem, and their
           difference (the empirical duality gap, Section 8.3).
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

from ..outputs import write_json
from .page import figure_png, html_table, integer_ranks, write_page

LOSSES = ("marginal", "incremental", "reconstruction")
MARKERS = "osD^v<>p*h"


def comparison_table(model) -> pd.DataFrame:
    """Per group and rank, each loss of the multigroup vectors and of the standard SVD."""
    svd = model.losses_of(model.svd_components())
    return model.group_losses_.merge(svd, on=["group", "rank"], suffixes=("", "_svd"))


def losses_figure(table: pd.DataFrame, title: str = "") -> bytes:
    """Fig. 2's layout: the three losses by rank, a marker per group; the SVD's dashed."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, kind in zip(axes, LOSSES):
        for i, (group, rows) in enumerate(table.groupby("group", sort=False)):
            marker = MARKERS[i % len(MARKERS)]
            line, = ax.plot(rows["rank"], rows[kind], marker=marker, label=f"{group}: multigroup")
            if f"{kind}_svd" in rows:
                ax.plot(rows["rank"], rows[f"{kind}_svd"], marker=marker, linestyle="--", fillstyle="none",
                        color=line.get_color(), label=f"{group}: SVD")
        ax.set_title(f"{kind} loss")
        ax.set_xlabel("rank")
        integer_ranks(ax)
    axes[0].legend(fontsize="small")
    if title:
        fig.suptitle(title)
    png = figure_png(fig)
    plt.close(fig)
    return png


def duality_figure(model, title: str = "") -> bytes:
    """Fig. 3: primal and dual objective by rank, and the gap between them."""
    import matplotlib.pyplot as plt

    ranks = np.arange(1, len(model.duality_gap_) + 1)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.4))
    left.plot(ranks, model.primal_objective_, marker="o", label="primal f = max_l h_l(v)")
    left.plot(ranks, model.dual_objective_, marker="x", linestyle="--", label="dual g(mu)")
    left.set_xlabel("rank")
    integer_ranks(left)
    left.legend(fontsize="small")
    right.semilogy(ranks, np.maximum(np.abs(model.duality_gap_), np.finfo(np.float64).tiny), marker="o")
    right.set_xlabel("rank")
    integer_ranks(right)
    right.set_title("|f - g| (empirical duality gap)")
    if title:
        fig.suptitle(title)
    png = figure_png(fig)
    plt.close(fig)
    return png


def write_multigroup_report(out_dir, model, title: str = "Multigroup SVD report") -> dict:
    """Write ``group_losses.csv`` (multigroup and SVD losses), ``multigroup.json``, the two figures
    (PNG) and ``multigroup.html`` (images embedded)."""
    os.makedirs(out_dir, exist_ok=True)
    table = comparison_table(model)
    paths = {"csv": os.path.join(out_dir, "group_losses.csv"), "json": os.path.join(out_dir, "multigroup.json"),
             "html": os.path.join(out_dir, "multigroup.html")}
    table.to_csv(paths["csv"], index=False)
    facts = {"groups": model.group_names_, "group_sizes": model.group_sizes_.tolist(),
             "n_features": int(model.n_features_in_), "n_components": int(model.n_components_),
             "solver": model.solver_, "n_passes": int(model.n_passes_), "sketched": bool(model.sketched_),
             "n_iter": model.n_iter_.tolist(), "mu": model.mu_.tolist(), "primal": model.primal_objective_.tolist(),
             "dual": model.dual_objective_.tolist(), "duality_gap": model.duality_gap_.tolist(),
             "scheduler": model.scheduler_}
    write_json(paths["json"], {**facts, "losses": table.to_dict(orient="records")}, indent=1)
    last = table[table["rank"] == table["rank"].max()]
    summary = [[row.group, *(float(row[kind]) for kind in LOSSES), *(float(row[f"{kind}_svd"]) for kind in LOSSES)]
               for _, row in last.iterrows()]
    gaps = [[r + 1, float(f), float(g), float(f - g), ", ".join(f"{w:.3g}" for w in mu)]
            for r, (f, g, mu) in enumerate(zip(model.primal_objective_, model.dual_objective_, model.mu_))]
    body = (f"<p>{len(model.group_names_)} groups ({', '.join(f'{n}: {s}' for n, s in zip(model.group_names_, model.group_sizes_))} rows), "
            f"{model.n_features_in_} features, rank {model.n_components_}, solver {model.solver_}, "
            f"{model.n_passes_} pass(es) over X.</p>"
            f"<h2>Losses at rank {model.n_components_}: multigroup vectors, then standard SVD</h2>"
            + html_table(["group", *LOSSES, *(f"{kind} (SVD)" for kind in LOSSES)], summary)
            + "<h2>Primal and dual objective by rank</h2>"
            + html_table(["rank", "primal f", "dual g", "gap f - g", "mu"], gaps))
    images = [("fig2_losses.png", losses_figure(table)), ("fig3_duality.png", duality_figure(model))]
    return write_page(paths, out_dir, title, body, images)


def views(model, name: str) -> list[tuple[str, bytes]]:
    """The multigroup SVD's figures in every report of a fit: the paper's Figs. 2 and 3."""
    return [(f"{name}-fig2_losses.png", losses_figure(comparison_table(model), f"{name}: multigroup (solid), SVD "
                                                                              "(dashed)")),
            (f"{name}-fig3_duality.png", duality_figure(model, name))]


def paper_report(data, options: dict, client, out_dir: str, title: str) -> dict:
    """``distfact report STORE --multigroup``: fit the multigroup SVD of rank ``--rank`` and write its report."""
    from ..estimators import MultigroupSVD

    model = MultigroupSVD(options["rank"], random_state=options["seed"], **options["params"])
    model.fit(data, client=client)
    return write_multigroup_report(out_dir, model, title=title)
