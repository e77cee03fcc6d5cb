"""``distfact demo``: the demo pipeline (``distfact/pipeline/demo.toml``) on a real data set shipped with scikit-learn.

The data: scikit-learn's bundled copy of the UCI ML hand-written digits (1,797 images of 8 x 8 pixels, grey
levels 0-16; BSD-licensed with scikit-learn). Groups are the digits 0-9: the per-group table shows which digits
a shared NMF dictionary serves worse.
"""

from __future__ import annotations

import os

from .pipeline import run_pipeline
from .pipeline.run import read_group_metrics

DEMO_SPEC = os.path.join(os.path.dirname(__file__), "pipeline", "demo.toml")


def run_demo(output="distfact-demo", scheduler=None, tls_dir=None, echo=print) -> dict:
    """Run the demo pipeline into ``output/demo/<today>/`` and print the per-digit errors by rank."""
    result = run_pipeline(DEMO_SPEC, root=output, scheduler=scheduler, tls_dir=tls_dir)
    table = read_group_metrics(result["run_dir"])
    errors = table[table["metric"] == "relative_error"].pivot(index="group", columns="rank", values="value")
    echo("relative_error per digit (columns: rank)")
    echo(errors.to_string(float_format=lambda v: f"{v:.4f}"))
    echo(f"report: {os.path.join(result['run_dir'], 'report', 'report.html')}"
         + ("" if result["ran"] else " (up to date: nothing was rerun)"))
    return result
