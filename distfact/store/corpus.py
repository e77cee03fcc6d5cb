"""Ingest a text corpus (JSONL: one JSON object per line, with a text and a group field).

The corpus is streamed, never held in memory:

- ``"count"`` / ``"tfidf"``: pass 1 reads every document once to count document
  frequencies (one set of tokens per document, with scikit-learn's ``CountVectorizer``
  analyzer) and picks the vocabulary: the ``max_features`` tokens of highest document
  frequency among those in at least ``min_df`` documents (ties broken by the token),
  sorted. Pass 2 vectorises ``batch_docs`` documents at a time with
  ``CountVectorizer(vocabulary=...)``; ``"tfidf"`` then applies the smooth idf
  ``log((1 + N) / (1 + df)) + 1`` and l2 row normalisation, as ``TfidfVectorizer``'s
  defaults do (computed in float64, stored as ``dtype``).
- ``"hashing"``: one pass with ``HashingVectorizer(n_features, alternate_sign=False,
  norm=None)``; no feature names.

Rows go to per-group CSR buffers that are flushed as blocks when full (see
:class:`distfact.store.tables.GroupBuffers`), so memory stays at about
``n_groups x block size`` plus one batch and the document-frequency table.
"""

from __future__ import annotations

import gzip
import heapq
import json
import math
import os
from collections import Counter
from numbers import Integral, Real

import numpy as np
import pandas as pd

from .grouped import GroupedMatrix
from .ingest import StoreWriter, rows_per_block
from .writing import DEFAULT_BLOCK_BYTES, check_destination
from .validate import group_lookup
from .tables import GroupBuffers, sort_group_names
from .files import fingerprint

VECTORIZERS = ("tfidf", "count", "hashing")
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".ndjson")


def _corpus_files(source) -> list[str]:
    """The JSONL files of ``source``: a file, a directory of ``*.jsonl`` files, or a list of either."""
    items = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    if not items:
        raise ValueError("the corpus is empty: no files given")
    files = []
    for item in items:
        item = os.fspath(item)
        if os.path.isdir(item):
            found = sorted(os.path.join(item, f) for f in os.listdir(item)
                           if f.lower().endswith(JSONL_SUFFIXES) and os.path.isfile(os.path.join(item, f)))
            if not found:
                raise ValueError(f"corpus directory {item!r} has no {'/'.join(JSONL_SUFFIXES)} files")
            files.extend(found)
        elif os.path.isfile(item):
            files.append(item)
        else:
            raise ValueError(f"corpus file {item!r} does not exist")
    return [os.path.abspath(f) for f in files]


def _open_binary(path: str):
    return gzip.open(path, "rb") if path.lower().endswith(".gz") else open(path, "rb")


def _documents(files, text_field: str, group_field: str, lookup: dict | None, progress=None):
    """Yield ``(text, group name)`` per document, in file and line order; blank lines are skipped.

    Every problem raises ``ValueError`` naming the file and the (1-based) line. Lines are decoded one by one, so
    that a byte that is not UTF-8 is reported on its own line. Group labels are names: a number and a string that
    read the same (``1`` and ``"1"``), or two ways of writing one number (``1`` and ``1.0``), would silently become
    one group, or two, so mixing them is an error naming both lines.

    ``progress(bytes)``: the bytes of the files read so far (compressed, for a gzipped file), every 1,024 lines.
    """
    first_seen: dict[str, tuple[str, str, int]] = {}  # group name -> (JSON type, file, line)
    read_before = 0
    for path in files:
        line_no = 0
        try:
            with _open_binary(path) as fh:
                for line_no, raw in enumerate(fh, 1):
                    if progress is not None and line_no % 1024 == 0:
                        progress(read_before + getattr(fh, "fileobj", fh).tell())
                    where = f"{path}: line {line_no}"
                    try:
                        line = raw.decode("utf-8")
                    except UnicodeDecodeError as exc:
                        raise ValueError(f"{where}: not UTF-8 text (byte {raw[exc.start:exc.start + 1]!r} at byte "
                                         f"{exc.start} of the line)") from None
                    if not line.strip():
                        continue
                    try:
                        doc = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise ValueError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from None
                    if not isinstance(doc, dict):
                        raise ValueError(f"{where}: expected a JSON object, got {type(doc).__name__}")
                    text = doc.get(text_field)
                    if text is None:
                        raise ValueError(f"{where}: missing text field {text_field!r}")
                    if not isinstance(text, str):
                        raise ValueError(f"{where}: text field {text_field!r} is a {type(text).__name__}, "
                                         f"not a string")
                    group = doc.get(group_field)
                    if group is None or (isinstance(group, float) and math.isnan(group)):
                        raise ValueError(f"{where}: missing group field {group_field!r}")
                    if isinstance(group, bool) or not isinstance(group, (str, int, float)):
                        raise ValueError(f"{where}: group field {group_field!r} is a {type(group).__name__}, "
                                         f"not a string or number")
                    name, kind = str(group), "string" if isinstance(group, str) else "number"
                    seen = first_seen.setdefault(name, (kind, path, line_no))
                    if seen[0] != kind:
                        raise ValueError(f"{where}: group {group!r} (a {kind}) and the group {name!r} of {seen[1]}: "
                                         f"line {seen[2]} (a {seen[0]}) would be one group; write group labels one way")
                    if kind == "number" and not isinstance(group, str):
                        _check_number_spelling(group, name, first_seen, where)
                    if lookup is not None and name not in lookup:
                        raise ValueError(f"{where}: group {name!r} is not one of group_names {list(lookup)}")
                    yield text, name
        except (OSError, EOFError) as exc:
            raise ValueError(f"{path}: cannot be read after line {line_no} ({exc})") from None
        read_before += os.path.getsize(path)
        if progress is not None:
            progress(read_before)


