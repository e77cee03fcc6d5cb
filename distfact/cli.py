"""The ``distfact`` command line: ingest, info, fit, report, demo.

Bad input exits with status 2 and a message naming the problem and where.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import logging
import math
import os
import sys

import numpy as np

from .store.files import class_labels

EXIT_BAD_INPUT = 2
# per method: its solvers (the first is the default) and its inits (likewise); max_iter, tol and n_estimates
# default to the estimator's own (``_estimator_default``)
FIT_SOLVERS = {"nmf": ("mu", "hals"), "fairer-nmf": ("mu", "am"), "stratified-nmf": ("mu",), "wl1-nmf": ("scd",),
               "ssnmf": ("mu",), "multigroup-svd": ("auto", "fw", "brent", "sdp")}
FIT_INITS = {"nmf": ("random", "nndsvda"), "fairer-nmf": ("random",), "stratified-nmf": ("random",),
             "wl1-nmf": ("hals", "random"), "ssnmf": ("random",)}


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


COUNT = _number(int, 0)  # 0, 1, 2, ...
POSITIVE = _number(int, 1)  # 1, 2, ...
NON_NEGATIVE = _number(float, 0.0)


def _add_scheduler_options(p):
    g = p.add_argument_group("where to run (default: in this process, nothing to start)")
    g.add_argument("--scheduler", metavar="ADDRESS", help="Dask scheduler address, or a scheduler file (*.json)")
    g.add_argument("--local-cluster", metavar="N", type=POSITIVE, help="start a LocalCluster of N worker processes")
    _add_tls_option(g)


def _add_tls_option(p):
    p.add_argument("--tls-dir", metavar="DIR", help="connect over TLS with DIR/ca.pem, cert.pem, key.pem (made by "
                                                    "`distfact make-certs`; default: the Dask config's TLS settings)")


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error on one line (the usage itself is what --help is for)."""

    def error(self, message):
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
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
    p.add_argument("--overwrite", action="store_true")

    p = sub.add_parser("info", help="groups, sizes, nnz and norms of a store")
    p.add_argument("store")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = sub.add_parser("fit", help="factor a store; write H, W and metrics.json")
    p.add_argument("store")
    p.add_argument("--method", default="nmf", choices=list(FIT_SOLVERS),
                   help="nmf; fairer-nmf (min-max relative group loss); stratified-nmf (shared topics plus a "
                        "shift per group, the groups being the strata); wl1-nmf (weighted L1 loss by sparse "
                        "coordinate descent, robust to outliers and false zeros); ssnmf (semi-supervised NMF: "
                        "X ~ W H and the labels ~ W B jointly); multigroup-svd (consistent multigroup singular "
                        "vectors: min-max group loss, signed data, one pass)")
    p.add_argument("--n-estimates", type=POSITIVE,
                   help="fairer-nmf: NMF runs per group for E_l (default: the estimator's, T of the paper)")
    p.add_argument("--v-updates", type=POSITIVE, default=2, help="stratified-nmf: v updates per iteration (M)")
    p.add_argument("--lam", type=NON_NEGATIVE, default=1.0,
                   help="wl1-nmf: weight of the zeros, in [0, 1] (1: L1-NMF); ssnmf: weight of the supervision term")
    p.add_argument("--model", default="FF", choices=["FF", "FD", "DF", "DD"],
                   help="ssnmf: the (reconstruction, supervision) losses, F = Frobenius, D = I-divergence")
    p.add_argument("--labels", default="groups",
                   help="ssnmf: 'groups' (the store's groups are the classes), 'none' (NMF), or a .npy/text file "
                        "with one class label per input row (-1: unlabelled)")
    p.add_argument("--hals-iter", type=COUNT, default=10, help="wl1-nmf: HALS iterations of --init hals")
    p.add_argument("--time-limit", type=_number(float, 0.0, strict=True),
                   help="wl1-nmf: seconds after which no new iteration starts")
    p.add_argument("--rank", "-r", type=POSITIVE, required=True, help="number of components")
    p.add_argument("--solver", choices=["mu", "hals", "am", "scd", "auto", "fw", "brent", "sdp"],
                   help="nmf: mu (default) or hals; fairer-nmf: mu (default) or am; stratified-nmf: mu; wl1-nmf: scd; "
                        "multigroup-svd: auto (default: brent for two groups, fw otherwise), fw, brent or sdp")
    p.add_argument("--center", action="store_true", help="multigroup-svd: subtract the column means")
    p.add_argument("--scale", action="store_true", help="multigroup-svd: divide the columns by their std")
    p.add_argument("--beta-loss", default="frobenius", choices=["frobenius", "kullback-leibler"])
    p.add_argument("--init", choices=["random", "nndsvda", "hals"],
                   help="random (default), or nndsvda for nmf; wl1-nmf: hals (default) or random")
    p.add_argument("--max-iter", type=COUNT,
                   help="iterations at most (default: the method's estimator's; fairer-nmf: until its stopping rule "
                        "holds, as its paper)")
    p.add_argument("--tol", type=NON_NEGATIVE,
                   help="change that stops the fit (default: the method's estimator's: a relative change; "
                        "fairer-nmf: eq. (10); stratified-nmf: none, run --max-iter iterations as its paper does; "
                        "wl1-nmf: on the objective divided by sum(X))")
    p.add_argument("--seed", type=COUNT, default=0)
    p.add_argument("--output", "-o", default="distfact-fit",
                   help="output directory: written beside it in .NAME.partial/ and swapped into place when complete; "
                        "must be new, empty or an earlier fit output (replaced with --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier fit output at --output")
    p.add_argument("--checkpoint-every", type=COUNT, default=0,
                   help="checkpoint every K iterations (0: never), into .NAME.partial/checkpoints/ beside --output")
    p.add_argument("--resume", action="store_true", help="continue an interrupted fit from its newest checkpoint")
    p.add_argument("--no-progress", action="store_true")
    _add_scheduler_options(p)

    p = sub.add_parser("report", help="a method paper's views: --fairness (Fairer-NMF), --stratified "
                                      "(Stratified-NMF), --ssnmf (SSNMF) or --multigroup (multigroup SVD)",
                       description="--multigroup (multigroup-lowrank.txt, Figs. 2 and 3): fit the multigroup SVD "
                                   "of rank --rank and write the marginal, incremental and reconstruction loss by "
                                   "rank per group beside the standard SVD's, the primal and dual objectives by "
                                   "rank, and an HTML page. "
                                   "--ssnmf (ssnmf.txt, Fig. 2 and Table 5): fit SSNMF with the groups (or --labels) "
                                   "as classes and write the normalised B, the top features of each topic and an "
                                   "HTML page. "
                                   "--fairness (fairer-nmf.txt, Figs. 2, 3, 5): for each rank, fit standard NMF "
                                   "and Fairer-NMF on STORE and write fairness.csv/json, the figures and an HTML "
                                   "page. --stratified (stratified-nmf.txt, Figs. 1, 3-6): fit Stratified-NMF "
                                   "with the groups as strata and write the normalised strata features, images "
                                   "(--image-shape), top features per stratum and per topic, and an HTML page.")
    p.add_argument("store")
    kind = p.add_mutually_exclusive_group(required=True)
    kind.add_argument("--fairness", action="store_true", help="the Fairer-NMF fairness report")
    kind.add_argument("--stratified", action="store_true", help="the Stratified-NMF report")
    kind.add_argument("--ssnmf", action="store_true", help="the SSNMF report (B heat map, top features per topic)")
    kind.add_argument("--multigroup", action="store_true",
                      help="the multigroup SVD report (losses by rank per group against the SVD, duality gaps)")
    p.add_argument("--ranks", default="1:10", help="fairness: ranks as FIRST:LAST (inclusive)")
    p.add_argument("--solver", choices=["mu", "am", "auto", "fw", "brent", "sdp"],
                   help="fairness: the Fairer-NMF scheme, mu (default) or am; multigroup: auto (default), fw, brent, sdp")
    p.add_argument("--rank", "-r", type=POSITIVE, default=10,
                   help="stratified, ssnmf: number of topics; multigroup: d")
    p.add_argument("--center", action="store_true", help="multigroup: subtract the column means")
    p.add_argument("--scale", action="store_true", help="multigroup: divide the columns by their std")
    p.add_argument("--model", default="DF", choices=["FF", "FD", "DF", "DD"], help="ssnmf: the losses (R, S)")
    p.add_argument("--lam", type=NON_NEGATIVE, default=1.0, help="ssnmf: weight of the supervision term")
    p.add_argument("--labels", default="groups", help="ssnmf: 'groups' or a file of class labels (as for fit)")
    p.add_argument("--image-shape", help="stratified: features are pixels of HEIGHTxWIDTH images, e.g. 8x8")
    p.add_argument("--top", type=POSITIVE, default=10,
                   help="stratified, ssnmf: top features listed per stratum and topic")
    p.add_argument("--max-iter", type=COUNT, help="iterations (default: 5000 fairness, 100 stratified and ssnmf)")
    p.add_argument("--tol", type=NON_NEGATIVE, default=1e-6, help="fairness: the stopping tolerance of both methods")
    p.add_argument("--seed", type=COUNT, default=0)
    p.add_argument("--output", "-o", default="distfact-report",
                   help="output directory (new, empty or an earlier report, replaced with --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier report at --output")
    _add_scheduler_options(p)

    p = sub.add_parser("run", help="run a pipeline spec (TOML): ingest -> fit -> evaluate -> report -> publish",
                       description="Run the pipeline SPEC into ROOT/<name>/<date>/, each stage committed by a marker "
                                   "written last. A rerun with the same spec and data does nothing; a changed "
                                   "section redoes its stage and what follows. Exit status: 0 done or nothing to "
                                   "do, 2 a bad spec (nothing run), 1 a failed stage (named; earlier stages stay "
                                   "committed). See docs/pipelines.md.")
    p.add_argument("spec", help="the pipeline's TOML file")
    p.add_argument("--date", help="the run's date, YYYY-MM-DD (default: today)")
    p.add_argument("--output", metavar="ROOT", help="root of the runs, a path or an fsspec URL (default: the "
                                                    "spec's [output] root)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted fit from its newest checkpoint")
    p.add_argument("--force", action="store_true", help="redo every stage")
    p.add_argument("--scheduler", metavar="ADDRESS", help="Dask scheduler address or scheduler file (overrides "
                                                          "the spec's [cluster])")
    _add_tls_option(p)

    p = sub.add_parser("demo", help="run the demo pipeline: NMF of a bundled real data set, per-group report",
                       description="Runs the pipeline shipped as distfact/pipeline/demo.toml (scikit-learn's "
                                   "bundled digits, grouped by digit, NMF at ranks 5 and 10) into "
                                   "OUTPUT/demo/<date>/ and prints the per-digit errors.")
    p.add_argument("--output", "-o", default="distfact-demo")
    p.add_argument("--scheduler", metavar="ADDRESS", help="Dask scheduler address, or a scheduler file (*.json)")
    _add_tls_option(p)

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
    if kind == "table" and not args.group_column:
        raise ValueError("a table source needs --group-column")
    if kind == "corpus" and args.signed:
        raise ValueError("--signed applies to array and table sources; a corpus is non-negative")
    data = ingest_source(args.source, args.dest, group_column=args.group_column, groups_file=args.groups_file,
                         signed=args.signed, text_field=args.text_field, group_field=args.group_field,
                         vectorizer=args.vectorizer, max_features=args.max_features, block_rows=args.block_rows,
                         overwrite=args.overwrite)
    if args.column_blocks:
        data = data.with_column_blocks()
    print(f"wrote {data!r}")


