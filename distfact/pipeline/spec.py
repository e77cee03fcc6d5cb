"""Pipeline specs: TOML files validated before any work, with errors that name the key and the line.

A spec (see ``pipelines/*.toml`` and docs/pipelines.md)::

    name = "digits-nmf"                     # runs go to <root>/<name>/<date>/
    [input]                                 # one of: store, source, dataset
    dataset = "digits"
    [[fit]]                                 # one table per method to run (several: compared in the report)
    method = "nmf"
    ranks = [5, 10]                         # or "auto": the rank chosen by masked cross-validation, as [select] says
    solver = "hals"                         # any parameter of the method's estimator
    [select]                                # only with a ranks = "auto" fit: distfact.select_rank's settings
    ranks = "2:8"                           # or a list; rule, n_splits, holdout, fit, random_state (default: the fit's seed)
    [evaluate]
    metrics = ["relative_error"]            # default: all the method's per-group metrics
    [report]
    title = "..."
    [output]
    root = "runs"                           # a local path or an fsspec URL
    checkpoint_every = "auto"               # or an int: every N iterations; 0: none
    [cluster]
    kind = "in-process"                     # or "local" (workers = N), or "scheduler" (address / scheduler_file)
"""

from __future__ import annotations

import difflib
import glob
import math
import os
import re
import tomllib
from dataclasses import dataclass, field

from ..registry import get_method
from ..estimators.contract import check_params
from ..estimators.select import DEFAULTS as SELECT_DEFAULTS, SettingError, check_settings, rank_range, refusal
from ..store.files import utf8_text
from ..store.sources import SOURCE_SUFFIXES, source_kind

DATASETS = ("digits", "heart", "heart-multigroup", "fairer-synthetic", "stratified-synthetic")


class SpecError(ValueError):
    """A spec that cannot run; the message names the file, the line and the key."""


@dataclass
class FitSpec:
    method: str
    ranks: list[int]
    seed: int
    params: dict
    inputs: dict  # the method's fit inputs (its declaration's fit_inputs): name -> value as written
    select: dict | None = None  # ranks = "auto": select_rank's settings, from [select] (see _select); ranks is []
    warm_start: str = "none"  # "previous": from the previous run's factors (pipeline/nightly.py)


@dataclass
class Spec:
    path: str
    name: str
    description: str
    input: dict
    fits: list[FitSpec]
    metrics: dict  # method -> list of metric names
    report: dict
    root: str
    checkpoint_every: int | str
    cluster: dict
    nightly: dict = field(default_factory=dict)  # keep, match_threshold, trend_runs, alerts (see _nightly)

    @property
    def directory(self) -> str:
        return os.path.dirname(os.path.abspath(self.path))

    def input_files(self, fit: FitSpec) -> dict:
        """``fit``'s inputs that name files, resolved against the spec's directory."""
        declared = get_method(fit.method).fit_inputs
        return {i.name: self.resolve(fit.inputs[i.name]) for i in declared if i.is_path(fit.inputs[i.name])}

    def resolve(self, path: str) -> str:
        """An input path of the spec, relative to the spec's directory (``~`` expanded)."""
        path = os.path.expanduser(path)
        return path if os.path.isabs(path) or "://" in path else os.path.join(self.directory, path)


# -- where keys are: a line locator for TOML text ---------------------------------------------------

HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
KEY = re.compile(r"^\s*([A-Za-z0-9_\-]+|\"[^\"]*\"|'[^']*')((?:\s*\.\s*(?:[A-Za-z0-9_\-]+|\"[^\"]*\"))*)\s*=")


