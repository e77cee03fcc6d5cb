"""Warm starts in nightly pipelines (issue 21): iterations and fit time of ``warm_start = "previous"`` against
the cold start, night by night, on a real data set that grows.

    python benchmarks/bench_nightly.py          # under a minute (24-26 s, 2026-11-30)
    python benchmarks/bench_nightly.py --corpus-docs 550000   # the nightly cost on 10 million non-zeros

The second form measures issue 21's target instead: what a night costs (ingest + warm fit) when 1% new documents
arrive, against a full re-ingest and a cold fit. A synthetic JSONL corpus (``bench_ingest_memory.py``'s generator:
4 groups, ~60 tokens a document from a Zipf vocabulary, half of them from one of ``--topics`` (10) planted topics;
``--topics 0``: none) of ``--corpus-docs`` documents as two partitions,
``incoming/part-00.jsonl`` (99%) and ``part-01.jsonl`` (1%), and a pipeline with ``source = "incoming/*.jsonl"``
(tf-idf, 20,000 words), NMF rank 10, HALS, ``tol = 1e-4``. Nightly root: night 0 sees part-00 (setup, not
timed), night 1 sees both: it appends part-01 to the root's store and warm-starts from night 0. Full root: one
run that sees both partitions: a new store of both (part-00 ingested, part-01 appended: the same rows and
columns) and a cold fit. Timed: the ingest and fit stages (``metrics.json: stage_seconds``; the warm fit's start,
one solve of the new rows, included), the two alternated ``--repeats`` times (night 1 on a copy of the nightly root
after night 0), medians. Results: benchmarks/results/nightly_corpus.json.

scikit-learn's digits (1,797 x 64, grouped by digit): night 0 holds the first 1,437 rows (80%), each of the next
four nights adds 90 rows (5% of the data) at the end. Each night runs the same pipeline twice into two roots, one
with ``warm_start = "previous"`` (from that root's previous night) and one cold (the estimator's own start),
interleaved; NMF rank 10, HALS and MU, ``tol = 1e-4``, ``max_iter = 2000``. Reported per night and solver: both
fits' iterations, fit seconds (``fit.json``: the fit alone; the warm one includes its start, i.e. reading the
previous factors and one solve of the new rows) and final relative error (the fit's objective history, last
value, relative to the cold start's). Results: benchmarks/results/nightly.json.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np

import distfact
from distfact.datasets import load_digits_grouped
from distfact.pipeline import run_pipeline

FIRST, STEP, NIGHTS, RANK = 1437, 90, 5, 10

SPEC = """
name = "digits-nightly"
[input]
source = "data.npz"
[[fit]]
method = "nmf"
rank = {rank}
solver = "{solver}"
tol = 1e-4
max_iter = 2000
{warm}
[output]
checkpoint_every = 0
"""


def main() -> dict:
    X, groups, _ = load_digits_grouped()
    out = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
           "case": f"digits, first {FIRST} rows then +{STEP} rows a night, NMF rank {RANK}, tol 1e-4", "nights": []}
    with tempfile.TemporaryDirectory() as tmp:
        for solver in ("hals", "mu"):
            for night in range(NIGHTS):
                m = FIRST + STEP * night
                np.savez(os.path.join(tmp, "data.npz"), X=X[:m], groups=groups[:m])
                row = {"solver": solver, "night": night, "rows": m}
                for kind in ("warm", "cold"):
                    spec = os.path.join(tmp, f"{kind}.toml")
                    with open(spec, "w") as f:
                        f.write(SPEC.format(rank=RANK, solver=solver,
                                            warm='warm_start = "previous"' if kind == "warm" else ""))
                    result = run_pipeline(spec, date=f"2026-02-{night + 1:02d}", root=os.path.join(tmp, solver, kind),
                                          stream=io.StringIO())
                    fit_dir = os.path.join(result["run_dir"], "fit", f"nmf-r{RANK}")
                    with open(os.path.join(fit_dir, "fit.json")) as f:
                        facts = json.load(f)
                    model = distfact.load(os.path.join(fit_dir, "model.npz"))
                    row[f"{kind}_iterations"] = facts["n_iter"]
                    row[f"{kind}_seconds"] = round(facts["seconds"], 3)
                    row[f"{kind}_objective"] = float(model.objective_history_[-1])
                row["warm_over_cold_objective"] = row["warm_objective"] / row["cold_objective"]
                row["warm_over_cold_seconds"] = row["warm_seconds"] / row["cold_seconds"]
                print(json.dumps(row))
                out["nights"].append(row)
    for solver in ("hals", "mu"):
        later = [r for r in out["nights"] if r["solver"] == solver and r["night"] > 0]
        out[f"{solver}_median_iterations"] = {k: float(np.median([r[f"{k}_iterations"] for r in later]))
                                              for k in ("warm", "cold")}
        out[f"{solver}_median_seconds_ratio"] = float(np.median([r["warm_over_cold_seconds"] for r in later]))
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "nightly.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    return out


CORPUS_SPEC = SPEC.replace('"digits-nightly"', '"corpus-nightly"').replace(
    'source = "data.npz"', 'source = "incoming/*.jsonl"\nmax_features = 20000')


def corpus_case(docs: int, repeats: int, topics: int) -> dict:
    """The nightly cost on a corpus of ``docs`` documents of which the last 1% arrive on night 1 (module docstring):
    night 1 and the full run alternated ``repeats`` times (night 1 on a copy of the root after night 0), medians."""
    import shutil

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_ingest_memory import vocabulary, write_corpus

    def stages(result) -> dict:
        with open(os.path.join(result["run_dir"], "metrics.json")) as f:
            metrics = json.load(f)
        with open(os.path.join(result["run_dir"], "fit", f"nmf-r{RANK}", "fit.json")) as f:
            facts = json.load(f)
        return {"ingest_seconds": round(metrics["stage_seconds"]["ingest"], 2),
                "fit_seconds": round(metrics["stage_seconds"]["fit"], 2), "iterations": facts["n_iter"],
                "nnz": metrics["input"]["nnz"], "partitions": metrics["input"]["partitions"]}

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "incoming").mkdir()
        words, n_new = vocabulary(60_000), max(docs // 100, 1)
        write_corpus(tmp / "incoming" / "part-00.jsonl", docs - n_new, words, 60, seed=0, topics=topics)
        for kind in ("warm", "cold"):
            (tmp / f"{kind}.toml").write_text(CORPUS_SPEC.format(
                rank=RANK, solver="hals", warm='warm_start = "previous"' if kind == "warm" else ""))
        night0 = stages(run_pipeline(tmp / "warm.toml", date="2026-03-01", root=str(tmp / "night0"),
                                     stream=io.StringIO()))
        write_corpus(tmp / "incoming" / "part-01.jsonl", n_new, words, 60, seed=1, topics=topics)
        runs = {"nightly": [], "full": []}
        for _ in range(repeats):
            shutil.copytree(tmp / "night0", tmp / "nightly")
            runs["nightly"].append(stages(run_pipeline(tmp / "warm.toml", date="2026-03-02", root=str(tmp / "nightly"),
                                                       stream=io.StringIO())))
            runs["full"].append(stages(run_pipeline(tmp / "cold.toml", date="2026-03-02", root=str(tmp / "full"),
                                                    stream=io.StringIO())))
            shutil.rmtree(tmp / "nightly")
            shutil.rmtree(tmp / "full")
    cost = {name: float(np.median([r["ingest_seconds"] + r["fit_seconds"] for r in done]))
            for name, done in runs.items()}
    out = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                       "platform": platform.platform()},
           "case": f"{docs} documents ({topics} planted topics; tf-idf, 20,000 words), +{n_new} (1%) on night 1, "
                   f"NMF rank {RANK} HALS tol 1e-4",
           "night0": night0, **runs, "median_seconds": cost,
           "ratio_nightly_to_full": cost["nightly"] / cost["full"]}
    print(json.dumps(out, indent=1))
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                        f"nightly_corpus{'_topics' if topics else ''}.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus-docs", type=int, help="measure the nightly cost on a corpus of this many documents")
    parser.add_argument("--repeats", type=int, default=3, help="(with --corpus-docs) night 1 and the full run, each")
    parser.add_argument("--topics", type=int, default=10,
                        help="(with --corpus-docs) topics planted in the corpus (0: Zipf tokens without structure)")
    args = parser.parse_args()
    corpus_case(args.corpus_docs, args.repeats, args.topics) if args.corpus_docs else main()
