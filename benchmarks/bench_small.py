"""Small fits at numpy's cost (issue 19): whole distfact fits against direct numpy loops of the same updates.

    PYTHONPATH=. python benchmarks/bench_small.py --before /work/main    # about 6 minutes on 2 cores
    PYTHONPATH=. python benchmarks/bench_small.py --quick                  # a few seconds, to check the script
    ... --blas-threads 1      # every process's BLAS on one thread (steadier figures on a busy machine)
    ... --output FILE         # the results elsewhere than benchmarks/results/small.json
    ... --pause 0             # no pause between the timed fits (default 0.3 s; see below)

Cases (each a whole fit, from the same start as its numpy peer; target: distfact at most 1.5x numpy):
  nmf         NMF MU (Frobenius), 400 x 100 uniform, rank 5, 2,000 iterations (tol=0); the peer is the
              Lee-Seung loop, H then W, as the engine orders them.
  stratified  Stratified-NMF on the paper's synthetic set (4 strata of 100 x 100), rank 5, 10,000 iterations;
              the peer is ``dense_algorithm_1``, Algorithm 1 line by line.
  fairer      Fairer-NMF MU on UCI Heart Disease by sex (297 x 12), rank 5, defaults (5 runs per group for
              E_l, their stopping rule, then the scheme until eq. 10); the peer transcribes Algorithm 1
              (each run an MU loop stopping on its own) and Algorithm 3 with the same rules, so both stop at the
              same iterations (checked: same E_l and iteration count).
  ssnmf       SSNMF (F,F), 500 x 300 uniform with 5 classes (all labelled), rank 10, lam 1, 1,000 iterations
              (tol=0); the peer is the (F,F) multiplicative updates, H, B, then W.
  nmf_store   the nmf case with X from a store on disk (written once by the worker, not timed; each fit opens it
              by its path, as a user's does): what a small fit from a store costs against the same numpy loop.
The numpy peers compute no loss unless their stopping rule needs one; distfact records it every iteration.

distfact runs in a worker process (PYTHONPATH: this checkout), and with ``--before DIR`` a second worker runs
the code in DIR (e.g. a checkout of main) on the same problems: repeats are interleaved (numpy, distfact,
before, numpy, ...), each figure is the median of ``--repeats`` (wall time; the CPU time's ratio is recorded too),
every worker warms up (numba) first. Each timed fit starts ``--pause`` seconds (0.3) after the last one ended: the
process that ran it leaves OpenBLAS's threads spinning some 0.1 s after their last call, on the cores the next fit,
in another process, needs (SSNMF with BLAS's own threads, medians of 11: 1.73-1.84 without a pause, 1.26-1.32 with
it, 1.34-1.40 without it but with OPENBLAS_THREAD_TIMEOUT=4, the shortest spin; BENCHMARKS.md). Each
distfact fit's result is checked against the numpy peer's (relative difference of H). Results:
benchmarks/results/small.json (``--quick``: small-quick.json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_nmf import machine, write_results  # noqa: E402

warnings.filterwarnings("ignore")

TARGET = 1.5
HERE = os.path.dirname(os.path.abspath(__file__))
FAIRER_TOL, FAIRER_ESTIMATE_TOL, FAIRER_RUNS, FAIRER_FLOOR = 1e-5, 1e-4, 5, 0.01  # FairerNMF's defaults


# ----------------------------------------------------------------------------------------------- numpy peers
def dense_algorithm_1(strata_A, W, H, v, n_iter, M=2, eps=1e-9):
    """Stratified-NMF's Algorithm 1 on dense per-stratum arrays, line by line; yields the seconds of each
    iteration (bench_stratified.py now compares against a scipy.sparse transcription; this is the dense one)."""
    colsums = [A.sum(axis=0) for A in strata_A]  # A(i)^T 1, constant
    for _ in range(n_iter):
        start = time.perf_counter()
        for _ in range(M):  # line 5
            v = [vi * c / (vi * A.shape[0] + H.T @ w.sum(axis=0) + eps)
                 for A, c, vi, w in zip(strata_A, colsums, v, W)]
        new_W = []
        for A, vi, w in zip(strata_A, v, W):  # line 7
            R = w @ H
            R += vi
            new_W.append(w * (A @ H.T) / (R @ H.T + eps))
        W = new_W
        numerator, denominator = 0.0, 0.0
        for A, vi, w in zip(strata_A, v, W):  # line 8
            R = w @ H
            R += vi
            numerator = numerator + w.T @ A
            denominator = denominator + w.T @ R
        H = H * numerator / (denominator + eps)
        yield time.perf_counter() - start


# ----------------------------------------------------------------------------------------------- problems
def nmf_problem(n_iter):
    rng = np.random.default_rng(0)
    return {"X": rng.random((400, 100)), "W": rng.random((400, 5)), "H": rng.random((5, 100)), "n_iter": n_iter}


def stratified_problem(n_iter):
    from distfact.datasets import make_stratified_synthetic

    X, strata, _ = make_stratified_synthetic(0)
    rng = np.random.default_rng(1)
    r = 5
    return {"X": X, "groups": strata, "W": rng.random((X.shape[0], r)) / np.sqrt(r),
            "H": rng.random((r, X.shape[1])) / np.sqrt(r), "v": rng.random((4, X.shape[1])), "n_iter": n_iter}


def fairer_problem(estimate_max_iter):
    from distfact.datasets import load_heart_disease

    X, groups, _ = load_heart_disease()
    return {"X": X, "groups": groups, "rank": 5, "estimate_max_iter": estimate_max_iter}


def ssnmf_problem(n_iter):
    rng = np.random.default_rng(0)
    m, n, r, k = 500, 300, 10, 5
    return {"X": rng.random((m, n)), "y": rng.integers(0, k, m), "W": rng.random((m, r)), "H": rng.random((r, n)),
            "B": rng.random((r, k)), "n_iter": n_iter}


PROBLEMS = {"nmf": nmf_problem, "stratified": stratified_problem, "fairer": fairer_problem, "ssnmf": ssnmf_problem,
            "nmf_store": nmf_problem}
SIZES = {"full": {"nmf": 2000, "stratified": 10_000, "fairer": 10_000, "ssnmf": 1000, "nmf_store": 2000},
         "quick": {"nmf": 200, "stratified": 500, "fairer": 300, "ssnmf": 100, "nmf_store": 200}}


# -------------------------------------------------------------------------------------------- numpy peers
def nmf_numpy(p):
    X, W, H = p["X"], p["W"].copy(), p["H"].copy()
    eps = np.finfo(X.dtype).eps
    for _ in range(p["n_iter"]):
        H = H * (W.T @ X) / np.maximum(W.T @ W @ H, eps)
        W = W * (X @ H.T) / np.maximum(W @ (H @ H.T), eps)
    return {"H": H}


def stratified_numpy(p):
    names = sorted(set(p["groups"]))
    strata = [p["X"][p["groups"] == name] for name in names]
    W = [p["W"][p["groups"] == name] for name in names]
    H, v = p["H"].copy(), list(p["v"])
    # dense_algorithm_1 yields its iterations' seconds, not its iterates: the result check uses
    # tests/oracles.py's transcription (``oracle_stratified``, not timed)
    for _ in dense_algorithm_1(strata, W, H, v, p["n_iter"]):
        pass
    return {}


def fairer_start(p):
    """distfact's own start of both phases (the seeds FairerNMF(random_state=0) uses), per group in row order."""
    import distfact
    from distfact.engine import InProcessExecutor, initialise
    from distfact.methods.fairer_nmf import FairerMU, GroupErrorEstimate

    data = distfact.from_arrays(p["X"], p["groups"])
    r, dtype = p["rank"], str(data.dtype)
    executor = InProcessExecutor(data, n_threads=1)
    try:
        estimate = GroupErrorEstimate(r, FAIRER_RUNS, FAIRER_ESTIMATE_TOL, dtype)
        H_runs = initialise(estimate, data, executor, [0, 1])["H"]
        W_runs = [np.concatenate([executor.locals[b.index] for b in data.blocks if b.group == g], axis=1)
                  for g in range(data.n_groups)]
        scheme = FairerMU(r, tuple(np.zeros(data.n_groups)), FAIRER_TOL, dtype)
        H0 = initialise(scheme, data, executor, [0, 2])["H"]
        W0 = [np.concatenate([executor.locals[b.index] for b in data.blocks if b.group == g])
              for g in range(data.n_groups)]
    finally:
        executor.close()
    order = data.row_index()
    X_sorted = p["X"][order]
    Xs = [X_sorted[group.row_start:group.row_stop] for group in data.meta.groups]
    return {"Xs": Xs, "H_runs": H_runs, "W_runs": W_runs, "H0": H0, "W0": W0}


