"""Weighted L1-NMF with a mask (issue 20): what the mask costs per sCD iteration, in one run on this machine.

    python benchmarks/bench_wl1_masks.py            # about 2 minutes
    python benchmarks/bench_wl1_masks.py --quick    # small sizes, to check the script

``bench_wl1.py`` (b)'s TDT2-shaped matrix (19,528 x 9,394, 1.16 M non-zeros, word counts), r = 30,
``WeightedL1NMF`` in-process on one thread (the machine is shared: one thread is the steadier measure): seconds of the first sCD iteration from the
same dense uniform random factors (every scalar subproblem has all its terms; ``bench_wl1.py`` explains why
the first), for

- no mask;
- ``mask="nan"`` with k missing entries at uniformly random positions (NaN stored in the sparse X), k = 0.25,
  0.5 and 1 times nnz: the complement form (few masked), whose cost should grow by O(r k) on top of the
  unmasked iteration;
- ``mask="nonzero"``: the observed form with nnz observed entries (the zeros' term vanishes).

The settings alternate over five rounds; the median per setting. Target (issue 20): O(masked entries x r)
per iteration on top of the unmasked update when few entries are masked, i.e. the extra time linear in k.
Results: benchmarks/results/wl1_masks.json (``--quick``: wl1_masks-quick.json).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import scipy.sparse as sp

import distfact
from bench_nmf import machine, write_results
from bench_wl1 import tdt2_like

SHARES = (0.25, 0.5, 1.0)


def with_nan(X, share, seed):
    """X (CSR) with ``share * nnz`` entries at random positions stored as NaN, and their number."""
    rng = np.random.default_rng(seed)
    m, n = X.shape
    flat = np.unique(rng.integers(0, m * n, size=int(share * X.nnz)))
    holes = sp.csr_matrix((np.ones(flat.size), (flat // n, flat % n)), shape=X.shape)
    kept = (X - X.multiply(holes)).tocoo()  # X's values off the holes
    rows = np.concatenate([kept.row, flat // n])
    cols = np.concatenate([kept.col, flat % n])
    values = np.concatenate([kept.data, np.full(flat.size, np.nan)])
    return sp.csr_matrix((values, (rows, cols)), shape=X.shape), flat.size


def first_iteration_seconds(X, mask, W0, H0) -> tuple[float, float]:
    """Seconds of the first sCD iteration and of the whole fit (one iteration, its preparation included)."""
    seconds = []
    model = distfact.WeightedL1NMF(W0.shape[1], lam=1.0, init="custom", max_iter=1, tol=0, n_threads=1,
                                   callback=lambda info: seconds.append(info.seconds))
    start = time.perf_counter()
    model.fit(X, mask=mask, W=W0, H=H0)
    return seconds[0], time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    m, n, zeros, r = (2000, 1000, 0.9937, 30) if args.quick else (19528, 9394, 0.9937, 30)
    X = tdt2_like(m, n, zeros)
    rng = np.random.default_rng(0)
    W0, H0 = rng.random((m, r)), rng.random((r, n))
    settings = {"none": (X, None, 0)}
    for share in SHARES:
        X_nan, k = with_nan(X, share, seed=int(share * 100))
        settings[f"nan x{share}"] = (X_nan, "nan", k)
    settings["nonzero"] = (X, "nonzero", X.nnz)
    first_iteration_seconds(*settings["nan x0.25"][:2], W0, H0)  # compile and warm up
    rounds = []
    for _ in range(5):
        rounds.append({name: first_iteration_seconds(X_s, mask, W0, H0) for name, (X_s, mask, _) in settings.items()})
    results = {"machine": machine(), "shape": [m, n], "nnz": int(X.nnz), "r": r, "settings": {}}
    base = float(np.median([run["none"][0] for run in rounds]))
    for name, (X_s, _, k) in settings.items():
        iteration = float(np.median([run[name][0] for run in rounds]))
        fit = float(np.median([run[name][1] for run in rounds]))
        extra = iteration - base
        results["settings"][name] = {
            "mask_entries": int(k), "nnz": int(X_s.nnz), "first_iteration_s": iteration, "fit_s": fit,
            "ratio_to_unmasked": iteration / base,
            "extra_ns_per_mask_entry_and_rank": 1e9 * extra / (k * r) if k else None,
            "rounds_s": [run[name][0] for run in rounds]}
        print(f"{name:>10}: {k:>9} mask entries, first iteration {iteration:.3f} s ({iteration / base:.2f}x the "
              f"unmasked), fit {fit:.3f} s" + (f", extra {1e9 * extra / (k * r):.1f} ns per entry and rank" if k
                                               else ""))
    write_results(results, f"benchmarks/results/wl1_masks{'-quick' if args.quick else ''}.json")


if __name__ == "__main__":
    main()