def _check_number_spelling(group, name: str, first_seen: dict, where: str) -> None:
    """``1`` and ``1.0`` are one number but two names: refuse the second spelling of a number."""
    other = str(int(group)) if isinstance(group, float) and group.is_integer() else (
        f"{float(group)}" if isinstance(group, int) else None)
    if other is not None and other != name and other in first_seen and first_seen[other][0] == "number":
        _, path, line = first_seen[other]
        raise ValueError(f"{where}: group {group!r} and the group {other} of {path}: line {line} are the same number "
                         "written two ways; write group labels one way")


def _batches(docs, batch_docs: int):
    texts, groups = [], []
    for text, group in docs:
        texts.append(text)
        groups.append(group)
        if len(texts) == batch_docs:
            yield texts, groups
            texts, groups = [], []
    if texts:
        yield texts, groups


def _min_count(min_df, n_docs: int) -> float:
    if isinstance(min_df, Integral) and not isinstance(min_df, bool):
        if min_df < 1:
            raise ValueError(f"min_df must be a positive integer or a fraction in (0, 1], got {min_df!r}")
        return int(min_df)
    if isinstance(min_df, Real) and 0 < min_df <= 1:
        return float(min_df) * n_docs
    raise ValueError(f"min_df must be a positive integer or a fraction in (0, 1], got {min_df!r}")


def _choose_vocabulary(df: Counter, n_docs: int, min_df, max_features) -> list[str]:
    """The ``max_features`` tokens of highest document frequency with df >= min_df, sorted."""
    threshold = _min_count(min_df, n_docs)
    candidates = ((tok, c) for tok, c in df.items() if c >= threshold)
    if max_features is None:
        return sorted(tok for tok, _ in candidates)
    top = heapq.nsmallest(int(max_features), candidates, key=lambda tc: (-tc[1], tc[0]))
    return sorted(tok for tok, _ in top)


