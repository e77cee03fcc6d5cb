"""Ingest a CSV or Parquet table with a group column, streamed in chunks.

The file is read ``chunk_rows`` rows at a time (pandas ``read_csv(chunksize=...)``,
pyarrow ``ParquetFile.iter_batches``). Rows of one group may be scattered over the
file: each group keeps a buffer of rows that is flushed to the :class:`StoreWriter`
as a block as soon as it holds a block's worth of rows, so memory stays at about
``n_groups x block size`` plus one chunk, whatever the size of the file.
"""

from __future__ import annotations

import csv
import gzip
import os
import re
import warnings

import numpy as np
import pandas as pd
import scipy.sparse as sp

from .grouped import GroupedMatrix
from .ingest import StoreWriter, rows_per_block, writer_mask
from .writing import DEFAULT_BLOCK_BYTES, check_destination
from .validate import group_lookup
from .files import fingerprint

CSV_SUFFIXES = {".csv": ",", ".csv.gz": ",", ".tsv": "\t", ".tsv.gz": "\t"}
PARQUET_SUFFIXES = (".parquet", ".pq")

# pandas' default NA strings, applied to the value columns only: a group may well be called "NA".
_NA_STRINGS = ["", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
               "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"]
_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


# -- shared with corpus.py ------------------------------------------------------
def sort_group_names(names) -> list[str]:
    """The default group order: numerically if every label is a number, else as strings."""
    names = list(names)
    if names and all(_NUMBER.match(n.strip()) for n in names):
        return sorted(names, key=lambda n: (float(n), n))
    return sorted(names)


class GroupBuffers:
    """Per-group row buffers that hand full blocks of ``per_block`` rows to a StoreWriter.

    ``add`` appends rows (a dense array or a CSR matrix, with their source row numbers)
    to a group's buffer and flushes whole blocks once it holds ``per_block`` rows;
    ``finish`` flushes what is left. Blocks of a group reach the writer in source order.
    """

    def __init__(self, writer: StoreWriter, per_block: int | None = None):
        self.writer = writer
        self.per_block = per_block
        self._parts: dict[str, list] = {}  # name -> [arrays, row arrays, n rows]

    def add(self, name: str, rows_data, rows: np.ndarray) -> None:
        if len(rows) == 0:
            return
        parts = self._parts.setdefault(name, [[], [], 0])
        parts[0].append(rows_data)
        parts[1].append(rows)
        parts[2] += len(rows)
        if self.per_block is not None and parts[2] >= self.per_block:
            self._flush(name, final=False)

    def finish(self) -> None:
        for name in list(self._parts):
            self._flush(name, final=True)

    def _flush(self, name: str, final: bool) -> None:
        arrays, row_arrays, n = self._parts.pop(name)
        if sp.issparse(arrays[0]):
            data = arrays[0] if len(arrays) == 1 else sp.vstack(arrays, format="csr")
        else:
            data = arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=0)
        rows = row_arrays[0] if len(row_arrays) == 1 else np.concatenate(row_arrays)
        del arrays, row_arrays
        per_block = self.per_block or n
        start = 0
        while n - start >= per_block or (final and start < n):
            stop = min(start + per_block, n)
            whole = start == 0 and stop == n  # no slice: slicing a CSR matrix copies it
            self.writer.add_block(name, data if whole else data[start:stop], rows if whole else rows[start:stop])
            start = stop
        if start < n:  # keep the tail (a copy, so the flushed rows can be freed)
            tail = data[start:]
            tail = tail.copy() if not sp.issparse(tail) else tail
            self._parts[name] = [[tail], [rows[start:].copy()], n - start]


# -- tables ---------------------------------------------------------------------
def _table_kind(source: str) -> tuple[str, str | None]:
    lower = source.lower()
    for suffix, sep in CSV_SUFFIXES.items():
        if lower.endswith(suffix):
            return "csv", sep
    if lower.endswith(PARQUET_SUFFIXES):
        return "parquet", None
    raise ValueError(f"cannot tell the format of {source!r} from its name: expected a "
                     f"{', '.join(CSV_SUFFIXES)} (CSV) or {', '.join(PARQUET_SUFFIXES)} (Parquet) file")


