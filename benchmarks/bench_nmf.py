"""distfact NMF against scikit-learn's NMF, measured in one run on this machine.

    python benchmarks/bench_nmf.py            # the full set (about 10 minutes on 2 cores)
    python benchmarks/bench_nmf.py --quick    # small sizes, to check the script
    python benchmarks/bench_nmf.py --cases dense --output /tmp/dense.json   # one case
    python benchmarks/bench_nmf.py --cases sparse --mu-only --output /tmp/sparse.json   # sparse MU alone

Cases (the targets of issues 2 and 19):
  dense   20000 x 2000 float64, rank 20
  sparse  100000 x 20000, 0.5% non-zeros, TF-IDF-like (Zipf column popularity, l2-normalised rows)
For each: per-iteration time of MU (distfact vs scikit-learn 'mu'; target ratio <= 0.5), and the time
distfact HALS takes to reach the final error of scikit-learn 'cd' (target: <= the time 'cd' takes).
Dense MU also against the GEMM floor measured in the same run (2 x 2mnr flops at the peak rate of a square
GEMM; target <= 1.3), and distfact on the same X in float32 (target: >= 1.7x faster than float64), and on
X ~ U(0, 1) of the same shape, whose fit is far from exact (``float32_far_from_exact``).
  small   400 x 100, rank 5, 2000 MU iterations: distfact fit vs a direct numpy loop of the same
          updates (target ratio <= 2).
Per-iteration times are (T(n2) - T(n1)) / (n2 - n1) for fits of n1 and n2 iterations with tol=0, so
initialisation and input conversion cancel out. Dense MU's floor ratio and float32 speed-up are also given
from one fit's own clock ("steady": the median time between consecutive iterations, from its callback), which
does not carry two whole fits' noise. Results go to benchmarks/results/nmf.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
import warnings

import numpy as np
import scipy.sparse as sp

warnings.filterwarnings("ignore", module="sklearn")


def machine() -> dict:
    import dask
    import numba
    import scipy
    import sklearn
    from threadpoolctl import threadpool_info

    cpu = "unknown"
    if os.path.exists("/proc/cpuinfo"):
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    blas = [f"{i.get('internal_api')} {i.get('version')} ({i.get('num_threads')} threads)"
            for i in threadpool_info() if i.get("user_api") == "blas"]
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem, 1), "python": platform.python_version(),
            "numpy": np.__version__, "scipy": scipy.__version__,
            "scikit-learn": sklearn.__version__, "dask": dask.__version__, "numba": numba.__version__,
            "blas": blas}


def dense_case(m, n, r, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((m, r)) @ rng.random((r, n)) + 0.1 * rng.random((m, n))


def sparse_case(m, n, density, seed=0):
    """TF-IDF-like: Zipf-popular columns, log-scaled counts, l2-normalised rows, ``density`` non-zeros.

    Each row draws k columns with replacement; k is set so that the expected number of
    *distinct* columns per row is density * n."""
    rng = np.random.default_rng(seed)
    popularity = 1.0 / np.arange(1, n + 1) ** 1.1
    popularity /= popularity.sum()
    want = density * n
    lo, hi = want, 50 * want
    for _ in range(60):  # bisection on E[distinct] = sum_j 1 - (1 - p_j)^k
        k = (lo + hi) / 2
        lo, hi = (k, hi) if np.sum(1 - (1 - popularity) ** k) < want else (lo, k)
    draws = int(round(k))
    cols = rng.choice(n, size=m * draws, p=popularity)
    rows = np.repeat(np.arange(m), draws)
    X = sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(m, n))
    X.sum_duplicates()  # data = term counts
    X.data = 1 + np.log(X.data)
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
    return sp.csr_matrix(sp.diags(1 / np.maximum(norms, 1e-12)) @ X)


def write_results(results: dict, path: str) -> None:
    """Write a benchmark's results as JSON (making the folder) and say where."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {path}")


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def per_iteration(make_fit, n1, n2):
    t1, _ = timed(lambda: make_fit(n1))
    t2, _ = timed(lambda: make_fit(n2))
    return (t2 - t1) / (n2 - n1)


def steady_iteration(make_model, X, n_iter):
    """Median seconds between consecutive iterations of one fit (from its callback's clock), the first two
    iterations left out: an iteration's own cost, without the start or the end of the fit. Steadier than the
    difference of two fits' times (``per_iteration``), which carries both fits' noise."""
    stamps = []
    make_model(n_iter, lambda info: stamps.append(time.perf_counter())).fit(X)
    return float(np.median(np.diff(stamps[2:])))


def gemm_floor(X, r, repeats=5):
    """The floor of an MU iteration on dense X: its two GEMM-shaped products X H^T and W^T X (2 m n r multiply-adds
    each). Measured two ways with numpy's BLAS on all its threads, best of ``repeats``: the two products themselves,
    and 2 x 2mnr flops at the peak rate of a square GEMM (2000 x 2000) in X's dtype."""
    rng = np.random.default_rng(0)
    (m, n), dtype = X.shape, X.dtype
    W, H = rng.random((m, r)).astype(dtype), rng.random((r, n)).astype(dtype)
    A = rng.random((2000, 2000)).astype(dtype)
    products = min(timed(lambda: (X @ H.T, W.T @ X))[0] for _ in range(repeats))
    peak = 2 * 2000 ** 3 / min(timed(lambda: A @ A)[0] for _ in range(repeats))
    return {"products_s": products, "peak_gflops": peak / 1e9, "floor_s": 4 * m * n * r / peak}


