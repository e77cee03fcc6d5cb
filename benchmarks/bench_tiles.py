"""The dense local step's row tiles (``kernels/nmf.py``: ``TILE_BYTES``) against no tiling, in one run.

    python benchmarks/bench_tiles.py [--dtype float32]    # about a minute

NMF MU, rank 20, on 20,000 x 2,000 (``bench_nmf.dense_case``), in-process defaults: seconds per iteration,
(T(25) - T(5)) / 20, three times per setting, the settings alternated twice. Settings: 1, 4, 16 and 64 MiB
tiles, and tiling off (a tile larger than any block: numpy's products on whole blocks, BLAS's own threads).
Prints one line per setting; nothing is written.
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench_nmf import dense_case

OFF = 1 << 40


def seconds_per_iteration(X, repeats: int = 3) -> list[float]:
    import distfact

    def fit(k):
        start = time.perf_counter()
        distfact.NMF(20, solver="mu", init="random", max_iter=k, tol=0, random_state=0).fit(X)
        return time.perf_counter() - start

    fit(2)  # staging and first calls
    return [(fit(25) - fit(5)) / 20 for _ in range(repeats)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="float64")
    args = parser.parse_args()
    from distfact.kernels import nmf

    X = dense_case(20000, 2000, 20).astype(args.dtype)
    settings = [OFF, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
    times = {tile: [] for tile in settings}
    for _ in range(2):
        for tile in settings:
            nmf.TILE_BYTES = tile
            times[tile] += seconds_per_iteration(X)
    for tile in settings:
        name = "no tiling" if tile == OFF else f"{tile >> 20} MiB tiles"
        print(f"{args.dtype} {name}: median {statistics.median(times[tile]):.4f} s/iteration "
              f"(all {[round(t, 4) for t in times[tile]]})")


if __name__ == "__main__":
    main()