def cmd_info(args):
    from .store import open_store

    info = open_store(args.store).info()
    if args.json:
        print(json.dumps(info, indent=2))
        return
    print(f"{info['path']}: {info['shape'][0]} x {info['shape'][1]} {info['dtype']} ({info['layout']}), "
          f"nnz {info['nnz']}, {info['n_blocks']} blocks")
    from .reports.terminal import format_table

    print(format_table(info["groups"]))


def _progress(args, max_iter):
    from .engine.progress import ProgressBar

    return None if args.no_progress else ProgressBar(max_iter)


def _fit_model(args, bar, checkpoint_dir):
    """The estimator ``distfact fit`` runs, from the command line's options (checkpoints in ``checkpoint_dir``)."""
    from .estimators import NMF, SSNMF, FairerNMF, StratifiedNMF, WeightedL1NMF

    solver = _method_choice(args, "--solver", args.solver, FIT_SOLVERS)
    init = _method_choice(args, "--init", args.init, FIT_INITS)
    if args.beta_loss != "frobenius" and args.method != "nmf":
        raise ValueError(f"--beta-loss {args.beta_loss} is available for nmf only")
    if args.v_updates != 2 and args.method != "stratified-nmf":
        raise ValueError("--v-updates is available for stratified-nmf only")
    if (args.hals_iter != 10 or args.time_limit is not None) and args.method != "wl1-nmf":
        raise ValueError("--hals-iter and --time-limit are available for wl1-nmf only")
    if args.lam != 1.0 and args.method not in ("wl1-nmf", "ssnmf"):
        raise ValueError("--lam is available for wl1-nmf and ssnmf only")
    if (args.model != "FF" or args.labels != "groups") and args.method != "ssnmf":
        raise ValueError("--model and --labels are available for ssnmf only")
    tol = _estimator_default(args.method, "tol") if args.tol is None else args.tol
    checkpoints = dict(checkpoint_dir=checkpoint_dir, checkpoint_every=args.checkpoint_every or 10, resume=args.resume)
    common = dict(max_iter=_max_iter(args), tol=tol, random_state=args.seed, callback=bar)
    if args.method == "ssnmf":
        return SSNMF(args.rank, model=args.model, lam=args.lam, **common, **checkpoints)
    if args.method == "wl1-nmf":
        return WeightedL1NMF(args.rank, lam=args.lam, init=init, hals_iter=args.hals_iter,
                             time_limit=args.time_limit, **common, **checkpoints)
    if args.method == "fairer-nmf":
        n_estimates = _estimator_default(args.method, "n_estimates") if args.n_estimates is None else args.n_estimates
        return FairerNMF(args.rank, solver=solver, n_estimates=n_estimates, **common, **checkpoints)
    if args.method == "stratified-nmf":
        return StratifiedNMF(args.rank, v_updates=args.v_updates, **common, **checkpoints)
    return NMF(args.rank, solver=solver, beta_loss=args.beta_loss, init=init, **common, **checkpoints)