def _select_columns(header: list[str], group_column: str, columns, where: str) -> list[str]:
    if group_column not in header:
        raise ValueError(f"{where} has no group column {group_column!r} (columns: {header})")
    if columns is None:
        columns = [c for c in header if c != group_column]
    else:
        columns = [str(c) for c in columns]
        missing = [c for c in columns if c not in header]
        if missing:
            raise ValueError(f"{where} has no column {missing[0]!r} (requested in columns; "
                             f"the file has {header})")
        if group_column in columns:
            raise ValueError(f"the group column {group_column!r} is also listed in columns")
        if len(set(columns)) != len(columns):
            raise ValueError(f"columns lists a column twice: {columns}")
    if not columns:
        raise ValueError(f"{where} has no value columns besides the group column {group_column!r}")
    return columns


def _numeric_chunk(frame: pd.DataFrame, columns: list[str], dtype: np.dtype, offset: int,
                   where: str) -> np.ndarray:
    """The value columns of one chunk as a (rows x columns) array; non-numeric columns are refused."""
    out = np.empty((len(frame), len(columns)), dtype=dtype)
    for j, name in enumerate(columns):
        col = frame[name]
        if pd.api.types.is_bool_dtype(col.dtype) or (pd.api.types.is_numeric_dtype(col.dtype)
                                                      and not pd.api.types.is_complex_dtype(col.dtype)):
            out[:, j] = col.to_numpy(dtype=dtype, na_value=np.nan)
            continue
        if not (pd.api.types.is_string_dtype(col.dtype) or col.dtype == object):
            raise ValueError(f"{where}: column {name!r} is not numeric (dtype {col.dtype})")
        parsed = pd.to_numeric(col, errors="coerce")
        bad = parsed.isna().to_numpy() & col.notna().to_numpy()
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{where}: column {name!r} is not numeric: row {offset + i} has value "
                             f"{col.iloc[i]!r}, which is not a number")
        out[:, j] = parsed.to_numpy(dtype=dtype, na_value=np.nan)
    return out


def _check_values(values: np.ndarray, columns: list[str], codes: np.ndarray, names: list[str], offset: int,
                  where: str, signed: bool = False, masked: bool = False) -> None:
    """Refuse NaN / inf / (unless ``signed``) negative values, naming the first bad row (source order) and column.
    ``masked`` (a table ingested with a mask): NaN is left to the store writer, which records it as missing
    (``missing="nan"``) or refuses it at an observed entry (a weight array)."""
    bad = ~np.isfinite(values) if signed else ~np.isfinite(values) | (values < 0)
    if masked:
        bad &= ~np.isnan(values)
    if not bad.any():
        return
    i, j = divmod(int(np.flatnonzero(bad.ravel())[0]), values.shape[1])
    value = values[i, j]
    what = "NaN (a missing value)" if np.isnan(value) else ("an infinite value" if np.isinf(value)
                                                           else "a negative value")
    prefix = "Negative values in data: " if what == "a negative value" else ""
    raise ValueError(f"{prefix}{where} has {what} ({float(value)!r}) at row {offset + i}, column {columns[j]!r} "
                     f"(group {names[codes[i]]!r}); " + ("values must be finite" if signed else
                                                          "distfact factors non-negative finite data"))


def _chunk_codes(labels: pd.Series, group_column: str, offset: int, where: str, lookup: dict | None):
    """Group names of one chunk: ``(codes, names)`` with names as strings; missing labels refused."""
    codes, uniques = pd.factorize(labels, use_na_sentinel=True)
    if (codes < 0).any():
        i = int(np.flatnonzero(codes < 0)[0])
        raise ValueError(f"{where}: group column {group_column!r} has a missing label at row {offset + i}")
    names = [str(u) for u in uniques]
    if lookup is not None:
        for k, name in enumerate(names):
            if name not in lookup:
                i = int(np.flatnonzero(codes == k)[0])
                raise ValueError(f"{where}: group column {group_column!r} has label {name!r} at row "
                                 f"{offset + i}, which is not one of group_names {list(lookup)}")
    return codes, names


_FIELD_COUNT = re.compile(r"Expected (\d+) fields in line (\d+), saw (\d+)")


