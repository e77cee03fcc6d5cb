"""A nightly run against the nights before: per-group metric trends, component drift, and the ``[alerts]``
thresholds (a run that crosses one commits everything, writes ``alerts.json`` and exits with status 3), and the
listing of past runs with their headline metrics (``distfact runs``).

The evaluate stage writes, beside ``group_metrics.csv``:

- ``components.json``: per fit, its components' stable ids (``nightly.py: component_ids``);
- ``trends.csv``: date, fit, rank, group, metric, value over the last ``[report] trend_runs`` runs (this one
  included);
- ``drift.csv``: date, fit, id, similarity (each component's cosine similarity to its match the night before);
- ``alerts.json``: the thresholds crossed (an empty list when none is).
"""

from __future__ import annotations

import json
import os

import pandas as pd

#: the exit status of ``distfact run`` when the run crossed an alert threshold (everything is committed)
EXIT_ALERT = 3
ALERTS = "alerts.json"


def alert_options(check, table: dict, spec) -> dict:
    """The [alerts] table: ``metric`` (default ``relative_error``), ``rise`` (a group's metric rising by more than
    this fraction since the previous run), ``spread`` (the largest minus the smallest group's metric above this),
    ``vanished`` (a component of the previous run without a match tonight; default false)."""
    from ..registry import get_method  # here: the registry imports every estimator, which `distfact runs` never needs

    path = ("alerts",)
    check.keys(table, path, {"metric", "rise", "spread", "vanished"})
    metric = check.typed(table, path, "metric", str, "relative_error")
    known = {m for fit in spec.fits for m in get_method(fit.method).metrics}
    if metric not in known:
        check.fail((*path, "metric"), f"unknown metric {metric!r} for the methods of this spec (known: "
                                      f"{', '.join(sorted(known))})")
    out = {"metric": metric, "rise": check.typed(table, path, "rise", float),
           "spread": check.typed(table, path, "spread", float), "vanished": check.typed(table, path, "vanished", bool,
                                                                                       False)}
    for key in ("rise", "spread"):
        if out[key] is not None and out[key] < 0:
            check.fail((*path, key), f"must be >= 0, got {out[key]}")
    return out


def read_alerts(run_dir: str) -> list[dict]:
    """The alerts a run's evaluation found (``alerts.json`` at the run's top, named in the log by the evaluate
    stage), or none for a run without the file; a rerun that had nothing to do returns them too (its exit status
    is the run's)."""
    path = os.path.join(run_dir, ALERTS)
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return json.load(f)


def read_metrics(run_dir: str) -> pd.DataFrame:
    """A run's evaluate/group_metrics.csv (group names as written)."""
    return pd.read_csv(os.path.join(run_dir, "evaluate", "group_metrics.csv"), keep_default_na=False,
                       dtype={"group": str, "fit": str, "method": str, "metric": str})


def trends(table: pd.DataFrame, date: str, earlier: list[str]) -> pd.DataFrame:
    """Per-group metrics of the runs ``earlier`` (their directories, oldest first) and of this run (``table``,
    dated ``date``): one row per date, fit, rank, group and metric."""
    frames = [read_metrics(run).assign(date=os.path.basename(run)) for run in earlier]
    frames.append(table.assign(date=date))
    out = pd.concat(frames, ignore_index=True)
    return out[["date", "fit", "rank", "group", "metric", "value"]]


def drift(components: dict, date: str, earlier: list[str]) -> pd.DataFrame:
    """Each component's similarity to its match of the night before, per date (ids as ``components.json`` keeps
    them; a new component has none)."""
    docs = []
    for run in earlier:
        path = os.path.join(run, "evaluate", "components.json")
        if os.path.isfile(path):
            with open(path) as f:
                docs.append((os.path.basename(run), json.load(f)))
    docs.append((date, components))
    rows = [{"date": day, "fit": fit, "id": i, "similarity": s}
            for day, doc in docs for fit, entry in doc["fits"].items()
            for i, s in zip(entry["ids"], entry["similarity"])]
    return pd.DataFrame(rows, columns=["date", "fit", "id", "similarity"])


