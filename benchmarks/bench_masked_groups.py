"""What a mask costs Stratified-NMF's and Fairer-NMF's local steps (issue 20), in one run.

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_masked_groups.py    # about a minute

One 10,000 x 500 block, rank 10: each method's ``local_step`` (W_b's update and the block's statistics; for
Stratified-NMF with a mask these include W^T M and the column Grams its objective needs) with a mask in the form the
fit would choose (``estimators/masks.py: block_form``) against the same step without, alternated, 15 times each,
medians. Cases as ``bench_masked.py``'s: dense X with 1% and 10% missing (the complement form; here X is zeroed at
its missing entries, as ``fit`` leaves X in memory, so no step copies X_b), a sparse X (5% stored) with
mask="nonzero" (the observed form). Writes benchmarks/results/masked_groups.json.
"""

from __future__ import annotations

import numpy as np

from bench_masked import COLS, RANK, cases, compare, write
from distfact.kernels.masked import COMPLEMENT
from distfact.methods.fairer_nmf import FairerMU
from distfact.methods.stratified_nmf import StratifiedMU


class Block:
    """What the steps read of a block besides X_b: its group (stratum) 0."""

    group = 0


def global_states(rng):
    """(name, method, global state) of each method, as after a first global step (one stratum / group)."""
    H, v = rng.random((RANK, COLS)), rng.random((1, COLS))
    stratified = StratifiedMU(RANK)
    yield "stratified-nmf", stratified, {**stratified.with_derived(H, v), "Mt1": np.ones((1, COLS))}
    yield "fairer-nmf (MU)", FairerMU(RANK, E=(0.0,), tol=0.0), {"H": H, "HHt": H @ H.T, "scale": 1.0, "c": np.ones(1)}


def main() -> None:
    rng = np.random.default_rng(0)
    results = []
    for method_name, method, G in list(global_states(rng)):
        for name, X, (form, P), W in cases(np.random.default_rng(0)):
            if form == COMPLEMENT:  # X zeroed at its missing entries, as fit leaves X in memory
                X = X.copy()
                X[P.nonzero()] = 0.0
            print(method_name, end=": ")
            results.append({"method": method_name, **compare(method, Block, G, name, X, form, P, W)})
    write(results, "masked_groups")


if __name__ == "__main__":
    main()
