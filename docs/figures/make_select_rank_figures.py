"""Regenerate the Table 1 figure of docs/select-rank.md (several minutes on 2 cores):

    python docs/figures/make_select_rank_figures.py          # --plot-only: redraw from the saved table

The Fairer-NMF paper's Table 1 data (Kassab et al., "Towards a Fairer Non-negative Matrix Factorization", 2024,
Section 6.2: groups A, B, C of 1000, 500 and 250 rows x 20 columns, ranks 3, 3 and 6, X_l = W_l H_l uniform on
[0, 1); ``make_fairer_synthetic``), each entry times 1 + 0.03 N(0, 1) (without noise every rank from r_l on
reconstructs group l exactly and its curve is flat from there). ``select_rank`` with NMF (HALS, 400 iterations), ranks 1 to 10, 5 folds of 10%,
``fit="joint"`` and ``fit="per_group"`` (the same held-out entries): each group's mean held-out error against rank,
the rank "worst_group" chooses marked.

Writes docs/figures/select-rank/{table1.csv, table1.png}.
"""

import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

import distfact  # noqa: E402
from distfact.datasets import make_fairer_synthetic  # noqa: E402
from distfact.estimators.select import choose_rank, rank_summary  # noqa: E402

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "select-rank")
RANKS = tuple(range(1, 11))
NOISE, SEED = 0.03, 0
FITS = ("joint", "per_group")


def results() -> pd.DataFrame:
    X, groups = make_fairer_synthetic(SEED, noise=NOISE)
    tables = []
    for fit in FITS:
        result = distfact.select_rank(distfact.NMF(1, solver="hals", max_iter=400, tol=0, random_state=0), X,
                                      groups=groups, ranks=RANKS, random_state=SEED, rule="worst_group", fit=fit)
        tables.append(result.table.assign(fit=fit))
        print(f"{fit}: {result.choices}", file=sys.stderr)
    return pd.concat(tables, ignore_index=True)


def plot(table: pd.DataFrame) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, fit in zip(axes, FITS):
        mine = table[table["fit"] == fit]
        curves = mine.groupby(["group", "rank"])["heldout_error"].mean().unstack("rank")
        for name, curve in curves.iterrows():
            ax.plot(curve.index, curve.to_numpy(), marker="o", label=f"group {name}")
        chosen = choose_rank(rank_summary(mine.drop(columns="fit")), "worst_group")
        ax.axvline(chosen, color="grey", linestyle="--", label=f"worst_group: {chosen}")
        ax.set_yscale("log")
        ax.set_xlabel("rank")
        ax.set_title(f'fit="{fit}"')
        ax.set_xticks(RANKS)
    axes[0].set_ylabel("mean held-out relative squared error")
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, "table1.png"), dpi=110)


if __name__ == "__main__":
    path = os.path.join(HERE, "table1.csv")
    if "--plot-only" not in sys.argv:
        os.makedirs(HERE, exist_ok=True)
        results().to_csv(path, index=False)
    plot(pd.read_csv(path))
