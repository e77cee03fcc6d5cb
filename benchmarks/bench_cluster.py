"""distfact on a real Dask cluster, out of core (issue 9), measured in one run on this machine.

    python benchmarks/bench_cluster.py                   # the full set: ~7 minutes on 2 idle cores (more when other
                                                         # jobs share them), ~7 GB of temporary disk at most
    python benchmarks/bench_cluster.py --quick           # small sizes, to check the script (about 2 minutes)
    python benchmarks/bench_cluster.py --dir /scratch    # where stores and clusters go (default: a temporary directory)
    python benchmarks/bench_cluster.py --parts a,c       # some parts only
    python benchmarks/bench_cluster.py --parts c,d --rows 200000 --memory 8GiB --output results/cluster-cd-200k.json
                                                         # (c), (d) at 200k / 400k / 800k rows

Every cluster is started by the project's script, ``cluster/start-local.sh N MEMORY DIR`` (a ``dask scheduler`` and
N ``dask worker`` processes, each a nanny that spawns one single-threaded worker process with a memory limit of
MEMORY, all on 127.0.0.1, with cluster/dask.yaml), reached with ``distributed.Client(scheduler_file=DIR/
scheduler.json)`` and stopped by ``cluster/stop-local.sh DIR`` whatever happens. The estimators get
``client=client``. Each new cluster first runs a tiny untimed warm-up fit (imports on the workers, numba's compiled
kernels). Stores are written block by block with ``distfact.store.StoreWriter`` (X is never whole in memory) and
removed at the end.

(a) Dense NMF out of core: a 786,432 x 1,000 float64 store (5.9 GiB, 4 groups, 96 blocks of 64 MiB) on 2 workers
    x 1 GiB, i.e. X ~3x the cluster's memory, so every pass streams X from the store (``make_executor``: X stays on
    the workers only when it takes at most half their memory). ``NMF(10, solver='mu', init='random', tol=0,
    max_iter=4)``. Measured: the fit completes; the peak resident memory of each worker process (sampled, and the
    kernel's VmHWM) against its 1 GiB limit; per-iteration seconds (the estimator's callback) against one raw read
    pass of the store (every block read and decompressed, nothing computed) run as tasks on the same 2 worker
    processes. The raw read runs before the fit and after every iteration (from the callback, while the fit
    waits), so every iteration is compared with the mean of the reads just before and after it (the machine is
    shared: other jobs' load moves both by 2x within minutes). Goal: the median of these ratios <= 1.5. A read in
    2 threads of this process (``bench_multigroup.raw_read_seconds``) is reported too. 24 GiB of RAM hold the
    whole store in the page cache (reported by fincore): the fit and the reads both read from the cache.
(b) FairerNMF on a synthetic corpus: 2,000,000 documents x 50,000 terms, ~55 non-zeros per row (110 M), 8 groups;
    term popularity a Zipf law (s = 1.1) plus 20 topics (each a Zipf law over its own 2,500 terms); each group has
    its own Dirichlet(0.2) topic mixture; values 1 + log(count), rows l2-normalised; written as a CSR store
    (16 blocks). ``FairerNMF(10, n_estimates=5)`` with 3 E_l iterations and 3 scheme iterations (tol=0) on
    2 workers x 4 GiB. Reported: ingest seconds, fit seconds, per-iteration seconds of both phases, passes, store
    size, peak worker memory.
(c) Time per NMF iteration against rows: dense 100k / 200k / 400k x 500 (4 groups, 12,500-row blocks: 8/16/32
    blocks), r = 10, on 2 workers x 4 GiB (X stays in the workers' memory); median of 10 iterations per fit, best
    of 3 fits per size, sizes interleaved. Goal: t(2x)/t(1x) and t(4x)/t(1x) within 15% of 2 and 4.
(d) The 4x fit of (c) on 1 worker x 4 GiB against 2 workers x 4 GiB: both clusters run side by side (the idle one
    costs nothing) and the fits alternate, 3 pairs; speed-up of the best per-iteration times (and per pair, and of
    whole fits).

Memory: a thread samples VmRSS (/proc/<pid>/status) of every process under each ``dask worker`` pid (the nanny, the
worker process it spawns, multiprocessing's resource tracker) every 0.2 s during a fit; the kernel's peak (VmHWM)
is reset (``/proc/<pid>/clear_refs``) before the fit and read after it. Worker restarts (a new worker pid) and the
memory lines of the worker logs (pausing, spilling, restarts) are recorded. Per-iteration times come from the
estimator's callback (``IterationInfo.seconds``: the global step, one pass, the loss) and, for FairerNMF's E_l phase,
from distfact's log line of each iteration. CPU: for every fit, iteration and read, the CPU seconds of the workers,
of the scheduler and nannies, of this process and of every other process on the machine (psutil), as cores. The
machine is shared with other jobs, which can take a core or more for minutes: wall times are the goals' measure, and
the workers' CPU seconds per iteration (which do not depend on how many cores were free) are reported beside them.
Results: benchmarks/results/cluster.json (``--quick``: cluster-quick.json), rewritten after each part.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings

import numpy as np
import scipy.sparse as sp

import distfact
from bench_multigroup import raw_read_seconds
from bench_nmf import machine, write_results

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
START = os.path.join(ROOT, "cluster", "start-local.sh")
STOP = os.path.join(ROOT, "cluster", "stop-local.sh")
MiB, GiB = 2**20, 2**30

FULL = {
    "a": {"shape": (786_432, 1000), "block_bytes": 64 * MiB, "workers": 2, "memory": "1GiB", "rank": 10, "max_iter": 4},
    "b": {"docs": 2_000_000, "terms": 50_000, "groups": 8, "block_rows": 125_000, "topics": 20, "topic_terms": 2500,
          "draws": (35, 35), "workers": 2, "memory": "4GiB", "rank": 10, "n_estimates": 5, "estimate_max_iter": 3,
          "max_iter": 3},
    "c": {"rows": 100_000, "cols": 500, "block_rows": 12_500, "workers": 2, "memory": "4GiB", "rank": 10,
          "max_iter": 10, "rounds": 3, "pairs": 3},
}
QUICK = {
    "a": {"shape": (90_000, 1000), "block_bytes": 8 * MiB, "workers": 2, "memory": "640MiB", "rank": 10, "max_iter": 3},
    "b": {"docs": 40_000, "terms": 5_000, "groups": 8, "block_rows": 2_500, "topics": 10, "topic_terms": 500,
          "draws": (35, 35), "workers": 2, "memory": "4GiB", "rank": 5, "n_estimates": 2, "estimate_max_iter": 2,
          "max_iter": 2},
    "c": {"rows": 10_000, "cols": 200, "block_rows": 2_500, "workers": 2, "memory": "4GiB", "rank": 10,
          "max_iter": 5, "rounds": 2, "pairs": 2},
}


def say(*args):
    print(f"[{time.strftime('%H:%M:%S')}]", *args, flush=True)


def mib(n_bytes):
    return None if n_bytes is None else round(n_bytes / MiB, 1)


# ----------------------------------------------------------------------------------------------- processes
def proc_status(pid: int) -> dict:
    """VmRSS and VmHWM of a process in bytes ({} if it is gone)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    key, value = line.split(":", 1)
                    out[key] = int(value.split()[0]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return out


def reset_peak(pid: int) -> bool:
    """Reset the kernel's peak resident size (VmHWM) of a process to its current size."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def process_tree(pid: int) -> list[tuple[int, str]]:
    """(pid, role) of a ``dask worker`` process and its descendants: 'nanny', 'worker' (the process the nanny
    spawns, which runs the tasks and has the memory limit), 'tracker' (multiprocessing's resource tracker)."""
    import psutil

    try:
        root = psutil.Process(pid)
        children = root.children(recursive=True)
    except psutil.Error:
        return []
    out = [(pid, "nanny")]
    for child in children:
        try:
            cmd = " ".join(child.cmdline())
        except psutil.Error:
            continue
        out.append((child.pid, "worker" if "spawn_main" in cmd else "tracker" if "resource_tracker" in cmd
                    else "other"))
    return out


# ------------------------------------------------------------------------------------------------ clusters
class Cluster:
    """A cluster started by cluster/start-local.sh, with its client."""

    def __init__(self, client, directory, n_workers, memory):
        self.client, self.directory, self.n_workers, self.memory = client, directory, n_workers, memory
        workers = client.scheduler_info()["workers"].values()
        self.memory_limit = sum(w.get("memory_limit") or 0 for w in workers)
        self.worker_limit = max(w.get("memory_limit") or 0 for w in workers)
        with open(os.path.join(directory, "scheduler.pid")) as f:
            self.scheduler_pid = int(f.read().strip())

    def nannies(self) -> dict[str, int]:
        out = {}
        for i in range(1, self.n_workers + 1):
            with open(os.path.join(self.directory, f"worker-{i}.pid")) as f:
                out[f"worker-{i}"] = int(f.read().strip())
        return out

    def logs(self) -> list[str]:
        return [os.path.join(self.directory, f"worker-{i}.log") for i in range(1, self.n_workers + 1)] + \
            [os.path.join(self.directory, "scheduler.log")]

    def log_offsets(self) -> dict[str, int]:
        return {path: os.path.getsize(path) if os.path.exists(path) else 0 for path in self.logs()}

    def log_events(self, offsets) -> list[str]:
        """Lines about memory, restarts, failures written to the cluster's logs since ``offsets``."""
        words = ("memory", "restart", "kill", "pause", "spill", "error", "exception", "fail", "timeout", "lost")
        events = []
        for path, offset in offsets.items():
            if not os.path.exists(path):
                continue
            with open(path, errors="replace") as f:
                f.seek(offset)
                for line in f:
                    if any(w in line.lower() for w in words):
                        events.append(f"{os.path.basename(path)}: {line.strip()[:300]}")
        return events

    def workers_alive(self) -> int:
        return len(self.client.scheduler_info()["workers"])


@contextlib.contextmanager
def dask_cluster(n_workers: int, memory: str, directory: str):
    """Start ``cluster/start-local.sh n_workers memory directory``, yield a :class:`Cluster`; always stop it."""
    from distributed import Client

    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    os.makedirs(directory, exist_ok=True)
    say(f"starting a cluster: {n_workers} worker(s) x {memory} in {directory}")
    try:
        started = time.perf_counter()
        run = subprocess.run(["bash", START, str(n_workers), memory, directory], env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if run.returncode != 0:
            raise RuntimeError(f"cluster/start-local.sh failed ({run.returncode}):\n{run.stdout}")
        say(run.stdout.strip().replace("\n", "; "), f"({time.perf_counter() - started:.1f} s)")
        client = Client(scheduler_file=os.path.join(directory, "scheduler.json"), timeout="30s")
        try:
            client.wait_for_workers(n_workers, timeout=60)
            yield Cluster(client, directory, n_workers, memory)
        finally:
            client.close()
    finally:
        stop = subprocess.run(["bash", STOP, directory], env=env, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT)
        say(stop.stdout.strip())


class PeakMemory:
    """Samples VmRSS of every process of the cluster's workers every ``interval`` s from a thread; resets and reads
    each process's VmHWM (and this process's) around the measured block."""

    def __init__(self, cluster: Cluster, interval: float = 0.2):
        self.cluster, self.interval = cluster, interval
        self.roles: dict[int, tuple[str, str]] = {}
        self.peak: dict[int, int] = {}
        self.tree_peak: dict[str, int] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self):
        self.driver_peak = max(self.driver_peak, proc_status(os.getpid()).get("VmRSS") or 0)
        for name, nanny in self.nannies.items():
            total = 0
            for pid, role in process_tree(nanny):
                if pid not in self.roles:
                    self.roles[pid] = (name, role)
                    reset_peak(pid)
                rss = proc_status(pid).get("VmRSS")
                if rss is not None:
                    self.peak[pid] = max(self.peak.get(pid, 0), rss)
                    total += rss
            self.tree_peak[name] = max(self.tree_peak.get(name, 0), total)
        self.samples += 1

    def _run(self):
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self):
        self.nannies = self.cluster.nannies()
        self.offsets = self.cluster.log_offsets()
        reset_peak(os.getpid())
        self.driver_start = proc_status(os.getpid()).get("VmRSS")
        self.driver_peak = 0
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._sample()
        self.hwm = {pid: proc_status(pid).get("VmHWM") for pid in self.roles}
        self.driver_hwm = proc_status(os.getpid()).get("VmHWM")
        self.events = self.cluster.log_events(self.offsets)
        return False

    def report(self) -> dict:
        limit = self.cluster.worker_limit
        workers = {}
        for name in self.nannies:
            pids = [pid for pid, (n, role) in self.roles.items() if n == name and role == "worker"]
            nanny = [pid for pid, (n, role) in self.roles.items() if n == name and role == "nanny"]
            worker_peak = max((max(self.peak.get(p, 0), self.hwm.get(p) or 0) for p in pids), default=None)
            workers[name] = {
                "worker_pids": pids, "restarted": len(pids) > 1,
                "worker_sampled_peak_rss_mib": mib(max((self.peak.get(p, 0) for p in pids), default=None)),
                "worker_vmhwm_mib": mib(max((self.hwm.get(p) or 0 for p in pids), default=None)),
                "worker_peak_mib": mib(worker_peak),
                "nanny_peak_rss_mib": mib(max((self.peak.get(p, 0) for p in nanny), default=None)),
                "tree_sampled_peak_rss_mib": mib(self.tree_peak.get(name)),
            }
        peak = max((w["worker_peak_mib"] or 0) for w in workers.values())
        return {"worker_memory_limit_mib": mib(limit), "workers": workers, "max_worker_peak_mib": peak,
                "under_limit": bool(peak * MiB < limit), "any_restart": any(w["restarted"] for w in workers.values()),
                "samples": self.samples, "interval_s": self.interval, "driver_vmhwm_mib": mib(self.driver_hwm),
                "driver_rss_at_start_mib": mib(self.driver_start), "driver_sampled_peak_rss_mib": mib(self.driver_peak),
                "log_events": self.events[:40], "n_log_events": len(self.events)}


# ------------------------------------------------------------------------------------------------- timings
class IterationLog(logging.Handler):
    """distfact's 'pass 0' and 'iteration k: ... (s)' log records, in order (FairerNMF's E_l phase has no callback)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.records = []

    def emit(self, record):
        msg = str(record.msg)
        if msg.startswith("iteration") and record.args:
            self.records.append(("iteration", record.created, float(record.args[-1])))
        elif msg.startswith("pass 0"):
            self.records.append(("pass0", record.created, None))


@contextlib.contextmanager
def iteration_log():
    logger = logging.getLogger("distfact")
    handler, level = IterationLog(), logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


CPU_KEYS = ("workers", "cluster_other", "driver", "machine_busy", "steal")


def cpu_snapshot(cluster) -> dict:
    """Cumulative CPU seconds (user + system) of the worker processes, of the scheduler and nannies, of this process,
    and of the whole machine (busy, and stolen by the hypervisor), with the time."""
    import psutil

    snap = dict.fromkeys(CPU_KEYS, 0.0)
    pids = [(pid, role) for nanny in cluster.nannies().values() for pid, role in process_tree(nanny)]
    pids.append((cluster.scheduler_pid, "scheduler"))
    for pid, role in pids:
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        snap["workers" if role == "worker" else "cluster_other"] += t.user + t.system
    me = psutil.Process().cpu_times()
    snap["driver"] = me.user + me.system
    machine_times = psutil.cpu_times()
    snap["machine_busy"] = sum(getattr(machine_times, k, 0.0) for k in ("user", "nice", "system", "irq", "softirq"))
    snap["steal"] = getattr(machine_times, "steal", 0.0)
    snap["time"] = time.perf_counter()
    return snap


def cores(delta: dict) -> dict:
    """CPU seconds of a time window as cores: the workers', the scheduler's and nannies', this process's, every
    other process's on the machine (other users' jobs), and the hypervisor's steal."""
    wall = max(delta["wall"], 1e-9)
    others = delta["machine_busy"] - delta["workers"] - delta["cluster_other"] - delta["driver"]
    return {"wall_s": delta["wall"], "cpu_s": {k: delta[k] for k in CPU_KEYS},
            "worker_cores": delta["workers"] / wall, "scheduler_nanny_cores": delta["cluster_other"] / wall,
            "driver_cores": delta["driver"] / wall, "other_processes_cores": max(others, 0.0) / wall,
            "steal_cores": delta["steal"] / wall}


