"""Source files into a store: which ingest a file takes (by its suffix), for ``distfact ingest`` and a pipeline's
``[input] source`` alike. The surfaces check their own options first (and word their errors in them)."""

from __future__ import annotations

import os

from .corpus import JSONL_SUFFIXES, _corpus_files, from_corpus
from .files import fingerprint, load_mask, load_npz, read_labels
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
    masking = source_masking(kind, missing, mask_file)
    if kind == "table":
        return from_table(source, group_column, dest, signed=signed, **masking, **common)
    if kind == "corpus":
        return from_corpus(source, dest, text_field=text_field, group_field=group_field, vectorizer=vectorizer,
                           max_features=max_features, **common)
    if kind == "arrays":
        X, groups = load_npz(source)
        if groups_file:
            groups = read_labels(groups_file)
        return from_arrays(X, groups, dest, signed=signed, ingest={"sources": [fingerprint(source)]}, **masking,
                           **common)
    raise _unknown_kind(source)


def source_masking(kind: str | None, missing: str | None, mask_file: str | None) -> dict:
    """The ``missing`` and ``mask`` (weights loaded from ``mask_file``) an ingest or append of a source of ``kind``
    passes on: a mask applies to arrays and tables, not to a corpus."""
    if kind == "corpus" and (missing is not None or mask_file is not None):
        raise ValueError("a mask (--missing, --mask) applies to array and table sources; a corpus has no missing "
                         "entries")
    return {"missing": missing, "mask": None if mask_file is None else load_mask(mask_file)}


def _unknown_kind(source) -> ValueError:
    return ValueError(f"source {source!r}: unknown kind (expected .npz, a table ({', '.join(CSV_SUFFIXES)}, "
                      f"{', '.join(PARQUET_SUFFIXES)}) or a corpus ({', '.join(JSONL_SUFFIXES)}))")


def append_source(source, dest, *, group_column: str | None = None, groups_file: str | None = None,
                  block_rows: int | None = None, missing: str | None = None, mask_file: str | None = None,
                  progress=None) -> tuple[GroupedMatrix, dict]:
    """Append the file (or the corpus files) ``source`` to the store ``dest`` (``distfact ingest --append``): a table,
    a corpus (a file, or a directory of partitions) or an .npz, by its kind, read as the store's first ingest was
    (:mod:`distfact.store.append`). Files whose content the store already holds (its ``ingests`` record their
    SHA-256) are skipped, so that appending a partition again, or a directory of partitions of which some are new,
    is idempotent. ``missing`` and ``mask_file``: the appended rows' mask, for a store with one (see
    :class:`distfact.store.append.AppendWriter`). Returns the store and what was done: ``version`` (None when nothing was appended), ``rows``,
    ``skipped`` (``file -> version`` that holds its content) and, for a vocabulary, ``out_of_vocabulary``."""
    from .append import append_arrays, append_corpus, append_table, ingested_sources

    if not os.path.exists(source):
        raise ValueError(f"source {source!r} does not exist")
    kind = source_kind(source)
    if kind is None:
        raise _unknown_kind(source)
    masking = source_masking(kind, missing, mask_file)
    store = GroupedMatrix.open(dest)
    known = ingested_sources(store.meta)
    files = _corpus_files(source) if kind == "corpus" else [os.path.abspath(source)]
    prints = {f: fingerprint(f)["sha256"] for f in files}
    skipped = {f: known[digest] for f, digest in prints.items() if digest in known}
    new = [f for f in files if f not in skipped]
    outcome = {"version": None, "rows": 0, "skipped": skipped}
    if not new:
        return store, outcome
    if kind == "corpus":
        appended, outcome["out_of_vocabulary"] = append_corpus(dest, new, block_rows=block_rows, progress=progress)
    elif kind == "table":
        appended = append_table(dest, new[0], group_column=group_column, block_rows=block_rows, progress=progress,
                                **masking)
    else:
        X, groups = load_npz(new[0])
        if groups_file:
            groups = read_labels(groups_file)
        appended = append_arrays(dest, X, groups, block_rows=block_rows, ingest={"sources": [fingerprint(new[0])]},
                                 progress=progress, **masking)
    if appended.meta.version != store.meta.version:
        outcome.update(version=appended.meta.version, rows=appended.shape[0] - store.shape[0])
    return appended, outcome