def mu_ratio(X, r, n1, n2, repeats, float32=False):
    """Per-iteration MU time of both libraries, measured alternately ``repeats`` times (this
    machine is a shared VM: single measurements move by +-30%); medians and the median ratio.
    Dense X: also the GEMM floor (``gemm_floor``) each time, and with ``float32`` distfact on X in float32."""
    import distfact
    from sklearn.decomposition import NMF as SkNMF

    def ours(data):
        return per_iteration(lambda k: distfact.NMF(r, solver="mu", init="random", max_iter=k, tol=0,
                                                    random_state=0).fit(data), n1, n2)

    def model(k, callback):
        return distfact.NMF(r, solver="mu", init="random", max_iter=k, tol=0, random_state=0, callback=callback)

    X32 = X.astype(np.float32) if float32 else None
    # a first fit of each kind in this process, untimed: its one-time costs (numba's cache loaded, BLAS's threads
    # started, pages of fresh buffers) once made a first round's T(n1) exceed its T(n2) (a ratio of -1.8)
    SkNMF(r, solver="mu", init="random", max_iter=n1, tol=0, random_state=0).fit(X)
    for data in (X, X32) if float32 else (X,):
        model(n1, None).fit(data)
    sk, mine, floors, singles, steady64, steady32 = [], [], [], [], [], []
    for _ in range(repeats):
        sk.append(per_iteration(lambda k: SkNMF(r, solver="mu", init="random", max_iter=k, tol=0,
                                                random_state=0).fit(X), n1, n2))
        mine.append(ours(X))
        if not sp.issparse(X):
            floors.append(gemm_floor(X, r))
            steady64.append(steady_iteration(model, X, n2))
        if float32:
            singles.append(ours(X32))
            steady32.append(steady_iteration(model, X32, n2))
    ratios = np.array(mine) / np.array(sk)
    out = {"sklearn_mu_s_per_iter": float(np.median(sk)), "distfact_mu_s_per_iter": float(np.median(mine)),
           "ratio": float(np.median(ratios)), "ratios": ratios.round(3).tolist(), "target": 0.5}
    if floors:
        to_floor = np.array(mine) / np.array([f["floor_s"] for f in floors])
        out["gemm_floor"] = {"floor_s": float(np.median([f["floor_s"] for f in floors])),
                             "products_s": float(np.median([f["products_s"] for f in floors])),
                             "peak_gflops": float(np.median([f["peak_gflops"] for f in floors])),
                             "distfact_to_floor": float(np.median(to_floor)), "ratios": to_floor.round(3).tolist(),
                             "target": 1.3}
        steady_to_floor = np.array(steady64) / np.array([f["floor_s"] for f in floors])
        out["gemm_floor"]["steady"] = {"distfact_s_per_iter": float(np.median(steady64)),
                                       "distfact_to_floor": float(np.median(steady_to_floor)),
                                       "ratios": steady_to_floor.round(3).tolist()}
    if float32:
        speedup = np.array(mine) / np.array(singles)
        steady = np.array(steady64) / np.array(steady32)
        out["float32"] = {"distfact_mu_s_per_iter": float(np.median(singles)), "speedup": float(np.median(speedup)),
                          "speedups": speedup.round(3).tolist(), "target": 1.7,
                          "steady": {"float64_s_per_iter": float(np.median(steady64)),
                                     "float32_s_per_iter": float(np.median(steady32)),
                                     "speedup": float(np.median(steady)), "speedups": steady.round(3).tolist()}}
    return out


def float32_far_from_exact(shape, r, n_iter, repeats):
    """distfact's float32 speed-up on X ~ U(0, 1) of ``shape`` (a rank-r fit's relative error about 0.5, where the
    dense case's is 0.079 after 60 MU iterations): each fit's steady clock, float64 and float32 alternated
    ``repeats`` times. Near an exact fit, float32's errors need each block's residual, a third product
    (``methods/nmf.py: _residuals_needed``); here they come from the statistics."""
    import distfact

    def model(k, callback):
        return distfact.NMF(r, solver="mu", init="random", max_iter=k, tol=0, random_state=0, callback=callback)

    X = np.random.default_rng(1).random(shape)
    X32 = X.astype(np.float32)
    steady64, steady32 = [], []
    for _ in range(repeats):
        steady64.append(steady_iteration(model, X, n_iter))
        steady32.append(steady_iteration(model, X32, n_iter))
    speedup = np.array(steady64) / np.array(steady32)
    return {"float64_s_per_iter": float(np.median(steady64)), "float32_s_per_iter": float(np.median(steady32)),
            "speedup": float(np.median(speedup)), "speedups": speedup.round(3).tolist(), "target": 1.7}


