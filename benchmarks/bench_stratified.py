"""Sparse Stratified-NMF (issues 4 and 19), end to end, against a plain scipy.sparse transcription of Algorithm 1.

    python benchmarks/bench_stratified.py                    # about 2 minutes on 2 cores
    python benchmarks/bench_stratified.py --blas-threads 1   # both with BLAS on one thread
    python benchmarks/bench_stratified.py --quick            # a small check run

Data: a 20-stratum sparse TF-IDF-like matrix, 20,000 documents x 50,000 terms (0.2% non-zeros: ~100 distinct
terms per document, Zipf-popular terms, l2-normalised rows; ``bench_nmf.sparse_case``), 1,000 documents per
stratum, rank 20, M = 2 v updates, 10 iterations. Both start from the same W, H, v (Section IV's uniform draws)
and are timed end to end from the CSR matrix and the strata labels: start-up (splitting X by stratum, A(i)^T 1,
distfact's conversion and pass 0) included. Their H after 10 iterations must agree (relative difference below
1e-10). The two alternate three times; medians. ``--blas-threads N`` limits BLAS to N threads for both (the
scipy transcription's dense products are multithreaded; on a loaded machine their threads wait on each other:
issue 19's note). Results: benchmarks/results/stratified.json (``--blas-threads``: stratified-blasN.json).
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from bench_nmf import machine, sparse_case, timed, write_results


def scipy_algorithm_1(X, strata, W, H, v, n_iter, M=2, eps=1e-9):
    """Algorithm 1 line by line on the per-stratum CSR matrices A(i) (scipy.sparse products for every product
    with A(i); (W(i) H + 1 v(i)^T) H^T and W(i)^T (W(i) H + 1 v(i)^T) by associativity, never m_i x n).
    ``W``: in X's row order; ``v``: one row per stratum, strata in sorted order. Returns H, v, W per stratum."""
    names = sorted(set(strata))
    rows = [np.flatnonzero(strata == name) for name in names]
    A = [X[index] for index in rows]
    colsums = [np.asarray(a.sum(axis=0)).ravel() for a in A]  # A(i)^T 1, constant
    W = [W[index] for index in rows]
    v = list(v)
    for _ in range(n_iter):
        for _ in range(M):  # line 5
            v = [vi * c / (a.shape[0] * vi + H.T @ w.sum(axis=0) + eps) for a, c, vi, w in zip(A, colsums, v, W)]
        HHt = H @ H.T
        W = [w * (a @ H.T) / (w @ HHt + H @ vi + eps) for a, vi, w in zip(A, v, W)]  # line 7
        numerator = sum((a.T @ w).T for a, w in zip(A, W))  # line 8
        denominator = sum((w.T @ w) @ H + np.outer(w.sum(axis=0), vi) for vi, w in zip(v, W))
        H = H * numerator / (denominator + eps)
    return H, v, W


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--blas-threads", type=int, default=None, help="BLAS threads for both (default: BLAS's own)")
    args = parser.parse_args()
    if args.blas_threads is not None:
        from threadpoolctl import threadpool_limits

        threadpool_limits(args.blas_threads, user_api="blas")
    import distfact

    m, n, density, r, s = (2_000, 5_000, 0.02, 10, 20) if args.quick else (20_000, 50_000, 0.002, 20, 20)
    n_iter, repeats = 10, (1 if args.quick else 3)
    X = sparse_case(m, n, density, seed=0)
    strata = np.repeat([f"s{i:02d}" for i in range(s)], m // s)
    print(f"X: {m} x {n}, {X.nnz} non-zeros, {s} strata, rank {r}, {n_iter} iterations")
    rng = np.random.default_rng(0)  # Section IV's start
    W0, H0, v0 = rng.random((m, r)) / np.sqrt(r), rng.random((r, n)) / np.sqrt(r), rng.random((s, n))
    distfact.StratifiedNMF(r, max_iter=1, random_state=0).fit(X[:200], groups=strata[:200])  # compile the kernels

    def ours():
        return distfact.StratifiedNMF(r, max_iter=n_iter, tol=None, init="custom").fit(X, groups=strata, W=W0,
                                                                                       H=H0, v=v0)

    def peer():
        return scipy_algorithm_1(X, strata, W0, H0, v0, n_iter)

    t_ours, t_peer = [], []
    for _ in range(repeats):
        seconds, model = timed(ours)
        t_ours.append(seconds)
        seconds, (H, v, _) = timed(peer)
        t_peer.append(seconds)
    agreement = float(np.linalg.norm(model.components_ - H) / np.linalg.norm(H))
    assert agreement < 1e-10, agreement
    ratios = np.array(t_ours) / np.array(t_peer)
    print(f"distfact {np.median(t_ours):.3f} s, scipy {np.median(t_peer):.3f} s for {n_iter} iterations; "
          f"ratio {np.median(ratios):.3f} (runs {ratios.round(3).tolist()}); H agrees to {agreement:.1e}")

    result = {"quick": args.quick, "blas_threads": args.blas_threads, "load_average": os.getloadavg(),
              "machine": machine(), "shape": [m, n], "nnz": int(X.nnz), "strata": s, "rank": r,
              "iterations": n_iter, "distfact_s": float(np.median(t_ours)), "scipy_s": float(np.median(t_peer)),
              "ratio": float(np.median(ratios)), "ratios": ratios.round(3).tolist(), "target": 0.5,
              "H_relative_difference": agreement}
    name = "stratified" + ("" if args.blas_threads is None else f"-blas{args.blas_threads}")
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                       f"{name}-quick.json" if args.quick else f"{name}.json")
    write_results(result, out)


if __name__ == "__main__":
    main()