def _method_choice(args, option: str, value, choices: dict) -> str:
    """``value`` if the method offers it, the method's default if it was not given."""
    offered = choices[args.method]
    if value is None:
        return offered[0]
    if value not in offered:
        raise ValueError(f"{option} {value} is not available for {args.method}; choose from {', '.join(offered)}")
    return value


def _estimator_default(method: str, name: str):
    """The default of parameter ``name`` of ``method``'s estimator: the CLI copies none of them."""
    from .pipeline.spec import estimator_class

    return inspect.signature(estimator_class(method).__init__).parameters[name].default


def _max_iter(args) -> int | None:
    """--max-iter, else the estimator's default (None for fairer-nmf: until its stopping rule holds)."""
    return _estimator_default(args.method, "max_iter") if args.max_iter is None else args.max_iter


def cmd_fit(args):
    from .engine.cluster import client_for
    from .reports.terminal import format_table, group_table
    from .outputs import OutputDir, write_json
    from .store import open_store

    data = open_store(args.store)
    if args.method == "multigroup-svd":
        return _fit_multigroup(args, data)
    if args.center or args.scale:
        raise ValueError("--center and --scale are available for multigroup-svd only")
    checkpointing = bool(args.checkpoint_every or args.resume)
    # Checkpoints live in the staging directory (beside --output) until the fit completes; --resume finds them there.
    with OutputDir(args.output, "fit", overwrite=args.overwrite, resume=args.resume,
                   keep=("checkpoints",) if checkpointing else (), scratch=("checkpoints",)) as out:
        bar = _progress(args, _max_iter(args))
        model = _fit_model(args, bar, out.path if checkpointing else None)
        _check_rank(model.n_components, data)
        W_out = os.path.join(out.path, "W")
        with client_for(args.scheduler, args.local_cluster, args.tls_dir) as client:
            if client is not None:
                print(f"dashboard: {client.dashboard_link}", file=sys.stderr)
            if args.method == "fairer-nmf":
                W = model.fit_transform(data, client=client)
            elif args.method == "ssnmf":
                model.fit(data, y=class_labels(args.labels, data), client=client, W_out=W_out)
            else:
                model.fit(data, client=client, W_out=W_out)
        if bar is not None:
            bar.close()
        written = ["H.npy"]
        np.save(os.path.join(out.path, "H.npy"), model.components_)
        np.save(os.path.join(out.path, "rows.npy"), data.row_index())  # W's stored row -> input row
        metrics = {"method": args.method, "rank": args.rank, "n_iter": model.n_iter_, "n_passes": model.n_passes_,
                   "converged": model.converged_, "loss_history": model.loss_history_.tolist(),
                   "scheduler": model.scheduler_, "store": os.path.abspath(args.store),
                   "groups": group_table(model, data)}
        if args.method == "fairer-nmf":
            written.append("W.npy")
            np.save(os.path.join(out.path, "W.npy"), W)
            metrics.update(E=model.E_.tolist(), c=model.c_.tolist(), max_group_loss=float(model.group_losses_.max()))
        else:
            written.append("W/ (one array per block, rows.npy maps them back)")
        if args.method == "stratified-nmf":
            written.append("v.npy")
            np.save(os.path.join(out.path, "v.npy"), model.strata_features_)  # one row per stratum, in "strata" order
            metrics.update(strata=model.strata_names_, normalised_loss=float(model.loss_history_[-1, 1]),
                           top_features=model.top_features(10))
        elif args.method == "nmf":
            metrics["reconstruction_err"] = model.reconstruction_err_
        elif args.method == "ssnmf":
            if model.B_ is not None:
                written.append("B.npy")
                np.save(os.path.join(out.path, "B.npy"), model.B_)  # Y ~ W B; columns in metrics' "classes" order
                metrics["classes"] = [str(c) for c in model.classes_]
            metrics.update(model=model._method.model, lam=args.lam, reconstruction=float(model.loss_history_[-1, 1]),
                           supervision=float(model.loss_history_[-1, 2]))
        elif args.method == "wl1-nmf":  # the L1 error, ||X - WH||_1; the groups' relative_error is its share
            metrics.update(lam=model.lam, l1_error=model.reconstruction_err_, timed_out=model.timed_out_)
        written.append("metrics.json")
        write_json(os.path.join(out.path, "metrics.json"), metrics)
        out.commit()
    print(format_table(metrics["groups"]))
    print(f"wrote {', '.join(os.path.join(args.output, name) for name in written)}")


