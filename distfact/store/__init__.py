"""Grouped matrices on Zarr: format, ingest and validation."""

from .grouped import GroupedMatrix, open_store
from .reading import BlockReader, ColumnBlockReader
from .format import Block, ColumnBlock
from .ingest import StoreWriter, from_arrays
from .tables import from_table
from .corpus import from_corpus

__all__ = ["Block", "BlockReader", "ColumnBlock", "ColumnBlockReader", "GroupedMatrix", "StoreWriter",
           "from_arrays", "open_store"]
__all__ += ["from_table", "from_corpus"]