def fairer_numpy(p):
    """Algorithm 1 (every run an MU loop with its own stop) and Algorithm 3 ('decaying' c, eq. 10), both with
    FairerNMF's rules: stop when the relative error changed by less than tol * max(it, 1%)."""
    s = p["start"]
    Xs, eps = s["Xs"], np.finfo(np.float64).eps
    norms = np.array([np.linalg.norm(X) for X in Xs])
    E = []
    for X, nrm, W_group, H_group in zip(Xs, norms, s["W_runs"], s["H_runs"]):  # Algorithm 1
        errors = []
        for W, H in zip(W_group, H_group):
            previous, current = 0.0, np.linalg.norm(X - W @ H) / nrm
            for _ in range(p["estimate_max_iter"]):
                if abs(current - previous) < FAIRER_ESTIMATE_TOL * max(current, FAIRER_FLOOR):
                    break
                H = H * (W.T @ X) / np.maximum(W.T @ W @ H, eps)
                W = W * (X @ H.T) / np.maximum(W @ (H @ H.T), eps)
                previous, current = current, np.linalg.norm(X - W @ H) / nrm
            errors.append(current * nrm)
        E.append(np.mean(errors))
    E = np.array(E)
    W, H = [w.copy() for w in s["W0"]], s["H0"].copy()  # Algorithm 3
    c = np.zeros(len(Xs))
    relative = np.array([np.linalg.norm(X - w @ H) for X, w in zip(Xs, W)]) / norms
    n_iter = 0
    for n_iter in range(1, 100_001):
        c[int(np.argmax(relative - E / norms))] += 1.0                                       # lines 7-8
        X_t = np.vstack([ci * X / nrm for ci, X, nrm in zip(c, Xs, norms)])                 # line 9
        W_t = np.vstack([ci * w / nrm for ci, w, nrm in zip(c, W, norms)])
        H = H * (W_t.T @ X_t) / np.maximum(W_t.T @ W_t @ H, eps)                            # line 10
        W = [w * (X @ H.T) / np.maximum(w @ (H @ H.T), eps) for X, w in zip(Xs, W)]        # line 11
        new = np.array([np.linalg.norm(X - w @ H) for X, w in zip(Xs, W)]) / norms
        stop = bool(np.all(np.abs(new - relative) < FAIRER_TOL * np.maximum(new, FAIRER_FLOOR)))
        relative = new
        if stop:
            break
    return {"H": H, "E": E, "n_iter": n_iter}


