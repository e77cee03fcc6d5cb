"""Regenerate the results of docs/masks.md (a few minutes, one core):

    python docs/figures/make_masks_figures.py               # --plot-only: redraw from the saved numbers

1. Ratings with holes (``distfact.datasets.load_movielens_ratings``: 453 films x 670 users, 43,083 ratings,
   films grouped by genre). For each of three seeds, 10% of the given ratings are held out at random; on the
   rest, for each rank: NMF with ``mask="nonzero"`` (only the given ratings are observed) and NMF of the same
   matrix with the missing ratings read as zeros; and two baselines without a rank, each film's mean rating and
   the overall mean. Scored on the held-out ratings: root mean squared error, per genre and overall.
2. Rank selection on UCI Heart Disease (Cleveland, ``load_heart_disease``, groups by sex): ``select_rank`` with
   ranks 1 to 10, 5 folds of 10% held-out entries; the held-out error against rank per group, with the ranks
   the three rules choose.

Writes docs/figures/masks/{ratings.json, ratings_heldout.png, heart_select_rank.csv, heart_select_rank.png}.
"""

import json
import os
import sys
import warnings

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402
from sklearn.exceptions import ConvergenceWarning  # noqa: E402

import distfact  # noqa: E402
from distfact.datasets import load_heart_disease, load_movielens_ratings  # noqa: E402

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "masks")
RANKS = (1, 2, 3, 5, 8, 12)
SEEDS = (0, 1, 2)
HOLDOUT = 0.1
HEART_RANKS = tuple(range(1, 11))


def split(X: sp.csr_matrix, seed: int):
    """The given ratings cut in two at random: (training matrix, held-out rows, columns, values)."""
    X = X.tocoo()
    held = np.random.default_rng(seed).random(X.nnz) < HOLDOUT
    train = sp.csr_matrix((X.data[~held], (X.row[~held], X.col[~held])), shape=X.shape)
    return train, X.row[held], X.col[held], X.data[held]


def rmse_by_group(predicted, actual, groups_of_entries, names):
    errors = {name: float(np.sqrt(np.mean((predicted - actual)[groups_of_entries == name] ** 2))) for name in names}
    errors["all"] = float(np.sqrt(np.mean((predicted - actual) ** 2)))
    return errors


def ratings_results():
    X, groups, _, _ = load_movielens_ratings()
    names = sorted(set(groups))
    results = []
    for seed in SEEDS:
        train, rows, cols, values = split(X, seed)
        entry_groups = groups[rows]
        given = np.diff(train.indptr)
        film_mean = np.asarray(train.sum(axis=1)).ravel() / np.maximum(given, 1)
        overall = train.data.mean()
        film_mean[given == 0] = overall
        results.append({"seed": seed, "model": "film mean", "rank": None,
                        "rmse": rmse_by_group(film_mean[rows], values, entry_groups, names)})
        results.append({"seed": seed, "model": "overall mean", "rank": None,
                        "rmse": rmse_by_group(np.full(len(values), overall), values, entry_groups, names)})
        for rank in RANKS:
            for model, mask in (("masked NMF", "nonzero"), ("NMF, missing as 0", None)):
                nmf = distfact.NMF(rank, max_iter=500, tol=1e-5, random_state=seed)
                W = nmf.fit_transform(train, groups=groups, mask=mask)
                predicted = np.einsum("ij,ji->i", W[rows], nmf.components_[:, cols])
                results.append({"seed": seed, "model": model, "rank": rank,
                                "rmse": rmse_by_group(predicted, values, entry_groups, names)})
            print(f"seed {seed} rank {rank} done", file=sys.stderr)
    return results


def heart_results():
    X, sex, _ = load_heart_disease()
    selection = distfact.select_rank(distfact.NMF(1, max_iter=1000, tol=1e-5, random_state=0), X, groups=sex,
                                     ranks=HEART_RANKS, n_splits=5, holdout=HOLDOUT, random_state=0)
    return selection.table, {rule: int(rank) for rule, rank in selection.choices.items()}


def plot_ratings(results):
    fig, ax = plt.subplots(figsize=(6, 4))
    for model, style in (("masked NMF", "o-"), ("NMF, missing as 0", "s--")):
        mean = [np.mean([r["rmse"]["all"] for r in results if r["model"] == model and r["rank"] == k]) for k in RANKS]
        ax.plot(RANKS, mean, style, label=model)
    for model, style in (("film mean", ":"), ("overall mean", "-.")):
        ax.axhline(np.mean([r["rmse"]["all"] for r in results if r["model"] == model]), ls=style, c="grey",
                   label=model)
    ax.set(xlabel="rank", ylabel="held-out RMSE (stars)", title="MovieLens, 10% of the ratings held out")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, "ratings_heldout.png"), dpi=120)


def plot_heart(table, chosen):
    fig, ax = plt.subplots(figsize=(6, 4))
    curves = table.groupby(["group", "rank"])["heldout_error"].mean().unstack(0)
    curves.plot(ax=ax, marker="o")
    for rank in sorted(set(chosen.values())):
        rules = ", ".join(rule for rule, chosen_rank in chosen.items() if chosen_rank == rank)
        ax.axvline(rank, ls=":", c="grey")
        ax.annotate(f"chosen by {rules}", (rank, ax.get_ylim()[1]), xytext=(4, -4), textcoords="offset points",
                    va="top", fontsize=8)
    ax.set_yscale("log")
    ax.set(xlabel="rank", ylabel="held-out relative squared error", title="UCI Heart (Cleveland), by sex")
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, "heart_select_rank.png"), dpi=120)


def main():
    os.makedirs(HERE, exist_ok=True)
    saved = os.path.join(HERE, "ratings.json")
    if "--plot-only" in sys.argv:
        with open(saved) as f:
            everything = json.load(f)
        import pandas as pd
        table = pd.read_csv(os.path.join(HERE, "heart_select_rank.csv"))
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            table, chosen = heart_results()
            everything = {"ratings": ratings_results(), "heart_chosen": chosen}
        table.to_csv(os.path.join(HERE, "heart_select_rank.csv"), index=False)
        with open(saved, "w") as f:
            json.dump(everything, f, indent=1)
    plot_ratings(everything["ratings"])
    plot_heart(table, everything["heart_chosen"])


if __name__ == "__main__":
    main()
