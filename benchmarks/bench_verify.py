"""What verifying a store's chunks costs a read pass (issue 17): verification on against off.

    python benchmarks/bench_verify.py                  # ~13 minutes on 2 idle cores (17 with valgrind), ~2.3 GB
                                                       # of temporary disk
    python benchmarks/bench_verify.py --quick          # small stores, to check the script (under a minute)
    python benchmarks/bench_verify.py --dir /scratch   # where the stores go (default: a temporary directory
                                                       # under /tmp); removed at the end either way

Two stores of more than 2 GB of X each, written block by block with ``distfact.store.StoreWriter`` (the generators of
``bench_cluster.py``):

- dense: 300,000 x 1,000 float64 (2.4 GB), 4 groups, a rank-10 product plus noise per group, blocks of 16,384 rows
  (128 MiB);
- CSR: a synthetic bag-of-words corpus (``bench_cluster.corpus_store``), 4,000,000 documents x 50,000 terms, ~48
  non-zeros a row (float64 values, int32 column numbers: 2.3 GB), 8 groups, blocks of 200,000 rows (~115 MB).

Each store is opened twice, ``GroupedMatrix.open(path, verify=True)`` and ``verify=False``, and read in full passes:
every block through the store's reader, as a fit's pass reads it. Three measurements:

- "pass": ``InProcessExecutor.map_blocks`` with a task that only touches the block (2 threads on this machine:
  exactly how a fit's pass reads blocks from a store). Verification on and off alternate, ``--repeats`` pairs of
  whole passes, the order swapped from one pair to the next (on/off, off/on, ...); each pair gives a ratio on/off.
  Reported: the median pair ratio and the ratio of the medians, for wall time and for this process's CPU time.
- "interleaved" in 1 and in 2 threads: ``--repeats`` passes in which every run of 1 (2) consecutive blocks is
  read twice in a row, verified and not, by 1 (2) threads (the order swapped from run to run and pass to pass),
  so that the machine's noise, which moves a whole pass by +-30% here when other jobs run, hits both alike.
  Reported: the ratio of the total times and the median of the per-run ratios.
- "CRC32C alone": the chunk files a pass reads, read into memory (not timed) and checksummed (timed), as a
  fraction of the unverified read time of "interleaved" in 1 thread.
- "instructions" (when valgrind is installed: ``apt install valgrind``): the instructions callgrind counts for
  reading the store's first block twice, verified and not, less those of starting Python and opening the store.
  Counts vary far less than times on a shared machine, but still by 1-2% between runs (allocator and import
  paths), about the size of the CRC's share of a dense block.

Target: on/off <= 1.05 for the pass.

The stores fit in this machine's page cache (24 GiB), and one untimed pass of each kind warms it: the numbers are
for cached reads, where a read is fastest, so the checksum's relative cost is largest (from disk it is smaller).
``fincore`` (util-linux) reports how much of each store is cached before and after the passes.
Results: benchmarks/results/verify.json (``--quick``: verify-quick.json).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import google_crc32c
import numpy as np

import distfact
from bench_cluster import corpus_store, dense_store, page_cache
from bench_nmf import machine, write_results
from distfact.engine.executor.inprocess import InProcessExecutor
from distfact.store.chunks import chunk_key
from distfact.store.reading import block_place

HERE = os.path.dirname(os.path.abspath(__file__))
GB = 1e9

STORES = {  # name -> (generator, arguments, keyword arguments) at full size, and at --quick size
    "dense": ((dense_store, (300_000, 1_000, 4, 16_384), {}), (dense_store, (20_000, 500, 4, 2_048), {})),
    "csr": ((corpus_store, (4_000_000, 50_000, 8, 200_000), dict(n_topics=20, topic_terms=2_500, draws=(40, 20))),
            (corpus_store, (100_000, 5_000, 8, 10_000), dict(n_topics=20, topic_terms=250, draws=(40, 20)))),
}


def say(*args):
    print(time.strftime("%H:%M:%S"), *args, flush=True)


def touch(X_b, local, block):
    """The task of a read pass: the block is read (and checked) by the executor; nothing is computed."""
    return X_b.shape[0]


def executor_pass(store) -> None:
    executor = InProcessExecutor(store)
    try:
        executor.map_blocks(touch)
    finally:
        executor.close()


def timed(fn) -> tuple[float, float]:
    """Wall and process CPU seconds of ``fn()``."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def crc_seconds(store) -> dict:
    """The CRC32C alone: the chunk file of every array a pass reads, read into memory (not timed), then
    checksummed (timed), as the verifying store does."""
    seconds, nbytes = 0.0, 0
    for block in store.blocks:
        node_path, _ = block_place(block)
        for name, shape in block.array_shapes(store.layout, store.shape[1]).items():
            if name == "rows" or 0 in shape:  # a pass does not read the rows
                continue
            with open(os.path.join(store.path, chunk_key(node_path, name, len(shape))), "rb") as f:
                stored = f.read()
            start = time.perf_counter()
            google_crc32c.value(stored)
            seconds += time.perf_counter() - start
            nbytes += len(stored)
    return {"seconds": round(seconds, 4), "stored_gb": round(nbytes / GB, 3),
            "gb_per_second": round(nbytes / GB / seconds, 2)}


