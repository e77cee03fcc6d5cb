"""Stop a fit at the first non-finite value (DESIGN §7: never exit 0 with NaN in an output).

Checked where the values are made: every block task checks its statistics and its new local factor, the driver
checks the global state after each global step and the objective after each pass. Small fits (issue 19) check what
the engine copies into its kept allocations by one test over each allocation (:func:`all_finite`): the blocks of an
in-process pass run in turn all at once, the global state as a whole; the per-array checks then only name where. The error names the iteration,
the block and its group, and the array. The arrays are a block's rows x rank or rank x n_features: a cheap check
beside the products that made them.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp


# Up to this size an array is checked first by its sum of squares: one BLAS dot, below the size at which OpenBLAS
# starts threads for it, and half the time of ``isfinite(array).all()``.
DOT_CHECK_MAX_SIZE = 8192
_FLOAT64 = np.dtype(np.float64)


def finite_array(array: np.ndarray) -> bool:
    """Whether a floating-point array holds no NaN and no infinity. The sum of squares of a small array is finite
    unless it does or its values are beyond 1e154 (then the exact test decides): the engine checks every block's
    factor and statistics on every pass, and small fits make many small ones (issue 19)."""
    if 0 < array.size <= DOT_CHECK_MAX_SIZE:
        flat = array if array.ndim == 1 else array.ravel()  # a vector's own dot: less dispatch than np.vdot
        if math.isfinite(flat.dot(flat)):
            return True
    return bool(np.isfinite(array).all())


def all_finite(items: list) -> bool:
    """Whether every floating-point array or number in ``items`` (as :func:`first_nonfinite` reads them) is finite:
    one test over what :func:`~distfact.kernels.memory.aligned_holding` returns covers a whole pass's small arrays
    (issue 19); only when it fails does :func:`check_block` look for where."""
    for item in items:
        if isinstance(item, np.ndarray):
            if item.dtype.kind != "f":
                continue
            if 0 < item.size <= DOT_CHECK_MAX_SIZE:  # finite_array's tests, without its call (issue 19)
                flat = item if item.ndim == 1 else item.ravel()
                if math.isfinite(flat.dot(flat)):
                    continue
            if not np.isfinite(item).all():
                return False
        elif isinstance(item, float):  # also numpy's float64
            if not math.isfinite(item):
                return False
        elif _nonfinite_path(item) is not None:
            return False
    return True


def first_nonfinite(value, name: str = "") -> str | None:
    """The name (``key``, ``key[i]``) of the first floating-point array or number in ``value`` (also inside dicts,
    lists, tuples, sparse matrices) holding a NaN or an infinity; None if all are finite."""
    path = _nonfinite_path(value)
    if path is None:
        return None
    for indexed, key in path:
        name = f"{name}[{key}]" if indexed else (f"{name}/{key}" if name else str(key))
    return name


def _nonfinite_path(value) -> list | None:
    """The steps (whether an index of a list or tuple, and the index or key), innermost last, leading to the first
    non-finite entry of ``value``; None if none. Names are only made once one is found."""
    if isinstance(value, np.ndarray):
        return None if value.dtype.kind != "f" or finite_array(value) else []
    if isinstance(value, dict):
        indexed, items = False, value.items()
    elif isinstance(value, (list, tuple)):
        indexed, items = True, enumerate(value)
    elif isinstance(value, (float, np.floating)):
        return None if math.isfinite(value) else []
    elif sp.issparse(value):
        return _nonfinite_path(value.data)
    else:
        return None
    for key, item in items:
        path = _nonfinite_path(item)
        if path is not None:
            return [(indexed, key), *path]
    return None


class NonFiniteError(ValueError):
    """A NaN or an infinity appeared in a fit, in ``what`` (an array), made by ``block`` (a row or column block) or
    at ``where`` (the global step, the objective), at ``iteration`` once the driver knows it. A ``ValueError``: the
    data or the parameters are beyond what the method can represent (the CLI exits with status 2)."""

    def __init__(self, what: str, block=None, where: str | None = None, iteration: int | None = None,
                 group_names=None):
        self.what, self.block, self.where, self.iteration, self.group_names = what, block, where, iteration, group_names
        if block is None:
            place = where
        elif hasattr(block, "row_start"):
            group = block.group if group_names is None else repr(group_names[block.group])
            place = f"block {block.index} (group {group}, stored rows {block.row_start}:{block.row_stop})"
        else:
            place = f"column block {block.index} (columns {block.col_start}:{block.col_stop})"
        at = "" if iteration is None else "pass 0 (the start): " if iteration == 0 else f"iteration {iteration}: "
        super().__init__(f"{at}{place} produced a non-finite value (NaN or infinity) in {what}; the fit stopped "
                         "(check the data's scale and the parameters)")

    def __reduce__(self):  # raised on a worker, re-raised on the driver
        return type(self), (self.what, self.block, self.where, self.iteration, self.group_names)

    def at(self, iteration: int, group_names) -> "NonFiniteError":
        """The same error, with the iteration and the group's name."""
        return NonFiniteError(self.what, self.block, self.where, iteration, list(group_names))


def check_block(block, local=None, stats=None, local_name: str = "its local factor") -> None:
    """In a block task: its new local factor (a column block: its part of the global factor) and its statistics
    are finite, else :class:`NonFiniteError`."""
    found = first_nonfinite(local)
    if found is not None:
        raise NonFiniteError(local_name + (f" ({found!r})" if found else ""), block)
    found = first_nonfinite(stats)
    if found is not None:
        raise NonFiniteError(f"statistic {found!r}", block)


def check_global(state: dict, iteration: int, where: str = "the global step") -> None:
    """On the driver, after a global step (or the start)."""
    found = first_nonfinite(state)
    if found is not None:
        raise NonFiniteError(f"{found!r}", where=where, iteration=iteration)


def check_objective(value: float, per_group, group_names, iteration: int) -> None:
    """On the driver, after a pass: the objective and its per-group terms (a vector per group, or per group and
    run: then the first group whose term is non-finite is named)."""
    if type(per_group) is not np.ndarray or per_group.dtype is not _FLOAT64:  # as the methods give it: no call
        per_group = np.asarray(per_group, dtype=np.float64)
    if math.isfinite(value) and finite_array(per_group):
        return
    per_group = per_group.ravel()
    bad = np.flatnonzero(~np.isfinite(per_group))
    if bad.size and per_group.size % len(group_names) == 0:
        group = group_names[bad[0] // (per_group.size // len(group_names))]
        raise NonFiniteError(f"its value ({per_group[bad[0]]!r})", where=f"the objective of group {group!r}",
                             iteration=iteration)
    raise NonFiniteError(f"its value ({value!r})", where="the objective", iteration=iteration)