def cpu_between(a: dict, b: dict) -> dict:
    return cores({**{k: b[k] - a[k] for k in CPU_KEYS}, "wall": b["time"] - a["time"]})


def cpu_combined(windows: list[dict]) -> dict | None:
    if not windows:
        return None
    return cores({**{k: sum(w["cpu_s"][k] for w in windows) for k in CPU_KEYS},
                  "wall": sum(w["wall_s"] for w in windows)})


def timed_fit(model, X, cluster, after_iteration=None) -> dict:
    """Fit ``model`` on X on the cluster: whole-fit seconds, per-iteration seconds (the callback), passes, and the
    CPU the processes got, per iteration (the window from one callback to the next; the first window also holds
    the initialisation and pass 0, so ``iterations_cpu`` sums the others). ``after_iteration(info)`` runs in the
    callback, outside the iteration's time and CPU window."""
    times, windows = [], []
    mark = [cpu_snapshot(cluster)]

    def callback(info):
        now = cpu_snapshot(cluster)
        times.append(info.seconds)
        windows.append(cpu_between(mark[0], now))
        if after_iteration is not None:
            after_iteration(info)
        mark[0] = cpu_snapshot(cluster)

    model.set_params(callback=callback)
    with iteration_log() as log, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tol=0: FairerNMF's E_l runs 'did not converge'
        first = cpu_snapshot(cluster)
        start = time.perf_counter()
        model.fit(X, client=cluster.client)
        seconds = time.perf_counter() - start
        last = cpu_snapshot(cluster)
    model.set_params(callback=None)
    steady = windows[1:] or windows
    per_iteration = {k: sum(w["cpu_s"][k] for w in steady) / max(len(steady), 1) for k in CPU_KEYS}
    return {"fit_seconds": seconds, "iteration_seconds": times,
            "worker_cpu_seconds_per_iteration": per_iteration["workers"],
            "scheduler_nanny_cpu_seconds_per_iteration": per_iteration["cluster_other"],
            "driver_cpu_seconds_per_iteration": per_iteration["driver"],
            "median_iteration_seconds": float(np.median(times)) if times else None,
            "n_iter": int(model.n_iter_), "n_passes": int(model.n_passes_), "log": log.records,
            "worker_losses": getattr(model, "worker_losses_", None),  # fits rerun after a lost worker (distfact)
            "fit_cpu": cpu_between(first, last), "iteration_cpu": windows,
            "iterations_cpu": cpu_combined(steady),
            "scheduler": {k: v for k, v in model.scheduler_.items() if k != "dashboard"}}