def ssnmf_numpy(p):
    X, Y = p["X"], np.eye(p["B"].shape[1])[p["y"]]
    W, H, B = p["W"].copy(), p["H"].copy(), p["B"].copy()
    eps, lam = 1e-10, 1.0
    for _ in range(p["n_iter"]):
        WtW = W.T @ W
        H = H / (eps + WtW @ H) * (W.T @ X)
        B = B / (eps + WtW @ B) * (W.T @ Y)
        W = W / (eps + W @ (H @ H.T) + lam * (W @ (B @ B.T))) * (X @ H.T + lam * (Y @ B.T))
    return {"H": H}


NUMPY = {"nmf": nmf_numpy, "stratified": stratified_numpy, "fairer": fairer_numpy, "ssnmf": ssnmf_numpy,
         "nmf_store": nmf_numpy}


def oracle_stratified(p):
    """The final H of Algorithm 1 (tests/oracles.py's transcription), for the result check only."""
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    from oracles import stratified_nmf

    names = sorted(set(p["groups"]))
    _, H, _, F = stratified_nmf([p["X"][p["groups"] == n] for n in names], [p["W"][p["groups"] == n] for n in names],
                                p["H"], list(p["v"]), p["n_iter"])
    return {"H": H, "F": F[-1]}


# --------------------------------------------------------------------------------------------- distfact
def distfact_fit(case, p):
    """The whole fit, as a user calls it; returns what the result check needs."""
    import distfact

    if case in ("nmf", "nmf_store"):
        X = p["store"] if case == "nmf_store" else p["X"]
        model = distfact.NMF(5, init="custom", max_iter=p["n_iter"], tol=0).fit(X, W=p["W"], H=p["H"])
        return {"H": model.components_}
    if case == "stratified":
        model = distfact.StratifiedNMF(5, init="custom", max_iter=p["n_iter"]).fit(
            p["X"], groups=p["groups"], W=p["W"], H=p["H"], v=p["v"])
        return {"H": model.components_, "F": model.objective_history_[-1]}
    if case == "fairer":
        model = distfact.FairerNMF(p["rank"], estimate_max_iter=p["estimate_max_iter"], random_state=0).fit(
            p["X"], groups=p["groups"])
        return {"H": model.components_, "E": model.E_, "n_iter": model.n_iter_}
    model = distfact.SSNMF(10, model="FF", lam=1.0, init="custom", max_iter=p["n_iter"], tol=0).fit(
        p["X"], y=p["y"], W=p["W"], H=p["H"], B=p["B"])
    return {"H": model.components_}


