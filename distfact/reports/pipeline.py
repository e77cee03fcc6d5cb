"""The pipeline's report: one self-contained HTML page (PNGs embedded), the PNGs, and CSV/JSON tables.

Sections: run facts (data, groups, scheduler, workers, seconds per stage, passes over X), the rank selection of
each fit with ``ranks = "auto"`` (``selection.py``), the look back (``trends.py``: alerts, per-group trends,
component ids and drift), then the sections every report of fits has (``fits.py``: the fits, per-group metrics
across ranks, objective curves, top features, each method's declared figures).
"""

from __future__ import annotations

import html
import json
import os

import pandas as pd

from .fits import fits_table, method_sections
from .page import html_table, write_page
from .selection import read_selection, selection_section
from .trends import trend_sections


def write_pipeline_report(out_dir: str, context: dict, fits: list[dict], table: pd.DataFrame) -> dict:
    """The report of the run in ``context`` into ``out_dir``: ``fits`` its committed fits (``run.py: load_fits``),
    ``table`` the evaluate stage's per-group metrics (``run.py: read_group_metrics``)."""
    spec, run_dir = context["spec"], context["run_dir"]
    with open(os.path.join(run_dir, "ingest", "input.json")) as f:
        data = json.load(f)
    shape = spec.report.get("image_shape")
    if shape is not None and shape[0] * shape[1] != data["shape"][1]:
        raise ValueError(f"[report] image_shape {shape[0]}x{shape[1]} has {shape[0] * shape[1]} pixels, the data "
                         f"have {data['shape'][1]} features")
    stage_seconds = {}
    for stage in ("ingest", "fit", "evaluate"):
        with open(os.path.join(run_dir, stage, "COMMITTED")) as f:
            marker = json.load(f)
        stage_seconds[stage] = round(marker["seconds"], 3)
        if stage == "fit":
            where = {"scheduler": marker.get("scheduler"), "workers": marker.get("workers")}
    facts = [["pipeline", spec.name], ["date", context["date"]], ["input", f"{spec.input['kind']}: {spec.input['value']}"],
             ["data", f"{data['shape'][0]} x {data['shape'][1]} ({data['layout']}, {data['nnz']} non-zeros)"],
             ["groups", ", ".join(f"{g}: {n}" for g, n in data["groups"].items())],
             ["scheduler", where["scheduler"] if not where["workers"] else f"{where['scheduler']} ({where['workers']} "
                           "workers)"],
             *([f"seconds: {s}", v] for s, v in stage_seconds.items())]
    body = ["<h2>Run</h2>" + html_table(["fact", "value"], facts), "<h2>Fits</h2>" + fits_table(fits)]
    images = []
    for fit in (f for f in fits if f["fit"].select is not None):  # ranks = "auto"
        section, figures = selection_section(fit["name"], *read_selection(os.path.join(run_dir, "fit", fit["name"])),
                                             out_dir)
        body.append(("<h2>Rank selection</h2>" if not images else "") + section)
        images += figures
    looking_back, trend_images = trend_sections(run_dir, spec.nightly["alerts"]["metric"], out_dir)
    sections, method_images = method_sections(fits, table, spec.metrics, spec.report["top"], out_dir, shape)
    body += looking_back + sections
    images += trend_images + method_images
    assert len({name for name, _ in images}) == len(images), "report images need distinct names"
    title = spec.report.get("title") or f"{spec.name}: {context['date']}"
    if spec.description:
        body.insert(0, f"<p>{html.escape(spec.description)}</p>")
    return write_page({"html": os.path.join(out_dir, "report.html")}, out_dir, title, "".join(body), images)
