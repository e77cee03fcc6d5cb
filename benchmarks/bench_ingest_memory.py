"""Peak memory of streaming corpus ingest: does it stay flat as the corpus grows?

Generates synthetic JSONL corpora (4 groups, ~60 tokens per document, a Zipf-distributed
vocabulary of real-looking words) of 20,000 and 200,000 documents, then runs
``distfact.from_corpus(..., vectorizer="tfidf")`` on each in a fresh subprocess and
reads that process's peak resident memory (``VmHWM`` from ``/proc/self/status``, with
``ru_maxrss`` as a fallback). Prints a table and the ratio peak(200k) / peak(20k)
(target: <= 1.5) and writes ``benchmarks/results/ingest_memory.json``.

Two numbers per run: the whole process's peak, and the peak above the memory held right
after ``import distfact`` (which alone is ~240 MiB once the engine imports numba, dask
and scikit-learn). Memory of the ingest is bounded by about ``groups x block size`` plus
one batch and the document-frequency table, not by the corpus: at the default 128 MiB
blocks a corpus whose matrix is smaller than that is buffered whole, so the benchmark
also measures 1 MiB blocks, where blocks are flushed during the pass.

Not a test, not run in CI::

    python benchmarks/bench_ingest_memory.py            # full run (a few minutes)
    python benchmarks/bench_ingest_memory.py --quick    # tiny run (seconds)
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
GROUPS = ["news", "forum", "papers", "reviews"]
GROUP_P = [0.4, 0.3, 0.2, 0.1]

CHILD = r"""
import json, resource, sys, time
def hwm_kb():
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB on Linux
import distfact
baseline = hwm_kb()
src, dest, block_bytes, batch_docs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
t = time.perf_counter()
G = distfact.from_corpus(src, dest, vectorizer="tfidf", block_bytes=block_bytes, batch_docs=batch_docs)
seconds = time.perf_counter() - t
print(json.dumps({"peak_kb": hwm_kb(), "baseline_kb": baseline,
                  "ru_maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "seconds": seconds, "shape": list(G.shape), "nnz": G.nnz, "n_blocks": G.n_blocks,
                  "group_sizes": G.group_sizes.tolist()}))