def _csv_chunks(source: str, sep: str, group_column: str, columns: list[str], chunk_rows: int, where: str,
                progress=None):
    """The group and value columns, ``chunk_rows`` rows at a time, every row as wide as the header.

    pandas is asked to parse every column (with ``usecols`` it silently drops the extra fields of a row that has
    too many) and never to take the first column as the rows' index (``index_col=False``: it does so, silently,
    when every data row has one field more than the header, e.g. a trailing delimiter); a row with too many fields
    is an error naming its line, and a row with too few has missing values, refused as such.
    """
    na_values = {c: _NA_STRINGS for c in columns}
    na_values[group_column] = [""]
    raw = open(source, "rb")  # read through here: its position is the bytes read of the (compressed) file
    total = os.fstat(raw.fileno()).st_size
    reader = pd.read_csv(raw, sep=sep, chunksize=chunk_rows, dtype={group_column: str}, keep_default_na=False,
                         na_values=na_values, index_col=False, compression="gzip" if source.lower().endswith(".gz")
                         else None)
    with raw, reader, warnings.catch_warnings():
        warnings.simplefilter("error", pd.errors.ParserWarning)  # "... loss of data with index_col=False"
        try:
            for frame in reader:
                if progress is not None:
                    progress(raw.tell(), total)
                yield frame[[group_column, *columns]]
        except pd.errors.ParserWarning:
            line, saw, expected = _first_wide_line(source, sep)
            raise ValueError(f"{where}: line {line} has {saw} fields, the header has {expected} (a trailing "
                             "delimiter?)") from None
        except pd.errors.ParserError as exc:
            width = _FIELD_COUNT.search(str(exc))
            if width is None:
                raise ValueError(f"{where} cannot be parsed as CSV: {str(exc).strip()}") from None
            expected, line, saw = width.groups()
            raise ValueError(f"{where}: line {line} has {saw} fields, the header has {expected}") from None
        except UnicodeDecodeError as exc:
            raise ValueError(f"{where} is not UTF-8 text (byte {exc.object[exc.start:exc.start + 1]!r} at offset "
                             f"{exc.start} of a chunk: {exc.reason})") from None


def _first_wide_line(source: str, sep: str) -> tuple[int, int, int]:
    """(line number, fields, header's fields) of the first line with more fields than the header."""
    opener = gzip.open if source.lower().endswith(".gz") else open
    with opener(source, "rt", encoding="utf-8", newline="") as f:
        rows = csv.reader(f, delimiter=sep)
        header = len(next(rows))
        return next((rows.line_num, len(row), header) for row in rows if len(row) > header)


def _parquet_chunks(pf, group_column: str, columns: list[str], chunk_rows: int, progress=None):
    done = 0
    for batch in pf.iter_batches(batch_size=chunk_rows, columns=[group_column, *columns]):
        done += batch.num_rows
        if progress is not None:
            progress(done, pf.metadata.num_rows)
        yield batch.to_pandas()


def from_table(source, group_column: str, path=None, *, columns=None, feature_names=None, group_names=None,
               block_rows=None, block_bytes=DEFAULT_BLOCK_BYTES, chunk_rows: int = 100_000,
               overwrite: bool = False, signed: bool = False, missing=None, mask=None, progress=None) -> GroupedMatrix:
    """Build a grouped matrix from a CSV or Parquet file with a group column, streamed in chunks.

    Parameters
    ----------
    source : str or os.PathLike
        A ``.csv``, ``.csv.gz``, ``.tsv`` (``.tsv.gz``) or ``.parquet`` / ``.pq`` file.
    group_column : str
        The column holding each row's group label.
    path : str or os.PathLike, optional
        Where to write the Zarr store; ``None`` keeps the blocks in memory.
    columns : list of str, optional
        The value columns, in order; default: every column but the group column.
    feature_names : list of str, optional
        One name per value column; default: the column names.
    group_names : list of str, optional
        The groups and their order; every label must be listed and no group may be empty.
        Default: the distinct labels, sorted (numerically when all are numbers).
    block_rows, block_bytes : int, optional
        Rows per block, or the target size of a block in bytes (default 128 MiB).
    chunk_rows : int
        Rows read from the file at a time.
    overwrite : bool
        Replace an existing store at ``path``.
    signed : bool
        Allow negative values (for :class:`distfact.MultigroupSVD`), as in :func:`from_arrays`.
    missing : {None, "nan"}
        ``"nan"``: the missing values of the table (empty fields, ``NA``, ``NaN``, ...) are missing entries,
        recorded in a mask beside X (X stored with 0 there), as ``from_arrays(..., missing="nan")``: the common
        case of a table with holes. Without it they are refused.
    mask : array-like or sparse matrix, optional
        Entry weights (0 = missing), one row per data row of the file, one column per value column; not with
        ``missing``.
    progress : callable or None
        ``progress(done, total)`` after each chunk read: bytes of a CSV file, rows of a Parquet file.

    The layout is dense; the dtype is float32 when every value column of a Parquet file
    is float32, float64 otherwise. Rows are stored group by group, in file order within a
    group; ``row_index()`` gives their 0-based data-row numbers in the file. Values are
    checked chunk by chunk; any failure leaves nothing at ``path``.
    """
    source = os.fspath(source)
    where = f"table {source!r}"
    kind, columns, dtype, chunks = table_chunks(source, group_column, columns, chunk_rows, where, progress)
    check_destination(path, overwrite)
    n = len(columns)
    if feature_names is None:
        feature_names = list(columns)
    elif len(feature_names) != n:
        raise ValueError(f"feature_names has {len(feature_names)} names, {where} has {n} value columns")
    lookup = group_lookup(group_names)
    per_block = rows_per_block(n, dtype.itemsize, None, block_rows, block_bytes)
    with StoreWriter(path, n, dtype, "dense", overwrite=overwrite, where=where, signed=signed,
                     mask=writer_mask(mask, missing)) as writer:
        n_rows, seen = write_table(writer, chunks, group_column, columns, per_block, lookup, where)
        order_names = list(lookup) if lookup is not None else sort_group_names(seen)
        return writer.commit(order_names, feature_names,
                             source={"kind": "table", "format": kind, "file": os.path.abspath(source),
                                     "group_column": group_column, "n_rows": n_rows},
                             ingest={"sources": [fingerprint(source)]})


