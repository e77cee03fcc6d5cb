"""Small fits' fixed costs (issue 19): whole fits that are mostly not iterations, and what checkpoints add to a small
fit, in fresh processes.

    python benchmarks/bench_fixed_costs.py                          # this checkout: about two minutes
    python benchmarks/bench_fixed_costs.py --before /path/to/other  # and another tree, processes alternated

Cases (each the median of 60 fits in one process, after one untimed fit):
  nmf_1_iter         NMF(5, max_iter=1) on 400 x 100 uniform, 4 groups of 100 rows: input blocking, the start,
                     one pass, the results
  stratified_1_iter  StratifiedNMF(5, max_iter=1) on the same X and groups
  heart_multigroup   MultigroupSVD(8, center=True, scale=True) on UCI Heart Disease by sex (297 x 22, the multigroup
                     benchmark's first case, Table 2 of the paper: 9 ms there)
  nmf_200_iter       NMF(5, max_iter=200) on the X of nmf_1_iter
  nmf_200_iter_checkpoints  the same with checkpoint_every=10 (each fit into a directory of its own): 20
                     checkpoints of the 4 blocks' W and the global state
  nmf_200_iter_default_checkpoints  the same with a checkpoint_dir and the default checkpoint_every (now "auto":
                     every 10 while checkpoints take at most a tenth of the fit's time; 10 before 2026-12-01's tenth
                     session, so that ``--before`` an older tree measures that change)

Each tree runs in ``--processes`` fresh processes (PYTHONPATH: the tree), this checkout's and the other's
alternated; a figure is the median of the processes' medians, and with ``--before`` the ratio this / before per
case and per pair of processes (the machine's speed moves within a run: a pair ran back to back). Results:
benchmarks/results/fixed_costs.json (with ``--before``: fixed_costs-ab.json).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
FITS = 60


def worker() -> None:
    """This process's medians (ms) of each case, as one JSON line."""
    import numpy as np

    import distfact
    import distfact.datasets

    warnings.simplefilter("ignore")
    rng = np.random.default_rng(0)
    X, groups = rng.random((400, 100)), np.repeat(["a", "b", "c", "d"], 100)
    X_heart, groups_heart = distfact.datasets.load_heart_multigroup()[:2]
    cases = {
        "nmf_1_iter": lambda: distfact.NMF(5, max_iter=1, tol=0, random_state=0).fit(X, groups=groups),
        "stratified_1_iter": lambda: distfact.StratifiedNMF(5, max_iter=1, tol=0, random_state=0).fit(
            X, groups=groups),
        "heart_multigroup": lambda: distfact.MultigroupSVD(8, center=True, scale=True).fit(
            X_heart, groups=groups_heart)}
    checkpoints = tempfile.TemporaryDirectory()
    directories = (os.path.join(checkpoints.name, str(i)) for i in itertools.count())
    cases["nmf_200_iter"] = lambda: distfact.NMF(5, max_iter=200, tol=0, random_state=0).fit(X, groups=groups)
    cases["nmf_200_iter_checkpoints"] = lambda: distfact.NMF(
        5, max_iter=200, tol=0, random_state=0, checkpoint_dir=next(directories), checkpoint_every=10).fit(
        X, groups=groups)
    cases["nmf_200_iter_default_checkpoints"] = lambda: distfact.NMF(
        5, max_iter=200, tol=0, random_state=0, checkpoint_dir=next(directories)).fit(X, groups=groups)
    out = {"distfact": distfact.__file__}
    for name, fit in cases.items():
        fit()  # first calls (numba's cache, imports)
        seconds = []
        for _ in range(FITS):
            start = time.perf_counter()
            fit()
            seconds.append(time.perf_counter() - start)
        out[name] = 1e3 * statistics.median(seconds)
    checkpoints.cleanup()
    print(json.dumps(out), flush=True)


def run_tree(tree: str) -> dict:
    env = {**os.environ, "PYTHONPATH": tree}
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker"], env=env, cwd=HERE, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="another tree (e.g. a checkout of main), measured in the same run")
    parser.add_argument("--processes", type=int, default=5)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker()
    from bench_nmf import machine, write_results

    trees = {"this": os.path.dirname(HERE), **({"before": os.path.abspath(args.before)} if args.before else {})}
    runs = {name: [] for name in trees}
    for _ in range(args.processes):
        for name, tree in trees.items():
            runs[name].append(run_tree(tree))
            print(name, runs[name][-1], flush=True)
    cases = [key for key in runs["this"][0] if key != "distfact"]
    results = {"machine": machine(), "fits_per_process": FITS, "processes": args.processes,
               "trees": {name: runs[name][0]["distfact"] for name in trees}, "cases": {}}
    for case in cases:
        entry = {f"{name}_ms": statistics.median(run[case] for run in runs[name]) for name in trees}
        if args.before:
            pairs = [this[case] / before[case] for this, before in zip(runs["this"], runs["before"])]
            entry.update(ratio=statistics.median(pairs), ratios=[round(ratio, 3) for ratio in pairs])
        results["cases"][case] = entry
        print(case, {key: round(value, 3) if isinstance(value, float) else value for key, value in entry.items()})
    write_results(results, os.path.join(HERE, "results", "fixed_costs-ab.json" if args.before else "fixed_costs.json"))


if __name__ == "__main__":
    main()
