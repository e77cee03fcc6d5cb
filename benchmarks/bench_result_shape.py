"""What one result shape costs (issue 18): the statistics that give every method's ``relative_error``.

    python benchmarks/bench_result_shape.py        # about 20 seconds

WeightedL1NMF's row pass now also gathers W_b^T X_b and W_b^T W_b (``methods/wl1_nmf.py: row_stats``), so that
||X_l - W_l H||_F comes from statistics at the end without another read of X. Timed here on the TDT2-shaped
matrix of ``bench_wl1.py`` (b) (19,528 x 9,394, 99.37% zeros, r = 30), median of 5, against the row sweep of
sCD from a state with 80% zeros in W and H (the regime of a fit's later iterations). Results:
benchmarks/results/result_shape.json.
"""

import time

import numpy as np
import scipy.sparse as sp

from bench_nmf import machine, write_results
from distfact.kernels import l1
from distfact.kernels.products import gram, wt_times_block


def median_seconds(f, n=5):
    f()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main():
    rng = np.random.default_rng(0)
    X = sp.random(19528, 9394, density=0.0063, random_state=1, format="csr",
                  data_rvs=lambda k: rng.integers(1, 5, k).astype(float))
    W, Ht = rng.random((19528, 30)), rng.random((9394, 30))
    one_group = np.zeros(1, dtype=np.int64)
    W_sparse, Ht_sparse = W * (rng.random(W.shape) < 0.2), Ht * (rng.random(Ht.shape) < 0.2)

    def sweep():
        l1.scd_sweep_rows(X.indptr, X.indices, X.data, W_sparse.copy(), Ht_sparse, 1.0, one_group)

    stats = median_seconds(lambda: (wt_times_block(W, X), gram(W)))
    row_sweep = median_seconds(sweep)
    result = {"machine": machine(), "nnz": int(X.nnz), "rank": 30, "row_stats_seconds": stats,
              "row_sweep_seconds": row_sweep, "share_of_row_sweep": stats / row_sweep}
    print(result)
    write_results(result, "benchmarks/results/result_shape.json")


if __name__ == "__main__":
    main()
