"""The first fit in a fresh process against the second (issue 19's target: at most 1 s slower), in a fresh
virtual environment as a new user makes it.

    python benchmarks/bench_first_fit.py [--venv DIR] [--repeats 3]    # about 10 minutes, most of it pip

Without ``--venv`` it makes a virtual environment in a temporary directory and installs this tree into it the
way the README says (``pip install .``: a normal, non-editable install, whose build compiles the numba kernels
into the wheel, setup.py and distfact/warmup.py); ``--venv DIR`` takes one with distfact installed already.
Each case is one estimator's small fit (120 x 40, 3 groups, rank 4; ``score`` included for the classifier;
the wide sparse cases 120 x 40,040 CSR, wider than one band of the CSR step at that rank, as a corpus's vocabulary)
run twice in a fresh process (``--case NAME``, with the environment's interpreter, from an empty directory),
which reports the import of distfact and the estimator and both fits' wall times. Phases:

- ``after_install``: every case once, in the first processes after the install, with the cache the install
  made; the numba cache files are listed before and after, so that any compilation shows as a new entry;
- ``later``: every case again, ``--repeats`` times interleaved (medians);
- ``no_cache``: every case with ``NUMBA_CACHE_DIR`` an empty directory of its own (numba then neither reads
  nor writes the installed cache): the compilation a first fit paid before the install made the cache;
- ``warmup``: ``python -m distfact.warmup`` into an empty ``NUMBA_CACHE_DIR``, what the install spends on it.

Results: benchmarks/results/first_fit.json.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: case -> (estimator, parameters, input): small fits of every estimator, each solver path dense and sparse
CASES = {
    "NMF mu dense": ("NMF", {"solver": "mu", "max_iter": 20}, "dense"),
    "NMF hals dense": ("NMF", {"solver": "hals", "max_iter": 20}, "dense"),
    "NMF mu sparse": ("NMF", {"solver": "mu", "max_iter": 20}, "sparse"),
    "NMF hals sparse": ("NMF", {"solver": "hals", "max_iter": 20}, "sparse"),
    "NMF mu wide sparse": ("NMF", {"solver": "mu", "max_iter": 20}, "wide sparse"),
    "NMF hals wide sparse": ("NMF", {"solver": "hals", "max_iter": 20}, "wide sparse"),
    "StratifiedNMF": ("StratifiedNMF", {"max_iter": 20}, "dense"),
    "FairerNMF mu": ("FairerNMF", {"max_iter": 10, "estimate_max_iter": 20, "n_estimates": 2}, "dense"),
    "FairerNMF am": ("FairerNMF", {"solver": "am", "max_iter": 5, "estimate_max_iter": 20, "n_estimates": 2},
                     "dense"),
    "WeightedL1NMF": ("WeightedL1NMF", {"max_iter": 5, "hals_iter": 3}, "sparse"),
    "SSNMF": ("SSNMF", {"max_iter": 10}, "dense"),
    "SSNMFClassifier fit+score": ("SSNMFClassifier", {"max_iter": 10}, "dense"),
    "MultigroupSVD": ("MultigroupSVD", {}, "dense"),
}


def run_case(name: str) -> None:
    """In the fresh process: import, then the same fit twice; print the times as JSON."""
    import warnings

    start = time.perf_counter()
    import numpy as np
    import scipy.sparse as sp

    import distfact

    estimator, params, kind = CASES[name]
    cls = getattr(distfact, estimator)
    imported = time.perf_counter() - start
    rng = np.random.default_rng(0)
    X = rng.random((120, 40))
    X = X if kind == "dense" else sp.csr_matrix(X * (X > 0.7))
    if kind == "wide sparse":  # wider than one band of the CSR step at rank 4 (kernels/nmf.py: CSR_BAND_BYTES)
        X = sp.hstack([X, sp.random(120, 40_000, density=1e-3, random_state=0)], "csr")
        X.sort_indices()
    groups = np.repeat(["a", "b", "c"], 40)
    labels = np.repeat([0, 1, 2], 40)

    def fit():
        if estimator == "SSNMFClassifier":
            cls(4, random_state=0, **params).fit(X, labels).score(X, labels)
        elif estimator == "SSNMF":
            cls(4, random_state=0, **params).fit(X, y=labels)
        elif estimator == "MultigroupSVD":
            cls(2, **params).fit(X, groups=groups)
        else:
            cls(4, random_state=0, **params).fit(X, groups=groups)

    warnings.simplefilter("ignore")  # fits capped at a few iterations on purpose
    times = []
    for _ in range(2):
        t = time.perf_counter()
        fit()
        times.append(time.perf_counter() - t)
    print(json.dumps({"import": imported, "first": times[0], "second": times[1]}))


def in_fresh_process(python: str, name: str, env: dict) -> dict:
    with tempfile.TemporaryDirectory() as cwd:
        out = subprocess.run([python, os.path.abspath(__file__), "--case", name], cwd=cwd, env=env, check=True,
                             capture_output=True, text=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    result["extra"] = result["first"] - result["second"]
    return result


def cache_files(site_packages: str) -> dict:
    """``{numba cache file: (size, mtime)}`` of the installed package."""
    return {os.path.relpath(p, site_packages): (os.path.getsize(p), os.path.getmtime(p))
            for p in glob.glob(os.path.join(site_packages, "distfact", "**", "*.nb[ic]"), recursive=True)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--venv", help="a virtual environment with distfact installed (default: make one)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--case", help=argparse.SUPPRESS)  # the fresh process's part
    args = parser.parse_args()
    if args.case:
        return run_case(args.case)
    from bench_nmf import machine, write_results

    scratch = tempfile.mkdtemp()
    result = {"machine": machine()}
    venv = args.venv
    if venv is None:
        venv = os.path.join(scratch, "venv")
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        start = time.perf_counter()
        subprocess.run([os.path.join(venv, "bin", "pip"), "install", "-q", HERE], check=True)
        result["install_seconds"] = time.perf_counter() - start
    python = os.path.join(venv, "bin", "python")
    site_packages = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   check=True, capture_output=True, text=True).stdout.strip()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NUMBA_CACHE_DIR")}

    before = cache_files(site_packages)
    result["after_install"] = {name: in_fresh_process(python, name, env) for name in CASES}
    after = cache_files(site_packages)
    result["cache_files_installed"] = len(before)
    result["cache_files_written_by_fits"] = sorted(p for p in after if before.get(p) != after[p])

    later = {name: [] for name in CASES}
    for _ in range(args.repeats):
        for name in CASES:
            later[name].append(in_fresh_process(python, name, env))
    result["later"] = {name: {key: sorted(r[key] for r in runs)[len(runs) // 2] for key in runs[0]}
                       for name, runs in later.items()}
    result["later_all"] = later

    result["no_cache"] = {name: in_fresh_process(python, name, {**env, "NUMBA_CACHE_DIR": tempfile.mkdtemp(dir=scratch)})
                          for name in CASES}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as cwd:
        subprocess.run([python, "-m", "distfact.warmup"], cwd=cwd, check=True, capture_output=True,
                       env={**env, "NUMBA_CACHE_DIR": tempfile.mkdtemp(dir=scratch)})
    result["warmup_seconds"] = time.perf_counter() - start

    print(f"{'case':28s} {'after install: import, 1st, 2nd, extra':>42s} {'later: extra':>13s} {'no cache: extra':>16s}")
    for name in CASES:
        a = result["after_install"][name]
        print(f"{name:28s} {a['import']:10.3f} {a['first']:10.3f} {a['second']:10.3f} {a['extra']:10.3f} "
              f"{result['later'][name]['extra']:13.3f} {result['no_cache'][name]['extra']:16.3f}")
    print(f"cache files installed: {result['cache_files_installed']}, written by the fits: "
          f"{result['cache_files_written_by_fits']}; warm-up {result['warmup_seconds']:.1f} s; "
          f"install {result.get('install_seconds', float('nan')):.1f} s")
    write_results(result, os.path.join(HERE, "benchmarks/results/first_fit.json"))
    shutil.rmtree(scratch)  # the environment it made (about 1 GB) and the empty caches


if __name__ == "__main__":
    main()