def _check_rank(rank: int, data) -> None:
    """The rank against the store's shape, before any work (the estimators check it again)."""
    from .estimators.base import check_rank

    check_rank(rank, data.shape)


def _multigroup_model(args, solver):
    from .estimators import MultigroupSVD

    return MultigroupSVD(args.rank, solver=solver, center=args.center, scale=args.scale, random_state=args.seed,
                         **({} if args.tol is None else {"tol": args.tol}),
                         **({} if args.max_iter is None else {"max_iter": args.max_iter}))


def _fit_multigroup(args, data):
    """``fit --method multigroup-svd``: V.npy (components), group_losses.csv and metrics.json."""
    from .engine.cluster import client_for
    from .outputs import OutputDir, write_json

    nmf_only = {"--init": args.init is not None, "--beta-loss": args.beta_loss != "frobenius",
                "--checkpoint-every": bool(args.checkpoint_every), "--resume": args.resume}
    if any(nmf_only.values()):
        raise ValueError(f"{', '.join(k for k, v in nmf_only.items() if v)} do not apply to multigroup-svd "
                         "(one pass, no iterations over X)")
    model = _multigroup_model(args, _method_choice(args, "--solver", args.solver, FIT_SOLVERS))
    model._check_n_components(data.shape[1])
    with OutputDir(args.output, "fit", overwrite=args.overwrite) as out:
        with client_for(args.scheduler, args.local_cluster, args.tls_dir) as client:
            model.fit(data, client=client)
        names = ("V.npy", "group_losses.csv", "metrics.json")
        np.save(os.path.join(out.path, names[0]), model.components_)
        model.group_losses_.to_csv(os.path.join(out.path, names[1]), index=False)
        write_json(os.path.join(out.path, names[2]), {
            "method": args.method, "rank": args.rank, "solver": model.solver_, "center": args.center,
            "scale": args.scale, "n_passes": model.n_passes_, "n_iter": model.n_iter_.tolist(),
            "mu": model.mu_.tolist(), "duality_gap": model.duality_gap_.tolist(),
            "primal": model.primal_objective_.tolist(), "dual": model.dual_objective_.tolist(),
            "groups": model.group_names_, "scheduler": model.scheduler_, "store": os.path.abspath(args.store)})
        out.commit()
    print(model.group_losses_[model.group_losses_["rank"] == args.rank].to_string(index=False))
    print(f"wrote {', '.join(os.path.join(args.output, name) for name in names)}")