def find_alerts(options: dict, table: pd.DataFrame, before: pd.DataFrame | None, components: dict,
                auto=frozenset()) -> list[dict]:
    """The thresholds of ``options`` (the spec's [alerts]) this run's metrics ``table`` crosses, against the
    previous run's ``before`` (None on the first night) and this run's ``components.json``. ``auto``: the fits
    whose rank select_rank chooses each night (``ranks = "auto"``): such a fit has one model a night, compared to
    the night before's whatever the two ranks (both recorded); any other fit is compared rank by rank."""
    metric, out = options["metric"], []
    now = table[table["metric"] == metric]
    if options["rise"] is not None and before is not None:
        def keyed(metrics):  # an auto-ranked fit's one model a night: its rank no part of the key
            return metrics.assign(key=metrics["rank"].where(~metrics["fit"].isin(auto), -1))

        both = keyed(now).merge(keyed(before[before["metric"] == metric]), on=["fit", "key", "group"],
                                suffixes=("", "_before"))
        for row in both.itertuples(index=False):
            if row.value > row.value_before * (1 + options["rise"]):
                ranks = f" (rank {row.rank_before} before, {row.rank} tonight)" if row.rank != row.rank_before else ""
                out.append({"alert": "rise", "fit": row.fit, "rank": int(row.rank),
                            "previous_rank": int(row.rank_before), "group": row.group, "metric": metric,
                            "value": float(row.value), "previous": float(row.value_before),
                            "threshold": options["rise"],
                            "message": f"{row.fit}: group {row.group}'s {metric} rose from {row.value_before:.4g} to "
                                       f"{row.value:.4g}{ranks} (more than {options['rise']:.0%})"})
    if options["spread"] is not None:
        for (fit, rank), rows in now.groupby(["fit", "rank"], sort=False):
            spread = float(rows["value"].max() - rows["value"].min())
            if spread > options["spread"]:
                worst, best = rows.loc[rows["value"].idxmax(), "group"], rows.loc[rows["value"].idxmin(), "group"]
                out.append({"alert": "spread", "fit": fit, "rank": int(rank), "metric": metric, "value": spread,
                            "threshold": options["spread"],
                            "message": f"{fit}: the groups' {metric} spread {spread:.4g} (worst {worst}, best {best}) "
                                       f"exceeds {options['spread']:.4g}"})
    if options["vanished"]:
        for fit, entry in components["fits"].items():
            for i in entry["vanished"]:
                out.append({"alert": "vanished", "fit": fit, "id": i,
                            "message": f"{fit}: component {i} of {components['previous']} has no match tonight "
                                       f"(cosine similarity below {components['threshold']})"})
    return out


def evaluate_history(out: str, context: dict, fits: list[dict], table: pd.DataFrame) -> list[dict]:
    """The evaluate stage's part that looks back (into ``out``): ``components.json``, ``trends.csv``,
    ``drift.csv`` and ``alerts.json``; each alert found is named in the log. Returns the alerts."""
    from ..outputs import write_json
    from .nightly import component_ids, published_runs

    spec, previous, log = context["spec"], context["previous"], context["log"]
    options = spec.nightly
    components = component_ids(context["run_dir"], previous, fits, options["match_threshold"])
    write_json(os.path.join(out, "components.json"), components, indent=1)
    earlier = []
    if previous is not None:
        runs_dir = os.path.dirname(previous)
        dates = [d for d in published_runs(runs_dir) if d <= os.path.basename(previous)]
        earlier = [os.path.join(runs_dir, d) for d in dates[-(options["trend_runs"] - 1):]] \
            if options["trend_runs"] > 1 else []
    trends(table, context["date"], earlier).to_csv(os.path.join(out, "trends.csv"), index=False)
    drift(components, context["date"], earlier).to_csv(os.path.join(out, "drift.csv"), index=False)
    found = find_alerts(options["alerts"], table, None if previous is None else read_metrics(previous), components,
                        auto={entry["name"] for entry in fits if entry["fit"].select is not None})
    write_json(os.path.join(out, ALERTS), found, indent=1)
    for alert in found:
        log("evaluate", "alert", **alert)
    return found


# -- distfact runs NAME -----------------------------------------------------------------------------

def run_summaries(runs_dir: str) -> list[dict]:
    """One row per complete run (oldest first): its date, whether ``LATEST`` names it, its rows, and per fit the
    worst group's value of the fit's first metric (``metrics.json``'s ``worst_group``), and its alerts."""
    from .nightly import published_runs, read_latest

    latest = read_latest(runs_dir)
    rows = []
    for date in published_runs(runs_dir):
        with open(os.path.join(runs_dir, date, "metrics.json")) as f:
            metrics = json.load(f)
        alerts = read_alerts(os.path.join(runs_dir, date))
        row = {"date": date, "latest": "<-" if date == latest else "", "rows": metrics["input"]["shape"][0]}
        seen = set()
        for worst in metrics["worst_group"]:  # in fit order, each fit's metrics in its declared order
            if worst["fit"] not in seen:
                seen.add(worst["fit"])
                row[f"{worst['fit']} worst {worst['metric']}"] = f"{worst['value']:.4g} ({worst['group']})"
        row["alerts"] = len(alerts)
        rows.append(row)
    columns = list(dict.fromkeys(key for row in rows for key in row))  # fits come and go: every run shows each
    return [{key: row.get(key, "") for key in columns} for row in rows]
