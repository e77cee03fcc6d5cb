"""What a masked block's kept constants save its local step (issue 19), in one process.

    python benchmarks/bench_kept_constants.py        # about a minute

From its first step on, a masked block's local state keeps X_b's values at its mask's entries and where X_b reads as
0 (``kernels/masked.py: KEPT_VALUES``, ``BlockTerms.constants``; SSNMF's ``Complement.constants``), which every step
gathered again before. One 2,000 x 300 dense block, rank 8, BLAS on one thread, each method's ``local_step`` from a
local state after its first step (the constants kept) against the same state without them (gathered again),
alternated ``--repeats`` times each; medians of the thread's CPU time. Masks: a fold of cross-validation (10% held
out: the complement form) and 10% observed (the observed form), in the form a fit gives each block
(``estimators/masks.py: block_masks``). NMF's MU step on a dense complement block is the fused tiled kernel, which
reads X_b's values in its tiles and keeps none; SSNMF's observed form keeps none either (its kernels gather them).
Results: benchmarks/results/kept_constants.json.
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

ROWS, COLS, RANK, CLASSES = 2_000, 300, 8, 4


class Block:
    """What the steps read of a block besides X_b: one block, of group (stratum) 0."""

    group, index, row_start, row_stop, n_rows = 0, 0, 0, ROWS, ROWS


def methods():
    from distfact.methods.nmf import NMFMethod
    from distfact.methods.ssnmf import SSNMFMethod
    from distfact.methods.stratified_nmf import StratifiedMU

    return {"NMF HALS": NMFMethod(RANK, solver="hals"), "NMF KL": NMFMethod(RANK, beta_loss="kullback-leibler"),
            "Stratified-NMF": StratifiedMU(RANK), "SSNMF FF": SSNMFMethod(RANK, "FF", lam=1.0)}


def start(name, method, X, y, inputs, rng):
    """(global state, local state) as before the block's first step."""
    from distfact.store.coerce import as_grouped

    W = rng.random((ROWS, RANK))
    if name == "SSNMF FF":
        return method.initial_global(X, rng, n_targets=CLASSES), {**inputs, "W": W, "Y": np.eye(CLASSES)[y]}
    data = as_grouped(X, None, block_rows=ROWS)
    G = method.initial_global(data, rng)
    if name == "Stratified-NMF":  # its global state after pass 0 (v, H v)
        G = method.global_step(G, [method.block_stats(X, {**inputs, "W": W}, Block(), G)], data)
    return G, {**inputs, "W": W}


def main():
    from threadpoolctl import threadpool_limits

    from distfact.estimators.masks import block_masks, resolve_mask
    from distfact.kernels.masked import KEPT_VALUES
    from distfact.kernels.memory import numpy_allocates_aligned
    from distfact.store.coerce import as_grouped

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    X, y = rng.random((ROWS, COLS)), rng.integers(0, CLASSES, ROWS)
    masks = {"10% held out": (rng.random(X.shape) >= 0.1) * 1.0, "10% observed": (rng.random(X.shape) < 0.1) * 1.0}
    results = []
    with threadpool_limits(1), numpy_allocates_aligned():
        for mask_name, M in masks.items():
            blocks, _ = block_masks(as_grouped(X, None, block_rows=ROWS), resolve_mask(X, M)[1])
            for name, method in methods().items():
                G, local = start(name, method, X, y, blocks[0], rng)
                kept, _ = method.local_step(X, local, Block(), G)
                if KEPT_VALUES[0] not in kept:
                    print(f"{name:15s} {mask_name:13s} keeps none")
                    continue
                gathered = {key: value for key, value in kept.items() if key not in KEPT_VALUES}
                seconds = {"kept": [], "gathered": []}
                for repeat in range(args.repeats):  # the two states' order alternates
                    for state in ("kept", "gathered")[::1 if repeat % 2 == 0 else -1]:
                        began = time.thread_time()
                        method.local_step(X, kept if state == "kept" else gathered, Block(), G)
                        seconds[state].append(time.thread_time() - began)
                row = {"method": name, "mask": mask_name, "form": next(iter(blocks[0])),
                       **{state: statistics.median(times) for state, times in seconds.items()}}
                row["ratio"] = row["kept"] / row["gathered"]
                results.append(row)
                print(f"{name:15s} {mask_name:13s} kept {row['kept'] * 1e3:6.2f} ms  gathered "
                      f"{row['gathered'] * 1e3:6.2f} ms  ratio {row['ratio']:.3f}", flush=True)
    write_results({"machine": machine(), "shape": [ROWS, COLS], "rank": RANK, "repeats": args.repeats,
                   "load": os.getloadavg(), "results": results},
                  os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "kept_constants.json"))


if __name__ == "__main__":
    main()
