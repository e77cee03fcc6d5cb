"""Checks applied to every block while it is ingested.

Each check raises ``ValueError`` with a message naming the problem and where it is:
the group, the row in the caller's order and, where it helps, the column.
"""

from __future__ import annotations

import numpy as np

from ..lazy import scipy_sparse as sp  # not imported by ``distfact info``

SUPPORTED_DTYPES = (np.dtype("float32"), np.dtype("float64"))


def working_dtype(dtype, where: str = "X") -> np.dtype:
    """float32/float64 are kept as given; integers and bools become float64; anything else is refused."""
    dtype = np.dtype(dtype)
    if dtype in SUPPORTED_DTYPES:
        return dtype
    if dtype.kind in "iub" or dtype == np.float16:
        return np.dtype("float64")
    raise ValueError(f"{where} has dtype {dtype}, which is not numeric; expected real numbers")


def check_csr_structure(X, where: str = "X") -> None:
    """Refuse a CSR (or CSC) matrix whose structure does not hold: ``indptr`` of one offset per row (column) and one
    more, non-decreasing from 0 to the number of stored entries, and indices within the columns (rows). scipy builds
    such a matrix from (data, indices, indptr) without looking, and its own conversions and ``toarray`` then write
    out of place; distfact's kernels read H^T and write sums at the indices they are given. Other formats pass."""
    if not sp.issparse(X) or X.format not in ("csr", "csc"):
        return
    (major, minor), (line, other) = (X.shape, ("row", "columns")) if X.format == "csr" else \
        (X.shape[::-1], ("column", "rows"))
    indptr, indices = X.indptr, X.indices
    if indptr.shape != (major + 1,) or indptr[0] != 0 or indptr[-1] != indices.size or (np.diff(indptr) < 0).any():
        raise ValueError(f"{where} is a malformed {X.format.upper()} matrix: its indptr must rise from 0 to its "
                         f"{indices.size} stored entries in {major + 1} offsets, one per {line} and one more")
    if indices.size and not (0 <= indices.min() and indices.max() < minor):
        flat = int(np.flatnonzero((indices < 0) | (indices >= minor))[0])
        at = int(np.searchsorted(indptr, flat, side="right") - 1)
        raise ValueError(f"{where} is a malformed {X.format.upper()} matrix: {line} {at} stores index "
                         f"{int(indices[flat])}, outside its {minor} {other} (0..{minor - 1})")


def check_block_values(block, group_name: str, source_rows: np.ndarray, where: str = "X",
                       signed: bool = False, square_sum: float = 0.0) -> None:
    """Refuse NaN, infinite and (unless ``signed``) negative entries, and data whose squares overflow;
    name the offending entry.

    ``source_rows[i]`` is the caller's row number of the block's i-th row. ``square_sum`` is the sum of
    the squares of every entry ingested so far, this block's included, accumulated in float64: it must
    be finite and at most the largest number of the block's dtype, so that ||X||^2, and the products
    of X's scale that the methods form (W^T X, W H), are numbers in that dtype; else the largest entry
    of the block is named.
    """
    values = block.data if sp.issparse(block) else block
    checks = [(np.isnan(values), "NaN"), (np.isinf(values), "an infinite value")]
    if not signed:
        checks.append((values < 0, "a negative value"))
    for mask, what in checks:
        if mask.any():
            first = _entry(block, np.flatnonzero(mask.ravel())[0], source_rows, group_name)
            # "Negative values in data" is the phrase scikit-learn's estimators use, and its checks look for
            prefix = "Negative values in data: " if what == "a negative value" else ""
            raise ValueError(f"{prefix}{where} has {what} {first}; "
                             + ("X must be finite" if signed else "distfact factors non-negative finite data"))
    limit = float(np.finfo(values.dtype).max)
    if not square_sum <= limit:  # also when infinite
        largest = _entry(block, np.argmax(np.abs(values.ravel())), source_rows, group_name)
        advice = " (or convert it to float64 before ingesting)" if values.dtype == np.float32 else ""
        raise ValueError(f"{where} is too large for {values.dtype}: the sum of the squares of its entries reaches "
                         f"{square_sum:.3g}, beyond the largest {values.dtype} number ({limit:.3g}), with the block "
                         f"whose largest entry is {largest}; scale X down{advice}")


def _entry(block, flat: int, source_rows: np.ndarray, group_name: str) -> str:
    """``(value) at row R, column C (group 'g')`` for the block's stored entry number ``flat``
    (of ``block.data`` for a sparse block, in C order for a dense one)."""
    flat = int(flat)
    if sp.issparse(block):
        row = int(np.searchsorted(block.indptr, flat, side="right") - 1)
        col, value = int(block.indices[flat]), block.data[flat]
    else:
        row, col = divmod(flat, block.shape[1])
        value = block[row, col]
    return f"({float(value)!r}) at row {int(source_rows[row])}, column {col} (group {group_name!r})"


def check_groups(groups, n_rows: int, where: str = "groups") -> np.ndarray:
    """Labels must be one per row of X."""
    labels = np.asarray(groups)
    if labels.ndim != 1:
        raise ValueError(f"{where} must be a 1-D vector of labels, got shape {labels.shape}")
    if labels.shape[0] != n_rows:
        raise ValueError(f"{where} has {labels.shape[0]} labels but X has {n_rows} rows")
    import pandas as pd

    missing = pd.isna(labels)
    if missing.any():
        row = int(np.flatnonzero(missing)[0])
        raise ValueError(f"{where} has a missing label ({labels[row]!r}) at row {row}")
    if labels.dtype == object:  # mixed types would not sort; labels are names
        check_label_spellings(labels, where)
        labels = labels.astype(str)
    return labels


def check_label_spellings(labels: np.ndarray, where: str = "groups") -> None:
    """Labels of an object array become names (``str``): refuse two different labels with one name (``1`` and
    ``'1'``, which would be merged into one group) and one label written two ways (``1`` and ``1.0``, equal in
    Python, which would become two groups); the error names a row of each."""
    import pandas as pd

    by_value, _ = pd.factorize(labels)  # equal labels share a code (1 == 1.0)
    by_name, names = pd.factorize(labels.astype(str))
    pairs, first = np.unique(np.stack([by_value, by_name]), axis=1, return_index=True)
    if pairs.shape[1] == by_value.max() + 1 == len(names):
        return
    for codes, outcome in ((pairs[0], "two groups"), (pairs[1], "one group")):  # one value, two names; vice versa
        values, counts = np.unique(codes, return_counts=True)
        if (counts > 1).any():
            a, b = (int(first[i]) for i in np.flatnonzero(codes == values[np.argmax(counts > 1)])[:2])
            raise ValueError(f"{where}: the labels {labels[a]!r} (row {a}, {type(labels[a]).__name__}) and "
                             f"{labels[b]!r} (row {b}, {type(labels[b]).__name__}) would be {outcome}; give labels "
                             "of one type")


def group_lookup(group_names) -> dict[str, int] | None:
    """``name -> index`` for an explicit list of group names (None stays None); refuses repeats."""
    if group_names is None:
        return None
    names = [str(g) for g in group_names]
    if len(set(names)) != len(names):
        raise ValueError(f"group_names has repeated names: {names}")
    return {name: i for i, name in enumerate(names)}
