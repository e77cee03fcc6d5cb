"""Source files into a store: which ingest a file takes (by its suffix), for ``distfact ingest`` and a pipeline's
``[input] source`` alike. The surfaces check their own options first (and word their errors in them)."""

from __future__ import annotations

import os

from .corpus import JSONL_SUFFIXES, from_corpus
from .files import load_mask, load_npz, read_labels
from .grouped import GroupedMatrix
from .ingest import from_arrays
from .tables import CSV_SUFFIXES, PARQUET_SUFFIXES, from_table

TABLE_SUFFIXES = (*CSV_SUFFIXES, *PARQUET_SUFFIXES)
SOURCE_SUFFIXES = (".npz", *TABLE_SUFFIXES, *JSONL_SUFFIXES)


def source_kind(source) -> str | None:
    """``"table"`` (CSV or Parquet), ``"corpus"`` (JSONL, or a directory of JSONL files) or ``"arrays"`` (.npz),
    by the name of ``source``; None for anything else."""
    lower = os.fspath(source).lower()
    if lower.endswith(TABLE_SUFFIXES):
        return "table"
    if lower.endswith(JSONL_SUFFIXES) or os.path.isdir(source):
        return "corpus"
    if lower.endswith(".npz"):
        return "arrays"
    return None


def ingest_source(source, dest, *, group_column: str | None = None, groups_file: str | None = None,
                  signed: bool = False, text_field: str = "text", group_field: str = "group", vectorizer: str = "tfidf",
                  max_features: int = 20000, block_rows: int | None = None, overwrite: bool = False,
                  missing: str | None = None, mask_file: str | None = None, progress=None) -> GroupedMatrix:
    """The store at ``dest`` ingested from the file (or corpus directory) ``source`` by its kind
    (:func:`source_kind`): a table by ``group_column`` (:func:`from_table`); a corpus by ``text_field``,
    ``group_field``, ``vectorizer`` and ``max_features`` (:func:`from_corpus`, non-negative: ``signed`` does
    not apply); an .npz's X and groups, ``groups_file`` replacing the groups (:func:`from_arrays`).
    ``missing`` ("nan") and ``mask_file`` (:func:`load_mask`): a mask stored beside X, for arrays and tables.
    ``progress(done, total)`` now and then, in the unit of the source's function."""
    if not os.path.exists(source):
        raise ValueError(f"source {source!r} does not exist")
    common = {"block_rows": block_rows, "overwrite": overwrite, "progress": progress}
    kind = source_kind(source)
    if kind == "corpus" and (missing is not None or mask_file is not None):
        raise ValueError("a mask (--missing, --mask) applies to array and table sources; a corpus has no missing "
                         "entries")
    masking = {"missing": missing, "mask": None if mask_file is None else load_mask(mask_file)}
    if kind == "table":
        return from_table(source, group_column, dest, signed=signed, **masking, **common)
    if kind == "corpus":
        return from_corpus(source, dest, text_field=text_field, group_field=group_field, vectorizer=vectorizer,
                           max_features=max_features, **common)
    if kind == "arrays":
        X, groups = load_npz(source)
        if groups_file:
            groups = read_labels(groups_file)
        return from_arrays(X, groups, dest, signed=signed, **masking, **common)
    raise ValueError(f"source {source!r}: unknown kind (expected .npz, a table ({', '.join(CSV_SUFFIXES)}, "
                     f"{', '.join(PARQUET_SUFFIXES)}) or a corpus ({', '.join(JSONL_SUFFIXES)}))")
