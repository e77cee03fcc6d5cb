"""Reports for the terminal: per-group tables as plain text (``distfact info``, ``distfact fit``)."""

from __future__ import annotations


def group_table(model, data) -> list[dict]:
    """One row per group: its size, the loss restricted to it and its relative error."""
    return [
        {"group": str(name), "rows": int(rows), "loss": float(loss), "relative_error": float(err)}
        for name, rows, loss, err in zip(model.group_names_, data.group_sizes, model.group_losses_,
                                         model.group_errors_)
    ]


def format_table(rows: list[dict]) -> str:
    """A plain-text table for the terminal."""
    columns = list(rows[0])
    cells = [[f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c]) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)
