"""Appending rows to a store on disk: new blocks (to existing groups or new ones) committed as the store's next
version (documented in ``docs/format.md``, "Appends and versions").

An append stages its blocks and the version's own arrays (column sums, per-group column sums, feature names, idf)
in a hidden sibling directory, as an ingest does, moves that directory into the store as ``versions/<k>/`` (one
rename), and then replaces the root ``zarr.json``, which holds the metadata, by a rename: the commit. Nothing the
previous version references is written, moved or removed, so a reader of that version (a ``GroupedMatrix`` opened
before) keeps reading it, and an append killed at any point leaves the store as it was (what it staged is removed by
the next append). Appends to one store are serialised by a lock (``flock`` on the store's directory, released by the
system when the process ends, however it ends).

Per-group statistics are updated from the new blocks only: a group's squared norm, sum and column sums are running
sums of its rows in order (``docs/format.md``, "Group statistics"), continued from the stored ones over the new rows,
its non-zeros the sum of its blocks'; the store's column sums are the groups' added in group order. They do not
depend on where rows are cut into blocks, so the appended store's groups, column sums, row index and feature names
are those of a fresh ingest of all the rows with any block cuts ("Equal to a fresh ingest"); its blocks are those
of a fresh ingest cut at the same rows. Rows are numbered after the store's (``row_index()`` is the row number in all the data ingested, in order);
the columns are the store's: a table's value columns must be its feature names, a corpus is vectorised with its
vocabulary (and idf weights) or its hashing vectoriser, and the tokens the vocabulary lacks are counted.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil

import numpy as np

from .files import fingerprint
from .format import Metadata, version_node
from .grouped import GroupedMatrix
from .ingest import GroupSums, StoreWriter, group_codes, input_rows, write_rows, writer_mask
from .masks import check_weights
from .writing import DEFAULT_BLOCK_BYTES, array_records, lock_store, write_arrays

logger = logging.getLogger("distfact")

STAGED_ROOT_DOCUMENT = ".root-zarr.json"  # the next root zarr.json, moved with the version into the store


class AppendWriter(StoreWriter):
    """Receives the validated blocks of an append to the store at ``path`` and commits them as its next version.

    Holds the store's lock from creation to :meth:`commit` or :meth:`abort`. Blocks are given as to a
    :class:`StoreWriter` (``add_block``), with row numbers relative to the appended source; ``commit`` takes the
    appended rows' groups in the order new groups are to follow the store's.

    ``mask`` is the appended rows' mask as a :class:`StoreWriter` takes it, and must suit the store's: to a store
    whose mask is of kind ``"nan"``, ``"nan"`` (or None: its NaN entries are missing all the same); to a store of
    kind ``"weights"``, the rows' weights (or None: every appended entry observed); each new block gets its mask
    and observed total as a fresh ingest of all the rows would. A store without a mask takes rows with no missing
    entry only (its earlier blocks have no mask to complete).
    """

    def __init__(self, path, where: str = "X", mask=None):
        path = os.path.abspath(os.fspath(path))
        self._lock = lock_store(path)
        try:
            store = GroupedMatrix.open(path)
            if store.group_column_sums is None:
                raise ValueError(f"store {path!r} was written before appends existed (it lacks the per-group column "
                                 "sums an append continues): ingest its data again to append to it")
            meta = store.meta
            super().__init__(path, meta.shape[1], meta.dtype, meta.layout, where=where, signed=meta.signed,
                             mask=mask)
            if meta.mask is not None:
                given = {"nan": "missing='nan'", "weights": "weights (mask=)"}
                if self.mask_kind not in (None, meta.mask):
                    raise ValueError(f"store {path!r} has a mask of kind {meta.mask!r}: give the appended rows' "
                                     f"missing entries as {given[meta.mask]}, not as {given[self.mask_kind]}")
                self.mask_kind = meta.mask
        except BaseException:
            self._release()
            raise
        self.store = store
        self.first_key = max(int(b.key) for b in meta.blocks) + 1
        self.row_offset = meta.shape[0]
        self._square_sum = math.fsum(g.sq_norm for g in meta.groups)
        self._group_sums = {g.name: GroupSums(store.group_column_sums[i].copy(), np.array([g.sq_norm, g.total]))
                            for i, g in enumerate(meta.groups)}

    def _check_destination(self) -> None:  # the destination is the store appended to
        pass

    def __exit__(self, exc_type, exc, tb):
        super().__exit__(exc_type, exc, tb)
        self.abort()  # (after a commit: nothing left to remove) the lock is released however the block ends
        return False

    def abort(self) -> None:
        super().abort()
        self._release()

    def _release(self) -> None:
        if getattr(self, "_lock", None) is not None:
            os.close(self._lock)  # releases the flock
            self._lock = None

    @property
    def n_rows(self) -> int:
        """Rows staged so far."""
        return sum(e["rows"] for e in self._staged)

    def commit(self, group_order: list[str], feature_names=None, source: dict | None = None, *,
               idf=None, ingest: dict | None = None) -> GroupedMatrix:
        """Commit the staged blocks as the store's next version; the store's groups keep their order and the new
        ones follow, in ``group_order``'s. ``feature_names``, ``source`` and ``idf`` are the store's (an append
        cannot change them); ``ingest`` is what the version's record in ``ingests`` holds besides its version and
        rows. Without staged rows nothing is written and the store is returned as it is."""
        try:
            old = self.store.meta
            if not self._staged:
                self.abort()
                logger.info("nothing to append to store %r", self.final_path)
                return self.store
            names = [g.name for g in old.groups]
            group_order = names + [name for name in group_order if name not in set(names)]
            self.check_groups(group_order, group_order[len(names):])
            if self.settle_masks(keep=old.mask is not None) != old.mask:
                raise ValueError(f"store {self.final_path!r} has no mask, but the appended rows have missing entries: "
                                 "its earlier blocks have no mask to record them beside; ingest all the rows again "
                                 "with missing='nan' (or mask=) to keep them")
            version = old.version + 1
            earlier = [[b for b in old.blocks if b.group == g] for g in range(len(names))]
            blocks = self.staged_blocks({name: g for g, name in enumerate(group_order)},
                                        earlier + [[] for _ in group_order[len(names):]], version)
            groups = self.group_records(group_order, blocks)
            rows = self.n_rows
            meta = Metadata((old.shape[0] + rows, old.shape[1]), old.dtype, old.layout, groups, blocks,
                            has_feature_names=old.has_feature_names, source=old.source, signed=old.signed,
                            mask=old.mask, version=version, ingests=[*old.ingests, {"version": version, "rows": rows, **(ingest or {})}])
            own = self.own_arrays(group_order, self.store.feature_names, self.store.idf)
            write_arrays(self._root, **own)
            meta.arrays = array_records(self._root.store.written, "", **own)
            meta.check(self.where)
            self._switch(meta)
        except BaseException:
            self.abort()
            raise
        self._release()
        return GroupedMatrix.open(self.final_path)

    def _switch(self, meta: Metadata) -> None:
        """Move the staged version into the store, then replace the root ``zarr.json`` (the commit)."""
        where = f"store {self.final_path!r}"
        root_document = os.path.join(self.final_path, "zarr.json")
        with open(root_document, "rb") as f:
            document = json.load(f)
        current = Metadata.from_json(document.get("attributes", {}).get("distfact"), where)
        if current != self.store.meta:  # replaced meanwhile (ingest --overwrite takes no lock)
            raise ValueError(f"{where} was replaced while rows were being appended to it; not appending")
        document["attributes"]["distfact"] = meta.to_json()
        staged_document = os.path.join(self.tmp_path, STAGED_ROOT_DOCUMENT)
        with open(staged_document, "w") as f:
            json.dump(document, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        target = os.path.join(self.final_path, version_node(meta.version).rstrip("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.exists(target):  # staged by an append killed before its commit: the lock says none is running
            logger.info("removing %s, left by an append that did not finish", target)
            shutil.rmtree(target)
        os.rename(self.tmp_path, target)
        self._root = None
        os.replace(os.path.join(target, STAGED_ROOT_DOCUMENT), root_document)  # the commit
        directory = os.open(self.final_path, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def ingested_sources(meta: Metadata) -> dict[str, int]:
    """SHA-256 -> version of every source file the store's ``ingests`` record."""
    return {source["sha256"]: record["version"] for record in meta.ingests for source in record.get("sources", ())
            if isinstance(source, dict) and isinstance(source.get("sha256"), str)}


