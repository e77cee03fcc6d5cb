"""Per-group metrics shared by the estimators."""

from __future__ import annotations

import numpy as np


def relative_to(values, scales) -> np.ndarray:
    """``values / scales`` group by group (a group's error relative to its data's norm or sum), where a group of
    zeros (scale 0) keeps its value as it is: 0 when it is reconstructed exactly, as after any iteration of the
    multiplicative or HALS updates, never an infinity or 0 / 0."""
    scales = np.asarray(scales, dtype=np.float64)
    return np.asarray(values, dtype=np.float64) / np.where(scales > 0, scales, 1.0)