def hals_vs_cd(X, r, max_iter):
    import distfact
    from sklearn.decomposition import NMF as SkNMF

    t_cd, cd = timed(lambda: SkNMF(r, solver="cd", init="nndsvda", max_iter=max_iter, random_state=0).fit(X))
    target = cd.reconstruction_err_
    trace = []
    start = time.perf_counter()

    def record(info):
        trace.append((time.perf_counter() - start, float(np.sqrt(2 * info.objective))))

    model = distfact.NMF(r, solver="hals", init="nndsvda", max_iter=4 * max_iter, tol=0, random_state=0,
                         callback=record)

    class Reached(Exception):
        pass

    def stop_when_reached(info):
        record(info)
        if trace[-1][1] <= target:
            raise Reached

    model.callback = stop_when_reached
    try:
        model.fit(X)
        reached = None
    except Reached:
        reached = trace[-1][0]
    return {"sklearn_cd_seconds": t_cd, "sklearn_cd_iterations": int(cd.n_iter_), "sklearn_cd_error": target,
            "distfact_hals_seconds_to_reach": reached, "distfact_hals_iterations": len(trace),
            "distfact_hals_best_error": min(e for _, e in trace),
            "ratio": None if reached is None else reached / t_cd, "target": 1.0}


def small_case(n_iter):
    import distfact

    rng = np.random.default_rng(0)
    X = rng.random((400, 100))
    r = 5
    eps = np.finfo(X.dtype).eps

    def numpy_loop():
        W, H = rng.random((400, r)), rng.random((r, 100))
        for _ in range(n_iter):
            H = H * (W.T @ X) / np.maximum(W.T @ W @ H, eps)
            W = W * (X @ H.T) / np.maximum(W @ (H @ H.T), eps)

    numpy_loop()
    distfact.NMF(r, max_iter=10, tol=0).fit(X)  # compile and warm up
    t_np, t_df = [], []
    for _ in range(5):  # alternate, keep the best of each (noise only ever adds time)
        t_np.append(timed(numpy_loop)[0])
        t_df.append(timed(lambda: distfact.NMF(r, max_iter=n_iter, tol=0, random_state=0).fit(X))[0])
    t_np, t_df = min(t_np), min(t_df)
    return {"numpy_loop_s": t_np, "distfact_fit_s": t_df, "ratio": t_df / t_np, "target": 2.0}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, to check the script")
    parser.add_argument("--output", help="default: results/nmf.json (--quick: results/nmf-quick.json; a run of some "
                                         "cases or --mu-only: results/nmf-partial.json, not replacing a whole run's)")
    parser.add_argument("--cases", default="small,dense,sparse", help="comma-separated subset (default: all)")
    parser.add_argument("--mu-only", action="store_true", help="dense and sparse: the MU comparison only (no HALS vs cd)")
    args = parser.parse_args()
    cases = set(args.cases.split(","))
    if args.quick:
        dense_shape, sparse_shape, iters, cd_iter, small_iter, repeats = (2000, 200), (5000, 2000), (3, 8), 30, 200, 1
    else:
        # fits of 10 and 60 iterations: the difference of two fits' times carries both fits' noise, which 20
        # iterations' difference did not outweigh (one run's three dense MU ratios were 0.85 to 1.92)
        dense_shape, sparse_shape, iters, cd_iter, small_iter, repeats = ((20000, 2000), (100000, 20000), (10, 60),
                                                                          200, 2000, 3)
    results = {"machine": machine(), "quick": args.quick, "load_average_at_start": os.getloadavg()}
    print(json.dumps(results["machine"], indent=1))

    if "small" in cases:
        results["small"] = small_case(small_iter)
        print("small", json.dumps(results["small"]))

    if "dense" in cases:
        X = dense_case(*dense_shape, 20)
        results["dense"] = {"shape": list(X.shape), "rank": 20, "mu": mu_ratio(X, 20, *iters, repeats, float32=True)}
        results["dense"]["float32_far_from_exact"] = float32_far_from_exact(X.shape, 20, iters[1], repeats)
        if not args.mu_only:
            results["dense"]["hals_vs_cd"] = hals_vs_cd(X, 20, cd_iter)
        print("dense", json.dumps(results["dense"]))
        del X

    if "sparse" in cases:
        X = sparse_case(*sparse_shape, 0.005)
        results["sparse"] = {"shape": list(X.shape), "nnz": int(X.nnz), "density": X.nnz / np.prod(X.shape),
                             "rank": 20, "mu": mu_ratio(X, 20, *iters, repeats)}
        if not args.mu_only:
            results["sparse"]["hals_vs_cd"] = hals_vs_cd(X, 20, cd_iter)
        print("sparse", json.dumps(results["sparse"]))

    results["load_average_at_end"] = os.getloadavg()
    partial = cases != {"small", "dense", "sparse"} or args.mu_only
    name = "nmf-quick.json" if args.quick else "nmf-partial.json" if partial else "nmf.json"
    write_results(results, args.output or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", name))


if __name__ == "__main__":
    main()