def from_corpus(source, path=None, *, text_field: str = "text", group_field: str = "group",
                vectorizer: str = "tfidf", n_features: int = 2**18, max_features: int | None = 20000,
                min_df=2, stop_words="english", vocabulary=None, group_names=None, block_rows=None,
                block_bytes=DEFAULT_BLOCK_BYTES, batch_docs: int = 2000, dtype=np.float32,
                overwrite: bool = False, progress=None) -> GroupedMatrix:
    """Build a sparse grouped matrix (documents x terms) from a JSONL corpus, streamed.

    Parameters
    ----------
    source : str, os.PathLike, or list of them
        A JSONL file (``.jsonl``, ``.jsonl.gz``, ``.ndjson``: one JSON object per line), a
        directory of such files (read in name order), or a list of files / directories.
    path : str or os.PathLike, optional
        Where to write the Zarr store; ``None`` keeps the blocks in memory.
    text_field, group_field : str
        The fields holding a document's text and its group label.
    vectorizer : {"tfidf", "count", "hashing"}
        See the module docstring. Analysis is scikit-learn's default (lowercase, words of
        2+ characters) with ``stop_words``.
    n_features : int
        Columns of the ``"hashing"`` vectorizer.
    max_features, min_df
        Vocabulary of ``"count"`` / ``"tfidf"``: the ``max_features`` tokens (``None``: all)
        with the highest document frequency among those in at least ``min_df`` documents
        (an int, or a fraction of the documents). Note: scikit-learn ranks ``max_features``
        by total term count; this ranks by document frequency.
    stop_words : "english", list of str or None
    vocabulary : list of str, optional
        The columns of ``"count"`` / ``"tfidf"``, in order, instead of a vocabulary chosen by ``max_features`` and
        ``min_df`` (the vocabulary of an earlier store, say, as an append keeps it); ``"tfidf"`` still takes the
        document frequencies of these documents.
    group_names : list of str, optional
        The groups and their order; default: the distinct labels, sorted (numerically when
        all are numbers).
    block_rows, block_bytes : int, optional
        Rows per block, or the target size of a block in bytes (default 128 MiB).
    batch_docs : int
        Documents vectorised at a time.
    dtype : float32 or float64
    overwrite : bool
        Replace an existing store at ``path``.
    progress : callable or None
        ``progress(bytes read, bytes to read)`` now and then: the files are read twice (vocabulary, then the
        vectors) but with ``"hashing"``.

    Layout is CSR; ``feature_names`` is the vocabulary (none for ``"hashing"``).
    ``row_index()`` gives each stored row's document number (0-based, over the files
    in order, blank lines not counted). Documents without tokens are kept as empty rows.
    A failure leaves nothing at ``path``.
    """
    from sklearn.feature_extraction.text import CountVectorizer

    if vectorizer not in VECTORIZERS:
        raise ValueError(f"vectorizer must be one of {VECTORIZERS}, got {vectorizer!r}")
    dtype = np.dtype(dtype)
    if dtype not in (np.dtype("float32"), np.dtype("float64")):
        raise ValueError(f"dtype must be float32 or float64, got {dtype}")
    if int(batch_docs) < 1:
        raise ValueError(f"batch_docs must be a positive integer, got {batch_docs!r}")
    batch_docs = int(batch_docs)
    if max_features is not None and int(max_features) < 1:
        raise ValueError(f"max_features must be a positive integer or None, got {max_features!r}")
    if vectorizer == "hashing" and int(n_features) < 1:
        raise ValueError(f"n_features must be a positive integer, got {n_features!r}")
    _min_count(min_df, 1)  # validate early
    files = _corpus_files(source)
    check_destination(path, overwrite)
    lookup = group_lookup(group_names)
    group_names = None if lookup is None else list(lookup)
    where = f"corpus {files[0]!r}" + (f" (+{len(files) - 1} files)" if len(files) > 1 else "")
    source_doc = {"kind": "corpus", "files": files, "vectorizer": vectorizer, "text_field": text_field,
                  "group_field": group_field,
                  "stop_words": stop_words if stop_words is None or isinstance(stop_words, str)
                  else sorted(stop_words)}

    size = sum(os.path.getsize(f) for f in files)
    passes = 1 if vectorizer == "hashing" else 2

    def read(n_pass: int):
        """``progress`` of the ``n_pass``-th reading of the files."""
        return None if progress is None else lambda done: progress(n_pass * size + done, passes * size)

    if vectorizer == "hashing":
        vec = vectorizer_for(vectorizer, stop_words, int(n_features))
        n_cols, feature_names, idf, per_block = int(n_features), None, None, None
        if block_rows is not None:
            per_block = rows_per_block(n_cols, dtype.itemsize, 0, block_rows, block_bytes)
        source_doc["n_features"] = n_cols
    else:
        analyze = CountVectorizer(stop_words=stop_words).build_analyzer()
        df: Counter = Counter()
        n_docs = 0
        seen_groups = set()
        for text, group in _documents(files, text_field, group_field, lookup, read(0)):
            df.update(set(analyze(text)))
            seen_groups.add(group)
            n_docs += 1
        if n_docs == 0:
            raise ValueError(f"{where} is empty: no documents")
        for name in group_names or ():
            if name not in seen_groups:
                raise ValueError(f"group {name!r} is empty: it has no documents in {where}")
        vocab = _choose_vocabulary(df, n_docs, min_df, max_features) if vocabulary is None else list(vocabulary)
        if not vocab:
            raise ValueError(f"{where}: empty vocabulary: no token occurs in at least min_df={min_df!r} "
                             f"of the {n_docs} documents")
        vocab_df = np.array([df[t] for t in vocab], dtype=np.float64)
        del df
        vec = vectorizer_for(vectorizer, stop_words, vocabulary=vocab)
        n_cols, feature_names = len(vocab), vocab
        idf = np.log((1.0 + n_docs) / (1.0 + vocab_df)) + 1.0 if vectorizer == "tfidf" else None
        nnz_per_row = float(vocab_df.sum()) / n_docs  # exact: nnz of the count matrix / rows
        per_block = rows_per_block(n_cols, dtype.itemsize, nnz_per_row, block_rows, block_bytes)
        source_doc.update(n_documents=n_docs, min_df=min_df, max_features=max_features)

    with StoreWriter(path, n_cols, dtype, "csr", overwrite=overwrite, where=where) as writer:
        offset, seen, _ = write_documents(writer, _documents(files, text_field, group_field, lookup, read(passes - 1)),
                                          vec, idf, per_block, block_rows, block_bytes, batch_docs, where)
        if vectorizer == "hashing":
            source_doc["n_documents"] = offset
        order_names = group_names if group_names is not None else sort_group_names(seen)
        return writer.commit(order_names, feature_names, source=source_doc, idf=idf,
                             ingest={"sources": [fingerprint(f) for f in files]})


