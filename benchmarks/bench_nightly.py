"""Warm starts in nightly pipelines (issue 21): iterations and fit time of ``warm_start = "previous"`` against
the cold start, night by night, on a real data set that grows.

    python benchmarks/bench_nightly.py          # about 3 minutes

scikit-learn's digits (1,797 x 64, grouped by digit): night 0 holds the first 1,437 rows (80%), each of the next
four nights adds 90 rows (5% of the data) at the end. Each night runs the same pipeline twice into two roots, one
with ``warm_start = "previous"`` (from that root's previous night) and one cold (the estimator's own start),
interleaved; NMF rank 10, HALS and MU, ``tol = 1e-4``, ``max_iter = 2000``. Reported per night and solver: both
fits' iterations, fit seconds (``fit.json``: the fit alone; the warm one includes its start, i.e. reading the
previous factors and one solve of the new rows) and final relative error (the fit's objective history, last
value, relative to the cold start's). Results: benchmarks/results/nightly.json.
"""

from __future__ import annotations

import io
import json
import os
import platform
import tempfile

import numpy as np

import distfact
from distfact.datasets import load_digits_grouped
from distfact.pipeline import run_pipeline

FIRST, STEP, NIGHTS, RANK = 1437, 90, 5, 10

SPEC = """
name = "digits-nightly"
[input]
source = "data.npz"
[[fit]]
method = "nmf"
rank = {rank}
solver = "{solver}"
tol = 1e-4
max_iter = 2000
{warm}
[output]
checkpoint_every = 0
"""


def main() -> dict:
    X, groups, _ = load_digits_grouped()
    out = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
           "case": f"digits, first {FIRST} rows then +{STEP} rows a night, NMF rank {RANK}, tol 1e-4", "nights": []}
    with tempfile.TemporaryDirectory() as tmp:
        for solver in ("hals", "mu"):
            for night in range(NIGHTS):
                m = FIRST + STEP * night
                np.savez(os.path.join(tmp, "data.npz"), X=X[:m], groups=groups[:m])
                row = {"solver": solver, "night": night, "rows": m}
                for kind in ("warm", "cold"):
                    spec = os.path.join(tmp, f"{kind}.toml")
                    with open(spec, "w") as f:
                        f.write(SPEC.format(rank=RANK, solver=solver,
                                            warm='warm_start = "previous"' if kind == "warm" else ""))
                    result = run_pipeline(spec, date=f"2026-02-{night + 1:02d}", root=os.path.join(tmp, solver, kind),
                                          stream=io.StringIO())
                    fit_dir = os.path.join(result["run_dir"], "fit", f"nmf-r{RANK}")
                    with open(os.path.join(fit_dir, "fit.json")) as f:
                        facts = json.load(f)
                    model = distfact.load(os.path.join(fit_dir, "model.npz"))
                    row[f"{kind}_iterations"] = facts["n_iter"]
                    row[f"{kind}_seconds"] = round(facts["seconds"], 3)
                    row[f"{kind}_objective"] = float(model.objective_history_[-1])
                row["warm_over_cold_objective"] = row["warm_objective"] / row["cold_objective"]
                row["warm_over_cold_seconds"] = row["warm_seconds"] / row["cold_seconds"]
                print(json.dumps(row))
                out["nights"].append(row)
    for solver in ("hals", "mu"):
        later = [r for r in out["nights"] if r["solver"] == solver and r["night"] > 0]
        out[f"{solver}_median_iterations"] = {k: float(np.median([r[f"{k}_iterations"] for r in later]))
                                              for k in ("warm", "cold")}
        out[f"{solver}_median_seconds_ratio"] = float(np.median([r["warm_over_cold_seconds"] for r in later]))
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "nightly.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
