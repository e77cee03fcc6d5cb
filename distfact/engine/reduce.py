"""Fixed-order tree sum of per-group block statistics.

A block's statistics are a dict ``name -> array`` for the block's group; a partial
sum is a dict ``group index -> statistics``. The pairing depends only on the
number of blocks, so the floating-point result is the same on any scheduler and
any number of workers.
"""

from __future__ import annotations

from typing import Callable, Iterable, TypeVar

T = TypeVar("T")


def tree_reduce(items: list[T], combine: Callable[[T, T], T]) -> T:
    """Combine ``items`` pairwise, (0,1), (2,3), ..., level by level, in index order."""
    if not items:
        raise ValueError("nothing to reduce")
    level = list(items)
    while len(level) > 1:
        paired = [combine(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            paired.append(level[-1])
        level = paired
    return level[0]


def tree_reduce_arrivals(n_items: int, arrivals: Iterable[tuple[int, T]], combine: Callable[[T, T], T]) -> T:
    """``tree_reduce`` of ``n_items`` items that arrive in any order, as ``(index, item)`` pairs.

    The same pairs are combined in the same order as by ``tree_reduce`` (so the same floating-point
    result), each as soon as both are there: only partial sums still waiting for their sibling are
    held, not every item (per-block statistics can be large, and blocks many)."""
    sizes = [n_items]  # items per level of the tree
    while sizes[-1] > 1:
        sizes.append((sizes[-1] + 1) // 2)
    waiting: dict[tuple[int, int], T] = {}
    for index, item in arrivals:
        level = 0
        while level < len(sizes) - 1:
            odd_one_out = index == sizes[level] - 1 and sizes[level] % 2
            if not odd_one_out:
                sibling = waiting.pop((level, index ^ 1), None)
                if sibling is None:
                    waiting[(level, index)] = item
                    break
                item = combine(sibling, item) if index % 2 else combine(item, sibling)
            index, level = index // 2, level + 1
        else:
            return item
    raise ValueError(f"only some of the {n_items} items arrived" if n_items else "nothing to reduce")


def keyed(group: int, stats: dict) -> dict:
    """Wrap one block's statistics as a partial sum keyed by its group."""
    return {group: stats}


def merge(a: dict, b: dict) -> dict:
    """Add two partial sums group by group (groups in increasing order, names as given)."""
    out = {}
    for g in sorted(a.keys() | b.keys()):
        if g in a and g in b:
            out[g] = {name: a[g][name] + b[g][name] for name in a[g]}
        else:
            out[g] = a[g] if g in a else b[g]
    return out


def add(a: dict, b: dict) -> dict:
    """Add two dicts of statistics name by name (a column block's statistics are arrays over groups)."""
    return {name: a[name] + b[name] for name in a}


def split_by_group(total: dict, n_groups: int) -> list[dict]:
    """Statistics summed over column blocks (``name -> array indexed by group``) as a list indexed by group."""
    return [{name: value[g] for name, value in total.items()} for g in range(n_groups)]


def by_group(total: dict, n_groups: int) -> list[dict]:
    """The reduced partial sum as a list indexed by group."""
    missing = [g for g in range(n_groups) if g not in total]
    if missing:
        raise ValueError(f"no statistics were produced for groups {missing}")
    return [total[g] for g in range(n_groups)]
