"""The ``distfact`` command line: ingest, info, fit, report, select-rank, run, runs, demo.

Bad input exits with status 2 and a message naming the problem and where.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import json
import logging
import math
import os
import sys
import time

EXIT_BAD_INPUT = 2


def _number(kind, low=None, strict=False):
    """An argparse type: a finite ``kind`` (int or float) >= ``low`` (> ``low`` if ``strict``), so that a bad value
    is refused with its option named before any work (a NaN tolerance, a negative cluster size)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if low is not None and (value <= low if strict else value < low):
            raise argparse.ArgumentTypeError(f"{text!r} must be {'>' if strict else '>='} {low}")
        return value

    parse.__name__ = kind.__name__  # what argparse names in "invalid int value"
    return parse


def _methods() -> dict:
    """Every method's declaration, by name (imports the estimators: only the commands that fit need it)."""
    from .registry import methods

    return methods()


def _method(name: str):
    from .registry import get_method

    return get_method(name)


def _resolve(ref):
    from .estimators.contract import resolve

    return resolve(ref)


COUNT = _number(int, 0)  # 0, 1, 2, ...
POSITIVE = _number(int, 1)  # 1, 2, ...
NON_NEGATIVE = _number(float, 0.0)


def _checkpoint_every(text: str):
    """``--checkpoint-every``: a count of iterations, or ``auto`` (the estimators' ``checkpoint_every="auto"``)."""
    if text == "auto":
        return text
    try:
        return COUNT(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= 0 (0: never) or 'auto'") from None


def _add_scheduler_options(p):
    g = p.add_argument_group("where to run (default: in this process, nothing to start)")
    g.add_argument("--scheduler", metavar="ADDRESS", help="Dask scheduler address, or a scheduler file (*.json)")
    g.add_argument("--local-cluster", metavar="N", type=POSITIVE, help="start a LocalCluster of N worker processes")
    _add_tls_option(g)


def _add_method_choice(p, declarations) -> None:
    """``--method``: one of the declared methods, each with its summary."""
    p.add_argument("--method", default="nmf", choices=list(declarations) or None,
                   help="; ".join(f"{name}: {d.summary}" for name, d in declarations.items()))


def _add_progress_option(p):
    p.add_argument("--no-progress", action="store_true",
                   help="no progress on stderr (else a bar on a terminal, lines with rates and an ETA off one)")


def _add_selection_options(p, load: bool) -> None:
    """select-rank's settings, their defaults and the rules read from ``distfact.select_rank`` (the one place
    they are set) when ``load`` (importing it imports the estimators: only for the commands that fit)."""
    rules, fits, defaults = (), (), {}
    if load:
        from .estimators.select import DEFAULTS as defaults, FITS as fits, RULES as rules
    p.add_argument("--n-splits", type=_number(int, 2), default=defaults.get("n_splits"), help="folds (at least 2)")
    p.add_argument("--holdout", type=_number(float, 0.0, strict=True), default=defaults.get("holdout"),
                   help="share of the observed entries each fold holds out, in (0, 1); n-splits x holdout <= 1")
    p.add_argument("--rule", choices=rules or None, default=defaults.get("rule"),
                   help="min: lowest mean held-out error; one_se: smallest rank within one standard error of it; "
                        "worst_group: lowest held-out error of the worst group")
    p.add_argument("--fit", choices=fits or None, default=defaults.get("fit"),
                   help="joint: one model of all the rows per rank and fold; per_group: one model per group, "
                        "fitted on the group's rows alone, each group's held-out entries scored by its own model")


def _add_tls_option(p):
    p.add_argument("--tls-dir", metavar="DIR", help="connect over TLS with DIR/ca.pem, cert.pem, key.pem (made by "
                                                    "`distfact make-certs`; default: the Dask config's TLS settings)")


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error on one line (the usage itself is what --help is for)."""

    def error(self, message):
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser(with_methods: bool = True) -> argparse.ArgumentParser:
    """The command line. ``with_methods``: derive ``fit``'s and ``report``'s method options from the methods'
    declarations (which imports every estimator); commands that need none start without that."""
    parser = _Parser(prog="distfact", description="Group-aware matrix factorisation on Dask.",
                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-v info, -vv debug)")
    parser.add_argument("--debug", action="store_true", help="show the traceback of any error")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser = functools.partial(sub.add_parser, formatter_class=argparse.ArgumentDefaultsHelpFormatter)

    p = sub.add_parser("ingest", help="write a grouped matrix store from arrays, a table or a text corpus",
                       description="Write a Zarr grouped-matrix store. SOURCE is an .npz (arrays X and "
                                   "optionally groups; or a scipy sparse .npz with --groups-file), a .csv/.parquet "
                                   "table with --group-column, or a .jsonl corpus.")
    p.add_argument("source")
    p.add_argument("dest", help="the store directory to write")
    p.add_argument("--groups-file", help=".npy or text file with one group label per row (array sources)")
    p.add_argument("--group-column", help="table sources: the column holding the group")
    p.add_argument("--text-field", default="text", help="corpus sources: the field with the text")
    p.add_argument("--group-field", default="group", help="corpus sources: the field with the group")
    p.add_argument("--vectorizer", default="tfidf", choices=["tfidf", "count", "hashing"])
    p.add_argument("--max-features", type=POSITIVE, default=20000)
    p.add_argument("--block-rows", type=POSITIVE, help="rows per block (default: ~128 MiB blocks)")
    p.add_argument("--column-blocks", action="store_true",
                   help="also write X by CSC column blocks (what wl1-nmf sweeps; fit adds them otherwise)")
    p.add_argument("--signed", action="store_true",
                   help="allow negative values (arrays and tables; for --method multigroup-svd only)")
    p.add_argument("--missing", choices=["nan"],
                   help="arrays and tables: NaN entries (a table's empty or NA fields) are missing; X is stored with "
                        "0 there and a mask beside it, which fits of the store use")
    p.add_argument("--mask", metavar="FILE", help="arrays and tables: entry weights (0 = missing) of X's shape, "
                                                  "a dense .npy or a scipy sparse .npz, stored beside X (with "
                                                  "--append: the appended rows' weights)")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--append", action="store_true",
                   help="add SOURCE's rows to the existing store DEST as its next version (new blocks; new groups "
                        "follow its groups), read as the store's first ingest was (its columns, vocabulary or "
                        "hashing, fields); files whose content the store already holds are skipped")
    _add_progress_option(p)

    p = sub.add_parser("info", help="groups, sizes, nnz and norms of a store")
    p.add_argument("store")
    p.add_argument("--json", action="store_true", help="print JSON")

    declarations = _methods() if with_methods else {}
    p = sub.add_parser("fit", help="factor a store; write the model, its components, W and the per-group metrics",
                       description="Fit a method on a store and write, into --output: model.npz (distfact.load "
                                   "reads it), components.npy, W/ (one array per block; rows.npy maps the stored "
                                   "rows back to the input's) when the method writes W, group_metrics.csv and "
                                   "metrics.json, plus the method's own arrays. Every option left out takes the "
                                   "method's estimator's default. `distfact report` reads the output.")
    p.add_argument("store")
    _add_method_choice(p, declarations)
    p.add_argument("--rank", "-r", type=POSITIVE, required=True, help="number of components")
    p.add_argument("--seed", type=COUNT, default=0, help="random_state")
    _add_method_options(p, declarations)
    p.add_argument("--output", "-o", default="distfact-fit",
                   help="output directory: written beside it in .NAME.partial/ and swapped into place when complete; "
                        "must be new, empty or an earlier fit output (replaced with --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier fit output at --output")
    p.add_argument("--checkpoint-every", type=_checkpoint_every, default=0, metavar="K",
                   help="checkpoint every K iterations, or 'auto': every 10 while checkpoints take at most a tenth of "
                        "the fit's time; 0 (the default): none, or 'auto' with --resume. Into "
                        ".NAME.partial/checkpoints/ beside --output")
    p.add_argument("--resume", action="store_true", help="continue an interrupted fit from its newest checkpoint")
    _add_progress_option(p)
    _add_scheduler_options(p)

    reports = {d.paper_report.flag: d for d in declarations.values() if d.paper_report is not None}
    p = sub.add_parser("report", help="a report of a fit output (no refit), or a method paper's report of a store",
                       description="PATH is a `distfact fit` output: write its report (per-group metrics, the "
                                   "objective by iteration, top features per component, the method's figures) "
                                   "without fitting again. Or PATH is a store and one of "
                                   + ", ".join(f"--{flag}" for flag in reports)
                                   + " asks for that method's paper report, which fits what it needs.")
    p.add_argument("path", metavar="PATH", help="a fit output directory, or a store (with a paper report's flag)")
    kind = p.add_mutually_exclusive_group()
    for flag, declaration in reports.items():
        kind.add_argument(f"--{flag}", action="store_const", const=declaration.name, dest="paper",
                          help=declaration.paper_report.help)
    p.add_argument("--ranks", default="1:10", help="paper reports that compare ranks: FIRST:LAST (inclusive)")
    p.add_argument("--rank", "-r", type=POSITIVE, default=10, help="paper reports of one fit: its rank")
    p.add_argument("--seed", type=COUNT, default=0, help="paper reports: random_state")
    p.add_argument("--image-shape", help="features are pixels of HEIGHTxWIDTH images, e.g. 8x8")
    p.add_argument("--top", type=POSITIVE, default=10, help="top features listed per component")
    _add_method_options(p, declarations)
    p.add_argument("--output", "-o", default="distfact-report",
                   help="output directory (new, empty or an earlier report, replaced with --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier report at --output")
    _add_progress_option(p)
    _add_scheduler_options(p)

    p = sub.add_parser("select-rank", help="choose the rank by masked cross-validation (held-out entries)",
                       description="Hold out random observed entries of the store (--holdout of them per fold, any "
                                   "entry of a dense store, stored entries of a sparse one), fit every rank of "
                                   "--ranks on the rest in one sweep (X read once per iteration for all ranks and "
                                   "folds), and print the held-out error per rank and the rank --rule chooses. "
                                   "Methods whose fit takes a mask only.")
    p.add_argument("store")
    _add_method_choice(p, declarations)
    p.add_argument("--ranks", required=True, help="the ranks compared: FIRST:LAST (inclusive)")
    _add_selection_options(p, with_methods)
    p.add_argument("--seed", type=COUNT, default=0, help="root seed of the held-out entries, and the models' "
                                                         "random_state (fixed, so that a rerun is the same)")
    _add_method_options(p, declarations)
    p.add_argument("--output", "-o", help="write the table (rank, fold, group, train_error, heldout_error) to this "
                                          "CSV file (written aside and renamed into place)")
    p.add_argument("--report", metavar="DIR", help="write a report into DIR: report.html with the held-out error "
                                                   "against rank per group (the chosen rank marked), its PNG, "
                                                   "selection.csv (the table) and selection.json (the choice)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier report at --report")
    _add_progress_option(p)
    _add_scheduler_options(p)

    p = sub.add_parser("run", help="run a pipeline spec (TOML): ingest -> fit -> evaluate -> report -> publish",
                       description="Run the pipeline SPEC into ROOT/<name>/<date>/, each stage committed by a marker "
                                   "written last. A rerun with the same spec and data does nothing; a changed "
                                   "section redoes its stage and what follows. Exit status: 0 done or nothing to "
                                   "do, 2 a bad spec (nothing run), 1 a failed stage (named; earlier stages stay "
                                   "committed), 3 the run crossed an [alerts] threshold (everything is committed; "
                                   "the alerts are in the run's alerts.json and log). See docs/pipelines.md.")
    p.add_argument("spec", help="the pipeline's TOML file")
    p.add_argument("--date", help="the run's date, YYYY-MM-DD (default: today)")
    p.add_argument("--output", metavar="ROOT", help="root of the runs, a path or an fsspec URL (default: the "
                                                    "spec's [output] root)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted fit from its newest checkpoint")
    p.add_argument("--force", action="store_true", help="redo every stage")
    p.add_argument("--scheduler", metavar="ADDRESS", help="Dask scheduler address or scheduler file (overrides "
                                                          "the spec's [cluster])")
    _add_tls_option(p)

    p = sub.add_parser("runs", help="list a pipeline's past runs with their headline metrics",
                       description="List the complete runs of the pipeline NAME under ROOT/NAME/, oldest first: the "
                                   "date, LATEST, each fit's worst group and its metric, the alerts crossed.")
    p.add_argument("name", help="the pipeline's name (its spec's name = ...)")
    p.add_argument("--root", default="runs", help="root of the runs")

    p = sub.add_parser("demo", help="run the demo pipeline: NMF of a bundled real data set, per-group report",
                       description="Runs the pipeline shipped as distfact/pipeline/demo.toml (scikit-learn's "
                                   "bundled digits, grouped by digit, NMF at ranks 5 and 10) into "
                                   "OUTPUT/demo/<date>/ and prints the per-digit errors.")
    p.add_argument("--output", "-o", default="distfact-demo")
    p.add_argument("--scheduler", metavar="ADDRESS", help="Dask scheduler address, or a scheduler file (*.json)")
    _add_tls_option(p)

    p = sub.add_parser("warmup", help="compile the numba kernels into numba's cache now, not on a first fit",
                       description="Runs the small fits of every method with numba kernels of its own so that "
                                   "numba compiles each kernel signature they use into its cache (beside the "
                                   "installed package, or NUMBA_CACHE_DIR, or a user cache directory where the "
                                   "package is read-only), in processes side by side, each with a share of the fits. "
                                   "`pip install .` does it when it builds distfact; run it after installing a wheel "
                                   "built on another machine, or as the user whose cache a read-only installation "
                                   "uses.")
    p.add_argument("--processes", type=_number(int, 1), default=None, metavar="N",
                   help="processes side by side (default: the usable cores, at most 4, one a kind of data; 1: in this "
                        "process)")

    p = sub.add_parser("make-certs", help="make TLS certificates for a Dask cluster (ca.pem, cert.pem, key.pem)",
                       description="Writes a certificate authority and one certificate and key, signed by it, that the "
                                   "scheduler, the workers and the clients all use (cluster/start-local.sh --tls DIR, "
                                   "distfact --tls-dir DIR). Needs the cryptography package (distfact[cluster]).")
    p.add_argument("directory")
    p.add_argument("--host", action="append", metavar="NAME",
                   help="a host name or IP address the certificate names (repeatable; default: localhost, 127.0.0.1)")
    p.add_argument("--days", type=POSITIVE, default=365, help="validity in days (at least 1)")
    return parser


def cmd_ingest(args):
    from .store.sources import ingest_source, source_kind

    kind = source_kind(args.source) if os.path.exists(args.source) else None  # (ingest_source names a missing one)
    if kind == "table" and not args.group_column and not args.append:  # (an append's is the store's)
        raise ValueError("a table source needs --group-column")
    if kind == "corpus" and args.signed:
        raise ValueError("--signed applies to array and table sources; a corpus is non-negative")
    from .engine.progress import Progress
    from .store.tables import PARQUET_SUFFIXES

    # what a source's ingest counts: the bytes of a file read as text, else rows
    bytes_read = kind == "corpus" or (kind == "table" and not args.source.lower().endswith(PARQUET_SUFFIXES))
    progress = Progress(what="read" if bytes_read else "rows", unit="B" if bytes_read else "rows",
                        shown=not args.no_progress)
    if args.append:
        return _append(args, progress)
    data = ingest_source(args.source, args.dest, group_column=args.group_column, groups_file=args.groups_file,
                         signed=args.signed, text_field=args.text_field, group_field=args.group_field,
                         vectorizer=args.vectorizer, max_features=args.max_features, block_rows=args.block_rows,
                         overwrite=args.overwrite, missing=args.missing, mask_file=args.mask,
                         progress=lambda done, total: progress.update(done, total=total))
    progress.close()
    if args.column_blocks:
        data = data.with_column_blocks()
    print(f"wrote {data!r}")


def _append(args, progress) -> None:
    """``distfact ingest --append``: the options of a first ingest that an append takes from the store are refused."""
    from .store.sources import append_source

    fixed = [option for option, given in (("--overwrite", args.overwrite), ("--signed", args.signed),
                                          ("--vectorizer", args.vectorizer != "tfidf"),
                                          ("--max-features", args.max_features != 20000),
                                          ("--text-field", args.text_field != "text"),
                                          ("--group-field", args.group_field != "group")) if given]
    if fixed:
        raise ValueError(f"--append reads SOURCE as the store's first ingest did; {', '.join(fixed)} cannot be given")
    data, outcome = append_source(args.source, args.dest, group_column=args.group_column,
                                  groups_file=args.groups_file, block_rows=args.block_rows, missing=args.missing,
                                  mask_file=args.mask, progress=lambda done, total: progress.update(done, total=total))
    progress.close()
    for file, version in outcome["skipped"].items():
        print(f"skipped {file}: its content is already in the store (version {version})")
    if outcome["version"] is None:
        print(f"nothing appended: {data!r} is unchanged")
    else:
        oov = outcome.get("out_of_vocabulary")
        print(f"appended {outcome['rows']} rows as version {outcome['version']}"
              + (f" ({oov['tokens']} out-of-vocabulary tokens in {oov['documents']} documents)" if oov else ""))
        if args.column_blocks:
            data = data.with_column_blocks()
        print(f"wrote {data!r}")


def cmd_info(args):
    from .store.describe import store_info  # the metadata alone: neither zarr nor the store's arrays

    info = store_info(args.store)
    if args.json:
        print(json.dumps(info, indent=2))
        return
    print(f"{info['path']}: {info['shape'][0]} x {info['shape'][1]} {info['dtype']} ({info['layout']}), "
          f"nnz {info['nnz']}, {info['n_blocks']} blocks")
    from .reports.terminal import format_table

    print(format_table(info["groups"]))


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def _method_options(declarations) -> dict[str, dict]:
    """Every method's user-set parameters and fit inputs as command-line options: option name -> the
    parameters (one per method that has it, by method name) and, for a fit input, its declaration."""
    options: dict[str, dict] = {}
    for name, declaration in declarations.items():
        for parameter in declaration.parameters().values():
            options.setdefault(parameter.name, {})[name] = parameter
        for fit_input in declaration.fit_inputs:
            options.setdefault(fit_input.name, {})[name] = fit_input
    return options


def _add_method_options(p, declarations) -> None:
    """The methods' parameters as options (``--solver``, ``--tol``, ...), derived from their estimators: an
    option left out is absent from the parsed arguments, which leaves the estimator's own default in place (shown
    in the help per method)."""
    if not declarations:  # a command that fits nothing: no estimator imported
        return
    from .estimators.contract import FitInput

    g = p.add_argument_group("method parameters (default: the method's estimator's own, listed per method)")
    for name, by_method in _method_options(declarations).items():
        first = next(iter(by_method.values()))
        if isinstance(first, FitInput):  # given as text
            g.add_argument(_option(name), default=argparse.SUPPRESS,
                           help=f"{', '.join(by_method)}: {first.help} (default {first.default!r})".replace("%", "%%"))
            continue
        kinds = {parameter.kind for parameter in by_method.values()}
        if len(kinds) > 1:
            raise TypeError(f"parameter {name!r} is a {' in one method and a '.join(k.__name__ for k in kinds)} "
                            "in another: a command-line option has one type")
        defaults = ", ".join(f"{method} {parameter.default!r}" for method, parameter in by_method.items())
        text = f"{first.help} (default: {defaults})".replace("%", "%%")
        choices = sorted({c for parameter in by_method.values() for c in parameter.choices or ()}) or None
        if first.kind is bool:
            g.add_argument(_option(name), action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=text)
        else:
            g.add_argument(_option(name), type={int: _number(int), float: _number(float)}.get(first.kind, str),
                           choices=choices, default=argparse.SUPPRESS, help=text)


def _given(args, declaration) -> tuple[dict, dict]:
    """The estimator parameters and fit inputs the user gave for ``declaration``'s method; an option of another
    method is a ValueError naming it."""
    from .estimators.contract import FitInput

    params, inputs = {}, {}
    mine = {**declaration.parameters(), **{i.name: i for i in declaration.fit_inputs}}
    for name in _method_options(_methods()):
        if not hasattr(args, name):
            continue
        value = getattr(args, name)
        if name not in mine:
            raise ValueError(f"{_option(name)} does not apply to {declaration.name} (its options: "
                             f"{', '.join(_option(n) for n in mine) or 'none'})")
        (inputs if isinstance(mine[name], FitInput) else params)[name] = value
    return params, inputs


def cmd_fit(args):
    import numpy as np

    from .engine.cluster import client_for
    from .engine.progress import show_iterations
    from .outputs import OutputDir
    from .reports.terminal import group_metrics_table
    from .store import open_store

    declaration = _method(args.method)
    params, inputs = _given(args, declaration)
    data = open_store(args.store)
    checkpointing = bool(args.checkpoint_every or args.resume)
    accepted = inspect.signature(declaration.estimator.__init__).parameters
    if checkpointing and "checkpoint_dir" not in accepted:
        raise ValueError(f"--checkpoint-every and --resume do not apply to {declaration.name} (its estimator does "
                         "not checkpoint)")
    # Checkpoints live in the staging directory (beside --output) until the fit completes; --resume finds them there.
    with OutputDir(args.output, "fit", overwrite=args.overwrite, resume=args.resume,
                   keep=("checkpoints",) if checkpointing else (), scratch=("checkpoints",)) as out:
        checkpoints = dict(checkpoint_dir=out.path, checkpoint_every=args.checkpoint_every or "auto",
                           resume=args.resume) if checkpointing else {}
        model = declaration.make(args.rank, params, random_state=args.seed, **checkpoints)
        progress = None if args.no_progress else show_iterations(model)
        with client_for(args.scheduler, args.local_cluster, args.tls_dir) as client:
            if client is not None:
                print(f"dashboard: {client.dashboard_link}", file=sys.stderr)
            started = time.perf_counter()
            model.fit(data, **declaration.fit_arguments(model, inputs, data, client, os.path.join(out.path, "W")))
            seconds = time.perf_counter() - started
        if progress is not None:  # (the model keeps it as its callback; a saved model holds no callable)
            progress.close("converged" if np.all(model.converged_) else "")
        written = write_fit_output(out.path, declaration, model, data, args, seconds)
        out.commit()
    table = model.group_metrics_
    if declaration.nested_ranks:
        table = table[table["rank"] == args.rank]
    print(group_metrics_table(table, data))
    if data.feature_names is not None:
        from .reports.fits import component_table

        print("\ntop features per component:")
        print("\n".join(f"{row[0]:>3}  {', '.join(row[1:])}" for row in component_table(model, 10)))
    print(f"wrote {', '.join(os.path.join(args.output, name) for name in written)}")


def write_fit_output(directory: str, declaration, model, data, args, seconds: float) -> list[str]:
    """What ``distfact fit`` writes for every method, plus the method's own arrays and facts; returns the names
    of what was written."""
    import numpy as np

    from .outputs import write_json

    written = []
    if os.path.isdir(os.path.join(directory, "W")):
        np.save(os.path.join(directory, "rows.npy"), data.row_index())  # W's stored row -> input row
        written += ["W/ (one array per block; rows.npy maps them back)"]
    arrays = {"components.npy": model.components_, **(_resolve(declaration.arrays)(model) if declaration.arrays else {})}
    for name, array in arrays.items():
        np.save(os.path.join(directory, name), array)
    model.save(os.path.join(directory, "model.npz"))
    model.group_metrics_.to_csv(os.path.join(directory, "group_metrics.csv"), index=False)
    n_iter = np.asarray(model.n_iter_).tolist()
    params = {k: v for k, v in model.get_params().items() if k in declaration.parameters()}
    write_json(os.path.join(directory, "metrics.json"), {
        "method": declaration.name, "rank": args.rank, "seed": args.seed, "params": params, "seconds": seconds,
        "n_iter": n_iter,
        "n_passes": int(model.n_passes_), "converged": bool(np.all(model.converged_)),
        "objective_history": np.asarray(model.objective_history_).tolist(), "scheduler": model.scheduler_,
        "store": os.path.abspath(args.store), **(_resolve(declaration.facts)(model) if declaration.facts else {})})
    return written + list(arrays) + ["model.npz", "group_metrics.csv", "metrics.json"]


def _parse_ranks(text: str) -> range:
    from .estimators.select import rank_range

    try:
        return rank_range(text)
    except ValueError as exc:
        raise ValueError(f"--ranks {exc}") from None


def cmd_report(args):
    from .outputs import OutputDir, read_manifest
    from .reports.page import parse_image_shape

    if read_manifest(args.path, "fit") is not None:
        if args.paper is not None:
            flag = _method(args.paper).paper_report.flag
            raise ValueError(f"{args.path} is a fit output; a paper report (--{flag}) reads a store")
        with OutputDir(args.output, "report", overwrite=args.overwrite) as out:
            from .reports.fit import write_fit_report

            paths = write_fit_report(args.path, out.path, top=args.top, image_shape=args.image_shape)
            out.commit()
        print(f"wrote {os.path.join(args.output, os.path.relpath(paths['html'], out.path))}")
        return
    if args.paper is None:
        flags = [f"--{d.paper_report.flag}" for d in _methods().values() if d.paper_report is not None]
        raise ValueError(f"{args.path} is not a fit output (no distfact-output.json of a fit); for a store, ask "
                         f"for a paper report: {', '.join(flags)}")
    from .engine.cluster import client_for
    from .store import open_store

    declaration = _method(args.paper)
    params, inputs = _given(args, declaration)
    data = open_store(args.path)
    options = {"rank": args.rank, "ranks": _parse_ranks(args.ranks), "seed": args.seed, "top": args.top,
               "image_shape": parse_image_shape(args.image_shape, data.shape[1]), "params": params,
               "progress": not args.no_progress,
               "inputs": {**{i.name: i.default for i in declaration.fit_inputs}, **inputs}}
    name = os.path.basename(os.path.normpath(data.path))
    with OutputDir(args.output, "report", overwrite=args.overwrite) as out, \
            client_for(args.scheduler, args.local_cluster, args.tls_dir) as client:
        paths = _resolve(declaration.paper_report.run)(data, options, client, out.path,
                                                      f"{declaration.paper_report.flag}: {name}")
        out.commit()
    final = {key: os.path.join(args.output, os.path.relpath(path, out.path)) for key, path in paths.items()}
    tables = f", {final['csv']}" if "csv" in final else ""
    print(f"wrote {final['html']}{tables} and the figures in {args.output}")


def cmd_select_rank(args):
    from .engine.cluster import client_for
    from .engine.progress import show_iterations
    from .outputs import OutputDir
    from .estimators.select import refusal, select_rank
    from .reports.terminal import format_table
    from .store import open_store

    declaration = _method(args.method)
    reason = refusal(declaration.estimator)
    if reason is not None:
        takers = [name for name, d in _methods().items() if refusal(d.estimator) is None]
        raise ValueError(f"select-rank cannot take {declaration.name}: {reason}; methods it takes: "
                         f"{', '.join(takers) or 'none'}")
    params, inputs = _given(args, declaration)
    data = open_store(args.store)
    ranks = _parse_ranks(args.ranks)
    model = declaration.make(ranks[0], params, random_state=args.seed)
    progress = None if args.no_progress else show_iterations(model, "select-rank: iteration")
    report = OutputDir(args.report, "report", overwrite=args.overwrite, option="--report") if args.report else None
    with report or contextlib.nullcontext(), client_for(args.scheduler, args.local_cluster, args.tls_dir) as client:
        arguments = declaration.fit_arguments(model, inputs, data, client)
        result = select_rank(model, data, ranks=ranks, n_splits=args.n_splits, holdout=args.holdout,
                             random_state=args.seed, rule=args.rule, fit=args.fit, **arguments)
        if progress is not None:
            progress.close()
        if report is not None:
            from .reports.selection import write_selection_report

            settings = {"method": declaration.name, "store": os.path.abspath(args.store), "ranks": list(ranks),
                        "n_splits": args.n_splits, "holdout": args.holdout, "fit": args.fit}
            write_selection_report(report.path, result, settings, declaration.name, f"select-rank: "
                                   f"{declaration.name} on {os.path.basename(os.path.normpath(args.store))}")
            report.commit()
    written = [path for path in (args.output, args.report and os.path.join(args.report, "report.html")) if path]
    if args.output:
        from .outputs import write_text

        write_text(args.output, result.table.to_csv(index=False))
    print(format_table([{**row, "chosen": "<-" if row["rank"] == result.rank_ else ""}
                        for row in result.summary.to_dict("records")]))
    print(f"chosen rank ({args.rule}): {result.rank_}; "
          + ", ".join(f"{rule}: {rank}" for rule, rank in result.choices.items())
          + (f"; wrote {', '.join(written)}" if written else ""))


def cmd_run(args):
    from .pipeline import RunLocked, StageFailed, run_pipeline

    try:
        result = run_pipeline(args.spec, date=args.date, root=args.output, resume=args.resume, force=args.force,
                              scheduler=args.scheduler, tls_dir=args.tls_dir)
    except (StageFailed, RunLocked) as exc:
        print(f"distfact run: {exc}", file=sys.stderr)
        return 1
    if result["ran"]:
        print(f"{result['run_dir']}: ran {', '.join(result['ran'])}; report: "
              f"{os.path.join(result['run_dir'], 'report', 'report.html')}")
    else:
        print(f"{result['run_dir']}: up to date (spec and data unchanged), nothing to do")
    if result["alerts"]:
        from .pipeline.alerts import EXIT_ALERT

        for alert in result["alerts"]:
            print(f"distfact run: alert: {alert['message']}", file=sys.stderr)
        return EXIT_ALERT
    return 0


def cmd_runs(args):
    from .pipeline.alerts import run_summaries
    from .reports.terminal import format_table

    runs_dir = os.path.join(os.path.abspath(os.path.expanduser(args.root)), args.name)
    rows = run_summaries(runs_dir)
    if not rows:
        raise ValueError(f"no complete runs of {args.name!r} in {runs_dir}")
    print(format_table(rows))


def cmd_demo(args):
    from .demo import run_demo
    from .pipeline import RunLocked, StageFailed

    try:
        run_demo(args.output, scheduler=args.scheduler, tls_dir=args.tls_dir)
    except (StageFailed, RunLocked) as exc:
        print(f"distfact demo: {exc}", file=sys.stderr)
        return 1


def cmd_warmup(args):
    from .warmup import WarmupFailed
    from .warmup import main as warm_up

    try:
        warm_up(args.processes)
    except WarmupFailed as exc:  # a share failed (its error printed above), or no several processes here
        print(f"distfact warmup: {exc}", file=sys.stderr)
        return 1


def cmd_make_certs(args):
    from .engine.tls import make_certificates

    try:
        paths = make_certificates(args.directory, hosts=args.host or ("localhost", "127.0.0.1"), days=args.days)
    except (FileExistsError, ImportError) as exc:
        raise ValueError(str(exc)) from exc
    print(f"wrote {', '.join(paths)}; start a TLS cluster with cluster/start-local.sh --tls {args.directory} and "
          f"connect with --tls-dir {args.directory}")


def main(argv=None) -> int:
    """Run a command. Exit status: 0 done; 3 a pipeline run crossed an [alerts] threshold; 2 bad input or a bad environment (a one-line message naming the problem
    and where: a missing or corrupt file, a full or read-only disk, an unreachable scheduler); 1 a failed pipeline
    stage, another process writing the same output (or running the same pipeline and date), a lost cluster, or an
    internal error (with its traceback: please report it); ``--debug`` shows the traceback of any error."""
    words = sys.argv[1:] if argv is None else list(argv)
    command = next((word for word in words if not word.startswith("-")), None)
    args = _parser(with_methods=command in ("fit", "report", "select-rank")).parse_args(argv)
    level = {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    commands = {"ingest": cmd_ingest, "info": cmd_info, "fit": cmd_fit, "report": cmd_report,
                "select-rank": cmd_select_rank, "run": cmd_run, "runs": cmd_runs,
                "demo": cmd_demo, "warmup": cmd_warmup, "make-certs": cmd_make_certs}
    try:
        return commands[args.command](args) or 0
    except (ValueError, OSError) as exc:
        if args.debug:
            raise
        print(f"distfact {args.command}: error: {_describe(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as exc:
        from .engine import WorkerLost  # here, not at start-up: importing the engine takes a third of a second
        from .outputs import Locked

        if args.debug or not isinstance(exc, (Locked, WorkerLost)):
            raise
        print(f"distfact {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"distfact {args.command}: interrupted", file=sys.stderr)
        return 130


def _describe(exc: BaseException) -> str:
    """One line for an error: an OSError's reason and file (its str() reads "[Errno 28] ..."), else its message."""
    if isinstance(exc, OSError) and exc.strerror:
        where = exc.filename if exc.filename is not None else ""
        return f"{exc.strerror}" + (f": {where!r}" if where else "")
    return str(exc).replace("\n", " ") if isinstance(exc, OSError) else str(exc)


if __name__ == "__main__":
    sys.exit(main())
