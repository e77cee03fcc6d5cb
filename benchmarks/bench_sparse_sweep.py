"""The CSR NMF local step (one fused sweep of a block's entries) alone, against an earlier version in the same run.

    python benchmarks/bench_sparse_sweep.py --before DIR     # DIR: an earlier source tree (git archive REV)

One block of ``bench_nmf.sparse_case`` (50,000 x 20,000 at 0.5% non-zeros, about 5 M, rank 20: half the
issue-19 case, one of the two blocks an in-process fit makes of it), ``kernels.nmf.frobenius_local`` with MU,
on one thread. Each round runs a fresh process per tree, alternating, each timing the step ``--calls`` times in
thread CPU time (other processes' time on a shared machine is not counted; their cache traffic is); per tree,
the median over rounds of each round's minimum and median. Results: benchmarks/results/sparse_sweep.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = """
import sys, time, numpy as np
sys.path.insert(0, {bench!r})
from bench_nmf import sparse_case
from distfact.kernels import nmf as k
assert k.__file__.startswith({tree!r}), k.__file__
X = sparse_case({rows}, 20000, 0.005)
rng = np.random.default_rng(0)
W, H = rng.random((X.shape[0], 20)), rng.random((20, X.shape[1]))
HHt = H @ H.T
k.frobenius_local(X, W, H, HHt, "mu")
times = []
for _ in range({calls}):
    start = time.thread_time()
    k.frobenius_local(X, W, H, HHt, "mu")
    times.append(time.thread_time() - start)
print(min(times), float(np.median(times)), X.nnz)
"""


def run(tree: str, rows: int, calls: int):
    env = {**os.environ, "PYTHONPATH": tree, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    # run in the tree: ``python -c`` puts the current directory first on sys.path, whose distfact (the other tree's,
    # when started from a checkout) would come before PYTHONPATH's
    child = CHILD.format(bench=HERE, tree=tree, rows=rows, calls=calls)
    out = subprocess.run([sys.executable, "-c", child], env=env, cwd=tree, capture_output=True, text=True,
                         check=True).stdout.split()
    return float(out[0]), float(out[1]), int(out[2])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="source tree of the earlier version")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=7)
    parser.add_argument("--rows", type=int, default=50000)
    parser.add_argument("--output", default=os.path.join(HERE, "results", "sparse_sweep.json"))
    args = parser.parse_args()
    trees = {"before": os.path.abspath(args.before), "now": os.path.dirname(HERE)}
    load = [os.getloadavg()]
    found = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            found[name].append(run(tree, args.rows, args.calls))
            print(name, found[name][-1], flush=True)
    load.append(os.getloadavg())
    summary = {name: {"min_s": float(np.median([t[0] for t in runs])), "median_s": float(np.median([t[1] for t in runs]))}
               for name, runs in found.items()}
    results = {"rows": args.rows, "nnz": found["now"][0][2], "rank": 20, "rounds": found, "summary": summary,
               "ratio_of_minima": summary["now"]["min_s"] / summary["before"]["min_s"],
               "ratio_of_medians": summary["now"]["median_s"] / summary["before"]["median_s"],
               "load_average": load}
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(results, f, indent=1)
    print(json.dumps({k: results[k] for k in ("summary", "ratio_of_minima", "ratio_of_medians", "load_average")}))


if __name__ == "__main__":
    main()
