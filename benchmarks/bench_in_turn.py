"""Small blocks held in memory: in turn or in threads (issue 19: small fits at numpy's cost).

    python benchmarks/bench_in_turn.py      # about 3 minutes on the standard 2-core machine
    ... --kib 125,250,500,1000              # the blocks' sizes (KiB); --repeats 3: each figure a median of these

The in-process executor runs the blocks of a held store (a store read once, at most ``RESIDENT_STORE_BYTES``) and
of CSR data in memory in parallel threads, unless each block is at most ``IN_TURN_BLOCK_BYTES``: then in turn.
For each size, a store on disk of 8 dense blocks of that size (200 columns; 4 groups of planted rank 3 plus 5%
noise) and two workloads, each timed with the blocks in threads (``IN_TURN_BLOCK_BYTES`` set to 0 for the fit)
and in turn (set above the blocks' size), interleaved, in this process, after a warm-up of each:

  fit  ``NMF(5, tol=0).fit(path)``, 32,000 / rows-a-block iterations (about the same arithmetic at every size)
  cv   ``select_rank(NMF(1, tol=0), path, ranks=[1, 2, 3])``: 5 folds, 15 masked models in one sweep, a tenth
       of the fit's iterations

and, on real data, the UCI Heart Disease store by sex (297 x 12, one block a group, as ``distfact ingest`` writes
it): ``FairerNMF(5)`` with its defaults and ``NMF(5, max_iter=1000, tol=0)``, each fitted from the store's path
as the CLI and the pipelines fit it; and CSR given in memory (4,000 x 1,000 at 2% from a rank-3 matrix, 4 groups):
``csr-fit``, ``NMF(5, max_iter=200, tol=0)``, and ``csr-cv``, ``select_rank`` as ``cv`` with 20 iterations.

Both modes give the same results (checked: the fit's components bitwise, the table's held-out errors).
Results: benchmarks/results/in_turn.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np
import scipy.sparse as sp

from bench_nmf import machine, write_results

N_COLUMNS, N_BLOCKS = 200, 8


def planted(rows: int, seed: int = 0):
    """Rank-3 non-negative data of 4 groups plus 5% noise."""
    rng = np.random.default_rng(seed)
    X = rng.random((rows, 3)) @ rng.random((3, N_COLUMNS))
    X += 0.05 * X.mean() * rng.random(X.shape)
    return X, four_groups(rows)


def four_groups(rows: int) -> np.ndarray:
    """Labels of 4 groups of ``rows`` / 4 consecutive rows each."""
    return np.repeat([f"g{i}" for i in range(4)], rows // 4)


def csr_planted(rows: int, columns: int, density: float, seed: int = 0):
    """CSR data of 4 groups: a random pattern at ``density`` holding a rank-3 non-negative matrix's values."""
    rng = np.random.default_rng(seed)
    pattern = sp.random(rows, columns, density=density, format="csr", random_state=seed)
    W, H = rng.random((rows, 3)), rng.random((3, columns))
    coo = pattern.tocoo()
    values = np.einsum("ij,ij->i", W[coo.row], H[:, coo.col].T)
    return sp.csr_matrix((values, (coo.row, coo.col)), shape=(rows, columns)), four_groups(rows)


def timed(run, executor_module, threshold: int) -> tuple[float, object]:
    """Seconds of one call of ``run`` with ``IN_TURN_BLOCK_BYTES`` = ``threshold``, and its result."""
    saved = executor_module.IN_TURN_BLOCK_BYTES
    executor_module.IN_TURN_BLOCK_BYTES = threshold
    try:
        start = time.perf_counter()
        result = run()
        return time.perf_counter() - start, result
    finally:
        executor_module.IN_TURN_BLOCK_BYTES = saved


def case(data, block_kib: float, iterations: int, workload: str, repeats: int) -> dict:
    """``data``: a store's path, or (X, groups) in memory."""
    import distfact
    from distfact.engine.executor import inprocess

    X, groups = (data, None) if isinstance(data, str) else data
    if workload == "heart-fairer":
        def run():
            return distfact.FairerNMF(5, random_state=0).fit(X).components_  # its defaults' iterations
    elif workload == "heart-nmf":
        def run():
            return distfact.NMF(5, max_iter=1000, tol=0, random_state=0).fit(X).components_
    elif workload.endswith("fit"):
        def run():
            return distfact.NMF(5, max_iter=iterations, tol=0, random_state=0).fit(X, groups=groups).components_
    else:
        def run():
            return distfact.select_rank(distfact.NMF(1, max_iter=max(iterations // 10, 5), tol=0, random_state=0),
                                        X, groups=groups, ranks=[1, 2, 3],
                                        random_state=0).table["heldout_error"].to_numpy()
    modes = {"threads": 0, "in_turn": 1 << 40}
    seconds = {mode: [] for mode in modes}
    results = {}
    for mode, threshold in modes.items():  # warm-up
        timed(run, inprocess, threshold)
    for _ in range(repeats):
        for mode, threshold in modes.items():
            spent, results[mode] = timed(run, inprocess, threshold)
            seconds[mode].append(spent)
    median = {mode: statistics.median(values) for mode, values in seconds.items()}
    out = {"block_kib": round(float(block_kib), 1), "iterations": None if workload == "heart-fairer" else iterations,
           "threads_seconds": round(median["threads"], 4), "in_turn_seconds": round(median["in_turn"], 4),
           "in_turn_over_threads": round(median["in_turn"] / median["threads"], 3),
           "same_results": bool(np.array_equal(results["threads"], results["in_turn"])),
           "all_seconds": seconds}
    print(workload, {key: value for key, value in out.items() if key != "all_seconds"}, flush=True)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kib", default="125,250,500,1000", help="the blocks' sizes in KiB")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import distfact
    from distfact.engine.executor import inprocess

    results = {"machine": machine(), "in_turn_block_bytes": inprocess.IN_TURN_BLOCK_BYTES, "cases": []}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        from distfact.datasets import load_heart_disease

        X, groups = load_heart_disease()[:2]
        path = os.path.join(tmp, "heart.zarr")
        distfact.from_arrays(X, groups, path=path)
        largest_group = max(np.unique(groups, return_counts=True)[1])
        for workload in ("heart-fairer", "heart-nmf"):
            results["cases"].append({"workload": workload, **case(path, largest_group * X.shape[1] * 8 / 1024, 1000,
                                                                   workload, args.repeats)})
        for kib in (int(k) for k in args.kib.split(",")):
            block_rows = max(4, kib * 1024 // (N_COLUMNS * 8)) // 4 * 4
            path = os.path.join(tmp, f"x{kib}.zarr")
            X, groups = planted(block_rows * N_BLOCKS)
            distfact.from_arrays(X, groups, path=path, block_rows=block_rows)
            for workload in ("fit", "cv"):
                results["cases"].append({"workload": workload, **case(path, block_rows * N_COLUMNS * 8 / 1024,
                                                                      32_000 // block_rows, workload, args.repeats)})
        # CSR given in memory: 4,000 x 1,000 at 2% (4 groups, cut into a block or more each)
        X, groups = csr_planted(4_000, 1_000, 0.02)
        blocks = distfact.from_arrays(X, groups)._blocks
        block_kib = max(inprocess._block_bytes(X_b) for X_b in blocks) / 1024
        for workload in ("csr-fit", "csr-cv"):
            results["cases"].append({"workload": workload, **case((X, groups), block_kib, 200, workload,
                                                                  args.repeats)})
    write_results(results, os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "in_turn.json"))


if __name__ == "__main__":
    main()