def worker(size):
    """Serve fits on stdin: one case name a line; answers one JSON line (seconds, result saved to a file)."""
    import atexit
    import shutil

    import distfact

    problems = {case: PROBLEMS[case](SIZES[size][case]) for case in PROBLEMS}
    warm = {case: PROBLEMS[case](5) for case in PROBLEMS}
    stores = tempfile.mkdtemp(prefix="bench-small-")
    atexit.register(shutil.rmtree, stores)
    for name, p in (("problem", problems["nmf_store"]), ("warm", warm["nmf_store"])):
        p["store"] = os.path.join(stores, f"{name}.zarr")
        distfact.from_arrays(p["X"], None, p["store"])
    for case in PROBLEMS:  # numba's compilation and first-call costs
        distfact_fit(case, warm[case])
    print(json.dumps({"ready": True, "distfact": __import__("distfact").__file__}), flush=True)
    for line in sys.stdin:
        case, out = line.split()
        start, cpu = time.perf_counter(), time.process_time()
        result = distfact_fit(case, problems[case])
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        np.savez(out, **result)
        print(json.dumps({"seconds": seconds, "cpu": cpu}), flush=True)


class Worker:
    def __init__(self, pythonpath, size):
        env = {**os.environ, "PYTHONPATH": pythonpath}
        self.process = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", size], env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.distfact = json.loads(self.process.stdout.readline())["distfact"]

    def fit(self, case, out):
        """(wall, CPU) seconds of one fit."""
        self.process.stdin.write(f"{case} {out}\n")
        self.process.stdin.flush()
        answer = json.loads(self.process.stdout.readline())
        return answer["seconds"], answer["cpu"]

    def close(self):
        self.process.stdin.close()
        self.process.wait()


