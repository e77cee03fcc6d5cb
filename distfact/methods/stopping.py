"""Stopping rules shared by the methods (each method module says which it uses)."""

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
