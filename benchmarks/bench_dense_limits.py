"""What bounds dense MU on this machine (issue 19's targets: 1.3x the GEMM floor, 0.5x scikit-learn's `mu`).

    python benchmarks/bench_dense_limits.py [--repeats 7]    # about a minute

On ``bench_nmf.dense_case``'s X (20,000 x 2,000 float64, 320 MB) at rank 20, each of these on one thread and on two,
the settings alternated ``--repeats`` times, medians of wall time:

  read          one sweep of X (numpy's sum; on two threads each sums half of X's rows): the memory's bandwidth,
                the least any pass over X costs
  X H^T, W^T X  numpy's products on the whole of X, BLAS on one thread and on two: what scikit-learn's `mu` runs
  square        a 2,000 x 2,000 GEMM: the peak rate that bench_nmf.py's floor is taken at (2 x 2mnr flops)
  local step    distfact's dense MU local step on the whole of X (``kernels/nmf.py: frobenius_local``: both
                products tile by tile, X read from memory once), its row chunks in one thread (BLAS held at one)
                and on BLAS's two threads (the default)
  held          the local step on two threads within ``kernels/blas_threads.py: pieces_on_cores``, as a fit's
                loop runs it: right after numpy's products on two threads, the plain "local step" shares the cores
                with OpenBLAS's worker thread, spinning

Prints a table and writes benchmarks/results/dense_limits.json.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import numpy as np

from bench_nmf import dense_case, machine, write_results

M, N, RANK = 20000, 2000, 20


def on_threads(fn, n_threads: int) -> None:
    """``fn(lo, hi)`` over X's rows split in ``n_threads`` equal parts, each part in its own thread."""
    bounds = np.linspace(0, M, n_threads + 1).astype(int)
    threads = [threading.Thread(target=fn, args=(lo, hi)) for lo, hi in zip(bounds[:-1], bounds[1:])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--output", default="benchmarks/results/dense_limits.json")
    args = parser.parse_args()
    from threadpoolctl import threadpool_limits

    from distfact.kernels.blas_threads import pieces_on_cores
    from distfact.kernels.nmf import frobenius_local

    rng = np.random.default_rng(0)
    X = dense_case(M, N, RANK)
    W, H = rng.random((M, RANK)), rng.random((RANK, N))
    Ht, HHt, A = np.ascontiguousarray(H.T), H @ H.T, rng.random((2000, 2000))
    flops = 2 * M * N * RANK  # of one product

    def read(threads):
        return lambda: on_threads(lambda lo, hi: X[lo:hi].sum(), threads)

    def held():
        with pieces_on_cores():
            frobenius_local(X, W, H, HHt, "mu")

    def settings(threads):
        return {"read": read(threads), "X H^T": lambda: X @ Ht, "W^T X": lambda: W.T @ X, "square": lambda: A @ A,
                "local step": lambda: frobenius_local(X, W, H, HHt, "mu"), **({"held": held} if threads == 2 else {})}

    times = {(name, threads): [] for threads in (1, 2) for name in settings(threads)}
    for _ in range(args.repeats):
        for threads in (1, 2):
            with threadpool_limits(threads):
                for name, run in settings(threads).items():
                    start = time.perf_counter()
                    run()
                    times[name, threads].append(time.perf_counter() - start)
    median = {key: statistics.median(values) for key, values in times.items()}

    def rate(name, threads):
        seconds = median[name, threads]
        if name == "read":
            return f"{X.nbytes / seconds / 1e9:.1f} GB/s"
        work = {"square": 2 * 2000 ** 3, "local step": 2 * flops, "held": 2 * flops}.get(name, flops)
        return f"{work / seconds / 1e9:.1f} GF/s"

    print(f"X {M} x {N} float64 ({X.nbytes / 1e6:.0f} MB), rank {RANK}; medians of {args.repeats}")
    print(f"{'':12s} {'1 thread':>22s} {'2 threads':>22s}")
    for name in settings(1):
        print(f"{name:12s} " + " ".join(f"{median[name, t] * 1e3:8.1f} ms {rate(name, t):>11s}" for t in (1, 2)))
    floor = 2 * flops / (2 * 2000 ** 3 / median["square", 2])
    numpy_products = median["X H^T", 2] + median["W^T X", 2]
    print(f"GEMM floor {floor * 1e3:.1f} ms; numpy's two products on 2 threads {numpy_products * 1e3:.1f} ms; "
          f"the local step on 2 threads {median['local step', 2] * 1e3:.1f} ms, "
          f"on 1 {median['local step', 1] * 1e3:.1f} ms, held {median['held', 2] * 1e3:.1f} ms "
          f"({rate('held', 2)}); "
          f"one read of X on 2 threads {median['read', 2] * 1e3:.1f} ms")
    write_results({"machine": machine(), "shape": [M, N], "rank": RANK, "repeats": args.repeats,
                   "median_seconds": {f"{name}, {threads} thread{'s' if threads > 1 else ''}": value
                                      for (name, threads), value in median.items()},
                   "all_seconds": {f"{name}, {threads}": values for (name, threads), values in times.items()},
                   "gemm_floor_s": floor, "numpy_products_2_threads_s": numpy_products}, args.output)


if __name__ == "__main__":
    main()