class CountingAnalyzer:
    """scikit-learn's analyzer (lower case, words of 2+ characters, ``stop_words``), keeping each document's number
    of tokens: those a fixed vocabulary does not count are the document's out-of-vocabulary tokens."""

    def __init__(self, stop_words):
        from sklearn.feature_extraction.text import CountVectorizer

        self.analyze = CountVectorizer(stop_words=stop_words).build_analyzer()
        self.lengths: list[int] = []

    def __call__(self, text: str) -> list[str]:
        tokens = self.analyze(text)
        self.lengths.append(len(tokens))
        return tokens


def vectorizer_for(kind: str, stop_words, n_features: int | None = None, vocabulary=None,
                   counting: CountingAnalyzer | None = None):
    """The scikit-learn vectoriser of a corpus: hashing into ``n_features`` columns, or token counts over
    ``vocabulary`` (``"count"`` and ``"tfidf"``, whose weights :func:`write_documents` applies), analysed by
    ``counting`` when given (the same analysis, counting tokens)."""
    from sklearn.feature_extraction.text import CountVectorizer, HashingVectorizer

    if kind == "hashing":
        return HashingVectorizer(n_features=n_features, alternate_sign=False, norm=None, stop_words=stop_words,
                                 dtype=np.float64)
    if counting is not None:
        return CountVectorizer(analyzer=counting, vocabulary=vocabulary, dtype=np.int64)
    return CountVectorizer(vocabulary=vocabulary, stop_words=stop_words, dtype=np.int64)


def write_documents(writer: StoreWriter, documents, vec, idf, per_block, block_rows, block_bytes, batch_docs: int,
                    where: str, counting: CountingAnalyzer | None = None) -> tuple[int, set, dict]:
    """The ``(text, group)`` pairs of ``documents``, vectorised ``batch_docs`` at a time (weighted by ``idf`` and
    l2-normalised for tf-idf), into ``writer`` by group in blocks of ``per_block`` rows (``None``: sized from the
    first batch). Returns the number of documents, the groups seen and, with ``counting`` (the analyzer of ``vec``),
    the out-of-vocabulary tokens and the documents that have some."""
    from sklearn.preprocessing import normalize

    dtype = writer.dtype
    buffers = GroupBuffers(writer, per_block)
    offset, seen, oov = 0, set(), {"tokens": 0, "documents": 0}
    for texts, groups in _batches(documents, batch_docs):
        X = vec.transform(texts).tocsr()
        if counting is not None:
            missed = np.asarray(counting.lengths, dtype=np.int64) - np.asarray(X.sum(axis=1)).ravel()
            counting.lengths.clear()
            oov["tokens"] += int(missed.sum())
            oov["documents"] += int(np.count_nonzero(missed))
        if idf is not None:
            X = X.astype(np.float64)
            X.data *= idf[X.indices]
            X = normalize(X, norm="l2", copy=False)
        X = X.astype(dtype)
        X.sort_indices()
        if buffers.per_block is None:  # hashing: size blocks from the first batch
            nnz_per_row = max(X.nnz / X.shape[0], 1.0)
            buffers.per_block = rows_per_block(X.shape[1], dtype.itemsize, nnz_per_row, block_rows, block_bytes)
        codes, names = pd.factorize(np.asarray(groups, dtype=object))
        order = np.argsort(codes, kind="stable")
        bounds = np.searchsorted(codes[order], np.arange(len(names) + 1))
        for k, name in enumerate(names):
            idx = order[bounds[k]:bounds[k + 1]]
            buffers.add(str(name), X[idx], offset + idx.astype(np.int64))
        seen.update(str(n) for n in names)
        offset += len(texts)
        del X, texts, groups
    if offset == 0:
        raise ValueError(f"{where} is empty: no documents")
    buffers.finish()
    return offset, seen, oov