"""


def vocabulary(n_words: int, seed: int = 0) -> list[str]:
    """Real-looking words: /usr/share/dict/words if present, else English stop words + syllable words."""
    rng = np.random.default_rng(seed)
    dict_path = Path("/usr/share/dict/words")
    if dict_path.exists():
        words = sorted({w.strip().lower() for w in dict_path.read_text(errors="ignore").split()
                        if w.strip().isalpha() and len(w.strip()) > 1})
        rng.shuffle(words)
        return words[:n_words]
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    stop = sorted(ENGLISH_STOP_WORDS)
    onsets = ["b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z",
              "br", "cl", "dr", "fl", "gr", "pl", "pr", "st", "tr", "sh", "ch", "th"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ea", "io", "ou"]
    codas = ["", "", "", "n", "r", "s", "l", "t", "m", "ck", "nd", "st"]
    made: set[str] = set(stop)
    words = []
    while len(words) < n_words - len(stop):
        n_syl = int(rng.choice([1, 2, 2, 3, 3, 4]))
        w = "".join(rng.choice(onsets) + rng.choice(vowels) for _ in range(n_syl)) + rng.choice(codas)
        if w not in made:
            made.add(w)
            words.append(w)
    # stop words are the most frequent tokens of real text: give them the top Zipf ranks
    head = list(rng.permutation(stop))
    return head + words


def write_corpus(path: Path, n_docs: int, words: list[str], tokens_per_doc: int, seed: int, topics: int = 0) -> None:
    """``n_docs`` JSONL documents of about ``tokens_per_doc`` tokens from a Zipf law over ``words``. ``topics`` > 0
    plants that many topics (fixed by the vocabulary, not by ``seed``, so that every partition shares them): each
    document has one, and half its tokens (on average) come from the topic's own Zipf law over 2,000 words of its
    own instead of the background law."""
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, len(words) + 1, dtype=np.float64)
    p = ranks ** -1.07
    p /= p.sum()
    vocab = np.array(words, dtype=object)
    topic_words = np.random.default_rng(len(words)).permutation(len(words))[:topics * 2000].reshape(topics, 2000)
    topic_p = p[:2000] / p[:2000].sum()
    with open(path, "w") as fh:
        for start in range(0, n_docs, 10_000):
            n = min(10_000, n_docs - start)
            lengths = np.maximum(rng.poisson(tokens_per_doc, n), 1)
            indices = rng.choice(len(words), size=int(lengths.sum()), p=p)
            if topics:
                of_topic = rng.random(indices.size) < 0.5
                topic = np.repeat(rng.integers(topics, size=n), lengths)[of_topic]
                indices[of_topic] = topic_words[topic, rng.choice(2000, size=int(of_topic.sum()), p=topic_p)]
            tokens = vocab[indices]
            groups = rng.choice(len(GROUPS), size=n, p=GROUP_P)
            bounds = np.concatenate([[0], np.cumsum(lengths)])
            fh.writelines(
                json.dumps({"id": start + i, "group": GROUPS[groups[i]],
                            "text": " ".join(tokens[bounds[i]:bounds[i + 1]])}) + "\n"
                for i in range(n))


def measure(corpus: Path, dest: Path, block_bytes: int, batch_docs: int) -> dict:
    if dest.exists():
        shutil.rmtree(dest)
    out = subprocess.run([sys.executable, "-c", CHILD, str(corpus), str(dest), str(block_bytes), str(batch_docs)],
                         check=True, capture_output=True, text=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    shutil.rmtree(dest, ignore_errors=True)
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny run: 2,000 and 20,000 documents")
    ap.add_argument("--sizes", type=int, nargs=2, help="the two corpus sizes (documents)")
    ap.add_argument("--tokens", type=int, default=60, help="mean tokens per document")
    ap.add_argument("--words", type=int, default=60_000, help="vocabulary size of the generator")
    ap.add_argument("--block-mb", type=float, nargs="+", default=[128, 1],
                    help="block sizes (MiB) to measure: 128 is distfact's default (a 200k-document corpus "
                         "then fits in one block per group, so it is all buffered); 1 makes blocks flush "
                         "during the pass, which shows the memory bound of streaming")
    ap.add_argument("--batch-docs", type=int, default=2000)
    ap.add_argument("--workdir", help="where to write the corpora (default: a temporary directory)")
    ap.add_argument("--out", help="JSON result file (default: benchmarks/results/ingest_memory[_quick].json)")
    args = ap.parse_args(argv)
    sizes = args.sizes or ([2_000, 20_000] if args.quick else [20_000, 200_000])
    out_path = Path(args.out) if args.out else HERE / "results" / (
        "ingest_memory_quick.json" if args.quick else "ingest_memory.json")

    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="distfact-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        words = vocabulary(args.words)
        corpora = {}
        for n in sizes:
            path = work / f"corpus-{n}.jsonl"
            t = time.perf_counter()
            write_corpus(path, n, words, args.tokens, seed=n)
            corpora[n] = path
            print(f"generated {n:>8,} documents ({path.stat().st_size / 2**20:7.1f} MiB) "
                  f"in {time.perf_counter() - t:5.1f} s", flush=True)
        runs = []
        for block_mb in args.block_mb:
            for n in sizes:
                r = measure(corpora[n], work / "store", int(block_mb * 2**20), args.batch_docs)
                r.update(documents=n, block_mb=block_mb, corpus_mb=corpora[n].stat().st_size / 2**20)
                runs.append(r)
                print(f"  block {block_mb:6.1f} MiB  {n:>8,} docs: peak {r['peak_kb'] / 1024:7.1f} MiB "
                      f"(after imports {r['baseline_kb'] / 1024:6.1f} MiB), {r['seconds']:6.1f} s, "
                      f"{r['n_blocks']} blocks", flush=True)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)

    small, large = sizes
    print()
    print(f"{'block MiB':>9} | {'docs':>9} | {'corpus MiB':>10} | {'peak MiB':>8} | {'above imports':>13} "
          f"| {'nnz':>11} | {'blocks':>6} | {'seconds':>7}")
    print("-" * 92)
    for r in runs:
        print(f"{r['block_mb']:9.1f} | {r['documents']:9,} | {r['corpus_mb']:10.1f} | {r['peak_kb'] / 1024:8.1f} | "
              f"{(r['peak_kb'] - r['baseline_kb']) / 1024:13.1f} | {r['nnz']:11,} | {r['n_blocks']:6} | "
              f"{r['seconds']:7.1f}")
    summary = []
    for block_mb in args.block_mb:
        by_n = {r["documents"]: r for r in runs if r["block_mb"] == block_mb}
        ratio = by_n[large]["peak_kb"] / by_n[small]["peak_kb"]
        ratio_above = ((by_n[large]["peak_kb"] - by_n[large]["baseline_kb"])
                       / max(by_n[small]["peak_kb"] - by_n[small]["baseline_kb"], 1))
        summary.append({"block_mb": block_mb, "ratio": ratio, "ratio_above_imports": ratio_above,
                        "meets_target": ratio <= 1.5})
        print(f"block {block_mb:g} MiB: peak({large:,}) / peak({small:,}) = {ratio:.2f} "
              f"(target <= 1.5: {'yes' if ratio <= 1.5 else 'NO'}); above imports: {ratio_above:.2f}")

    out_path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": "ingest_memory", "vectorizer": "tfidf", "sizes": sizes, "tokens_per_doc": args.tokens,
           "generator_words": args.words, "groups": GROUPS, "group_p": GROUP_P, "batch_docs": args.batch_docs,
           "quick": args.quick, "python": platform.python_version(), "platform": platform.platform(),
           "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "runs": runs, "summary": summary}
    out_path.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
