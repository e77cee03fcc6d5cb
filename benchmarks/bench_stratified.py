"""Stratified-NMF per-iteration time (issue 4) against a direct dense numpy implementation of Algorithm 1.

    python benchmarks/bench_stratified.py            # about 2 minutes on 2 cores, ~9 GB of memory
    python benchmarks/bench_stratified.py --quick    # a small check run

Data: a 20-stratum sparse TF-IDF-like matrix, 20,000 documents x 50,000 terms (0.2% non-zeros: ~100 distinct
terms per document, Zipf-popular terms, l2-normalised rows; ``bench_nmf.sparse_case``), rank 20, M = 2.
distfact runs in-process from the CSR matrix: (T(12 iterations) - T(2)) / 10. The peer keeps each stratum as a
dense numpy array (8 GB in all) and runs Algorithm 1 line by line with BLAS (A(i)^T 1 computed once); its
iterations are timed one by one (median of 3). Both in the same run. Results: benchmarks/results/stratified.json.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from bench_nmf import machine, sparse_case, timed, write_results


def dense_algorithm_1(strata_A, W, H, v, n_iter, M=2, eps=1e-9):
    """Algorithm 1 on dense per-stratum arrays; yields the seconds of each iteration."""
    colsums = [A.sum(axis=0) for A in strata_A]  # A(i)^T 1, constant
    for _ in range(n_iter):
        start = time.perf_counter()
        for _ in range(M):  # line 5
            v = [vi * c / (vi * A.shape[0] + H.T @ w.sum(axis=0) + eps)
                 for A, c, vi, w in zip(strata_A, colsums, v, W)]
        new_W = []
        for A, vi, w in zip(strata_A, v, W):  # line 7
            R = w @ H
            R += vi
            new_W.append(w * (A @ H.T) / (R @ H.T + eps))
        W = new_W
        numerator, denominator = 0.0, 0.0
        for A, vi, w in zip(strata_A, v, W):  # line 8
            R = w @ H
            R += vi
            numerator = numerator + w.T @ A
            denominator = denominator + w.T @ R
        H = H * numerator / (denominator + eps)
        yield time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    import distfact

    m, n, density, r, s = (2_000, 5_000, 0.02, 10, 20) if args.quick else (20_000, 50_000, 0.002, 20, 20)
    X = sparse_case(m, n, density, seed=0)
    strata = np.repeat([f"s{i:02d}" for i in range(s)], m // s)
    print(f"X: {m} x {n}, {X.nnz} non-zeros, {s} strata, rank {r}")
    distfact.StratifiedNMF(r, max_iter=1, random_state=0).fit(X[:200], groups=strata[:200])  # compile the kernels

    def fit(k):
        return distfact.StratifiedNMF(r, max_iter=k, random_state=0).fit(X, groups=strata)
    t2, _ = timed(lambda: fit(2))
    t12, model = timed(lambda: fit(12))
    ours = (t12 - t2) / 10
    print(f"distfact: {ours:.3f} s/iteration ({model.n_passes_} passes for 12 iterations)")

    rng = np.random.default_rng(0)
    seconds, dense = timed(lambda: [X[strata == name].toarray() for name in sorted(set(strata))])
    print(f"densified the strata in {seconds:.1f} s ({sum(A.nbytes for A in dense) / 2**30:.1f} GiB)")
    W = [rng.random((A.shape[0], r)) / np.sqrt(r) for A in dense]
    H, v = rng.random((r, n)) / np.sqrt(r), [rng.random(n) for _ in dense]
    peer = float(np.median(list(dense_algorithm_1(dense, W, H, v, 3))))
    print(f"dense numpy: {peer:.3f} s/iteration; ratio distfact / dense = {ours / peer:.3f}")

    result = {"quick": args.quick, "machine": machine(), "shape": [m, n], "nnz": int(X.nnz), "strata": s, "rank": r,
              "distfact_s_per_iter": ours, "dense_numpy_s_per_iter": peer, "ratio": ours / peer}
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                       "stratified-quick.json" if args.quick else "stratified.json")
    write_results(result, out)


if __name__ == "__main__":
    main()
