"""Regenerate the results of docs/wl1-nmf.md (about 9 minutes, one core):

    python docs/figures/make_wl1_figures.py               # --plot-only: redraw from the saved numbers

Section 7.3 of Seraghiti et al., 2026, matrix completion with false zeros (Fig. 7.3): a rank-20 100 x 50 matrix
W H (uniform factors) plus Laplace noise of diversity 0.1; a share q1 of the entries set to 0, of which a
share q2 are the smallest entries (false zeros) and the rest random (missing). For each lambda, the relative
error ||W H - W* H*||_F / ||W H||_F of ``WeightedL1NMF`` (10 HALS iterations, then sCD until the objective
divided by sum(X) changes by less than 1e-6, at most 300 iterations), averaged over 10 random starts.
Writes docs/figures/wl1-false-zeros/{fig7_3_false_zeros.png, false_zeros.json}.
"""

import json
import os
import sys
import warnings

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.exceptions import ConvergenceWarning  # noqa: E402

import distfact  # noqa: E402
from distfact.datasets import make_false_zeros  # noqa: E402

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "wl1-false-zeros")
ZEROS = (0.3, 0.5, 0.7)
FALSE_SHARES = (0.0, 0.5, 1.0)
LAMBDAS = (0.0, 0.001, 0.01, 0.05, 0.1, 0.5, 1.0)
STARTS = 10


def relative_error(zeros, false_share, lam, seed):
    X, truth = make_false_zeros(zeros, false_share, random_state=seed)
    model = distfact.WeightedL1NMF(20, lam=lam, max_iter=300, tol=1e-6, random_state=seed, n_threads=1)
    W = model.fit_transform(X)
    return float(np.linalg.norm(W @ model.components_ - truth) / np.linalg.norm(truth))


def compute() -> dict:
    table = {}
    for zeros in ZEROS:
        for false_share in FALSE_SHARES:
            table[f"{zeros}/{false_share}"] = {str(lam): float(np.mean([relative_error(zeros, false_share, lam, s)
                                                                        for s in range(STARTS)]))
                                               for lam in LAMBDAS}
            print(zeros, false_share, {k: round(v, 3) for k, v in table[f"{zeros}/{false_share}"].items()}, flush=True)
    doc = {"zeros_q1": ZEROS, "false_share_q2": FALSE_SHARES, "lambdas": LAMBDAS, "starts": STARTS,
           "mean_relative_error": table}
    with open(os.path.join(HERE, "false_zeros.json"), "w") as f:
        json.dump(doc, f, indent=1)
    return doc


def plot(doc: dict, top: float = 2.0) -> None:
    """Fig. 7.3's layout; means above ``top`` (lambda = 0 diverging on some starts: nothing penalises W H
    on the zeros) are drawn at the top edge with their value."""
    table = doc["mean_relative_error"]
    fig, axes = plt.subplots(1, len(ZEROS), figsize=(12, 3.6), sharey=True)
    positions = np.arange(len(LAMBDAS))
    for ax, zeros in zip(axes, ZEROS):
        for false_share in FALSE_SHARES:
            values = np.array([table[f"{zeros}/{false_share}"][str(lam)] for lam in LAMBDAS])
            line, = ax.plot(positions, np.minimum(values, top), marker="o", label=f"q2 = {false_share:g}")
            for x, value in zip(positions, values):
                if value > top:
                    ax.annotate(f"{value:.0e}", (x, top), textcoords="offset points", xytext=(4, -12 - 9 * false_share),
                                color=line.get_color(), fontsize=7)
        ax.set_xticks(positions, [f"{lam:g}" for lam in LAMBDAS])
        ax.set_ylim(0, top * 1.05)
        ax.set_xlabel("lambda")
        ax.set_title(f"q1 = {zeros:g} of the entries are 0")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("||WH - W*H*||_F / ||WH||_F (mean of 10)")
    axes[-1].legend(title="false zeros")
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, "fig7_3_false_zeros.png"), dpi=110)
    print(f"wrote {HERE}")


def main():
    warnings.filterwarnings("ignore", category=ConvergenceWarning)
    os.makedirs(HERE, exist_ok=True)
    if "--plot-only" in sys.argv:  # redraw from the saved numbers
        with open(os.path.join(HERE, "false_zeros.json")) as f:
            return plot(json.load(f))
    plot(compute())


if __name__ == "__main__":
    main()