def alternated(i: int) -> tuple[bool, bool]:
    """The order of the verified (True) and unverified read of the i-th pair."""
    return (True, False) if i % 2 == 0 else (False, True)


def compare_passes(stores: dict, repeats: int) -> dict:
    """Executor passes with verification on and off, alternately, ``repeats`` pairs."""
    for verify in (True, False):  # untimed: warms the page cache and the code paths
        executor_pass(stores[verify])
    times = {True: [], False: []}
    for i in range(repeats):
        for verify in alternated(i):
            times[verify].append(timed(functools.partial(executor_pass, stores[verify])))
    on, off = np.array(times[True]), np.array(times[False])  # (repeats, 2): wall, cpu
    out = {}
    for k, clock in enumerate(("wall", "cpu")):
        out[clock] = {"on_seconds": on[:, k].round(4).tolist(), "off_seconds": off[:, k].round(4).tolist(),
                      "pair_ratios": (on[:, k] / off[:, k]).round(4).tolist(),
                      "median_pair_ratio": round(float(np.median(on[:, k] / off[:, k])), 4),
                      "ratio_of_medians": round(float(np.median(on[:, k]) / np.median(off[:, k])), 4)}
    return out


def compare_interleaved(stores: dict, repeats: int, threads: int) -> dict:
    """Passes in which every run of ``threads`` consecutive blocks is read verified and unverified back to back,
    each run by ``threads`` threads at once (the order alternating)."""
    readers = {verify: store.reader() for verify, store in stores.items()}
    blocks = stores[True].blocks
    runs = [blocks[k:k + threads] for k in range(0, len(blocks), threads)]
    seconds = {True: np.zeros((repeats, len(runs))), False: np.zeros((repeats, len(runs)))}
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for i in range(repeats):
            for j, run in enumerate(runs):
                for verify in alternated(i + j):
                    start = time.perf_counter()
                    list(pool.map(readers[verify], run))
                    seconds[verify][i, j] = time.perf_counter() - start
    on, off = seconds[True], seconds[False]
    return {"on_seconds_per_pass": on.sum(axis=1).round(4).tolist(),
            "off_seconds_per_pass": off.sum(axis=1).round(4).tolist(),
            "ratio_of_totals": round(float(on.sum() / off.sum()), 4),
            "median_run_ratio": round(float(np.median(on / off)), 4)}


