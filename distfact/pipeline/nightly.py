"""What a nightly pipeline knows of the nights before: the previous published run, warm starts from its factors,
component ids kept across runs, and retention of old runs.

A *run* here is a directory ``<root>/<name>/<YYYY-MM-DD>/`` that distfact wrote and can recognise: its manifest
(``distfact-output.json``, written last by :class:`distfact.outputs.OutputDir`) says it is a pipeline run, and its
publish stage is committed. Anything else beside the runs (a directory being removed by retention, a build in
progress, a user's file) is no run: never listed, never used as the previous run, never removed.

Rows are identified across nights by their input row number (``GroupedMatrix.row_index()``): a source that grows
does so at its end (new rows after the old ones, as an append or a re-ingest of the longer source gives them), so
row ``i`` of tonight is row ``i`` of last night for every ``i`` last night had.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import uuid

import numpy as np

from ..outputs import (MANIFEST, MANIFEST_FORMAT, Locked, file_sha256, locked, read_manifest, read_text,
                       remove_output, sibling, write_json)

RUN_KIND = "pipeline run"
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
#: a fit's warm-start factors (H, and W by input row number) and their facts, beside its model
START_FILE, START_FACTS = "start.npz", "start.json"
#: a run directory renamed aside by retention before it is removed (:func:`_aside`): not a date, so no longer a run
REMOVING = re.compile(r"\.\d{4}-\d{2}-\d{2}\.removing-[0-9a-f]{8}")
#: a date's run lock (``outputs.sibling(run, "lock")``), which ``outputs.locked`` fills with its holder's pid
RUN_LOCK = re.compile(r"\.(\d{4}-\d{2}-\d{2})\.lock")
WARM_STARTS = ("none", "previous")


# -- runs -------------------------------------------------------------------------------------------

def is_run(path: str) -> bool:
    """``path`` is a complete pipeline run distfact wrote: a date-named directory whose manifest says so, with its
    publish stage committed."""
    if not DATE.fullmatch(os.path.basename(path)) or os.path.islink(path) or not os.path.isdir(path):
        return False
    try:
        with open(os.path.join(path, MANIFEST)) as f:
            manifest = json.load(f)
        with open(os.path.join(path, "publish", "COMMITTED")) as f:
            published = json.load(f)
    except (OSError, ValueError):
        return False
    return (isinstance(manifest, dict) and manifest.get("format") == MANIFEST_FORMAT
            and manifest.get("kind") == RUN_KIND and isinstance(published, dict) and published.get("stage") == "publish")


def published_runs(runs_dir: str) -> list[str]:
    """The dates of the complete runs in ``runs_dir`` (``<root>/<name>``), oldest first."""
    if not os.path.isdir(runs_dir):
        return []
    return sorted(name for name in os.listdir(runs_dir) if is_run(os.path.join(runs_dir, name)))


def previous_run(runs_dir: str, date: str) -> str | None:
    """The newest complete run dated before ``date`` (its directory), or None (the first night)."""
    earlier = [d for d in published_runs(runs_dir) if d < date]
    return os.path.join(runs_dir, earlier[-1]) if earlier else None


def previous_identity(previous: str | None) -> str | None:
    """What identifies the previous run in this run's stage hashes: its date and the hash its publish stage
    committed (so a rerun finds the same previous run and does nothing, and a redone previous night redoes what
    builds on it)."""
    if previous is None:
        return None
    with open(os.path.join(previous, "publish", "COMMITTED")) as f:
        return f"{os.path.basename(previous)}:{json.load(f)['hash']}"


# -- warm starts ------------------------------------------------------------------------------------

def can_warm_start(method: str) -> bool:
    """A method warm-starts when its estimator takes init='custom' with W and H first among its custom factors
    (read from the estimator's constraints and ``_custom_factors``)."""
    from ..registry import get_method  # here: the registry imports every estimator, which retention never needs

    declaration = get_method(method)
    init = declaration.parameters().get("init")
    factors = getattr(declaration.estimator, "_custom_factors", ())
    return init is not None and "custom" in (init.choices or ()) and tuple(factors[:2]) == ("W", "H")


def warm_start_methods() -> list[str]:
    from ..registry import methods

    return [name for name in methods() if can_warm_start(name)]


def save_start(directory: str, model, data) -> None:
    """The fit's factors a later night starts from, into ``directory``: ``start.npz`` holding H (the components)
    and W by input row number (read back from ``W/``, block by block), and ``start.json`` with their shapes,
    dtype and the file's SHA-256 (what :func:`read_start` checks)."""
    from ..engine.executor.spill import load_local

    W_stored = np.concatenate([np.asarray(load_local(os.path.join(directory, "W"), block)) for block in data.blocks])
    W = np.empty_like(W_stored)
    W[data.row_index()] = W_stored
    H = np.asarray(model.components_)
    path = os.path.join(directory, START_FILE)
    aside = f"{path}.partial-{uuid.uuid4().hex[:8]}.npz"
    np.savez(aside, H=H, W=W)
    os.replace(aside, path)
    write_json(os.path.join(directory, START_FACTS), {"H": list(H.shape), "W": list(W.shape), "dtype": str(H.dtype),
                                                      "sha256": file_sha256(path)}, indent=1)


def read_start(directory: str, rank: int, n_features: int) -> tuple[np.ndarray, np.ndarray]:
    """(H, W by input row number) from a previous run's fit ``directory``, checked: the file's SHA-256 against
    the one recorded, exactly the arrays H and W, float dtypes, H of shape (rank, n_features), W of rank columns,
    finite and non-negative. Nothing is unpickled. ValueError naming the file and what is wrong."""
    path = os.path.join(directory, START_FILE)
    try:
        with open(os.path.join(directory, START_FACTS)) as f:
            facts = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{directory}: no readable {START_FACTS} ({exc})") from None
    if not isinstance(facts, dict) or facts.get("sha256") != file_sha256(path):
        raise ValueError(f"{path}: its SHA-256 is not the one the run recorded in {START_FACTS} (damaged or changed)")
    with np.load(path, allow_pickle=False) as arrays:
        if sorted(arrays.files) != ["H", "W"]:
            raise ValueError(f"{path}: holds {sorted(arrays.files)}, expected H and W")
        H, W = arrays["H"], arrays["W"]
    for name, array, shape in (("H", H, (rank, n_features)), ("W", W, (W.shape[0], rank))):
        if array.dtype.kind != "f" or array.ndim != 2 or array.shape != shape or list(array.shape) != facts.get(name):
            raise ValueError(f"{path}: {name} has dtype {array.dtype} and shape {array.shape}, expected floats of "
                             f"shape {shape} as recorded ({facts.get(name)})")
        if not np.isfinite(array).all() or (array < 0).any():
            raise ValueError(f"{path}: {name} is not finite and non-negative")
    return H, W


def _recorded_rank(directory: str):
    """The rank the previous run's start file records (its H's rows), or None when unreadable (then
    :func:`read_start` says what is wrong)."""
    try:
        with open(os.path.join(directory, START_FACTS)) as f:
            return json.load(f)["H"][0]
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None


class WarmStart:
    """A fit's start from the previous run: the parameters (init='custom') and ``fit``'s factors, or nothing (a
    cold start: the first night, or a fit the previous run did not have)."""

    def __init__(self, params: dict | None = None, factors: dict | None = None, note: str = ""):
        self.params, self.factors, self.note = params or {}, factors or {}, note


def warm_start(previous: str | None, name: str, fit, rank: int, data, client, log) -> WarmStart:
    """The start of fit ``name`` (rank ``rank``) of the data ``data`` from the previous run: its H, its W for
    the rows it had, and for new rows the previous model's solve of them (``transform``: one read of X), or, where
    the model cannot solve them (a stratum it never saw), the mean of its rows of W; the method's other custom
    factors from the previous model (``_warm_factors``). Logged, as is the fallback to a cold start."""
    from ..estimators.persistence import load as load_model

    if getattr(fit, "warm_start", "none") != "previous":
        return WarmStart()
    directory = None if previous is None else os.path.join(previous, "fit", name)
    if directory is None or not os.path.isfile(os.path.join(directory, START_FILE)):
        reason = "no previous run" if previous is None else f"the previous run {previous} has no fit {name}"
        log("fit", "cold-start", fit=name, reason=f"{reason}: the method's own start")
        return WarmStart()
    previous_rank = _recorded_rank(directory)
    if previous_rank is not None and previous_rank != rank:  # ranks = "auto" chose another rank tonight: nothing of the same shape to start from
        log("fit", "cold-start", fit=name, reason=f"the previous run's rank was {previous_rank}, tonight's is {rank}: "
            "the method's own start")
        return WarmStart()
    H, W_before = read_start(directory, rank, data.shape[1])
    model = load_model(os.path.join(directory, "model.npz"))
    m, kept = data.shape[0], min(data.shape[0], W_before.shape[0])  # rows by input row number
    if kept == m:
        W, solved = W_before[:m].copy(), "none"
    else:
        try:
            W, solved = np.array(model.transform(data, client=client), dtype=W_before.dtype), "solve"
        except ValueError as exc:  # a new stratum the previous model cannot represent
            W = np.broadcast_to(W_before.mean(axis=0), (m, rank)).copy()
            solved = f"mean of the previous rows ({exc})"
        W[:kept] = W_before[:kept]
    factors = {"W": W, "H": H, **model._warm_factors(data)}
    log("fit", "warm-start", fit=name, previous=os.path.basename(previous), rows_kept=kept,
        rows_new=m - kept, new_rows=solved)
    return WarmStart({"init": "custom"}, factors, note=os.path.basename(previous))


# -- stable component ids ---------------------------------------------------------------------------

COMPONENTS = "components.json"


def match_components(H: np.ndarray, H_before: np.ndarray, ids_before: list[int], next_id: int,
                     threshold: float) -> dict:
    """Component ids for the rows of ``H`` from the previous run's ``H_before`` (ids ``ids_before``): the
    assignment maximising the total cosine similarity of rows (``scipy.optimize.linear_sum_assignment``; its
    absolute value, as a signed component and its negation are one), a pair below ``threshold`` not a match.
    A component without a match gets a new id from ``next_id`` on; previous ids without a match have vanished."""
    from scipy.optimize import linear_sum_assignment

    def unit(A):
        norms = np.linalg.norm(A, axis=1, keepdims=True)
        return A / np.where(norms > 0, norms, 1.0)

    similarity = np.abs(unit(np.asarray(H, dtype=np.float64)) @ unit(np.asarray(H_before, dtype=np.float64)).T)
    ids, best = [None] * H.shape[0], [0.0] * H.shape[0]
    for i, j in zip(*linear_sum_assignment(similarity, maximize=True)):
        best[i] = float(similarity[i, j])
        if similarity[i, j] >= threshold:
            ids[i] = int(ids_before[j])
    new = []
    for i in range(H.shape[0]):
        if ids[i] is None:
            ids[i] = next_id
            new.append(next_id)
            next_id += 1
    vanished = sorted(set(map(int, ids_before)) - set(ids))
    return {"ids": ids, "similarity": best, "new": new, "vanished": vanished, "next_id": next_id}


def component_ids(run_dir: str, previous: str | None, fits: list[dict], threshold: float) -> dict:
    """``components.json``'s content: per fit, its components' ids kept from the previous run's matching fit
    (same name), their similarity to it, the new and the vanished ids; the first night numbers them 0..r-1."""
    before = {}
    if previous is not None and os.path.isfile(os.path.join(previous, "evaluate", COMPONENTS)):
        with open(os.path.join(previous, "evaluate", COMPONENTS)) as f:
            before = json.load(f)["fits"]
    out = {"previous": None if previous is None else os.path.basename(previous), "threshold": threshold, "fits": {}}
    for entry in fits:
        H = np.asarray(entry["model"].components_)
        old = before.get(entry["name"])
        if old is None:
            r = H.shape[0]
            out["fits"][entry["name"]] = {"ids": list(range(r)), "similarity": [None] * r, "new": list(range(r)),
                                          "vanished": [], "next_id": r}
            continue
        H_before = np.load(os.path.join(previous, "fit", entry["name"], "components.npy"), allow_pickle=False)
        if H_before.shape[1] != H.shape[1] or len(old["ids"]) != H_before.shape[0]:
            raise ValueError(f"{previous}: fit {entry['name']}'s components ({H_before.shape}) do not match its "
                             f"{COMPONENTS} ({len(old['ids'])} ids) or tonight's features ({H.shape[1]})")
        out["fits"][entry["name"]] = match_components(H, H_before, old["ids"], old["next_id"], threshold)
    return out


# -- retention --------------------------------------------------------------------------------------

def retain(runs_dir: str, keep: int, log, made: str | None = None) -> list[str]:
    """Remove the runs older than the ``keep`` newest: only directories :func:`is_run` recognises, never the one
    ``LATEST`` names, nor ``made`` (the date of the run this invocation just made: a backfill of an old date is
    kept until a later retention), nor a date whose run lock (``.<date>.lock``) another process holds (a rerun or
    backfill of it in progress: skipped, and logged). Each is renamed aside first (:func:`_aside`: no longer a
    run), then removed, its manifest last; the leftovers of a retention killed midway (names :func:`_aside`
    gives, still holding a pipeline run's manifest, or empty) are removed first, and last the run locks of dates
    that have no run, which no process holds (a retention or run killed while holding one; a lock file holds its
    holder's pid or nothing: any other file of that name is not distfact's and is kept). Returns the dates removed."""
    with locked(os.path.join(runs_dir, ".retention.lock"), f"retention in {runs_dir}"):
        for name in os.listdir(runs_dir):
            path = os.path.join(runs_dir, name)
            if (REMOVING.fullmatch(name) and not os.path.islink(path) and os.path.isdir(path)
                    and (read_manifest(path, RUN_KIND) is not None or not os.listdir(path))):
                remove_output(path)
        latest, dates = read_latest(runs_dir), published_runs(runs_dir)
        removed = []
        for date in dates[:max(len(dates) - keep, 0)]:
            if date == latest:
                continue
            if date == made:
                log("retention", "kept", to_file=False, date=date,
                    reason=f"the run just made, though older than the {keep} newest (a later retention removes it)")
                continue
            run = os.path.join(runs_dir, date)
            try:
                with locked(sibling(run, "lock"), f"a run of {date}"):
                    aside = os.path.join(runs_dir, _aside(date))
                    os.rename(run, aside)  # one step: from here on it is no run
            except Locked:
                log("retention", "skipped", to_file=False, date=date,
                    reason="a run of this date is in progress in another process (the next retention removes it)")
                continue
            remove_output(aside)
            removed.append(date)
        for name in os.listdir(runs_dir):
            lock, date = os.path.join(runs_dir, name), RUN_LOCK.fullmatch(name)
            if date and not os.path.lexists(os.path.join(runs_dir, date.group(1))) and _lock_file(lock):
                with contextlib.suppress(Locked), locked(lock, f"a run of {date.group(1)}"):
                    pass  # held by nobody: taken, and removed as it is released (a run in progress holds it: kept)
        if removed:
            log("retention", "removed", to_file=False, runs=removed, kept=keep)  # (the run is committed: on the stream)
        return removed


def _lock_file(path: str) -> bool:
    """Whether ``path`` is a regular file as ``outputs.locked`` leaves it: its holder's pid, or nothing."""
    if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) > 20:
        return False
    with open(path, "rb") as f:
        return re.fullmatch(rb"\d*", f.read()) is not None


def _aside(date: str) -> str:
    """The name a run of ``date`` is renamed to by retention before it is removed (:data:`REMOVING`)."""
    return f".{date}.removing-{uuid.uuid4().hex[:8]}"


def read_latest(runs_dir: str) -> str | None:
    """The date ``LATEST`` in ``runs_dir`` names, or None when there is none yet."""
    return read_text(os.path.join(runs_dir, "LATEST"))