def new_rows_groups(names, store: GroupedMatrix) -> list[str]:
    """The store's groups, then the ``names`` it lacks, in their order."""
    known = set(store.group_names)
    return store.group_names + [name for name in names if name not in known]


def append_arrays(path, X, groups=None, *, feature_names=None, block_rows=None, block_bytes=DEFAULT_BLOCK_BYTES,
                  mask=None, missing=None, ingest: dict | None = None, progress=None) -> GroupedMatrix:
    """Append the rows of X (numpy, scipy.sparse, dask or a DataFrame; cast to the store's dtype and layout) with one
    group label per row to the store at ``path`` (see :meth:`GroupedMatrix.append`)."""
    mask = writer_mask(mask, missing)
    X, feature_names = input_rows(X, feature_names, missing)
    if mask is not None and not isinstance(mask, str):
        mask = check_weights(mask, X.shape)
    with AppendWriter(path, mask=mask) as writer:
        store = writer.store
        if X.shape[1] != store.shape[1]:
            raise ValueError(f"X has {X.shape[1]} columns, the store {store.path!r} has {store.shape[1]}")
        if feature_names is not None and (store.feature_names is None
                                          or [str(f) for f in feature_names] != list(store.feature_names)):
            raise ValueError(f"the feature names of X are not those of the store {store.path!r}")
        codes, names = group_codes(groups, X.shape[0])
        write_rows(writer, X, codes, names, block_rows, block_bytes, progress)
        return writer.commit(new_rows_groups(names, store), ingest=ingest)


