"""Start-up of the command line (issue 19's target: `distfact --help` and `distfact info` under 0.5 s).

    python benchmarks/bench_startup.py [--before DIR]    # about 30 seconds

Wall time of a fresh process for `distfact --help`, `distfact info STORE` (a small store) and `distfact fit --help`
(which derives the methods' options, importing every estimator), median of 5. With ``--before DIR`` (a source
tree of an earlier version, e.g. ``git archive 485c15f | tar -x -C DIR``), the same commands run with that tree
first on the path, alternating with this one, so that the ratio is measured in one run.
Results: benchmarks/results/startup.json.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from bench_nmf import machine, write_results

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def seconds(command, path_first, cwd):
    env = {**os.environ, "PYTHONPATH": path_first}  # from an empty directory: `-m` puts the cwd first on the path
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "distfact.cli", *command], env=env, cwd=cwd, check=True,
                   capture_output=True)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", help="source tree of an earlier version, compared in the same run")
    args = parser.parse_args()
    from distfact.store.ingest import from_arrays

    scratch = tempfile.mkdtemp()
    store = os.path.join(scratch, "x.zarr")
    from_arrays(np.ones((60, 8)), np.array(["a", "b"] * 30), store)
    trees = {"this": HERE, **({"before": os.path.abspath(args.before)} if args.before else {})}
    commands = {"--help": ["--help"], "info": ["info", store], "fit --help": ["fit", "--help"]}
    times = {tree: {name: [] for name in commands} for tree in trees}
    for _ in range(5):
        for tree, path in trees.items():
            for name, command in commands.items():
                times[tree][name].append(seconds(command, path, scratch))
    result = {"machine": machine(), "median_seconds": {tree: {name: float(np.median(t)) for name, t in by.items()}
                                                       for tree, by in times.items()}, "all_seconds": times}
    print(result["median_seconds"])
    write_results(result, "benchmarks/results/startup.json")


if __name__ == "__main__":
    main()
