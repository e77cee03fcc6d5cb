"""Rank sweeps in shared passes (issue 19's target: a sweep of 10 ranks takes at most 3x the largest rank's fit alone).

    python benchmarks/bench_sweep.py [--quick] [--cases memory,store,small]
    # about 4 minutes on a quiet machine (--quick: the small case only, seconds; --cases: these, in this order)

NMF MU, a fixed number of iterations (tol=0, so that every model runs them all), ranks 2, 4, ..., 20 (10 ranks):
``distfact.fit_many`` (one sweep), the largest rank alone, and the 10 ranks fitted one by one, in one run,
interleaved, medians of the repeats. Cases:

  store   20,000 x 2,000 float64 dense store on disk (320 MB of X, blocks of 2,500 rows, read by every pass),
          10 iterations: where reading X matters
  memory  the same X in memory (the sweep shares its products: one per chunk for all the ranks), 10 iterations
  small   400 x 100 in memory, 4 groups, 300 iterations: the engine's per-pass cost; also the sweep's arithmetic
          alone (``numpy_floor``: a direct numpy loop of the ten models' MU updates stacked side by side, one
          product of each kind per group's block for all ten, on one BLAS thread, no objective), about the least
          any engine could spend on the sweep

Results: benchmarks/results/sweep.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

from bench_nmf import machine, write_results

RANKS = list(range(2, 21, 2))


def median_seconds(runs: dict, repeats: int) -> dict:
    """Each callable of ``runs`` ``repeats`` times, interleaved; median seconds of each."""
    times = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def numpy_floor(X, groups, max_iter: int) -> None:
    """The sweep's arithmetic without the engine: Lee & Seung's MU for the models of ``RANKS`` stacked side by side
    (X_b [H_1; ...; H_k]^T and W_b^T X_b one product each per group's block, each model's W_s H_s H_s^T, W_s^T W_s
    and W_s^T W_s H_s its own), on one BLAS thread, no objective."""
    from threadpoolctl import threadpool_limits

    blocks = [np.ascontiguousarray(X[groups == g]) for g in np.unique(groups)]
    bounds = np.cumsum([0] + RANKS)
    segments = list(zip(bounds[:-1], bounds[1:]))
    rng = np.random.default_rng(0)
    H = rng.random((bounds[-1], X.shape[1]))
    Ws = [rng.random((len(X_b), bounds[-1])) for X_b in blocks]
    eps = np.finfo(np.float64).eps
    with threadpool_limits(1):
        for _ in range(max_iter):
            HHt = [H[a:b] @ H[a:b].T for a, b in segments]
            WtX, WtW = np.zeros_like(H), [np.zeros((b - a, b - a)) for a, b in segments]
            for i, X_b in enumerate(blocks):
                W = Ws[i]
                WHHt = np.empty_like(W)
                for (a, b), G in zip(segments, HHt):
                    WHHt[:, a:b] = W[:, a:b] @ G
                Ws[i] = W = W * (X_b @ H.T) / np.maximum(WHHt, eps)
                WtX += W.T @ X_b
                for (a, b), total in zip(segments, WtW):
                    total += W[:, a:b].T @ W[:, a:b]
            WtWH = np.empty_like(H)
            for (a, b), G in zip(segments, WtW):
                WtWH[a:b] = G @ H[a:b]
            H = H * WtX / np.maximum(WtWH, eps)


def case(X, groups, max_iter: int, repeats: int, separate_repeats: int, floor: bool = False) -> dict:
    from distfact import NMF, fit_many

    template = NMF(max(RANKS), max_iter=max_iter, tol=0.0, random_state=0)
    swept = fit_many(template, X, groups=groups, ranks=RANKS)  # warm-up (numba, page cache), and the pass count
    runs = {"sweep": lambda: fit_many(template, X, groups=groups, ranks=RANKS),
            "largest_alone": lambda: NMF(max(RANKS), max_iter=max_iter, tol=0.0,
                                         random_state=0).fit(X, groups=groups)}
    if floor:
        runs["numpy_floor"] = lambda: numpy_floor(X, groups, max_iter)
    out = median_seconds(runs, repeats)
    out.update(median_seconds({"separate": lambda: [NMF(r, max_iter=max_iter, tol=0.0, random_state=0).fit(
        X, groups=groups) for r in RANKS]}, separate_repeats))
    out = {f"{name}_seconds": round(value, 4) for name, value in out.items()}
    out.update(ranks=RANKS, max_iter=max_iter, sweep_passes=swept[0].sweep_passes_,
               separate_passes=sum(m.n_passes_ for m in swept),
               sweep_over_largest=round(out["sweep_seconds"] / out["largest_alone_seconds"], 3),
               sweep_over_separate=round(out["sweep_seconds"] / out["separate_seconds"], 3))
    if floor:
        out["numpy_floor_over_largest"] = round(out["numpy_floor_seconds"] / out["largest_alone_seconds"], 3)
    print({key: value for key, value in out.items() if key != "ranks"})
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the small case only")
    parser.add_argument("--cases", default="small,memory,store", help="the cases to run, in this order")
    args = parser.parse_args()
    from distfact import from_arrays, open as open_store

    results = {"machine": machine(), "cases": {}}
    for name in ["small"] if args.quick else args.cases.split(","):
        rng = np.random.default_rng(0)  # each case's X whatever ran before it
        if name == "small":
            print("small: 400 x 100, 300 iterations")
            results["cases"]["small"] = case(rng.random((400, 100)), np.repeat([f"g{i}" for i in range(4)], 100),
                                             300, repeats=5, separate_repeats=3, floor=True)
            continue
        rng.random((400, 100))  # the small case's draw: the large X as when the cases ran in the default order
        X, groups = rng.random((20_000, 2_000)), np.repeat(["a", "b", "c", "d"], 5_000)
        if name == "memory":
            print("memory: 20,000 x 2,000 in memory, 10 iterations")
            results["cases"]["memory"] = case(X, groups, 10, repeats=3, separate_repeats=1)
            continue
        with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
            path = os.path.join(tmp, "x.zarr")
            from_arrays(X, groups, path=path, block_rows=2_500)
            del X
            print("store: 20,000 x 2,000 dense store on disk, 10 iterations")
            results["cases"]["store"] = case(open_store(path), None, 10, repeats=3, separate_repeats=1)
    write_results(results, os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "sweep.json"))


if __name__ == "__main__":
    main()