def cluster_read_seconds(client, store) -> float:
    """One raw read pass of the store as tasks on the cluster's workers: every block read (and decompressed) by
    a worker, nothing computed, only a scalar returned."""
    reader = store.reader()

    def first_value(block):
        return float(reader(block)[0, 0])

    start = time.perf_counter()
    client.gather(client.map(first_value, store.blocks, pure=False))
    return time.perf_counter() - start


def task_summary(data, wall: float, n_workers: int) -> dict:
    """Where the workers' time went, from ``distributed.get_task_stream``: tasks and seconds per function and action
    (compute, transfer, disk-read/-write), and the share of the workers' time spent computing tasks."""
    from dask.utils import key_split

    by = {}
    for task in data:
        name = key_split(task["key"])
        name = "load_block" if name.startswith("BlockReader") else name  # X placed on the workers from the store
        for step in task["startstops"]:
            entry = by.setdefault(f"{name} {step['action']}", {"tasks": 0, "seconds": 0.0})
            entry["tasks"] += 1
            entry["seconds"] += step["stop"] - step["start"]
    for entry in by.values():
        entry["mean_seconds"] = entry["seconds"] / entry["tasks"]
    busy = sum(entry["seconds"] for key, entry in by.items() if key.endswith(" compute"))
    return {"by_function": by, "worker_compute_fraction": busy / (wall * n_workers)}


