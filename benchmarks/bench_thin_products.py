"""Thin products of small dense blocks: distfact's loops against BLAS (issue 19), in one process.

    python benchmarks/bench_thin_products.py        # about a minute

A small fit's local step is two products of its block with a factor of a few columns: X_b H^T (rows x r) and
W_b^T X_b (r x n). ``kernels/products.py`` forms them in register-blocked numba loops (``_thin_times_ht``,
``_thin_wt_times``) instead of numpy's BLAS products where this benchmark found the loops faster (``thin_xht``,
``thin_wt``); the column ``taken`` says whether ``block_times_ht`` / ``wt_times_block`` take them for the shape. Each
shape and dtype: the loops (called directly, into a new output array, as the two functions call them) against the
expressions the two functions use otherwise (``X @ H^T`` with H^T copied C-contiguous, ``W.T @ X``), alternated
``--repeats`` times, each time a batch of calls; medians of the thread's CPU time per call, BLAS on one thread (the
loops take blocks below ``THIN_WORK`` multiply-adds, which OpenBLAS runs on one thread anyway; the larger shapes
show what BLAS's single thread gives up to them). Shapes: the small-fit benchmarks' blocks (``bench_small.py``: NMF's
400 x 100 by rank 5, Stratified-NMF's strata of 100 x 100, Fairer-NMF's UCI Heart groups of 12 features, SSNMF's 500 x
300 by rank 10), the ranks at the loops' limits (2, 8, 12, 16), rank 1. Results: benchmarks/results/thin_products.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_nmf import machine, write_results  # noqa: E402

SHAPES = [(400, 100, 5), (100, 100, 5), (500, 100, 2), (300, 100, 8), (150, 100, 12), (201, 12, 5), (96, 12, 3),
          (333, 100, 1), (400, 100, 16), (500, 300, 10), (2000, 200, 10)]


def per_call(fn, calls: int) -> float:
    start = time.thread_time()
    for _ in range(calls):
        fn()
    return (time.thread_time() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "thin_products.json"))
    args = parser.parse_args()

    from threadpoolctl import threadpool_limits

    from distfact.kernels.products import _thin_times_ht, _thin_wt_times, thin_wt, thin_xht

    rng = np.random.default_rng(0)
    rows = []
    with threadpool_limits(1, user_api="blas"):
        for (m, n, r) in SHAPES:
            for dtype in (np.float64, np.float32):
                X, H, W = (rng.random(shape).astype(dtype) for shape in ((m, n), (r, n), (m, r)))
                calls = max(20, int(2e7 / (m * n * r)))
                pairs = {"X H^T": (lambda: _thin_times_ht(X, H, np.empty((m, r), dtype)),
                                   lambda: X @ np.ascontiguousarray(H.T), thin_xht(X, H)),
                         "W^T X": (lambda: _thin_wt_times(W, X, np.empty((r, n), dtype)), lambda: W.T @ X,
                                   thin_wt(W, X))}
                for product, (loops, blas, taken) in pairs.items():
                    loops(), blas()  # compiled, warm
                    times = {"loops": [], "blas": []}
                    for _ in range(args.repeats):
                        times["loops"].append(per_call(loops, calls))
                        times["blas"].append(per_call(blas, calls))
                    loop_s, blas_s = statistics.median(times["loops"]), statistics.median(times["blas"])
                    row = {"shape": [m, n, r], "dtype": np.dtype(dtype).name, "product": product, "taken": taken,
                           "loops_us": round(loop_s * 1e6, 2), "blas_us": round(blas_s * 1e6, 2),
                           "ratio": round(loop_s / blas_s, 3), "loops_gflops": round(2 * m * n * r / loop_s / 1e9, 1),
                           "blas_gflops": round(2 * m * n * r / blas_s / 1e9, 1)}
                    rows.append(row)
                    print(f"{m:5d} x {n:4d} r {r:2d} {row['dtype']:8s} {product}: loops {row['loops_us']:8.1f} us "
                          f"({row['loops_gflops']:5.1f} GF/s)  BLAS {row['blas_us']:8.1f} us "
                          f"({row['blas_gflops']:5.1f} GF/s)  ratio {row['ratio']:.2f}{'  taken' * taken}", flush=True)
    write_results({"machine": machine(), "repeats": args.repeats, "results": rows}, args.out)


if __name__ == "__main__":
    main()
