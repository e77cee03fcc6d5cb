"""Per-group metrics shared by the estimators and the reports."""

from __future__ import annotations

import numpy as np


def relative_to(values, scales) -> np.ndarray:
    """``values / scales`` group by group (a group's error relative to its data's norm or sum), where a group of
    zeros (scale 0) keeps its value as it is: 0 when it is reconstructed exactly, as after any iteration of the
    multiplicative or HALS updates, never an infinity or 0 / 0."""
    scales = np.asarray(scales, dtype=np.float64)
    return np.asarray(values, dtype=np.float64) / np.where(scales > 0, scales, 1.0)


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