def page_cache(path) -> dict | None:
    """Bytes of the store's files on disk and in the page cache (util-linux fincore), or None without fincore."""
    files = [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
    size = sum(os.path.getsize(f) for f in files)
    if shutil.which("fincore") is None:
        return {"disk_bytes": size, "cached_bytes": None}
    cached = 0
    for i in range(0, len(files), 200):
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES", *files[i:i + 200]],
                             text=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout
        cached += sum(int(v) for v in out.split())
    return {"disk_gib": round(size / GiB, 3), "cached_gib": round(cached / GiB, 3),
            "cached_fraction": round(cached / max(size, 1), 3)}


def disk_bytes(path) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


# -------------------------------------------------------------------------------------------------- stores
def dense_store(path, m, n, n_groups, block_rows, rank=10, seed=0):
    """m x n non-negative float64, ``n_groups`` groups of equal size: per group a random rank-``rank`` product
    (uniform factors, a group-specific H) plus 0.1 x uniform noise, written block by block."""
    rng = np.random.default_rng(seed)
    sizes = [m // n_groups + (g < m % n_groups) for g in range(n_groups)]
    names = [f"g{g}" for g in range(n_groups)]
    with distfact.store.StoreWriter(path, n, np.float64, "dense", overwrite=True) as writer:
        row = 0
        for g, size in enumerate(sizes):
            H = rng.random((rank, n)) * (1 + 0.5 * g)
            for start in range(0, size, block_rows):
                k = min(block_rows, size - start)
                block = rng.random((k, rank)) @ H
                block += 0.1 * rng.random((k, n))
                writer.add_block(names[g], block, np.arange(row, row + k))
                row += k
        return writer.commit(names)


def corpus_store(path, docs, terms, n_groups, block_rows, n_topics, topic_terms, draws, seed=0):
    """A synthetic bag-of-words corpus as a CSR store, block by block. Every document draws ``draws[0]`` terms
    from a Zipf law (s = 1.1) over all terms and ``draws[1]`` from its topic, a Zipf law (s = 1) over the topic's
    own ``topic_terms`` random terms; its topic comes from its group's Dirichlet(0.2) mixture over ``n_topics``
    topics. Values 1 + log(count), rows l2-normalised."""
    rng = np.random.default_rng(seed)
    background = np.cumsum(1.0 / np.arange(1, terms + 1) ** 1.1)
    background /= background[-1]
    vocab = np.stack([rng.choice(terms, topic_terms, replace=False) for _ in range(n_topics)])
    topic = np.cumsum(1.0 / np.arange(1, topic_terms + 1))
    topic /= topic[-1]
    mixtures = rng.dirichlet(np.full(n_topics, 0.2), size=n_groups)
    sizes = [docs // n_groups + (g < docs % n_groups) for g in range(n_groups)]
    names = [f"g{g}" for g in range(n_groups)]
    with distfact.store.StoreWriter(path, terms, np.float64, "csr", overwrite=True) as writer:
        row = 0
        for g, size in enumerate(sizes):
            for start in range(0, size, block_rows):
                k = min(block_rows, size - start)
                z = rng.choice(n_topics, k, p=mixtures[g])
                cols = np.concatenate([
                    np.minimum(np.searchsorted(background, rng.random((k, draws[0]))), terms - 1),
                    vocab[z[:, None], np.minimum(np.searchsorted(topic, rng.random((k, draws[1]))), topic_terms - 1)],
                ], axis=1)
                rows = np.repeat(np.arange(k), cols.shape[1])
                X = sp.csr_matrix((np.ones(rows.size), (rows, cols.ravel())), shape=(k, terms))
                X.sum_duplicates()
                X.data = 1.0 + np.log(X.data)
                norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
                X = sp.csr_matrix(sp.diags(1.0 / norms) @ X)
                del cols, rows
                writer.add_block(names[g], X, np.arange(row, row + k))
                row += k
        return writer.commit(names)


def warm_up(cluster, directory, sparse=False):
    """A tiny fit on the cluster (imports on the workers, numba compilation), not timed."""
    path = os.path.join(directory, "warmup.zarr")
    try:
        rng = np.random.default_rng(1)
        X = rng.random((4000, 300))
        if sparse:
            X = sp.csr_matrix(X * (X > 0.9))
        groups = np.repeat(["a", "b"], 2000)
        store = distfact.from_arrays(X, groups, path=path, block_rows=1000, overwrite=True)
        distfact.NMF(5, tol=0, max_iter=2, random_state=0).fit(store, client=cluster.client)
        if sparse:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # tol=0: the E_l runs 'did not converge'
                distfact.FairerNMF(5, n_estimates=2, estimate_max_iter=2, max_iter=2, tol=0, estimate_tol=0,
                                   random_state=0).fit(store, client=cluster.client)
        cluster_read_seconds(cluster.client, store)
    finally:
        shutil.rmtree(path, ignore_errors=True)


def make_store(what, fn, *args, **kwargs):
    say(f"writing {what} ...")
    reset_peak(os.getpid())
    start = time.perf_counter()
    store = fn(*args, **kwargs)
    seconds = time.perf_counter() - start
    info = {"write_seconds": seconds, "writer_vmhwm_mib": mib(proc_status(os.getpid()).get("VmHWM")),
            "shape": list(store.shape), "n_blocks": store.n_blocks, "x_in_memory_gib": round(store.nbytes / GiB, 3),
            "store_on_disk_gib": round(disk_bytes(store.path) / GiB, 3), "nnz": store.nnz, "groups": store.n_groups}
    say(f"wrote {what}: {info}")
    return store, info


# --------------------------------------------------------------------------------------------------- parts
def measured_read(cluster, store) -> dict:
    """A raw read pass on the cluster (``cluster_read_seconds``) with the CPU the processes got meanwhile."""
    before = cpu_snapshot(cluster)
    seconds = cluster_read_seconds(cluster.client, store)
    return {"seconds": seconds, "cpu": cpu_between(before, cpu_snapshot(cluster))}


def part_a(cfg, directory, results, save):
    """Dense NMF streamed from a store ~3x the cluster's memory; a raw read pass before the fit and after every
    iteration (from the callback, while the fit waits), so that each iteration has a read on either side."""
    from distributed import get_task_stream

    m, n = cfg["shape"]
    out = results["a"] = {"config": {**cfg, "shape": [m, n]}}
    path = os.path.join(directory, "dense-a.zarr")
    try:
        store, out["store"] = make_store(f"(a) dense {m} x {n}", dense_store, path, m, n, 4,
                                         max(1, cfg["block_bytes"] // (8 * n)))
        with dask_cluster(cfg["workers"], cfg["memory"], os.path.join(directory, "cluster-a")) as cluster:
            warm_up(cluster, directory)
            out["cluster"] = {"workers": cluster.n_workers, "memory_limit_per_worker_mib": mib(cluster.worker_limit),
                              "cluster_memory_gib": round(cluster.memory_limit / GiB, 3),
                              "x_over_cluster_memory": round(store.nbytes / cluster.memory_limit, 2),
                              "x_streamed": store.nbytes > cluster.memory_limit // 2}
            out["page_cache_before"] = page_cache(path)
            say("(a) page cache:", out["page_cache_before"])
            thread_reads = [raw_read_seconds(store, threads=2)[0]]
            reads = [measured_read(cluster, store)]
            say(f"(a) raw read pass: {reads[0]['seconds']:.2f} s as tasks on the 2 workers "
                f"(workers on {reads[0]['cpu']['worker_cores']:.2f} cores, other processes "
                f"{reads[0]['cpu']['other_processes_cores']:.2f}), {thread_reads[0]:.2f} s in 2 threads here")

            def after_iteration(info):
                reads.append(measured_read(cluster, store))
                say(f"(a) iteration {info.iteration}: {info.seconds:.2f} s; raw read pass after it "
                    f"{reads[-1]['seconds']:.2f} s")

            say(f"(a) fitting NMF({cfg['rank']}), max_iter={cfg['max_iter']} ...")
            model = distfact.NMF(cfg["rank"], solver="mu", init="random", tol=0, max_iter=cfg["max_iter"],
                                 random_state=0)
            with PeakMemory(cluster) as mem, get_task_stream(cluster.client) as stream:
                fit = timed_fit(model, store, cluster, after_iteration)
            out["fit"] = fit
            out["fit_tasks"] = task_summary(stream.data, fit["fit_seconds"], cluster.n_workers)
            out["memory"] = mem.report()
            out["workers_alive_after"] = cluster.workers_alive()
            thread_reads.append(raw_read_seconds(store, threads=2)[0])
            out["page_cache_after"] = page_cache(path)
        iters = fit["iteration_seconds"]
        read_s = [r["seconds"] for r in reads]
        pairs = [t / ((read_s[k] + read_s[k + 1]) / 2) for k, t in enumerate(iters)]
        tasks = out["fit_tasks"]["by_function"]
        out.update({
            "raw_reads_cluster": reads, "raw_read_seconds_cluster": read_s, "raw_read_seconds_threads": thread_reads,
            "per_iteration_seconds": float(np.median(iters)),
            "ratio_per_iteration": pairs,
            "ratio": float(np.median(pairs)),
            "ratio_of_medians": float(np.median(iters) / np.median(read_s)),
            "ratio_to_fastest_read": float(np.median(iters) / min(read_s)),
            "ratio_to_thread_read": float(np.median(iters) / min(thread_reads)),
            "run_block_task_seconds": tasks.get("run_block compute", {}).get("mean_seconds"),
            "read_task_seconds": tasks.get("first_value compute", {}).get("mean_seconds"),
            "goal_ratio": 1.5,
            "worker_cpu_seconds_per_iteration": fit["worker_cpu_seconds_per_iteration"],
            "worker_cpu_seconds_per_read": float(np.median([r["cpu"]["cpu_s"]["workers"] for r in reads])),
        })
        out["cpu_ratio"] = out["worker_cpu_seconds_per_iteration"] / out["worker_cpu_seconds_per_read"]
        out["meets_goal_time"] = out["ratio"] <= 1.5
        out["meets_goal_memory"] = bool(out["memory"]["under_limit"] and not out["memory"]["any_restart"]
                                        and out["workers_alive_after"] == cfg["workers"])
        say(f"(a) fit {fit['fit_seconds']:.1f} s (with the reads between iterations), passes {fit['n_passes']}; "
            f"iterations {np.round(iters, 2).tolist()} s, reads {np.round(read_s, 2).tolist()} s; "
            f"iteration / adjacent reads {np.round(pairs, 2).tolist()}, median {out['ratio']:.2f} (goal <= 1.5: "
            f"{out['meets_goal_time']}); tasks: run_block {out['run_block_task_seconds']:.3f} s, read "
            f"{out['read_task_seconds']:.3f} s; worker CPU per iteration / per read {out['cpu_ratio']:.2f}; "
            f"worker peaks "
            f"{ {k: v['worker_peak_mib'] for k, v in out['memory']['workers'].items()} } MiB "
            f"(under the limit, no restart: {out['meets_goal_memory']}); log events {out['memory']['n_log_events']}")
    finally:
        shutil.rmtree(path, ignore_errors=True)
        save()


def part_b(cfg, directory, results, save):
    from distributed import get_task_stream

    out = results["b"] = {"config": {**cfg, "draws": list(cfg["draws"])}}
    path = os.path.join(directory, "corpus-b.zarr")
    try:
        store, out["store"] = make_store(f"(b) corpus {cfg['docs']} x {cfg['terms']}", corpus_store, path,
                                         cfg["docs"], cfg["terms"], cfg["groups"], cfg["block_rows"], cfg["topics"],
                                         cfg["topic_terms"], cfg["draws"])
        out["ingest_seconds"] = out["store"]["write_seconds"]
        out["nnz_per_row"] = store.nnz / store.shape[0]
        out["page_cache"] = page_cache(path)
        with dask_cluster(cfg["workers"], cfg["memory"], os.path.join(directory, "cluster-b")) as cluster:
            warm_up(cluster, directory, sparse=True)
            out["cluster"] = {"workers": cluster.n_workers, "memory_limit_per_worker_mib": mib(cluster.worker_limit),
                              "x_streamed": store.nbytes > cluster.memory_limit // 2}
            model = distfact.FairerNMF(cfg["rank"], n_estimates=cfg["n_estimates"],
                                       estimate_max_iter=cfg["estimate_max_iter"], max_iter=cfg["max_iter"], tol=0,
                                       estimate_tol=0, random_state=0)
            say(f"(b) fitting FairerNMF({cfg['rank']}, n_estimates={cfg['n_estimates']}) ...")
            with PeakMemory(cluster) as mem, get_task_stream(cluster.client) as stream:
                fit = timed_fit(model, store, cluster)
            out["fit_tasks"] = task_summary(stream.data, fit["fit_seconds"], cluster.n_workers)
            out["memory"] = mem.report()
            out["workers_alive_after"] = cluster.workers_alive()
        iters = [s for kind, _, s in fit["log"] if kind == "iteration"]
        n_est = cfg["estimate_max_iter"]
        fit["estimate_iteration_seconds"] = iters[:n_est]
        fit["scheme_iteration_seconds"] = iters[n_est:]
        out["fit"] = fit
        out["fit_seconds"] = fit["fit_seconds"]
        out["per_iteration_seconds"] = {"estimate_phase_median": float(np.median(iters[:n_est])),
                                        "scheme_median": float(np.median(iters[n_est:]))}
        out["passes"] = fit["n_passes"]
        out["group_errors"] = np.round(model.group_errors_, 4).tolist()
        say(f"(b) fit {fit['fit_seconds']:.1f} s, passes {fit['n_passes']}, E_l iterations "
            f"{np.round(iters[:n_est], 2).tolist()} s, scheme iterations {np.round(iters[n_est:], 2).tolist()} s; "
            f"workers on {fit['fit_cpu']['worker_cores']:.2f} cores, other processes "
            f"{fit['fit_cpu']['other_processes_cores']:.2f}; worker peak {out['memory']['max_worker_peak_mib']} MiB "
            f"of {out['memory']['worker_memory_limit_mib']}, restarts: {out['memory']['any_restart']}")
    finally:
        shutil.rmtree(path, ignore_errors=True)
        save()


def nmf_fit(cluster, store, cfg, label) -> dict:
    model = distfact.NMF(cfg["rank"], solver="mu", init="random", tol=0, max_iter=cfg["max_iter"], random_state=0)
    fit = timed_fit(model, store, cluster)
    fit.pop("log")
    cpu = fit["iterations_cpu"]
    say(f"{label}: fit {fit['fit_seconds']:.2f} s, median iteration {fit['median_iteration_seconds']:.4f} s "
        f"(workers on {cpu['worker_cores']:.2f} cores, other processes {cpu['other_processes_cores']:.2f}; worker CPU "
        f"{fit['worker_cpu_seconds_per_iteration']:.3f} s per iteration)")
    return fit


def part_cd(cfg, directory, results, save, do_c=True, do_d=True):
    """(c) on a 2-worker cluster; (d) alternates fits on that cluster and on a 1-worker one, both kept running."""
    base, n = cfg["rows"], cfg["cols"]
    factors = (1, 2, 4) if do_c else (4,)
    stores, paths = {}, {}
    out_c = results["c"] = {"config": cfg, "fits": {}} if do_c else None
    out_d = results["d"] = {"config": {**cfg, "rows": 4 * base}} if do_d else None
    try:
        for f in factors:
            paths[f] = os.path.join(directory, f"dense-c{f}.zarr")
            stores[f], info = make_store(f"(c) dense {f * base} x {n}", dense_store, paths[f], f * base, n, 4,
                                         cfg["block_rows"])
            if do_c:
                out_c.setdefault("stores", {})[f"{f}x"] = info
        with contextlib.ExitStack() as stack:
            two = stack.enter_context(dask_cluster(2, cfg["memory"], os.path.join(directory, "cluster-2w")))
            warm_up(two, directory)
            if do_c:
                out_c["x_in_worker_memory"] = {f"{f}x": stores[f].nbytes <= two.memory_limit // 2 for f in factors}
                for r in range(cfg["rounds"]):
                    for f in factors:
                        out_c["fits"].setdefault(f"{f}x", []).append(
                            nmf_fit(two, stores[f], cfg, f"(c) {f}x ({f * base} rows), round {r + 1}"))
                best = {f: min(fit["median_iteration_seconds"] for fit in out_c["fits"][f"{f}x"]) for f in factors}
                out_c["per_iteration_seconds"] = {f"{f}x": best[f] for f in factors}
                out_c["ratio_2x"] = best[2] / best[1]
                out_c["ratio_4x"] = best[4] / best[1]
                out_c["linear_2x"] = abs(out_c["ratio_2x"] / 2 - 1) <= 0.15
                out_c["linear_4x"] = abs(out_c["ratio_4x"] / 4 - 1) <= 0.15
                out_c["meets_goal"] = out_c["linear_2x"] and out_c["linear_4x"]
                cpu = {f: float(np.median([fit["worker_cpu_seconds_per_iteration"] for fit in out_c["fits"][f"{f}x"]]))
                       for f in factors}
                out_c["worker_cpu_seconds_per_iteration"] = {f"{f}x": cpu[f] for f in factors}
                out_c["cpu_ratio_2x"], out_c["cpu_ratio_4x"] = cpu[2] / cpu[1], cpu[4] / cpu[1]
                out_c["cpu_linear"] = abs(cpu[2] / cpu[1] / 2 - 1) <= 0.15 and abs(cpu[4] / cpu[1] / 4 - 1) <= 0.15
                out_c["worker_cores"] = {
                    f"{f}x": [fit["iterations_cpu"]["worker_cores"] for fit in out_c["fits"][f"{f}x"]] for f in factors}
                out_c["other_processes_cores"] = {
                    f"{f}x": [fit["iterations_cpu"]["other_processes_cores"] for fit in out_c["fits"][f"{f}x"]]
                    for f in factors}
                slope, intercept = np.polyfit([f * base for f in factors], [best[f] for f in factors], 1)
                out_c["least_squares_line"] = {"fixed_seconds": intercept, "seconds_per_100k_rows": slope * 1e5}
                say(f"(c) per iteration (best of {cfg['rounds']}) {out_c['per_iteration_seconds']}; t(2x)/t(1x) = "
                    f"{out_c['ratio_2x']:.2f} (2), t(4x)/t(1x) = {out_c['ratio_4x']:.2f} (4); linear within 15%: "
                    f"{out_c['meets_goal']}; line: {intercept:.3f} s + {slope * 1e5:.3f} s per 100k rows; worker CPU "
                    f"per iteration {cpu}: ratios {cpu[2] / cpu[1]:.2f}, {cpu[4] / cpu[1]:.2f}")
                save()
            if not do_d:
                return
            one = stack.enter_context(dask_cluster(1, cfg["memory"], os.path.join(directory, "cluster-1w")))
            warm_up(one, directory)
            out_d["x_in_worker_memory_1_worker"] = stores[4].nbytes <= one.memory_limit // 2
            fits1, fits2 = [], []
            for r in range(cfg["pairs"]):
                fits2.append(nmf_fit(two, stores[4], cfg, f"(d) 2 workers, pair {r + 1}"))
                fits1.append(nmf_fit(one, stores[4], cfg, f"(d) 1 worker, pair {r + 1}"))
        per1 = [f["median_iteration_seconds"] for f in fits1]
        per2 = [f["median_iteration_seconds"] for f in fits2]
        out_d.update({
            "fits_1_worker": fits1, "fits_2_workers": fits2,
            "per_iteration_seconds_1_worker": min(per1), "per_iteration_seconds_2_workers": min(per2),
            "speedup_per_pair": [a / b for a, b in zip(per1, per2)],
            "speedup_per_iteration": min(per1) / min(per2),
            "speedup_median_of_pairs": float(np.median([a / b for a, b in zip(per1, per2)])),
            "speedup_whole_fit": min(f["fit_seconds"] for f in fits1) / min(f["fit_seconds"] for f in fits2),
            "worker_cores_2_workers": [f["iterations_cpu"]["worker_cores"] for f in fits2],
            "worker_cores_1_worker": [f["iterations_cpu"]["worker_cores"] for f in fits1],
            "other_processes_cores_2_workers": [f["iterations_cpu"]["other_processes_cores"] for f in fits2],
            "other_processes_cores_1_worker": [f["iterations_cpu"]["other_processes_cores"] for f in fits1],
            "worker_cpu_seconds_per_iteration_2_workers": [f["worker_cpu_seconds_per_iteration"] for f in fits2],
            "worker_cpu_seconds_per_iteration_1_worker": [f["worker_cpu_seconds_per_iteration"] for f in fits1],
        })
        say(f"(d) per iteration (best of {cfg['pairs']}): 1 worker {min(per1):.4f} s, 2 workers {min(per2):.4f} s, "
            f"speed-up {out_d['speedup_per_iteration']:.2f} (pairs {np.round(out_d['speedup_per_pair'], 2).tolist()}); "
            f"whole fit {out_d['speedup_whole_fit']:.2f}")
    finally:
        for path in paths.values():
            shutil.rmtree(path, ignore_errors=True)
        save()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to check the script")
    parser.add_argument("--dir", default=None, help="where stores and cluster directories go (a new subdirectory, "
                                                    "removed at the end; default: the system's temporary directory)")
    parser.add_argument("--parts", default="a,b,c,d", help="comma-separated subset of a,b,c,d")
    parser.add_argument("--output", help="default: results/cluster.json (--quick: results/cluster-quick.json)")
    parser.add_argument("--rows", type=int, help="(c), (d): the 1x row count (default 100,000; 4x must stay in "
                                                 "the workers' memory: see --memory)")
    parser.add_argument("--memory", help="(c), (d): each worker's memory limit (default 4GiB)")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    cfg = QUICK if args.quick else FULL
    cfg["c"] = {**cfg["c"], **({"rows": args.rows} if args.rows else {}), **({"memory": args.memory} if args.memory
                                                                            else {})}
    output = args.output or os.path.join(HERE, "results", "cluster-quick.json" if args.quick else "cluster.json")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the clusters are stopped (finally blocks)
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
    directory = tempfile.mkdtemp(prefix="distfact-bench-cluster-", dir=args.dir)
    results = {"machine": machine(), "quick": args.quick, "parts": sorted(parts),
               "dask_config": os.environ.get("DASK_CONFIG", os.path.join(ROOT, "cluster", "dask.yaml")),
               "directory": directory}
    say("machine:", results["machine"])
    say("working in", directory)

    def save():
        write_results(results, output)

    started = time.perf_counter()
    try:
        if "a" in parts:
            part_a(cfg["a"], directory, results, save)
        if "b" in parts:
            part_b(cfg["b"], directory, results, save)
        if "c" in parts or "d" in parts:
            part_cd(cfg["c"], directory, results, save, do_c="c" in parts, do_d="d" in parts)
    finally:
        results["total_seconds"] = time.perf_counter() - started
        save()
        shutil.rmtree(directory, ignore_errors=True)
        say(f"done in {results['total_seconds']:.0f} s; removed {directory}")


if __name__ == "__main__":
    main()
