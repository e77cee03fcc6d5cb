"""Grouped matrices on Zarr: format, ingest and validation."""

from .grouped import BlockReader, ColumnBlockReader, GroupedMatrix, StoreWriter, open_store
from .format import Block, ColumnBlock
from .ingest import from_arrays
from .tables import from_table
from .corpus import from_corpus

__all__ = ["Block", "BlockReader", "ColumnBlock", "ColumnBlockReader", "GroupedMatrix", "StoreWriter",
           "from_arrays", "open_store"]
__all__ += ["from_table", "from_corpus"]
