"""What a fold's mask costs a whole SSNMF fit (issues 19 and 20), against the unmasked fit, in one run; and the
same for the other masked estimators (``--estimator``).

    python benchmarks/bench_ssnmf_masks.py                      # about a minute
    python benchmarks/bench_ssnmf_masks.py --before DIR         # and the code in DIR (e.g. a checkout of main)
    python benchmarks/bench_ssnmf_masks.py --estimator StratifiedNMF --before DIR    # another estimator

``SSNMF(8, model="FF", max_iter=50, tol=0)`` on a dense 2,000 x 300 uniform X with 4 classes, BLAS on one thread:
without a mask, and with the masks rank selection by masked cross-validation gives a fold (10% of the entries held
out, as a dense weight array and as a CSR matrix) and a mask of few observed entries (10% observed). Each tree's
fits run in a process of their own (``PYTHONPATH``: the tree), the trees' repeats interleaved; figures are medians
of ``--repeats`` (each process first fits every case for 2 iterations, untimed: numba's kernels load), and
each masked fit's ratio to the unmasked fit of the same process. Every tree's final objective is
checked to agree across trees and rounds (relative 1e-9), and printed. ``--estimator``: the same fits of
StratifiedNMF, FairerNMF (MU; ``estimate_max_iter`` 50 too, 2 runs per group), NMF-HALS or NMF-KL, the 4 classes
as their groups. Results: benchmarks/results/ssnmf_masks.json (another estimator's: masks_ESTIMATOR.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_nmf import machine, write_results  # noqa: E402

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS, COLS, RANK, CLASSES, ITERATIONS = 2_000, 300, 8, 4, 50


def estimator(name: str, iterations: int):
    """(the estimator, whether its fit takes the classes as labels ``y``, else as ``groups``)."""
    import distfact

    made = {
        "SSNMF": lambda: distfact.SSNMF(RANK, model="FF", max_iter=iterations, tol=0, random_state=0),
        "StratifiedNMF": lambda: distfact.StratifiedNMF(RANK, max_iter=iterations, tol=0, random_state=0),
        "FairerNMF": lambda: distfact.FairerNMF(RANK, max_iter=iterations, estimate_max_iter=iterations, n_estimates=2,
                                                tol=0, estimate_tol=0, random_state=0),
        "NMF-HALS": lambda: distfact.NMF(RANK, solver="hals", max_iter=iterations, tol=0, random_state=0),
        "NMF-KL": lambda: distfact.NMF(RANK, beta_loss="kullback-leibler", max_iter=iterations, tol=0, random_state=0),
    }
    return made[name](), name == "SSNMF"


ESTIMATORS = ("SSNMF", "StratifiedNMF", "FairerNMF", "NMF-HALS", "NMF-KL")


def problem():
    import scipy.sparse as sp

    rng = np.random.default_rng(0)
    X, y = rng.random((ROWS, COLS)), rng.integers(0, CLASSES, ROWS)
    fold = (rng.random(X.shape) >= 0.1).astype(float)
    return X, y, {"none": None, "10% held out, dense": fold, "10% held out, CSR": sp.csr_matrix(fold),
                  "10% observed, dense": (rng.random(X.shape) < 0.1).astype(float)}


def measure(name: str) -> dict:
    """One round of estimator ``name`` in this process (the tree first on its path): seconds and final objective of
    each case's fit."""
    import warnings

    from threadpoolctl import threadpool_info

    import distfact

    X, y, masks = problem()
    out = {"distfact": distfact.__file__, "blas": [(p["internal_api"], p["num_threads"]) for p in threadpool_info()]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for mask in masks.values():  # untimed: the process's first fits load numba's kernels
            model, labelled = estimator(name, 2)
            model.fit(X, **({"y": y} if labelled else {"groups": y}), mask=mask)
        for case, mask in masks.items():
            model, labelled = estimator(name, ITERATIONS)
            started = time.perf_counter()
            model.fit(X, **({"y": y} if labelled else {"groups": y}), mask=mask)
            out[case] = {"seconds": time.perf_counter() - started, "loss": float(model.objective_history_[-1])}
    return out


def run(tree: str, name: str) -> dict:
    env = {**os.environ, "PYTHONPATH": tree, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--measure", "--estimator", name], env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="a source tree of distfact to compare with, in the same run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--estimator", choices=ESTIMATORS, default="SSNMF")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.estimator)))
        return
    trees = {"this": HERE, **({"before": os.path.abspath(args.before)} if args.before else {})}
    rounds = {name: [] for name in trees}
    for repeat in range(args.repeats):  # the trees' order alternates round by round
        for name, tree in list(trees.items())[::1 if repeat % 2 == 0 else -1]:
            rounds[name].append(run(tree, args.estimator))
    cases = list(problem()[2])
    for case in cases:  # every fit of a case ends at the same loss, to rounding, in every tree and round
        losses = [r[case]["loss"] for results in rounds.values() for r in results]
        assert np.allclose(losses, losses[0], rtol=1e-9, atol=0), (case, losses)
    summary = {}
    for name, results in rounds.items():
        summary[name] = {"distfact": results[0]["distfact"]}
        for case in cases:
            seconds = statistics.median(r[case]["seconds"] for r in results)
            ratio = statistics.median(r[case]["seconds"] / r["none"]["seconds"] for r in results)
            summary[name][case] = {"seconds": seconds, "ratio_to_unmasked": ratio, "loss": results[0][case]["loss"]}
            loss = results[0][case]["loss"]
            print(f"{name:6s} {case:22s} {seconds:7.3f} s  {ratio:5.2f} x unmasked  loss {loss:.10g}")
    output = "ssnmf_masks.json" if args.estimator == "SSNMF" else f"masks_{args.estimator}.json"
    write_results({"machine": machine(), "estimator": args.estimator, "shape": [ROWS, COLS], "rank": RANK,
                   "iterations": ITERATIONS, "repeats": args.repeats, "load": os.getloadavg(), "summary": summary,
                   "rounds": rounds}, os.path.join(HERE, "benchmarks", "results", output))


if __name__ == "__main__":
    main()
