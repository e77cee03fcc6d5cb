"""``distfact demo``: ingest a real data set that ships with scikit-learn, factor it, report per group.

The data: scikit-learn's bundled copy of the UCI ML hand-written digits (1,797 images of
8 x 8 pixels, grey levels 0-16; BSD-licensed with scikit-learn). Groups are the digits
0-9: the per-group table shows which digits a shared NMF dictionary serves worse.
"""

from __future__ import annotations

import os

import numpy as np

from .datasets import load_digits_grouped
from .estimators import NMF
from .metrics import format_table, group_table
from .report import write_report
from .store import from_arrays


def run_demo(output="distfact-demo", n_components=10, max_iter=1000, random_state=0, client=None,
             callback=None, echo=print) -> dict:
    """Ingest the digits to ``output/digits.zarr``, fit NMF (HALS), print the per-group table,
    write the report to ``output/report/``. Returns the report's paths."""
    X, groups, names = load_digits_grouped()
    store_path = os.path.join(output, "digits.zarr")
    data = from_arrays(X, groups, store_path, feature_names=names, block_rows=256, overwrite=True)
    echo(f"ingested {data.shape[0]} x {data.shape[1]} digits into {store_path} "
         f"({data.n_groups} groups, {data.n_blocks} blocks)")
    model = NMF(n_components, solver="hals", init="nndsvda", max_iter=max_iter, tol=1e-4,
                random_state=random_state, callback=callback)
    model.fit(data, client=client)
    echo(f"NMF rank {n_components}: {model.n_iter_} iterations, {model.n_passes_} passes over X, "
         f"relative error {model.reconstruction_err_ / np.sqrt(data.group_sq_norms.sum()):.4f}, "
         f"scheduler {model.scheduler_['scheduler']}")
    echo(format_table(group_table(model, data)))
    paths = write_report(os.path.join(output, "report"), model, data,
                         title="distfact demo: NMF of hand-written digits, per digit", image_shape=(8, 8),
                         facts={"data": "scikit-learn load_digits (UCI ML hand-written digits)"})
    echo(f"report: {paths['report.html']}")
    return paths
