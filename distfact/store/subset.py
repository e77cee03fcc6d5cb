"""One group's rows of a :class:`GroupedMatrix` as a GroupedMatrix of their own, read from the same blocks (no
copy of X): what ``select_rank(fit="per_group")`` fits each group's models on.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .format import Metadata
from .grouped import GroupedMatrix


class GroupRows(GroupedMatrix):
    """Group ``group`` of ``data`` alone, as if its rows had been ingested by themselves with the same blocks.

    One group, ``data``'s blocks of that group renumbered from 0 (stored rows from 0), read where they are (the
    same store on disk, or the same arrays in memory). Rows are numbered 0..m_l-1 in the order of their numbers
    in ``data``: ``row_index()`` maps each stored row to that number, and ``source_rows[k]`` is row k's number in
    ``data``, so ``mask[source_rows]`` is a mask of ``data`` cut to the group, and a W of this matrix (its row
    order) goes back to ``data``'s rows as ``W_data[source_rows] = W``.

    A fit on a ``GroupRows`` is bitwise the same fit on the group's rows ingested alone with the same block
    boundaries (their starts draw from the stored rows, numbered alike). Column blocks of a store on disk are
    refused (they would be written into the whole store).
    """

    def __init__(self, data: GroupedMatrix, group: int):
        mine = [b for b in data.blocks if b.group == group]
        first = data.meta.groups[group].row_start
        blocks = [replace(b, index=i, group=0, row_start=b.row_start - first, row_stop=b.row_stop - first)
                  for i, b in enumerate(mine)]
        record = data.meta.groups[group]  # its statistics are its rows' (not its blocks'): the same ingested alone
        stats = replace(record, row_start=0, row_stop=record.row_stop - record.row_start)
        meta = Metadata((stats.row_stop, data.shape[1]), data.meta.dtype, data.layout, [stats], blocks,
                        has_feature_names=data.meta.has_feature_names, source=data.meta.source,
                        signed=data.meta.signed, arrays=data.meta.arrays, mask=data.meta.mask,
                        version=data.meta.version)
        meta.check(f"group {data.group_names[group]!r} of {data!r}")
        stored = data.row_index()[first:stats.row_stop + first]
        self.source_rows = np.sort(stored)
        self._positions = np.searchsorted(self.source_rows, stored)
        sums = None if data.group_column_sums is None else data.group_column_sums[group:group + 1].copy()
        super().__init__(meta, None if sums is None else sums[0], path=data.path,
                         blocks=None if not data.in_memory else [data._blocks[b.index] for b in mine],
                         masks=None if data._masks is None else [data._masks[b.index] for b in mine],
                         block_rows=[self._positions[b.row_start:b.row_stop] for b in blocks],
                         feature_names=data.feature_names, verify=data.verify, group_column_sums=sums)

    @property
    def column_sums(self) -> np.ndarray:
        """The group's column sums: ``data``'s record of them, or (a store written before appends, which has none)
        its rows' running sums read from its blocks on first use (only the multigroup SVD needs them)."""
        if self._column_sums is None:
            from ..kernels.running_sums import add_rows

            self._column_sums, running = np.zeros(self.shape[1]), np.zeros(2)
            for block in self.blocks:
                add_rows(self.load_block(block.index), self._column_sums, running)
        return self._column_sums

    @column_sums.setter
    def column_sums(self, value) -> None:
        self._column_sums = value

    def row_index(self) -> np.ndarray:
        return self._positions

    def with_column_blocks(self, block_bytes=None, n_blocks=None) -> GroupedMatrix:
        if not self.in_memory:
            raise ValueError("column blocks of one group's rows of a store on disk are not supported (they would "
                             "be written into the whole store)")
        return super().with_column_blocks(block_bytes, n_blocks)
