"""What a mask costs NMF's local step (issue 20): one block's masked step against the unmasked one, in one run.

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_masked.py    # about half a minute

One 10,000 x 500 block, rank 10, MU Frobenius: ``NMFMethod.local_step`` (W_b's update and the block's statistics)
with a mask in the form the fit would choose (``estimators/masks.py: block_form``) against the same step without,
the two alternated, 15 times each, medians. Cases: dense X with 1% and 10% of its entries missing (the complement
form), and a sparse X (5% stored) with mask="nonzero" (the observed form). Writes
benchmarks/results/masked.json.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import numpy as np
import scipy.sparse as sp

from distfact.estimators.masks import block_form
from distfact.methods.nmf import NMFMethod

ROWS, COLS, RANK, REPEATS = 10_000, 500, 10, 15


class Block:
    """What the step reads of a block besides X_b."""

    sq_norm = total = 0.0


def cases(rng):
    X, W = rng.random((ROWS, COLS)), rng.random((ROWS, RANK))
    rows = np.arange(ROWS)
    for missing in (0.01, 0.1):
        yield f"dense, {missing:.0%} missing", X, block_form((rng.random(X.shape) > missing) * 1.0, rows), W
    S = sp.random(ROWS, COLS, density=0.05, random_state=0, format="csr")
    yield "sparse 5%, mask='nonzero'", S, block_form(sp.csr_matrix((S != 0) * 1.0), rows), W


def compare(method, block, G, name, X, form, P, W) -> dict:
    """``method.local_step`` on the block with its mask (as after a first step: X_b's sums kept) against the same
    step without, alternated ``REPEATS`` times: the row of the results, printed."""
    local = method.local_step(X, {form: P, "W": W}, block, G)[0]
    method.local_step(X, W, block, G)
    masked, plain = [], []
    for _ in range(REPEATS):
        for times, state in ((masked, local), (plain, W)):
            start = time.perf_counter()
            method.local_step(X, state, block, G)
            times.append(time.perf_counter() - start)
    row = {"case": name, "form": form, "mask_entries": int(P.nnz), "masked_ms": statistics.median(masked) * 1e3,
           "unmasked_ms": statistics.median(plain) * 1e3}
    row["ratio"] = row["masked_ms"] / row["unmasked_ms"]
    print(f"{name} ({form}, {P.nnz} entries): masked {row['masked_ms']:.1f} ms, unmasked "
          f"{row['unmasked_ms']:.1f} ms, ratio {row['ratio']:.2f}")
    return row


def write(results: list, name: str) -> None:
    """benchmarks/results/NAME.json with the block's shape, the repeats and the load."""
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", f"{name}.json")
    with open(out, "w") as f:
        json.dump({"rows": ROWS, "cols": COLS, "rank": RANK, "repeats": REPEATS, "load": os.getloadavg(),
                   "results": results}, f, indent=1)


def main() -> None:
    rng = np.random.default_rng(0)
    method = NMFMethod(RANK)
    G = method.with_derived(rng.random((RANK, COLS)), scale=1.0)
    write([compare(method, Block, G, name, X, form, P, W) for name, X, (form, P), W in cases(rng)], "masked")


if __name__ == "__main__":
    main()