def append_table(path, source, *, group_column: str | None = None, block_rows=None,
                 block_bytes=DEFAULT_BLOCK_BYTES, chunk_rows: int = 100_000, missing=None, mask=None,
                 progress=None) -> GroupedMatrix:
    """Append the rows of a CSV or Parquet table to the store at ``path``: its value columns are the store's feature
    names (the columns of the table first ingested), read in the store's dtype; the group column is the store's
    unless given. ``missing`` / ``mask``: the rows' mask, as for :func:`from_table` (see :class:`AppendWriter`)."""
    from .ingest import rows_per_block
    from .tables import sort_group_names, table_chunks, write_table

    source = os.fspath(source)
    where = f"table {source!r}"
    with AppendWriter(path, where, mask=writer_mask(mask, missing)) as writer:
        store = writer.store
        group_column = group_column or store.meta.source.get("group_column")
        if store.feature_names is None or not group_column:
            raise ValueError(f"store {store.path!r} was not ingested from a table (it has no column names and group "
                             "column to read another with)")
        _, columns, _, chunks = table_chunks(source, group_column, list(store.feature_names), chunk_rows, where,
                                             progress, dtype=store.dtype)
        per_block = rows_per_block(len(columns), store.dtype.itemsize, None, block_rows, block_bytes)
        _, seen = write_table(writer, chunks, group_column, columns, per_block, None, where)
        return writer.commit(new_rows_groups(sort_group_names(seen), store), ingest={"sources": [fingerprint(source)]})