def table_chunks(source: str, group_column: str, columns, chunk_rows: int, where: str, progress=None, dtype=None):
    """``(format, value columns, dtype, chunks)`` of the table ``source``: chunks of ``chunk_rows`` rows, each a
    DataFrame of the group column and the value columns. The dtype is ``dtype`` if given (an append: the store's),
    else float32 when every value column of a Parquet file is float32, float64 otherwise."""
    kind, sep = _table_kind(source)
    if int(chunk_rows) < 1:
        raise ValueError(f"chunk_rows must be a positive integer, got {chunk_rows!r}")
    chunk_rows = int(chunk_rows)
    if not os.path.isfile(source):
        raise ValueError(f"{where} does not exist or is not a file")
    if kind == "csv":
        try:
            header = [str(c) for c in pd.read_csv(source, sep=sep, nrows=0).columns]
        except pd.errors.EmptyDataError:
            raise ValueError(f"{where} is empty (no header line)") from None
        columns = _select_columns(header, group_column, columns, where)
        chosen = np.dtype("float64")
        chunks = _csv_chunks(source, sep, group_column, columns, chunk_rows, where, progress)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(source)
        except (pa.ArrowInvalid, OSError) as exc:
            raise ValueError(f"{where} is not a readable Parquet file ({exc})") from None
        schema = pf.schema_arrow
        columns = _select_columns(list(schema.names), group_column, columns, where)
        for name in columns:
            t = schema.field(name).type
            if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
                    or pa.types.is_decimal(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
                    or pa.types.is_null(t)):
                raise ValueError(f"{where}: column {name!r} is not numeric (type {t})")
        float32 = all(schema.field(c).type == pa.float32() for c in columns)
        chosen = np.dtype("float32" if float32 else "float64")
        chunks = _parquet_chunks(pf, group_column, columns, chunk_rows, progress)
    return kind, columns, np.dtype(dtype) if dtype is not None else chosen, chunks


def write_table(writer: StoreWriter, chunks, group_column: str, columns: list[str], per_block: int,
                lookup: dict | None, where: str) -> tuple[int, set]:
    """Every chunk's rows, checked, into ``writer`` by group in blocks of ``per_block`` rows; returns the number of
    data rows and the groups seen."""
    buffers = GroupBuffers(writer, per_block)
    offset, seen = 0, set()
    for frame in chunks:
        if len(frame) == 0:
            continue
        codes, names = _chunk_codes(frame[group_column], group_column, offset, where, lookup)
        values = _numeric_chunk(frame, columns, writer.dtype, offset, where)
        _check_values(values, columns, codes, names, offset, where, writer.signed, writer.mask_kind is not None)
        del frame
        order = np.argsort(codes, kind="stable")
        bounds = np.searchsorted(codes[order], np.arange(len(names) + 1))
        for k, name in enumerate(names):
            idx = order[bounds[k]:bounds[k + 1]]
            buffers.add(name, values[idx], offset + idx.astype(np.int64))
        seen.update(names)
        offset += len(codes)
    if offset == 0:
        raise ValueError(f"{where} is empty: it has no data rows")
    buffers.finish()
    return offset, seen