def key_lines(text: str) -> dict:
    """``path -> line`` for tables, array-of-table entries and keys, e.g. ``("fit", 0, "method") -> 12``.
    Keys of inline tables get their parent's line."""
    lines, table, counts, open_quote = {}, (), {}, None
    for number, line in enumerate(text.splitlines(), start=1):
        if open_quote is not None:  # inside a multi-line string: its text is not TOML
            if line.count(open_quote) % 2:
                open_quote = None
            continue
        for quote in ('"""', "'''"):
            if line.count(quote) % 2:  # a multi-line string opens here and continues on the next lines
                open_quote = quote
        header = HEADER.match(line)
        if header:
            path = tuple(part.strip().strip('"') for part in header.group(2).split("."))
            if header.group(1) == "[[":
                index = counts.get(path, -1) + 1
                counts[path] = index
                table = (*path, index)
            else:
                table = path
            lines.setdefault(table, number)
            continue
        key = KEY.match(line)
        if key:
            parts = [key.group(1).strip("\"'")] + [p.strip().strip('"') for p in key.group(2).split(".") if p.strip()]
            path = (*table, *parts)
            lines.setdefault(path, number)
            for inner in re.findall(r"([A-Za-z0-9_\-]+)\s*=", line[key.end():]):  # inline table keys
                lines.setdefault((*path, inner), number)
    return lines


