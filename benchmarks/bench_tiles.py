"""The dense local step's row tiles (``kernels/nmf.py``: ``TILE_BYTES``) against no tiling, in one run; with
``--sparse``, the CSR step's bands of columns (``CSR_BAND_BYTES``) instead.

    python benchmarks/bench_tiles.py [--dtype float32]    # about a minute
    python benchmarks/bench_tiles.py --kib 256,512,768,1024            # other tile sizes
    python benchmarks/bench_tiles.py --sparse --kib 128,256,512,1024,2048   # band sizes, about 3 minutes

NMF MU, rank 20, on 20,000 x 2,000 (``bench_nmf.dense_case``), in-process defaults: seconds per iteration,
(T(25) - T(5)) / 20, three times per setting, the settings alternated twice. Settings: 1, 4, 16 and 64 MiB
tiles, and tiling off (a tile larger than any block: numpy's products on whole blocks, BLAS's own threads), or
the sizes given (``--kib``). ``--sparse``: the same on ``bench_nmf.sparse_case`` (100,000 x 20,000 at 0.5%), each
size the bytes of H^T's and (W^T X)^T's rows a band holds. Prints one line per setting; nothing is written.
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench_nmf import dense_case, sparse_case

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
    parser.add_argument("--kib", help="comma-separated sizes in KiB (default: tiles of 1 to 64 MiB and none)")
    parser.add_argument("--sparse", action="store_true", help="the CSR step's bands on the sparse case")
    args = parser.parse_args()
    from distfact.kernels import nmf

    if args.sparse:
        X, constant, what = sparse_case(100000, 20000, 0.005).astype(args.dtype), "CSR_BAND_BYTES", "bands"
    else:
        X, constant, what = dense_case(20000, 2000, 20).astype(args.dtype), "TILE_BYTES", "tiles"
    settings = ([int(kib) << 10 for kib in args.kib.split(",")] if args.kib
                else [OFF, 1 << 20, 4 << 20, 16 << 20, 64 << 20])
    times = {size: [] for size in settings}
    for _ in range(2):
        for size in settings:
            setattr(nmf, constant, size)
            times[size] += seconds_per_iteration(X)
    for size in settings:
        name = f"no {what}" if size == OFF else f"{size >> 10} KiB {what}"
        print(f"{args.dtype} {name}: median {statistics.median(times[size]):.4f} s/iteration "
              f"(all {[round(t, 4) for t in times[size]]})")


if __name__ == "__main__":
    main()