def _parse_ranks(text: str) -> range:
    try:
        first, last = (int(v) for v in text.split(":"))
    except ValueError as exc:
        raise ValueError(f"--ranks must be FIRST:LAST, got {text!r}") from exc
    if not 1 <= first <= last:
        raise ValueError(f"--ranks must satisfy 1 <= FIRST <= LAST, got {text!r}")
    return range(first, last + 1)


def _parse_image_shape(text):
    try:
        height, width = (int(v) for v in text.lower().split("x"))
    except ValueError as exc:
        raise ValueError(f"--image-shape must be HEIGHTxWIDTH, e.g. 8x8; got {text!r}") from exc
    return height, width


def cmd_report(args):
    from .engine.cluster import client_for
    from .outputs import OutputDir
    from .store import open_store

    data = open_store(args.store)
    name = os.path.basename(os.path.normpath(data.path))
    if not args.multigroup and (args.center or args.scale):
        raise ValueError("--center and --scale are available for --multigroup only")
    if args.multigroup and args.solver in ("mu", "am"):
        raise ValueError(f"--solver {args.solver} is for --fairness; --multigroup takes auto, fw, brent or sdp")
    if not args.multigroup and args.solver in ("auto", "fw", "brent", "sdp"):
        raise ValueError(f"--solver {args.solver} is for --multigroup; --fairness takes mu or am")
    ranks = _parse_ranks(args.ranks) if args.fairness else None
    if args.fairness:
        _check_rank(ranks[-1], data)
        small = [(g, int(n)) for g, n in zip(data.group_names, data.group_sizes) if n < ranks[-1]]
        if small:
            raise ValueError(f"--ranks {args.ranks}: group {small[0][0]!r} has {small[0][1]} rows, fewer than rank "
                             f"{ranks[-1]} (Fairer-NMF's E_l needs a rank-r NMF of every group)")
    elif not args.multigroup:
        _check_rank(args.rank, data)
    labels = class_labels(args.labels, data) if args.ssnmf else None
    if args.ssnmf and labels is None:
        raise ValueError("the SSNMF report needs classes: --labels groups or a file of labels")
    shape = None if args.image_shape is None else _parse_image_shape(args.image_shape)
    if shape is not None and shape[0] * shape[1] != data.shape[1]:
        raise ValueError(f"--image-shape {args.image_shape} has {shape[0] * shape[1]} pixels, "
                         f"the store has {data.shape[1]} features")
    with OutputDir(args.output, "report", overwrite=args.overwrite) as out, \
            client_for(args.scheduler, args.local_cluster, args.tls_dir) as client:
        if args.multigroup:
            from .reports.multigroup_svd import write_multigroup_report

            model = _multigroup_model(args, args.solver or "auto")
            model._check_n_components(data.shape[1])
            model.fit(data, client=client)
            paths = write_multigroup_report(out.path, model, title=f"Multigroup SVD: {name}")
        elif args.ssnmf:
            from .estimators import SSNMF
            from .reports.ssnmf import write_ssnmf_report

            model = SSNMF(args.rank, model=args.model, lam=args.lam,
                          max_iter=100 if args.max_iter is None else args.max_iter, random_state=args.seed)
            model.fit(data, y=labels, client=client)
            paths = write_ssnmf_report(out.path, model, top=args.top, title=f"SSNMF ({args.model}): {name}")
        elif args.stratified:
            from .estimators import StratifiedNMF
            from .reports.stratified_nmf import write_stratified_report

            model = StratifiedNMF(args.rank, max_iter=100 if args.max_iter is None else args.max_iter,
                                  random_state=args.seed)
            model.fit(data, client=client)
            paths = write_stratified_report(out.path, model, image_shape=shape, top=args.top,
                                            title=f"Stratified-NMF: {name}")
        else:
            from .reports.fairness import fairness_table, write_fairness_report

            rows = fairness_table(data, ranks=ranks, solver=args.solver or "mu", tol=args.tol,
                                  max_iter=5000 if args.max_iter is None else args.max_iter,
                                  random_state=args.seed, client=client,
                                  progress=lambda r: print(f"rank {r} done", file=sys.stderr))
            paths = write_fairness_report(rows, out.path, title=f"Fairness report: {name}")
        out.commit()
    final = {key: os.path.join(args.output, os.path.relpath(path, out.path)) for key, path in paths.items()}
    print(f"wrote {final['html']}, {final['csv']} and the figures in {args.output}")


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
    return 0


def cmd_demo(args):
    from .demo import run_demo
    from .pipeline import RunLocked, StageFailed

    try:
        run_demo(args.output, scheduler=args.scheduler, tls_dir=args.tls_dir)
    except (StageFailed, RunLocked) as exc:
        print(f"distfact demo: {exc}", file=sys.stderr)
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
    """Run a command. Exit status: 0 done; 2 bad input or a bad environment (a one-line message naming the problem
    and where: a missing or corrupt file, a full or read-only disk, an unreachable scheduler); 1 a failed pipeline
    stage, another process writing the same output (or running the same pipeline and date), a lost cluster, or an
    internal error (with its traceback: please report it); ``--debug`` shows the traceback of any error."""
    args = _parser().parse_args(argv)
    level = {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    commands = {"ingest": cmd_ingest, "info": cmd_info, "fit": cmd_fit, "report": cmd_report, "run": cmd_run,
                "demo": cmd_demo, "make-certs": cmd_make_certs}
    from .engine import WorkerLost
    from .outputs import Locked

    try:
        return commands[args.command](args) or 0
    except (ValueError, OSError) as exc:
        if args.debug:
            raise
        print(f"distfact {args.command}: error: {_describe(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (Locked, WorkerLost) as exc:
        if args.debug:
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