class Checker:
    """Type and key checks that raise :class:`SpecError` with ``file:line``."""

    def __init__(self, path: str, text: str):
        self.path, self.lines = path, key_lines(text)

    def where(self, *path) -> str:
        for end in range(len(path), 0, -1):
            if path[:end] in self.lines:
                return f"{self.path}:{self.lines[path[:end]]}"
        return f"{self.path}"

    @staticmethod
    def label(*path) -> str:
        """``fit #2 key 'solver'``-style names: array entries counted from 1, as a reader counts tables."""
        out = ""
        for part in path:
            out += f" #{part + 1}" if isinstance(part, int) else (f" key {part!r}" if out else f"[{part}]")
        return out

    def fail(self, path: tuple, message: str):
        raise SpecError(f"{self.where(*path)}: {self.label(*path)}: {message}")

    def keys(self, table: dict, path: tuple, allowed, required=()) -> None:
        for key in table:
            if key not in allowed:
                close = difflib.get_close_matches(key, list(allowed), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                self.fail((*path, key), f"unknown key{hint} (allowed: {', '.join(sorted(allowed))})")
        for key in required:
            if key not in table:
                self.fail(path, f"missing key {key!r}")

    def typed(self, table: dict, path: tuple, key: str, kind, default=None):
        if key not in table:
            return default
        value = table[key]
        names = {str: "a string", int: "an integer", float: "a number", bool: "true or false", list: "a list",
                 dict: "a table"}
        ok = (isinstance(value, kind) and not (kind in (int, float) and isinstance(value, bool))) or \
             (kind is float and isinstance(value, int) and not isinstance(value, bool))
        if not ok:
            self.fail((*path, key), f"expected {names.get(kind, kind.__name__)}, got {type(value).__name__} "
                                    f"{value!r}")
        if kind is float and not math.isfinite(value):  # TOML has nan and inf
            self.fail((*path, key), f"expected a finite number, got {value!r}")
        return float(value) if kind is float else value


# -- the spec -------------------------------------------------------------------------------------

def load_spec(path) -> Spec:
    """Read and validate ``path``; every problem found before any work is a :class:`SpecError`."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise SpecError(f"{path}: no such pipeline spec")
    with open(path, "rb") as f:
        text = utf8_text(f.read(), path, SpecError)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: not valid TOML: {exc}") from exc
    check = Checker(path, text)
    check.keys(doc, (), {"name", "description", "input", "fit", "select", "evaluate", "report", "output", "cluster",
                         "alerts"},
               required=("name", "input", "fit"))
    name = check.typed(doc, (), "name", str)
    if not re.fullmatch(r"[A-Za-z0-9_.\-]+", name) or set(name) == {"."}:
        check.fail(("name",), f"{name!r}: use letters, digits, '_', '-' and '.' (it names a directory)")
    spec = Spec(path=path, name=name, description=check.typed(doc, (), "description", str, ""),
                input={}, fits=[], metrics={}, report={}, root="", checkpoint_every="auto", cluster={})
    spec.input = _input(check, spec, check.typed(doc, (), "input", dict))
    fits = check.typed(doc, (), "fit", list)
    if not fits:
        check.fail(("fit",), "at least one [[fit]] table is needed")
    spec.fits = [_fit(check, spec, item, i) for i, item in enumerate(fits)]
    _select(check, doc.get("select"), spec.fits)
    spec.metrics = _evaluate(check, doc.get("evaluate", {}), spec.fits)
    spec.report = _report(check, doc.get("report", {}))
    output = check.typed(doc, (), "output", dict, {})
    check.keys(output, ("output",), {"root", "checkpoint_every", "keep"})
    spec.root = os.path.expanduser(check.typed(output, ("output",), "root", str, "runs"))
    spec.checkpoint_every = output.get("checkpoint_every", "auto")
    if spec.checkpoint_every != "auto" and not (isinstance(spec.checkpoint_every, int)
                                                and not isinstance(spec.checkpoint_every, bool)
                                                and spec.checkpoint_every >= 0):
        check.fail(("output", "checkpoint_every"), 'expected an integer >= 0 (0: no checkpoints) or "auto", got '
                                                   f"{type(spec.checkpoint_every).__name__} {spec.checkpoint_every!r}")
    spec.cluster = _cluster(check, spec, check.typed(doc, (), "cluster", dict, {}))
    spec.nightly = _nightly(check, doc, spec)
    return spec


def _input(check: Checker, spec: Spec, table: dict) -> dict:
    path = ("input",)
    check.keys(table, path, {"store", "source", "dataset", "group_column", "signed", "text_field", "group_field",
                             "vectorizer", "max_features", "block_rows", "column_blocks", "store_path"})
    given = [key for key in ("store", "source", "dataset") if key in table]
    if len(given) != 1:
        check.fail(path, "give exactly one of 'store', 'source' or 'dataset'"
                         + (f" (got {', '.join(given)})" if given else ""))
    kind = given[0]
    out = {"kind": kind, "value": check.typed(table, path, kind, str)}
    for key, typ in (("group_column", str), ("signed", bool), ("text_field", str), ("group_field", str),
                     ("vectorizer", str), ("max_features", int), ("block_rows", int), ("column_blocks", bool),
                     ("store_path", str)):
        if key in table:
            out[key] = check.typed(table, path, key, typ)
    if kind == "dataset":
        if out["value"] not in DATASETS:
            check.fail((*path, "dataset"), f"unknown data set {out['value']!r} (known: {', '.join(DATASETS)})")
        return out
    location = spec.resolve(out["value"])
    out["path"] = location
    if "://" in location:
        check.fail((*path, kind), f"{out['value']!r}: inputs are local paths (ingest remote data first)")
    if kind == "source" and glob.has_magic(out["value"]):
        out["partitions"] = True  # (only then: the ingest digest of every other spec is what it was)
    if "store_path" in out:
        if not out.get("partitions"):
            check.fail((*path, "store_path"), "applies to a source of partitions (a pattern such as "
                                              "'incoming/*.jsonl'): where the runs append them")
        out["store_path"] = spec.resolve(out["store_path"])
    if out.get("partitions"):  # partitions may arrive later: the pattern's folder must be there
        if not os.path.isdir(os.path.dirname(location)) or glob.has_magic(os.path.dirname(out["value"])):
            check.fail((*path, kind), f"{out['value']!r}: a pattern of partitions names files of one existing "
                                      "folder (paths are relative to the spec's directory)")
    elif not os.path.exists(location):
        check.fail((*path, kind), f"{out['value']!r} does not exist (paths are relative to the spec's directory)")
    if kind == "store" and not os.path.isfile(os.path.join(location, "zarr.json")):
        check.fail((*path, kind), f"{out['value']!r} is not a distfact store (no zarr.json; write one with "
                                  "'distfact ingest')")
    if kind == "source":
        source = source_kind(location)
        if source is None:
            check.fail((*path, "source"), f"unknown kind of source {out['value']!r} (expected one of "
                                          f"{', '.join(SOURCE_SUFFIXES)} or a directory of .jsonl files; a pattern of partitions, "
                                          "such as 'incoming/*.jsonl', ends in one of them)")
        if source == "table" and "group_column" not in out:
            check.fail(path, "a table source needs 'group_column'")
    if "vectorizer" in out and out["vectorizer"] not in ("tfidf", "count", "hashing"):
        check.fail((*path, "vectorizer"), f"unknown vectorizer {out['vectorizer']!r} (tfidf, count or hashing)")
    return out


def _fit(check: Checker, spec: Spec, table, index: int) -> FitSpec:
    path = ("fit", index)
    if not isinstance(table, dict):
        check.fail(path, "each [[fit]] entry must be a table")
    method = check.typed(table, path, "method", str)
    if method is None:
        check.fail(path, "missing key 'method'")
    try:
        declaration = get_method(method)
    except ValueError as exc:
        check.fail((*path, "method"), str(exc))
    parameters = declaration.parameters()
    inputs = {fit_input.name: fit_input for fit_input in declaration.fit_inputs}
    check.keys(table, path, {"method", "ranks", "rank", "seed", "warm_start", *parameters, *inputs})
    if ("rank" in table) == ("ranks" in table):
        check.fail(path, "give exactly one of 'rank' or 'ranks'")
    auto = table.get("ranks") == AUTO
    if auto:
        ranks = []
    elif "rank" in table:
        ranks = [check.typed(table, path, "rank", int)]
    elif isinstance(table["ranks"], str):
        check.fail((*path, "ranks"), f"expected a list of ranks or {AUTO!r}, got {table['ranks']!r}")
    else:
        ranks = check.typed(table, path, "ranks", list)
    if not auto and (not ranks or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 1 for r in ranks)):
        check.fail((*path, "ranks" if "ranks" in table else "rank"), f"ranks must be positive integers, got {ranks!r}")
    values = {name: check.typed(table, path, name, parameter.kind)
              for name, parameter in parameters.items() if name in table}
    for name, value in values.items():  # the estimator's own constraints, in its words
        try:
            check_params(declaration.estimator, {name: value})
        except ValueError as exc:
            check.fail((*path, name), str(exc))
    given = {}
    for name, fit_input in inputs.items():
        given[name] = check.typed(table, path, name, str, fit_input.default)
        if fit_input.is_path(given[name]) and not os.path.exists(spec.resolve(given[name])):
            check.fail((*path, name), f"{given[name]!r}: no such file (paths are relative to the spec's directory; "
                                      f"{fit_input.help})")
    seed = check.typed(table, path, "seed", int, 0)
    if seed < 0:
        check.fail((*path, "seed"), f"must be a non-negative integer, got {seed}")
    return FitSpec(method, sorted(set(ranks)), seed, values, given, select={} if auto else None,
                   warm_start=_warm_start(check, table, path, method))


AUTO = "auto"  # ranks = "auto" in a [[fit]] table


def _select(check: Checker, table, fits: list[FitSpec]) -> None:
    """[select]: the settings of ``distfact.select_rank`` for the fits with ``ranks = "auto"`` (each fit's
    ``select``): ``ranks`` (a list or "FIRST:LAST"), and ``rule``, ``n_splits``, ``holdout``, ``fit`` (select_rank's
    defaults where left out) and ``random_state``, the root seed of the held-out entries (default: the fit's
    ``seed``, so that a run is reproducible; select_rank alone draws a fresh one)."""
    path = ("select",)
    auto = [i for i, fit in enumerate(fits) if fit.select is not None]
    for i in auto:
        reason = refusal(get_method(fits[i].method).estimator)
        if reason is not None:
            check.fail(("fit", i, "ranks"), f"{AUTO!r} chooses the rank by masked cross-validation, which "
                                            f"{fits[i].method} cannot take: {reason}")
    if table is None:
        if auto:
            check.fail(("fit", auto[0], "ranks"), f"ranks = {AUTO!r} needs a [select] table (at least its 'ranks', "
                                                  "the ranks compared)")
        return
    if not isinstance(table, dict):
        check.fail(path, "expected a table")
    if not auto:
        check.fail(path, f"a [select] table is for [[fit]] tables with ranks = {AUTO!r}, and no [[fit]] has it")
    check.keys(table, path, {"ranks", *SELECT_DEFAULTS}, required=("ranks",))
    ranks = table["ranks"]
    if isinstance(ranks, str):
        try:
            ranks = list(rank_range(ranks))
        except ValueError as exc:
            check.fail((*path, "ranks"), f"ranks {exc}")
    elif not isinstance(ranks, list) or not ranks or not all(isinstance(r, int) and not isinstance(r, bool)
                                                              and r >= 1 for r in ranks):
        check.fail((*path, "ranks"), f"expected a list of positive integers or \"FIRST:LAST\", got {ranks!r}")
    settings = {"n_splits": check.typed(table, path, "n_splits", int, SELECT_DEFAULTS["n_splits"]),
                "holdout": check.typed(table, path, "holdout", float, SELECT_DEFAULTS["holdout"]),
                "rule": check.typed(table, path, "rule", str, SELECT_DEFAULTS["rule"]),
                "fit": check.typed(table, path, "fit", str, SELECT_DEFAULTS["fit"])}
    try:
        check_settings(**settings)
    except SettingError as exc:
        check.fail((*path, exc.key), str(exc))
    seed = check.typed(table, path, "random_state", int)
    if seed is not None and seed < 0:
        check.fail((*path, "random_state"), f"must be a non-negative integer, got {seed}")
    for i in auto:
        fits[i].select = {"ranks": sorted(set(ranks)), **settings,
                          "random_state": fits[i].seed if seed is None else seed}


def _evaluate(check: Checker, table, fits) -> dict:
    path = ("evaluate",)
    if not isinstance(table, dict):
        check.fail(path, "expected a table")
    check.keys(table, path, {"metrics"})
    wanted = check.typed(table, path, "metrics", list)
    known = {fit.method: list(get_method(fit.method).metrics) for fit in fits}
    out = {}
    for method, names in known.items():
        if wanted is None:
            out[method] = names
            continue
        unknown = [m for m in wanted if not any(m in metrics for metrics in known.values())]
        if unknown:
            check.fail((*path, "metrics"), f"unknown metric {unknown[0]!r} for the methods of this spec "
                                           f"(known: {', '.join(sorted({m for ms in known.values() for m in ms}))})")
        out[method] = [m for m in wanted if m in names] or names
    return out


def _report(check: Checker, table) -> dict:
    path = ("report",)
    if not isinstance(table, dict):
        check.fail(path, "expected a table")
    check.keys(table, path, {"title", "top", "image_shape", "match_threshold", "trend_runs"})
    shape = check.typed(table, path, "image_shape", list)
    if shape is not None and (len(shape) != 2 or not all(isinstance(v, int) and v > 0 for v in shape)):
        check.fail((*path, "image_shape"), f"expected [height, width], got {shape!r}")
    top = check.typed(table, path, "top", int, 10)
    if top < 1:
        check.fail((*path, "top"), f"must be at least 1, got {top}")
    return {"title": check.typed(table, path, "title", str), "top": top,
            "image_shape": None if shape is None else tuple(shape)}


def _cluster(check: Checker, spec: Spec, table: dict) -> dict:
    path = ("cluster",)
    check.keys(table, path, {"kind", "workers", "address", "scheduler_file", "tls_dir"})
    kind = check.typed(table, path, "kind", str, "in-process")
    if kind not in ("in-process", "local", "scheduler"):
        check.fail((*path, "kind"), f"unknown kind {kind!r} (in-process, local or scheduler)")
    out = {"kind": kind, "workers": check.typed(table, path, "workers", int, 2),
           "address": check.typed(table, path, "address", str), "scheduler_file": check.typed(table, path, "scheduler_file", str),
           "tls_dir": check.typed(table, path, "tls_dir", str)}
    if kind == "scheduler" and not (out["address"] or out["scheduler_file"]):
        check.fail(path, "kind = 'scheduler' needs 'address' or 'scheduler_file'")
    if kind == "local" and out["workers"] < 1:
        check.fail((*path, "workers"), f"must be at least 1, got {out['workers']}")
    if out["scheduler_file"] is not None:
        out["scheduler_file"] = spec.resolve(out["scheduler_file"])
        if not out["scheduler_file"].endswith(".json") or not os.path.isfile(out["scheduler_file"]):
            check.fail((*path, "scheduler_file"), f"{out['scheduler_file']!r} is not an existing .json scheduler "
                                                  "file (paths are relative to the spec's directory)")
    if out["tls_dir"] is not None:
        if kind != "scheduler":
            check.fail((*path, "tls_dir"), f"is for kind = 'scheduler' (a scheduler reached over the network), "
                                           f"not {kind!r}")
        out["tls_dir"] = spec.resolve(out["tls_dir"])
        if not os.path.isdir(out["tls_dir"]):
            check.fail((*path, "tls_dir"), f"{out['tls_dir']!r} is not a directory (the cluster's ca.pem, cert.pem "
                                           "and key.pem; paths are relative to the spec's directory)")
    return out


# -- what a nightly run knows of the nights before (pipeline/nightly.py, pipeline/alerts.py) -------------------

def _warm_start(check: Checker, table: dict, path: tuple, method: str) -> str:
    """A [[fit]] table's ``warm_start``: "none" (default) or "previous", for a method whose estimator takes a
    custom start (W and H)."""
    from .nightly import WARM_STARTS, can_warm_start, warm_start_methods

    value = check.typed(table, path, "warm_start", str, "none")
    if value not in WARM_STARTS:
        check.fail((*path, "warm_start"), f"unknown warm start {value!r} ({' or '.join(WARM_STARTS)})")
    if value == "previous" and not can_warm_start(method):
        check.fail((*path, "warm_start"), f"method {method!r} cannot start from given factors (its estimator has no "
                                          f"init='custom' with W and H); methods that can: "
                                          f"{', '.join(warm_start_methods())}")
    return value


def _nightly(check: Checker, doc: dict, spec: Spec) -> dict:
    """[output] keep, [report] match_threshold and trend_runs, and the [alerts] table."""
    from .alerts import alert_options

    output, report = doc.get("output", {}), doc.get("report", {})
    keep = check.typed(output, ("output",), "keep", int)
    if keep is not None and keep < 1:
        check.fail(("output", "keep"), f"must be at least 1 (the newest runs kept), got {keep}")
    threshold = check.typed(report, ("report",), "match_threshold", float, 0.5)
    if not 0 <= threshold <= 1:
        check.fail(("report", "match_threshold"), f"a cosine similarity in [0, 1], got {threshold}")
    trend_runs = check.typed(report, ("report",), "trend_runs", int, 14)
    if trend_runs < 1:
        check.fail(("report", "trend_runs"), f"must be at least 1, got {trend_runs}")
    return {"keep": keep, "match_threshold": threshold, "trend_runs": trend_runs,
            "alerts": alert_options(check, check.typed(doc, (), "alerts", dict, {}), spec)}