def count_instructions(path: str) -> dict | None:
    """Instructions (callgrind) of reading the first block of the store at ``path`` twice, verified ("on") and not
    ("off"), each less those of a process that only opens the store; None without valgrind."""
    if shutil.which("valgrind") is None:
        return None
    counts = {}
    for mode in ("open", "off", "on"):
        run = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={os.devnull}", sys.executable,
                              os.path.abspath(__file__), "--read-first-block", path, mode],
                             capture_output=True, text=True, check=True)
        counts[mode] = int(re.search(r"Collected : (\d+)", run.stderr).group(1))
    read = {mode: counts[mode] - counts["open"] for mode in ("on", "off")}
    return {"read_twice_on": read["on"], "read_twice_off": read["off"],
            "ratio_on_off": round(read["on"] / read["off"], 4)}


def read_first_block(path: str, mode: str) -> None:
    """What ``count_instructions`` runs under callgrind."""
    store = distfact.store.GroupedMatrix.open(path, verify=mode == "on")
    if mode != "open":
        reader = store.reader()
        for _ in range(2):
            reader(store.blocks[0])


def measure(name: str, directory: str, quick: bool, repeats: int) -> dict:
    generator, args, kwargs = STORES[name][quick]
    path = os.path.join(directory, f"{name}.zarr")
    say(f"writing the {name} store ...")
    start = time.perf_counter()
    generator(path, *args, **kwargs)
    info = {"write_seconds": round(time.perf_counter() - start, 1)}
    stores = {verify: distfact.store.GroupedMatrix.open(path, verify=verify) for verify in (True, False)}
    store = stores[True]
    info.update(shape=list(store.shape), layout=store.layout, nnz=store.nnz, n_blocks=store.n_blocks,
                x_gb=round(store.nbytes / GB, 3), page_cache_before=page_cache(path))
    say(f"{name}: {info}")
    info["pass"] = compare_passes(stores, repeats)
    say(f"{name} pass: wall on/off {info['pass']['wall']['median_pair_ratio']}, "
        f"cpu on/off {info['pass']['cpu']['median_pair_ratio']}")
    for threads in (1, 2):
        kind = f"interleaved_{threads}_thread" + ("s" if threads > 1 else "")
        info[kind] = compare_interleaved(stores, repeats, threads)
        say(f"{name} {kind}: on/off {info[kind]['ratio_of_totals']} (totals), {info[kind]['median_run_ratio']} "
            "(median run)")
    info["crc32c_alone"] = crc_seconds(stores[False])
    info["instructions"] = count_instructions(path)
    say(f"{name}: instructions {info['instructions']}")
    info["page_cache_after"] = page_cache(path)
    read_off = float(np.median(info["interleaved_1_thread"]["off_seconds_per_pass"]))
    info["crc32c_alone"]["fraction_of_read"] = round(info["crc32c_alone"]["seconds"] / read_off, 4)
    say(f"{name}: CRC32C alone {info['crc32c_alone']}")
    shutil.rmtree(path)
    return info


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", help="where the stores are written (default: a temporary directory under /tmp)")
    parser.add_argument("--repeats", type=int, default=15, help="on/off pairs per store and kind of pass (at least 5)")
    parser.add_argument("--quick", action="store_true", help="small stores, to check the script")
    parser.add_argument("--read-first-block", nargs=2, metavar=("STORE", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.read_first_block:
        return read_first_block(*args.read_first_block)
    if args.repeats < 5 and not args.quick:
        parser.error("--repeats must be at least 5")
    directory = tempfile.mkdtemp(prefix="distfact-bench-verify-", dir=args.dir)
    output = os.path.join(HERE, "results", "verify-quick.json" if args.quick else "verify.json")
    results = {"benchmark": "verify", "machine": machine(), "command": " ".join(["python", *sys.argv]),
               "quick": args.quick, "repeats": args.repeats, "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
               "target": "pass: on/off <= 1.05", "stores": {}}
    try:
        for name in STORES:
            results["stores"][name] = measure(name, directory, args.quick, args.repeats)
            write_results(results, output)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
