"""Stopping rules shared by the methods (each method module says which it uses), and the sum of the groups'
statistics that their global steps start from."""

from __future__ import annotations

import numpy as np


def groups_relative_change_below(group_objectives: list[np.ndarray], tol: float) -> bool:
    """True when every group's objective moved by less than ``tol`` relative to its previous value.

    ``tol <= 0`` never stops early. Needs two recorded values.
    """
    if tol <= 0 or len(group_objectives) < 2:
        return False
    previous, current = np.asarray(group_objectives[-2]), np.asarray(group_objectives[-1])
    change = np.abs(previous - current) / np.maximum(np.abs(previous), np.finfo(np.float64).tiny)
    return bool(np.all(change < tol))


def relative_decrease_below(objectives: list[float], tol: float | None) -> bool:
    """True when the objective fell by less than ``tol`` relative to its previous value.

    ``tol`` None or <= 0 never stops early. Needs two recorded values.
    """
    if tol is None or tol <= 0 or len(objectives) < 2:
        return False
    previous, current = objectives[-2], objectives[-1]
    return bool(previous - current < tol * max(abs(previous), np.finfo(np.float64).tiny))


def group_sums(stats: list[dict]) -> dict:
    """Each statistic summed over the groups, ``{name: sum(s[name] for s in stats)}`` with the same additions
    (0 + the first group's, then each next group's in order), without a generator per statistic (small fits
    sum them every iteration, issue 19). One group's are its own arrays, not copies (0 + x is x but for the sign
    of a zero): a global step reads its sums and writes into none (tests/test_engine.py)."""
    first, rest = stats[0], stats[1:]
    if not rest:
        return dict(first)
    total = {name: 0 + value for name, value in first.items()}
    for s in rest:
        for name in total:
            total[name] = total[name] + s[name]
    return total
