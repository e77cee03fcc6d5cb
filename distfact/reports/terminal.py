"""Reports for the terminal: per-group tables as plain text (``distfact info``, ``distfact fit``)."""

from __future__ import annotations


def format_table(rows: list[dict]) -> str:
    """A plain-text table for the terminal."""
    columns = list(rows[0])
    cells = [[f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c]) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def group_metrics_table(table, data) -> str:
    """The per-group metrics as a plain-text table: one row per group (its rows), one column per metric."""
    sizes = dict(zip(data.group_names, data.group_sizes.tolist()))
    wide = table.pivot_table(index="group", columns="metric", values="value", sort=False)
    return format_table([{"group": str(group), "rows": sizes.get(group, 0), **{m: float(v) for m, v in row.items()}}
                         for group, row in wide.iterrows()])