def append_corpus(path, files: list[str], *, block_rows=None, block_bytes=DEFAULT_BLOCK_BYTES, batch_docs: int = 2000,
                  progress=None) -> tuple[GroupedMatrix, dict]:
    """Append the documents of the JSONL ``files`` to the store at ``path``, vectorised as the store's were: its
    fields, stop words and vectoriser; the vocabulary fixed at the first ingest (its feature names, and its idf weights
    for tf-idf) or the same hashing. Returns the store and the out-of-vocabulary counts (``tokens``: tokens the
    vocabulary lacks, ``documents``: documents with some), which its ``ingests`` record holds too."""
    from .corpus import CountingAnalyzer, _documents, vectorizer_for, write_documents
    from .ingest import rows_per_block
    from .tables import sort_group_names

    where = f"corpus {files[0]!r}" + (f" (+{len(files) - 1} files)" if len(files) > 1 else "")
    with AppendWriter(path, where) as writer:
        store = writer.store
        options = store.meta.source
        kind = options.get("vectorizer")
        if options.get("kind") != "corpus" or kind not in ("tfidf", "count", "hashing"):
            raise ValueError(f"store {store.path!r} was not ingested from a corpus (no vectoriser to read more with)")
        if kind == "tfidf" and store.idf is None:
            raise ValueError(f"store {store.path!r} was written before appends existed (it lacks the idf weights "
                             "of its tf-idf vectoriser): ingest its corpus again to append to it")
        counting = None if kind == "hashing" else CountingAnalyzer(options.get("stop_words"))
        vec = vectorizer_for(kind, options.get("stop_words"), store.shape[1],
                             None if store.feature_names is None else list(store.feature_names), counting)
        nnz_per_row = max(store.nnz / store.shape[0], 1.0)
        per_block = rows_per_block(store.shape[1], store.dtype.itemsize, nnz_per_row, block_rows, block_bytes)
        size = sum(os.path.getsize(f) for f in files)
        documents = _documents(files, options["text_field"], options["group_field"], None,
                               None if progress is None else lambda done: progress(done, size))
        _, seen, oov = write_documents(writer, documents, vec, store.idf, per_block, block_rows, block_bytes,
                                       batch_docs, where, counting)
        record = {"sources": [fingerprint(f) for f in files], **({"out_of_vocabulary": oov} if counting else {})}
        return writer.commit(new_rows_groups(sort_group_names(seen), store), ingest=record), oov


def append_rows(self, X, groups=None, *, feature_names=None, block_rows=None, block_bytes=None, mask=None,
                missing=None) -> GroupedMatrix:
    """The store with the rows of X appended, as its next version (see ``docs/format.md``, "Appends").

    X (numpy, scipy.sparse, dask or a DataFrame, with the store's columns; cast to its dtype and layout) and one
    group label per row (``None``: all in the group ``"all"``): rows of the store's groups go into new blocks
    after theirs, new groups follow the store's (in sorted order). Blocks are cut as :func:`from_arrays` cuts
    them (``block_rows`` rows, or about ``block_bytes``). The metadata is written last and atomically: this
    object, and any reader of the previous version, keeps reading that version, and an append that fails or is
    killed leaves the store as it was. The per-group statistics are updated from the new blocks only, and are those
    of a fresh ingest of all the rows however it cuts them (``docs/format.md``, "Equal to a fresh ingest"). Column
    blocks are not carried over (their rows would move): :meth:`with_column_blocks` builds the new version's.
    A store with a mask (``docs/format.md``, "Masks") takes the rows' mask as it was ingested: ``missing="nan"``
    (the default for it) for a store of kind ``"nan"``, ``mask=`` the rows' weights for one of kind ``"weights"``
    (without: every appended entry observed); a store without a mask refuses rows with missing entries.
    Requires a store on disk, written by a distfact with appends.
    """
    if self.in_memory:
        raise ValueError("append() adds rows to a store on disk; this GroupedMatrix is in memory")
    return append_arrays(self.path, X, groups, feature_names=feature_names, block_rows=block_rows,
                         block_bytes=DEFAULT_BLOCK_BYTES if block_bytes is None else block_bytes, mask=mask,
                         missing=missing)


GroupedMatrix.append = append_rows  # a method of the matrix, defined above the ingest's writer (see grouped.py)
