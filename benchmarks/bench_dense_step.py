"""The dense NMF local step (``kernels.nmf.frobenius_local``, MU, tiled) alone, against an earlier version.

    python benchmarks/bench_dense_step.py --before DIR     # DIR: an earlier source tree (git archive REV); ~3 minutes

20,000 rows of X = W H exactly (``--shapes``: columns x rank, default 2,000 x 20, 500 x 20, 1,000 x 20, 5,000 x 20,
2,000 x 5, 2,000 x 50), W and H uniform; for float64, and float32 with its float64 sums (``sums64``), each without and
with the residual ||X - W_new H||^2 (a float32 fit near an exact factorisation computes it every pass). In-process
defaults (BLAS's threads: the tiles' chunks on both cores). Each round runs a fresh process per tree, alternating,
each timing every case ``--calls`` times (wall clock); per tree and case, the median over rounds of each round's
median. The BLAS's kind (threadpoolctl's core type) decides whether distfact makes a tile's products in runs of rows
for OpenBLAS's small-matrix kernels (``kernels/nmf.py: _product_rows``); it is printed. Results:
benchmarks/results/dense_step.json.
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
import json, time, numpy as np
from threadpoolctl import threadpool_info
from distfact.kernels import nmf as k
assert k.__file__.startswith({tree!r}), k.__file__
rng = np.random.default_rng(0)
out = {{}}
for n, r in {shapes!r}:
    W0, H0 = rng.random((20000, r)), rng.random((r, n))
    X0 = W0 @ H0
    for dtype in (np.float64, np.float32):
        X, W, H = X0.astype(dtype), W0.astype(dtype), H0.astype(dtype)
        HHt, sums64 = H @ H.T, dtype == np.float32
        for residual in (False, True):
            step = lambda: k.frobenius_local(X, W, H, HHt, "mu", residual=residual, sums64=sums64)
            step()
            times = []
            for _ in range({calls}):
                start = time.perf_counter()
                step()
                times.append(time.perf_counter() - start)
            out[f"{{n}}x{{r}} {{np.dtype(dtype).name}}{{' residual' if residual else ''}}"] = float(np.median(times))
blas = sorted({{(i["internal_api"], i.get("architecture")) for i in threadpool_info() if i["user_api"] == "blas"}})
print(json.dumps({{"cases": out, "blas": blas}}))
"""


def run(tree: str, shapes, calls: int) -> dict:
    env = {**os.environ, "PYTHONPATH": tree}
    # run in the tree: ``python -c`` puts the current directory first on sys.path (see bench_sparse_sweep.py)
    child = CHILD.format(tree=tree, shapes=shapes, calls=calls)
    out = subprocess.run([sys.executable, "-c", child], env=env, cwd=tree, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="source tree of the earlier version")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=9)
    parser.add_argument("--shapes", default="2000x20,500x20,1000x20,5000x20,2000x5,2000x50",
                        help="comma-separated COLUMNSxRANK")
    parser.add_argument("--output", default=os.path.join(HERE, "results", "dense_step.json"))
    args = parser.parse_args()
    shapes = [tuple(int(v) for v in shape.split("x")) for shape in args.shapes.split(",")]
    trees = {"before": os.path.abspath(args.before), "now": os.path.dirname(HERE)}
    load = [os.getloadavg()]
    found = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            found[name].append(run(tree, shapes, args.calls))
            print(name, json.dumps({case: round(s * 1e3, 1) for case, s in found[name][-1]["cases"].items()}),
                  flush=True)
    load.append(os.getloadavg())
    cases = list(found["now"][0]["cases"])
    medians = {name: {case: float(np.median([r["cases"][case] for r in runs])) for case in cases}
               for name, runs in found.items()}
    ratios = {case: medians["now"][case] / medians["before"][case] for case in cases}
    for case in cases:
        print(f"{case:24s} before {medians['before'][case] * 1e3:7.1f} ms  now {medians['now'][case] * 1e3:7.1f} ms"
              f"  ratio {ratios[case]:.3f}")
    print("BLAS:", found["now"][0]["blas"])
    results = {"rows": 20000, "rounds": found, "median_s": medians, "ratios": ratios, "blas": found["now"][0]["blas"],
               "load_average": load}
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
