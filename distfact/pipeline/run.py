"""``distfact run SPEC``: ingest -> fit -> evaluate -> report -> publish into ``<root>/<name>/<date>/``.

Each stage writes into ``<stage>.partial/`` and is committed by writing ``COMMITTED`` (its input hash,
timings) last and renaming the directory to ``<stage>/``: a stage that fails leaves earlier stages committed
and nothing of its own (its partial directory is removed); a process killed mid-stage leaves only a partial
directory, which the next run discards, except the fit's with ``--resume``, whose checkpoints continue.

A stage's input hash chains the spec's sections it depends on and the upstream hashes, starting from a
content hash of the data: a rerun with the same spec and data finds every stage committed with its hash and
does nothing; a changed section redoes its stage and everything downstream; ``--force`` redoes all.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import glob
import hashlib
import json
import os
import re
import shutil
import sys
import time
import uuid

import numpy as np

from ..registry import get_method
from .._version import __version__
from ..estimators.persistence import load as load_model
from ..estimators.sweep import can_sweep, fit_many
from ..outputs import Locked, OutputDir, locked, read_text, settle, sibling, write_json
from ..outputs import file_sha256 as _file_digest  # (the name data_digest and stage_hashes use)
from ..reports.fits import group_metric_rows, read_fit_facts
from .alerts import ALERTS, evaluate_history, read_alerts
from .nightly import (RUN_KIND, WarmStart, previous_identity, previous_run, read_latest, retain, save_start,
                      warm_start)
from .select import selected_rank
from .spec import Spec, load_spec

STAGES = ("ingest", "fit", "evaluate", "report", "publish")
MARKER = "COMMITTED"


class StageFailed(RuntimeError):
    """A stage raised; ``stage`` names it (the CLI exits with status 1 and says which)."""

    def __init__(self, stage: str, error: BaseException, log: str | None = None):
        super().__init__(f"stage {stage!r} failed: {type(error).__name__}: {error}"
                         + (f" (the run's log: {log})" if log else ""))
        self.stage = stage


class RunLog:
    """Structured log lines (one JSON object per line) on stderr and, once a stage runs, in ``log.jsonl``."""

    def __init__(self, run_dir: str, name: str, date: str, stream=None):
        self.path, self.name, self.date = os.path.join(run_dir, "log.jsonl"), name, date
        self.stream = stream if stream is not None else sys.stderr
        self.to_file = False

    def terminal(self) -> bool:
        from ..engine.progress import is_terminal

        return is_terminal(self.stream)

    def progress_options(self, stage: str, **fields) -> dict:
        """What a :class:`distfact.engine.progress.Progress` of a stage's work takes to show it here: a bar on a
        terminal, else "progress" lines of this log (not written to its file)."""
        if self.terminal():
            return {"stream": self.stream}
        return {"emit": lambda line, figures: self(stage, "progress", to_file=False, message=line, **fields,
                                                   **figures)}

    def __call__(self, stage: str, event: str, to_file: bool = True, **fields) -> None:
        """One line; ``to_file=False``: on the stream only (progress, which would make the log differ run to run)."""
        line = json.dumps({"time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds"),
                           "pipeline": self.name, "date": self.date, "stage": stage, "event": event, **fields},
                          default=str)
        if self.terminal():  # over a progress bar being drawn (which its next update draws again below)
            self.stream.write("\r\x1b[K")
        print(line, file=self.stream, flush=True)
        if self.to_file and to_file:
            with open(self.path, "a") as f:
                f.write(line + "\n")


# -- hashes -----------------------------------------------------------------------------------------

def _digest(*parts) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(json.dumps(part, sort_keys=True, default=str).encode() if not isinstance(part, bytes) else part)
    return h.hexdigest()


def data_digest(spec: Spec, partitions: list[dict] | None = None) -> str:
    """A content hash of the input: SHA-256 of a source's file(s); the bundled data set's name (and distfact's
    version); for a store, which may be far larger than memory, a fingerprint instead of its bytes: its logical
    metadata (shape, groups with their norms, sums and non-zeros, blocks with their masks, version) plus the name,
    size and modification time of every file of its row blocks (each block's node: ``blocks/<key>`` or, for a
    block an append added, ``versions/<k>/blocks/<key>``; its mask's arrays are in it), so that rewriting any
    block or mask changes it, while adding column blocks (which some methods do to the store) does not. For a
    source of partitions (a pattern), the SHA-256 of every file it matches, by name: a night that brings no new
    partition has the previous night's digest; ``partitions`` (``night_partitions``) are the files of the night, by
    default every file the pattern matches now."""
    kind, value = spec.input["kind"], spec.input["value"]
    if kind == "dataset":
        return _digest("dataset", value, __version__)
    path = spec.input["path"]
    if spec.input.get("partitions"):
        files = matched_partitions(path) if partitions is None else partitions  # a night may have recorded none
        return _digest("partitions", *[(p["name"], p["sha256"]) for p in files])
    if kind == "store":
        from ..store import open_store

        store = open_store(path)
        meta = store.meta.to_json()
        meta.pop("column_blocks", None)
        files = sorted(f for block in store.blocks for f in _walk(os.path.join(path, block.node)))
        return _digest("store", meta, [(os.path.relpath(f, path), os.stat(f).st_size, os.stat(f).st_mtime_ns)
                                       for f in files])
    files = sorted(_walk(path)) if os.path.isdir(path) else [path]
    return _digest(kind, *[(os.path.relpath(f, path) if os.path.isdir(path) else "", _file_digest(f)) for f in files])


def matched_partitions(pattern: str) -> list[dict]:
    """``{"name", "sha256"}`` of every file ``pattern`` matches, in name order."""
    return [{"name": os.path.basename(f), "sha256": _file_digest(f)} for f in sorted(glob.glob(pattern))]


def night_partitions(spec: Spec, stage_dirs) -> dict | None:
    """For a source of partitions, what the run of a date reads: ``{"files": [{"name", "sha256"}], "metadata":
    the store version's metadata document or None}``. The files are fixed by the date's first ingest: the
    ``ingest/input.json`` of the first committed stage among ``stage_dirs`` (the date's committed run, then a build
    a failed run left) records them, with the store version they made (``store-version.json``), so that a rerun of
    a night reads that night's partitions and store version whatever arrived, changed or was removed since; a date
    with no record reads every file the pattern matches now. None for other sources."""
    if not spec.input.get("partitions"):
        return None
    for stage in stage_dirs:
        if _read_marker(stage) is None:
            continue
        record = os.path.join(stage, "input.json")
        with open(record) as f:
            files = json.load(f).get("partitions", {}).get("files")
        if files is None:  # recorded before runs kept their partitions' digests
            continue
        if not (isinstance(files, list) and all(
                isinstance(p, dict) and set(p) == {"name", "sha256"} and isinstance(p["name"], str)
                and isinstance(p["sha256"], str) and re.fullmatch(r"[0-9a-f]{64}", p["sha256"]) for p in files)):
            raise ValueError(f"{record}: 'partitions' 'files' must be a list of {{'name', 'sha256'}} records (the "
                             "file is damaged; move the run of this date aside to run it again)")
        with open(os.path.join(stage, STORE_VERSION)) as f:
            return {"files": files, "metadata": json.load(f)}
    return {"files": matched_partitions(spec.input["path"]), "metadata": None}


def _walk(path):
    for directory, _, names in os.walk(path):
        for name in names:
            yield os.path.join(directory, name)


def stage_hashes(spec: Spec, root: str, previous: str | None = None, partitions: list[dict] | None = None) -> dict:
    """Each stage's input hash; ``previous`` identifies the previous run (``nightly.py: previous_identity``), which
    warm-started fits and the evaluation (component ids, trends, alerts) build on; ``partitions``: the night's
    files, for a source of partitions (``night_partitions``)."""
    files = [_file_digest(path) for f in spec.fits for path in spec.input_files(f).values()]
    fits = [{"method": f.method, "ranks": f.ranks, "seed": f.seed, "params": f.params, "inputs": f.inputs,
             **({"select": f.select} if f.select is not None else {})} for f in spec.fits]
    out = {"ingest": _digest("ingest", data_digest(spec, partitions), {k: v for k, v in spec.input.items() if k != "path"})}
    warm = any(f.warm_start != "none" for f in spec.fits)
    out["fit"] = _digest("fit", out["ingest"], fits, files, *([previous] if warm else []))
    evaluation = {k: v for k, v in spec.nightly.items() if k != "keep"}
    out["evaluate"] = _digest("evaluate", out["fit"], spec.metrics, previous, evaluation)
    out["report"] = _digest("report", out["evaluate"], spec.report, spec.description)
    out["publish"] = _digest("publish", out["report"], root)
    return out


# -- the run ----------------------------------------------------------------------------------------

def check_url(url: str) -> None:
    """Before any work: ``url``'s protocols (several in a chained URL) are ones fsspec knows and can use here
    (their packages installed)."""
    for part in url.split("::"):  # chained URLs: simplecache::s3://bucket/runs
        _check_protocol(url, part.split("://", 1)[0] if "://" in part else part)


def _check_protocol(url: str, protocol: str) -> None:
    import fsspec

    try:
        fsspec.get_filesystem_class(protocol)
    except ValueError:
        raise ValueError(f"--output / [output] root {url!r}: unknown protocol {protocol!r} (fsspec knows "
                         f"{', '.join(sorted(p for p in fsspec.available_protocols() if len(p) > 1)[:12])}, ...)") \
            from None
    except ImportError as exc:
        raise ValueError(f"--output / [output] root {url!r}: the {protocol!r} protocol needs a package that is not "
                         f"installed ({exc})") from None


RunLocked = Locked  # another process is running the same pipeline and date


def run_pipeline(spec_path, *, date: str | None = None, root: str | None = None, resume: bool = False,
                 force: bool = False, scheduler: str | None = None, tls_dir=None, stream=None) -> dict:
    """Run (or skip, if committed with the same inputs) every stage. Returns ``{"run_dir", "ran", "skipped"}``.
    Spec problems raise :class:`distfact.pipeline.spec.SpecError` before any work; a stage that raises
    becomes :class:`StageFailed`; a run of the same pipeline and date in progress elsewhere, :class:`RunLocked`.

    ``root`` (default: the spec's ``[output] root``) is a local path, relative to the current directory, or
    an fsspec URL; for a URL the stages run in ``~/.cache/distfact/runs/<hash of the URL>/`` and publish uploads.
    ``scheduler`` and ``tls_dir`` (its certificates) override the spec's ``[cluster]``.

    The stages that run are built aside, in ``.<date>.partial/`` beside the run (an :class:`OutputDir`: the
    committed stages they build on are linked into it), and swapped into place in one step once publish has
    committed: a stage that fails, or a kill, leaves the date's previous run as it was (and ``LATEST``, the
    top-level ``metrics.json`` with it). Stages committed in the build by a run that failed later are reused by the
    next run, like those of the run itself; a fit's partial checkpoints only with ``resume``."""
    spec = load_spec(spec_path)
    date = date or dt.date.today().isoformat()
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", date):
        raise ValueError(f"--date must be YYYY-MM-DD, got {date!r}")
    try:
        dt.date.fromisoformat(date)
    except ValueError as exc:
        raise ValueError(f"--date {date!r} is not a calendar date") from exc
    root = root if root is not None else spec.root
    remote = "://" in root and not root.startswith("file://")
    if remote:
        check_url(root)
        local_root = os.path.join(os.path.expanduser("~/.cache/distfact/runs"), _digest(root)[:16])
    else:
        root = local_root = os.path.abspath(os.path.expanduser(root.removeprefix("file://")))
    run_dir = os.path.join(local_root, spec.name, date)
    previous = previous_run(os.path.dirname(run_dir), date)
    build = OutputDir(run_dir, RUN_KIND, overwrite=True, keep_all=True, option="the run", lock=False)
    log = RunLog(build.path, spec.name, date, stream)
    night = night_partitions(spec, [os.path.join(d, "ingest") for d in (run_dir, build.path)])
    hashes = stage_hashes(spec, root, previous_identity(previous), None if night is None else night["files"])
    context = {"night": night, "previous": previous, "spec": spec, "run_dir": build.path, "final_dir": run_dir, "root": root, "remote": remote,
               "resume": resume, "scheduler": scheduler, "tls_dir": tls_dir, "log": log, "date": date,
               "fit_hash": hashes["fit"]}
    os.makedirs(os.path.dirname(run_dir), exist_ok=True)
    with locked(sibling(run_dir, "lock"), f"a run of {spec.name} for {date}"), contextlib.ExitStack() as stack:
        settle(run_dir, RUN_KIND)
        ran, skipped, reused = [], [], []
        for stage in STAGES:
            source = None if force or ran else next(
                (d for d in (os.path.join(run_dir, stage), os.path.join(build.path, stage))
                 if (_read_marker(d) or {}).get("hash") == hashes[stage]), None)
            if source is not None:
                skipped.append(stage)
                reused.append(source)
                log(stage, "skip", hash=hashes[stage][:12], reason="committed with the same inputs")
                continue
            if not ran:
                stack.enter_context(build)
                _start_build(build.path, run_dir, spec, reused, STAGES[STAGES.index(stage):])
                log.to_file = True
            _run_stage(stage, hashes[stage], context)
            ran.append(stage)
        built_aside = any(os.path.dirname(source) == build.path for source in reused)
        if built_aside and not ran:  # committed aside by a run stopped before its swap
            stack.enter_context(build)
            _start_build(build.path, run_dir, spec, reused, ())
        if built_aside or ran:
            shutil.copyfile(os.path.join(build.path, "publish", "metrics.json"),
                            os.path.join(build.path, "metrics.json"))
            shutil.copyfile(os.path.join(build.path, "evaluate", ALERTS), os.path.join(build.path, ALERTS))
            build.commit()
        _update_latest(run_dir, date)
    alerts = read_alerts(run_dir)
    if spec.nightly.get("keep"):
        retain(os.path.dirname(run_dir), spec.nightly["keep"], log, made=date)
    if not ran:
        log("run", "up-to-date", message=f"{run_dir}: every stage is committed with the same spec and data; "
                                         "nothing to do (--force redoes it)")
    return {"run_dir": run_dir, "ran": ran, "skipped": skipped, "alerts": alerts}


def _start_build(build: str, run_dir: str, spec: Spec, reused: list[str], to_run) -> None:
    """The build directory holds the reused stages (linked from the run if they are its), the run's log so far, the
    spec, and nothing of the stages about to run but a fit's partial directory (which ``_run_stage`` keeps or
    discards)."""
    for source in reused:
        target = os.path.join(build, os.path.basename(source))
        if source != target:
            if os.path.lexists(target):
                shutil.rmtree(target)
            link_tree(source, target)
    for stage in to_run:
        if os.path.isdir(os.path.join(build, stage)):  # committed by an earlier attempt with other inputs
            shutil.rmtree(os.path.join(build, stage))
    old_log, new_log = os.path.join(run_dir, "log.jsonl"), os.path.join(build, "log.jsonl")
    if os.path.isfile(old_log) and not os.path.exists(new_log):
        shutil.copyfile(old_log, new_log)  # the date's history continues (appended to: a copy, not a link)
    shutil.copyfile(spec.path, os.path.join(build, "spec.toml"))


def link_tree(source: str, target: str) -> None:
    """``target`` as a copy of the directory ``source``: files hard-linked (distfact writes a new file, aside
    and renamed, rather than into an existing one), metadata (``*.json``, which a stage may rewrite, e.g. the
    store's ``zarr.json`` when column blocks are added, and some Zarr versions do so in place) copied, as is any
    file that cannot be linked."""
    for top, dirs, names in os.walk(source):
        here = os.path.join(target, os.path.relpath(top, source))
        os.makedirs(here, exist_ok=True)
        for name in names:
            origin, copy = os.path.join(top, name), os.path.join(here, name)
            try:
                if name.endswith(".json"):
                    raise OSError("copied")
                os.link(origin, copy)
            except OSError:
                shutil.copy2(origin, copy)


def _update_latest(run_dir: str, date: str) -> None:
    """``LATEST`` beside the dated runs names the newest date with a committed run (a backfill of an older date
    leaves it), under a lock shared by the pipeline's dates; also after a run that had nothing to do, so that a
    process killed between its swap and this corrects itself."""
    if _read_marker(os.path.join(run_dir, "publish")) is None:
        return
    runs = os.path.dirname(run_dir)
    latest = os.path.join(runs, "LATEST")
    with locked(os.path.join(runs, ".LATEST.lock"), f"updating {latest}"):
        if date > (read_latest(runs) or ""):
            aside = f"{latest}.partial-{uuid.uuid4().hex[:8]}"
            with open(aside, "w") as f:
                f.write(date + "\n")
            os.replace(aside, latest)


def _read_marker(stage_dir: str):
    path = os.path.join(stage_dir, MARKER)
    try:
        with open(path) as f:
            marker = json.load(f)
    except (OSError, ValueError):  # absent, or damaged: the stage is not committed (it runs again)
        return None
    return marker if isinstance(marker, dict) else None


def _run_stage(stage: str, digest: str, context: dict) -> None:
    run_dir, log = context["run_dir"], context["log"]
    final, partial = os.path.join(run_dir, stage), os.path.join(run_dir, f"{stage}.partial")
    resumable = stage == "fit" and context["resume"] and _partial_hash(partial) == digest
    if os.path.exists(partial) and not resumable:
        reason = ("made with another spec or data" if stage == "fit" and context["resume"] else
                  "left by an interrupted run" + (" (--resume continues an interrupted fit)" if stage == "fit" else ""))
        log(stage, "discard", message=f"removing {partial}, {reason}")
        shutil.rmtree(partial)
    os.makedirs(partial, exist_ok=True)
    with open(os.path.join(partial, "HASH"), "w") as f:  # what a --resume must match
        f.write(digest)
    log(stage, "start", hash=digest[:12])
    started = time.perf_counter()
    try:
        facts = STAGE_FUNCTIONS[stage](partial, context) or {}
    except (KeyboardInterrupt, SystemExit):  # like a kill: the fit's checkpoints stay for --resume
        log(stage, "interrupted", seconds=round(time.perf_counter() - started, 3))
        raise
    except Exception as exc:
        shutil.rmtree(partial, ignore_errors=True)
        log(stage, "fail", seconds=round(time.perf_counter() - started, 3), error=f"{type(exc).__name__}: {exc}")
        raise StageFailed(stage, exc, log.path) from exc
    seconds = time.perf_counter() - started
    write_json(os.path.join(partial, MARKER), {  # written last: the stage's outputs are complete
        "stage": stage, "hash": digest, "seconds": seconds, "finished": dt.datetime.now(dt.timezone.utc).isoformat(),
        "distfact": __version__, **facts}, indent=1)
    os.rename(partial, final)  # the build holds no committed copy of a stage that runs (_start_build)
    log(stage, "done", seconds=round(seconds, 3), hash=digest[:12])


def _partial_hash(partial: str):
    return read_text(os.path.join(partial, "HASH"))


# -- the stages -------------------------------------------------------------------------------------

def open_input(run_dir: str):
    """The grouped matrix the ingest stage committed: for partitions appended to a persistent store, the version
    of the store the stage ingested (its metadata kept beside ``input.json``), whatever was appended since."""
    from ..store import GroupedMatrix, open_store

    with open(os.path.join(run_dir, "ingest", "input.json")) as f:
        store = json.load(f)["store"]
    pinned = os.path.join(run_dir, "ingest", STORE_VERSION)
    if os.path.isfile(pinned):
        with open(pinned) as f:
            return GroupedMatrix.open(store, version_metadata=json.load(f))
    return open_store(store if os.path.isabs(store) else os.path.join(run_dir, "ingest", store))


SOURCE_OPTIONS = ("group_column", "signed", "text_field", "group_field", "vectorizer", "max_features", "block_rows")
STORE_VERSION = "store-version.json"  # the metadata of the version of a persistent store a run ingested
PARTITIONS_STORE = "store.zarr"  # the persistent store of a source of partitions, by default beside the runs


def partitions_store(spec: Spec, runs_dir: str) -> str:
    """Where the runs of a spec whose source is a pattern of partitions append them: ``[input] store_path``, or
    ``store.zarr`` beside the dated runs (``<root>/<name>/``)."""
    return spec.input.get("store_path") or os.path.join(runs_dir, PARTITIONS_STORE)


def ingest_partitions(options: dict, dest: str, night: dict, log):
    """The night's partitions (``night_partitions``) into the store ``dest``, in name order: those the store holds
    (by content: their SHA-256 among those its ``ingests`` record) skipped, whatever their names (a backfill, a copy
    under another name, a rerun: the file need not exist any more), the first ever into a new store (the source's
    ingest, which fixes its columns and vocabulary), the others appended, each as a version. Returns the store (the
    version the night recorded when it holds the night's partitions, else the store as it is) and ``{"ingested":
    [names], "skipped": [names], "rows": rows added, "files": the night's files}``. Idempotent: what a run killed
    midway appended is skipped by the next."""
    from ..store import GroupedMatrix
    from ..store.append import ingested_sources
    from ..store.sources import append_source, ingest_source

    folder = os.path.dirname(options["path"])
    exists = os.path.exists(os.path.join(dest, "zarr.json"))
    if not night["files"] and not exists:
        raise ValueError(f"no partition matches {options['value']!r} and the store {dest!r} does not exist yet")
    source_options = {key: options[key] for key in SOURCE_OPTIONS if key in options}
    record = {"ingested": [], "skipped": [], "rows": 0, "files": night["files"]}
    held = ingested_sources(GroupedMatrix.open(dest).meta) if exists else {}
    for partition in night["files"]:
        name, file = partition["name"], os.path.join(folder, partition["name"])
        if partition["sha256"] in held:
            record["skipped"].append(name)
            continue
        if not os.path.isfile(file) or _file_digest(file) != partition["sha256"]:
            raise ValueError(f"partition {file!r} changed or vanished since the run listed it (SHA-256 "
                             f"{partition['sha256'][:12]}...): run the night again")
        if not os.path.exists(os.path.join(dest, "zarr.json")):
            data = ingest_source(file, dest, **source_options)
            outcome = {"version": 0, "rows": data.shape[0]}
        else:
            data, outcome = append_source(file, dest, group_column=options.get("group_column"),
                                          block_rows=options.get("block_rows"))
        record["skipped" if outcome["version"] is None else "ingested"].append(name)
        record["rows"] += outcome["rows"]
    log("ingest", "partitions", ingested=len(record["ingested"]), skipped=len(record["skipped"]),
        rows=record["rows"], store=dest)
    pinned = night["metadata"]
    if not record["ingested"] and pinned is not None and pinned.get("version", 0) >= max(
            (held[p["sha256"]] for p in night["files"]), default=0):
        return GroupedMatrix.open(dest, version_metadata=pinned), record
    return GroupedMatrix.open(dest), record


def stage_ingest(out: str, context: dict) -> dict:
    from ..datasets import (load_digits_grouped, load_heart_disease, load_heart_multigroup, make_fairer_synthetic,
                            make_stratified_synthetic)
    from ..store import from_arrays, open_store
    from ..store.sources import ingest_source

    spec = context["spec"]
    kind, options = spec.input["kind"], spec.input
    target = os.path.join(out, "data.zarr")
    if kind == "store":
        data = open_store(options["path"])
        store = os.path.abspath(options["path"])
    elif kind == "dataset":
        loader = {"digits": load_digits_grouped, "heart": load_heart_disease, "heart-multigroup": load_heart_multigroup,
                  "fairer-synthetic": lambda: (*make_fairer_synthetic(), None),
                  "stratified-synthetic": lambda: (*make_stratified_synthetic()[:2], None)}[options["value"]]
        X, groups, names = loader()
        data = from_arrays(X, groups, target, feature_names=names, signed=options["value"] == "heart-multigroup",
                           block_rows=options.get("block_rows"))
        store = "data.zarr"
    elif options.get("partitions"):
        data, partitions = ingest_partitions(options, partitions_store(spec, os.path.dirname(context["final_dir"])),
                                             context["night"], context["log"])
        store = data.path
    else:
        data = ingest_source(options["path"], target, **{key: options[key] for key in SOURCE_OPTIONS if key in options})
        store = "data.zarr"
    if options.get("column_blocks") and not data.has_column_blocks:
        data = data.with_column_blocks()
    if options.get("partitions"):  # the version this run reads, whatever later runs append
        write_json(os.path.join(out, STORE_VERSION), data.meta.to_json())
    write_json(os.path.join(out, "input.json"), {
        "store": store, "shape": list(data.shape), "groups": dict(zip(data.group_names, data.group_sizes.tolist())),
        "layout": data.layout, "nnz": int(data.nnz),
        **({"version": data.meta.version, "partitions": partitions} if options.get("partitions") else {})}, indent=1)
    return {"shape": list(data.shape), "n_groups": data.n_groups}


def fit_runs(spec: Spec) -> list[tuple[str, object, int | None]]:
    """``(directory name, fit spec, rank)`` of every fit: one per rank, except for a method whose one fit gives
    every rank (``nested_ranks``, as the multigroup SVD's consistent components), fitted once at the largest,
    and a fit with ``ranks = "auto"``, ``<method>-auto`` of rank None (the rank its selection chooses)."""
    names = [f.method for f in spec.fits]
    out = []
    for i, fit in enumerate(spec.fits):
        suffix = f"-{i + 1}" if names.count(fit.method) > 1 else ""
        if fit.select is not None:
            out.append((f"{fit.method}{suffix}-auto", fit, None))
            continue
        ranks = [max(fit.ranks)] if get_method(fit.method).nested_ranks else fit.ranks
        out += [(f"{fit.method}{suffix}-r{rank}", fit, rank) for rank in ranks]
    return out


def stage_fit(out: str, context: dict) -> dict:
    from ..engine.cluster import client_for

    spec, log = context["spec"], context["log"]
    data = open_input(context["run_dir"])
    cluster = spec.cluster
    address = context["scheduler"] or cluster.get("address") or cluster.get("scheduler_file")  # files end in .json
    workers = cluster["workers"] if cluster["kind"] == "local" and not context["scheduler"] else None
    facts = {}
    tls_dir = context["tls_dir"] or cluster.get("tls_dir")
    with client_for(address if (context["scheduler"] or cluster["kind"] == "scheduler") else None, workers,
                    tls_dir) as client:
        facts["scheduler"] = "in-process" if client is None else client.scheduler.address
        facts["workers"] = 0 if client is None else len(client.scheduler_info()["workers"])
        pending = []
        for name, fit, rank in fit_runs(spec):
            if os.path.exists(os.path.join(out, name, "DONE")):
                log("fit", "skip-fit", fit=name, reason="finished before the interruption")
            else:
                pending.append((name, fit, rank))
        for fit in spec.fits:
            runs = [(name, rank) for name, of, rank in pending if of is fit]
            for name, _ in runs:
                os.makedirs(os.path.join(out, name), exist_ok=True)
            if len(runs) > 1 and can_sweep(get_method(fit.method).estimator) and fit.warm_start == "none":
                started = time.perf_counter()
                models = _fit_sweep(fit, runs, data, out, client, spec,
                                    log.progress_options("fit", fits=[name for name, _ in runs]))
                seconds = time.perf_counter() - started
                log("fit", "sweep-done", fits=[name for name, _ in runs], seconds=round(seconds, 3),
                    n_passes=int(models[0].sweep_passes_))
                for (name, rank), model in zip(runs, models):  # each fit's share of the sweep's time
                    _commit_fit(os.path.join(out, name), name, fit, rank, model, seconds / len(runs), log)
                continue
            for name, rank in runs:  # a warm start per rank: each its own fit
                started = time.perf_counter()
                if fit.select is not None:  # ranks = "auto": the rank select_rank chooses, then its fit
                    rank = selected_rank(fit, name, data, os.path.join(out, name), client, spec, log)
                start = warm_start(context["previous"], name, fit, rank, data, client, log)
                model = _fit_one(fit, rank, data, os.path.join(out, name), client, spec, context["resume"],
                                 log.progress_options("fit", fit=name), start)
                if fit.warm_start != "none":
                    save_start(os.path.join(out, name), model, data)
                _commit_fit(os.path.join(out, name), name, fit, rank, model, time.perf_counter() - started, log,
                            start.note)
    return facts


def _commit_fit(directory: str, name: str, fit, rank: int, model, seconds: float, log, warm_from: str = "") -> None:
    """A fit's files, then its DONE marker (a fit of a sweep records the sweep's passes over X too)."""
    np.save(os.path.join(directory, "components.npy"), model.components_)
    model.save(os.path.join(directory, "model.npz"))  # distfact's model format: no pickle
    n_iter = model.n_iter_.tolist() if isinstance(model.n_iter_, np.ndarray) else int(model.n_iter_)
    facts = {"method": fit.method, "rank": rank, "seconds": seconds, "n_iter": n_iter,
             "n_passes": int(model.n_passes_), "scheduler": model.scheduler_}
    if hasattr(model, "sweep_passes_"):
        facts["sweep_passes"] = int(model.sweep_passes_)
    if warm_from:
        facts["warm_start"] = warm_from  # the date of the run it started from
    write_json(os.path.join(directory, "fit.json"), facts, indent=1)
    open(os.path.join(directory, "DONE"), "w").close()
    shutil.rmtree(os.path.join(directory, "checkpoints"), ignore_errors=True)  # only needed to resume
    log("fit", "fit-done", fit=name, seconds=round(seconds, 3), n_iter=n_iter, n_passes=int(model.n_passes_))


def _fit_one(fit, rank: int, data, directory: str, client, spec: Spec, resume: bool, progress_options: dict,
             start=None):
    """One fit, from the method's own start or ``start`` (a :class:`~distfact.pipeline.nightly.WarmStart`)."""
    from ..engine.progress import show_iterations

    declaration = get_method(fit.method)
    checkpoints = dict(checkpoint_dir=directory, checkpoint_every=spec.checkpoint_every,  # -> directory/checkpoints/
                       resume=resume) if spec.checkpoint_every else {}
    start = start or WarmStart()
    model = declaration.make(rank, {**fit.params, **start.params}, random_state=fit.seed, **checkpoints)
    progress = show_iterations(model, f"{os.path.basename(directory)}: iteration", **progress_options)
    inputs = {**fit.inputs, **spec.input_files(fit)}
    model.fit(data, **declaration.fit_arguments(model, inputs, data, client, W_out=os.path.join(directory, "W")),
              **start.factors)
    if progress is not None:
        progress.close()
        model.set_params(callback=None)  # (the model is saved: its parameters as given)
    return model


def _fit_sweep(fit, runs: list, data, out: str, client, spec: Spec, progress_options: dict) -> list:
    """The ranks of one [[fit]] table in the same passes over X (``distfact.fit_many``; a sweep writes no
    checkpoints: interrupted, its ranks are fitted again), with one progress for the sweep's iterations."""
    from ..engine.progress import show_iterations

    declaration = get_method(fit.method)
    models = [declaration.make(rank, fit.params, random_state=fit.seed) for _, rank in runs]
    progress = show_iterations(models[0], f"{fit.method} ranks {runs[0][1]}..{runs[-1][1]}: iteration",
                               **progress_options)
    if progress is not None:
        for model in models[1:]:
            model.set_params(callback=progress.iteration)  # each running model tells its iteration
    arguments = declaration.fit_arguments(models[0], {**fit.inputs, **spec.input_files(fit)}, data, client,
                                          W_out=os.path.join(out, runs[0][0], "W"))
    W_out = [os.path.join(out, name, "W") for name, _ in runs] if arguments.pop("W_out", None) else None
    models = fit_many(models, data, W_out=W_out, **arguments)
    if progress is not None:
        progress.close()
        for model in models:
            model.set_params(callback=None)  # (the models are saved: their parameters as given)
    return models


def load_fits(run_dir: str, spec: Spec) -> list[dict]:
    """Every committed fit: its name, spec, rank, model (``distfact.load``: nothing is unpickled) and facts
    (``fit.json``, checked: ValueError naming the file and the field)."""
    out = []
    for name, fit, rank in fit_runs(spec):
        directory = os.path.join(run_dir, "fit", name)
        model = load_model(os.path.join(directory, "model.npz"))
        facts = read_fit_facts(os.path.join(directory, "fit.json"), ("seconds", "n_passes", "n_iter", "rank"))
        rank = facts["rank"] if rank is None else rank  # ranks = "auto": the rank chosen
        out.append({"name": name, "fit": fit, "method": get_method(fit.method), "rank": rank, "model": model,
                    "facts": facts})
    return out


def stage_evaluate(out: str, context: dict) -> dict:
    import pandas as pd

    spec = context["spec"]
    fits = load_fits(context["run_dir"], spec)
    rows = [row for e in fits for row in group_metric_rows(e["name"], e["method"], e["rank"], e["model"],
                                                            spec.metrics[e["fit"].method], e["fit"].ranks)]
    table = pd.DataFrame(rows)
    table.to_csv(os.path.join(out, "group_metrics.csv"), index=False)
    worst = table.loc[table.groupby(["fit", "rank", "metric"], sort=False)["value"].idxmax()]  # in fit order
    summary = {"fits": [{"fit": e["name"], "method": e["fit"].method, "rank": e["rank"], **e["facts"]} for e in fits],
               "worst_group": worst.to_dict(orient="records")}
    write_json(os.path.join(out, "metrics.json"), summary, indent=1)
    found = evaluate_history(out, context, fits, table)
    return {"rows": len(table), "alerts": len(found)}


def read_group_metrics(run_dir: str):
    """evaluate/group_metrics.csv with group names as written (a group may be called "NA" or "null")."""
    import pandas as pd

    return pd.read_csv(os.path.join(run_dir, "evaluate", "group_metrics.csv"), keep_default_na=False,
                       dtype={"group": str, "fit": str, "method": str, "metric": str})


def stage_report(out: str, context: dict) -> dict:
    from ..reports.pipeline import write_pipeline_report

    run_dir = context["run_dir"]
    paths = write_pipeline_report(out, context, load_fits(run_dir, context["spec"]), read_group_metrics(run_dir))
    return {"html": os.path.relpath(paths["html"], out)}


def stage_publish(out: str, context: dict) -> dict:
    """The run's ``metrics.json`` (stage timings, the input, where it ran, the evaluation), copied to the run's
    top once committed, with ``LATEST`` beside the dated runs; with an fsspec URL root, the report, the tables,
    ``metrics.json`` and ``LATEST`` uploaded to ``<url>/<name>/<date>/`` (replacing an earlier upload),
    ``PUBLISHED`` last."""
    run_dir, spec = context["run_dir"], context["spec"]
    stages = {stage: _read_marker(os.path.join(run_dir, stage)) for stage in STAGES[:-1]}
    with open(os.path.join(run_dir, "evaluate", "metrics.json")) as f:
        evaluation = json.load(f)
    with open(os.path.join(run_dir, "ingest", "input.json")) as f:
        data = json.load(f)
    metrics = {"pipeline": spec.name, "date": context["date"], "distfact": __version__,
               "stage_seconds": {s: m["seconds"] for s, m in stages.items()},
               "input": {"kind": spec.input["kind"], "value": spec.input["value"], **data},
               "scheduler": stages["fit"].get("scheduler"), "workers": stages["fit"].get("workers"), **evaluation}
    write_json(os.path.join(out, "metrics.json"), metrics, indent=1)
    destination = context["final_dir"]
    if context["remote"]:
        import fsspec

        destination = f"{context['root'].rstrip('/')}/{spec.name}/{context['date']}"
        fs, target = fsspec.core.url_to_fs(destination)
        if fs.exists(target):
            fs.rm(target, recursive=True)
        fs.makedirs(target + "/report", exist_ok=True)
        for name in sorted(os.listdir(os.path.join(run_dir, "report"))):
            if name != MARKER:
                fs.put_file(os.path.join(run_dir, "report", name), f"{target}/report/{name}")
        fs.put_file(os.path.join(out, "metrics.json"), f"{target}/metrics.json")
        fs.put_file(os.path.join(run_dir, "evaluate", "group_metrics.csv"), f"{target}/group_metrics.csv")
        latest = f"{context['root'].rstrip('/')}/{spec.name}/LATEST"
        latest_fs, latest_path = fsspec.core.url_to_fs(latest)
        current = latest_fs.cat(latest_path).decode().strip() if latest_fs.exists(latest_path) else ""
        if context["date"] >= current:
            with latest_fs.open(latest_path, "w") as f:
                f.write(context["date"] + "\n")
        with fs.open(f"{target}/PUBLISHED", "w") as f:
            f.write(json.dumps({"date": context["date"], "published": dt.datetime.now(dt.timezone.utc).isoformat()}))
    return {"destination": destination}


STAGE_FUNCTIONS = {"ingest": stage_ingest, "fit": stage_fit, "evaluate": stage_evaluate, "report": stage_report,
                   "publish": stage_publish}
