"""Per-pass overhead of a fit on a Dask LocalCluster (issue 19's target: at most 20 ms beyond the arithmetic for a
store of 8 blocks), before and after a change, in one run.

    python benchmarks/bench_overhead.py --before /work/main    # about 2 minutes

An 800 x 50 float64 store of 8 blocks (4 groups, 100 rows per block), ``NMF(2, solver='mu', init='random',
tol=0, max_iter=60)``, on a ``LocalCluster`` of 2 single-threaded worker processes: the arithmetic is tiny, so
what a pass costs is the engine's and Dask's overhead. Each measurement is a fresh process (this script with
``--measure``) with one source tree first on its path (``--before DIR``: an earlier version's tree; the other is
this one), which starts its own cluster (the workers inherit the path), runs an untimed warm-up fit, then
``--fits`` fits under Dask's ``get_task_stream``. Per pass: the wall time of an iteration (the estimator's
callback, ``IterationInfo.seconds``: the global step on the driver, one pass, the loss) and the tasks' compute
time from the task stream (every task of the timed fits' passes, summed and divided by the passes and the 2
workers: the arithmetic on the critical path, the blocks being split evenly). Overhead = median iteration -
compute per pass. Against it, Dask's own floor, measured in the same process after the fits: a round of one empty
task on each worker, its result brought back (``dask_round_seconds``). The two trees alternate (``--rounds``
each); figures are medians over the rounds.
Results: benchmarks/results/overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N_WORKERS = 2


def measure(store: str, n_fits: int, max_iter: int) -> dict:
    """In a process with the tree under test first on its path: per-pass wall and compute seconds."""
    from distributed import Client, LocalCluster, get_task_stream

    import distfact
    from distfact import NMF
    from distfact.store import open_store

    data = open_store(store)
    with LocalCluster(n_workers=N_WORKERS, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        NMF(2, solver="mu", init="random", tol=0, max_iter=3, random_state=0).fit(data, client=client)
        walls, computes = [], []
        for _ in range(n_fits):
            seconds = []
            with get_task_stream(client=client) as stream:
                model = NMF(2, solver="mu", init="random", tol=0, max_iter=max_iter, random_state=0,
                            callback=lambda info: seconds.append(info.seconds)).fit(data, client=client)
            compute = sum(part["stop"] - part["start"] for task in stream.data for part in task["startstops"]
                          if part["action"] == "compute")
            walls.append(float(np.median(seconds)))
            computes.append(compute / model.n_passes_ / N_WORKERS)
        floor = dask_round_seconds(client, rounds=max_iter)
    return {"distfact": distfact.__file__, "iteration_seconds": walls, "compute_seconds_per_pass": computes,
            "passes_per_fit": int(model.n_passes_), "components_sum": float(model.components_.sum()),
            "dask_round_seconds": floor}


def dask_round_seconds(client, rounds: int) -> float:
    """Dask's floor for a pass on this cluster: the median time of a round of one empty task on each worker, its
    result brought back (what any pass costs beyond its arithmetic, whatever the engine)."""
    import time

    from distributed import as_completed

    workers = sorted(client.scheduler_info()["workers"])
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        futures = [client.submit(int, 0, pure=False, workers=[worker]) for worker in workers]
        for _ in as_completed(futures, loop=client.loop, with_results=True):
            pass
        times.append(time.perf_counter() - started)
    return float(np.median(times))


def run(tree: str, store: str, args) -> dict:
    env = {**os.environ, "PYTHONPATH": tree}
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--measure", store, "--fits", str(args.fits),
                          "--max-iter", str(args.max_iter)], env=env, capture_output=True, text=True, check=True,
                         cwd=tempfile.gettempdir())
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", help="an earlier version's source tree, measured alternately with this one")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fits", type=int, default=3, help="timed fits per process")
    parser.add_argument("--max-iter", type=int, default=60)
    parser.add_argument("--measure", metavar="STORE", help=argparse.SUPPRESS)
    parser.add_argument("--output", default=os.path.join(HERE, "benchmarks", "results", "overhead.json"))
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.fits, args.max_iter)))
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_nmf import machine, write_results

    sys.path.insert(0, HERE)
    from distfact.store import from_arrays

    trees = {"after": HERE, **({"before": os.path.abspath(args.before)} if args.before else {})}
    with tempfile.TemporaryDirectory(prefix="distfact-overhead-") as tmp:
        rng = np.random.default_rng(0)
        store = os.path.join(tmp, "store")
        data = from_arrays(rng.random((800, 50)), np.repeat(np.arange(4), 200), store, block_rows=100)
        assert len(data.blocks) == 8
        rounds = {name: [] for name in trees}
        for r in range(args.rounds):
            for name, tree in (trees.items() if r % 2 == 0 else reversed(trees.items())):
                rounds[name].append(run(tree, store, args))
                print(f"round {r + 1} {name}: iteration {1e3 * np.median(rounds[name][-1]['iteration_seconds']):.1f} ms",
                      file=sys.stderr, flush=True)
    summary = {}
    for name, results in rounds.items():
        wall = float(np.median([w for res in results for w in res["iteration_seconds"]]))
        compute = float(np.median([c for res in results for c in res["compute_seconds_per_pass"]]))
        floor = float(np.median([res["dask_round_seconds"] for res in results if "dask_round_seconds" in res]))
        summary[name] = {"iteration_ms": 1e3 * wall, "compute_ms_per_pass": 1e3 * compute,
                         "overhead_ms_per_pass": 1e3 * (wall - compute), "dask_round_ms": 1e3 * floor,
                         "tree": trees[name]}
    if "before" in summary:
        summary["same_components"] = rounds["before"][0]["components_sum"] == rounds["after"][0]["components_sum"]
        summary["overhead_ratio_after_before"] = (summary["after"]["overhead_ms_per_pass"]
                                                  / summary["before"]["overhead_ms_per_pass"])
    for name in trees:
        s = summary[name]
        print(f"{name}: iteration {s['iteration_ms']:.1f} ms, compute {s['compute_ms_per_pass']:.2f} ms per pass, "
              f"overhead {s['overhead_ms_per_pass']:.1f} ms per pass (Dask's round of an empty task per worker: "
              f"{s['dask_round_ms']:.1f} ms)")
    write_results({"machine": machine(), "store": "800 x 50 float64, 8 blocks, 4 groups",
                   "fit": f"NMF(2, solver='mu', init='random', tol=0, max_iter={args.max_iter})",
                   "workers": N_WORKERS, "rounds": rounds, "summary": summary}, args.output)


if __name__ == "__main__":
    main()