def relative_difference(a, b):
    return float(np.linalg.norm(np.asarray(a) - np.asarray(b)) / np.linalg.norm(np.asarray(b)))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", help="a checkout of earlier code (e.g. /work/main), measured in the same run")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cases", default=",".join(PROBLEMS))
    parser.add_argument("--blas-threads", type=int, help="BLAS threads of every process (default: BLAS's own)")
    parser.add_argument("--pause", type=float, default=0.3,
                        help="seconds between one timed fit's end and the next one's start (default 0.3)")
    parser.add_argument("--output", help="where the results go (default: benchmarks/results/small.json, or "
                        "small-quick.json with --quick)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker)
    if args.blas_threads:  # before the workers start (they inherit it) and for the numpy peers here
        for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[name] = str(args.blas_threads)
        from threadpoolctl import threadpool_limits

        threadpool_limits(args.blas_threads)
    size = "quick" if args.quick else "full"
    repeats = 1 if args.quick else args.repeats
    cases = args.cases.split(",")
    problems = {case: PROBLEMS[case](SIZES[size][case]) for case in cases}
    if "fairer" in problems:
        problems["fairer"]["start"] = fairer_start(problems["fairer"])
    workers = {"distfact": Worker(os.path.dirname(HERE), size)}
    if args.before:
        workers["before"] = Worker(os.path.abspath(args.before), size)
    print({name: w.distfact for name, w in workers.items()}, flush=True)
    times = {case: {"numpy": [], **{name: [] for name in workers}} for case in cases}
    cpu = {case: {"numpy": [], **{name: [] for name in workers}} for case in cases}
    checks = {case: {} for case in cases}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(repeats):
            for case in cases:
                time.sleep(args.pause)
                start, cpu_start = time.perf_counter(), time.process_time()
                peer = NUMPY[case](problems[case])
                times[case]["numpy"].append(time.perf_counter() - start)
                cpu[case]["numpy"].append(time.process_time() - cpu_start)
                if case == "stratified" and repeat == 0:
                    peer = oracle_stratified(problems[case])
                for name, w in workers.items():
                    out = os.path.join(tmp, f"{case}-{name}.npz")
                    time.sleep(args.pause)
                    wall, cpu_seconds = w.fit(case, out)
                    times[case][name].append(wall)
                    cpu[case][name].append(cpu_seconds)
                    if repeat == 0:
                        ours = np.load(out)
                        checks[case][name] = {"H_relative_difference": relative_difference(ours["H"], peer["H"])}
                        if case == "stratified":
                            # F tends to 0 on this exactly-factorable set: its difference is measured against ||A||^2
                            checks[case][name]["F_difference_over_sq_norm"] = float(
                                abs(ours["F"] - peer["F"]) / np.vdot(problems[case]["X"], problems[case]["X"]))
                        if case == "fairer":
                            checks[case][name].update(E_relative_difference=relative_difference(ours["E"], peer["E"]),
                                                      n_iter=int(ours["n_iter"]), numpy_n_iter=peer["n_iter"])
                print(case, {name: f"{t[-1]:.3f}" for name, t in times[case].items()}, flush=True)
    for w in workers.values():
        w.close()
    rows = []
    for case in cases:
        median = {name: float(np.median(t)) for name, t in times[case].items()}
        median_cpu = {name: float(np.median(t)) for name, t in cpu[case].items()}
        row = {"case": case, "numpy_s": median["numpy"], "distfact_s": median["distfact"],
               "ratio": median["distfact"] / median["numpy"], "target": TARGET,
               "met": median["distfact"] / median["numpy"] <= TARGET,
               "cpu_ratio": median_cpu["distfact"] / median_cpu["numpy"], "check": checks[case],
               "all_seconds": times[case], "all_cpu_seconds": cpu[case]}
        if args.before:
            row.update(before_s=median["before"], before_ratio=median["before"] / median["numpy"],
                       before_cpu_ratio=median_cpu["before"] / median_cpu["numpy"])
        rows.append(row)
        print(f"{case:<11} numpy {row['numpy_s']:.3f} s  distfact {row['distfact_s']:.3f} s  ratio {row['ratio']:.2f}"
              + f" (CPU {row['cpu_ratio']:.2f})"
              + (f"  before {row['before_s']:.3f} s, ratio {row['before_ratio']:.2f} (CPU {row['before_cpu_ratio']:.2f})"
                 if args.before else "")
              + f"  checks {checks[case]}")
    result = {"machine": machine(), "quick": args.quick, "repeats": repeats, "pause": args.pause, "sizes": SIZES[size],
              "blas_threads": args.blas_threads, "load_average": os.getloadavg(),
              "before": args.before, "cases": rows}
    default = os.path.join(HERE, "results", "small-quick.json" if args.quick else "small.json")
    write_results(result, args.output or default)


if __name__ == "__main__":
    main()
