"""What an append costs against a full re-ingest: a night's 1% of new documents added to a corpus store.

Writes a synthetic JSONL corpus (``bench_ingest_memory.py``'s generator: 4 groups, ~60 tokens a document, a Zipf
vocabulary) of ``--docs`` documents as two partitions, ``old.jsonl`` (99%) and ``new.jsonl`` (1%); ingests
``old.jsonl`` (count vectoriser, 20,000 words); then times, interleaved ``--repeats`` times, (a) appending
``new.jsonl`` to a copy of that store (``append_source``, as ``distfact ingest --append`` does) and (b) ingesting
both partitions afresh with the same vocabulary (``from_corpus(..., vocabulary=...)``). Prints the medians and
their ratio, and writes ``benchmarks/results/append.json``.

Not a test, not run in CI::

    python benchmarks/bench_append.py                # 200,000 documents (a few minutes)
    python benchmarks/bench_append.py --docs 20000   # quicker
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_ingest_memory import vocabulary, write_corpus  # noqa: E402

from distfact.store import from_corpus  # noqa: E402
from distfact.store.sources import append_source  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=200_000, help="documents in all (1%% of them appended)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-append-"))
    try:
        words = vocabulary(60_000)
        n_new = max(args.docs // 100, 1)
        write_corpus(work / "old.jsonl", args.docs - n_new, words, 60, seed=0)
        write_corpus(work / "new.jsonl", n_new, words, 60, seed=1)
        options = {"vectorizer": "count", "max_features": 20_000, "min_df": 2}
        base = from_corpus(work / "old.jsonl", work / "base", **options)
        vocab = list(base.feature_names)
        times = {"append": [], "full_ingest": []}
        for repeat in range(args.repeats):
            shutil.copytree(work / "base", work / "appended")
            started = time.perf_counter()
            appended, outcome = append_source(str(work / "new.jsonl"), str(work / "appended"))
            times["append"].append(time.perf_counter() - started)
            assert outcome["rows"] == n_new
            started = time.perf_counter()
            fresh = from_corpus([work / "old.jsonl", work / "new.jsonl"], work / "fresh", vocabulary=vocab, **options)
            times["full_ingest"].append(time.perf_counter() - started)
            assert fresh.shape == appended.shape and fresh.nnz == appended.nnz
            shutil.rmtree(work / "appended")
            shutil.rmtree(work / "fresh")
        medians = {name: statistics.median(values) for name, values in times.items()}
        result = {"documents": args.docs, "appended": n_new, "nnz": int(appended.nnz), "seconds": times,
                  "median_seconds": medians, "ratio_append_to_full": medians["append"] / medians["full_ingest"],
                  "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                              "python": platform.python_version()}}
        print(f"{args.docs} documents ({appended.nnz} non-zeros), {n_new} appended: append {medians['append']:.2f} s, "
              f"full re-ingest {medians['full_ingest']:.2f} s, ratio {result['ratio_append_to_full']:.3f}")
        out = Path(__file__).parent / "results" / "append.json"
        out.write_text(json.dumps(result, indent=2) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
