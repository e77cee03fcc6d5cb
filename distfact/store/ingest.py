"""Ingest: the :class:`StoreWriter` every source feeds (blocks validated, staged aside, committed at once), and
in-memory arrays (numpy, scipy.sparse, dask, pandas) into a grouped matrix."""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass, replace

import numpy as np

from ..kernels.memory import aligned
# imported at their first use, which ``distfact info`` never makes (distfact/lazy.py)
from ..lazy import scipy_sparse as sp, store_chunks as chunks, zarr, zarr_storage
from .format import Block, BlockMask, GroupStats, Metadata
from .grouped import GroupedMatrix
from .masks import FORM_NAMES, ComplementMask, block_form, block_observed_total, check_weights, nan_missing, zero_missing
from .validate import check_block_values, check_csr_structure, check_groups, group_lookup, working_dtype
from .writing import DEFAULT_BLOCK_BYTES, array_records, block_stats, check_destination, write_arrays


@dataclass
class GroupSums:
    """A group's running sums (``kernels/running_sums.py``): its column sums, and ``running`` = [sum of squares,
    sum], every entry of its rows added in row order (float64), carried from one block to the next."""

    column_sums: np.ndarray
    running: np.ndarray

    @classmethod
    def zeros(cls, n_cols: int) -> "GroupSums":
        return cls(np.zeros(n_cols, dtype=np.float64), np.zeros(2, dtype=np.float64))


class StoreWriter:
    """Receives validated blocks group by group and commits them all at once.

    On disk, blocks go to a hidden sibling directory that is renamed into place by
    :meth:`commit`; anything that fails before that leaves the destination as it
    was. With ``path=None`` the blocks are kept in memory.

    ``mask``: None (every entry observed), ``"nan"`` (the blocks' NaN entries are missing) or a weight array
    or sparse matrix with one row per source row (0 = missing; checked by :func:`check_weights`). Each block's
    X is then stored with 0 at its missing entries, beside the block's mask in the sparse form storing fewer
    entries (``store/masks.py: block_form``), so that every statistic the metadata records of X is over the
    observed entries. A mask that marks nothing (no NaN, all weights 1) writes a store without a mask.

    Each group's squared norm, sum and column sums are running sums of its rows in order, carried from one block to
    the next (:class:`GroupSums`; ``docs/format.md``, "Group statistics"): they are the same wherever the rows are
    cut into blocks, and the same dense or CSR.
    """

    def __init__(self, path, n_cols: int, dtype, layout: str, *, overwrite: bool = False,
                 where: str = "X", signed: bool = False, mask=None):
        self.n_cols = n_cols
        self.signed = signed
        self.mask_kind, self.weights = stored_mask(mask, n_cols)
        self.dtype = np.dtype(dtype)
        self.layout = layout
        self.where = where
        self.final_path = None if path is None else os.path.abspath(os.fspath(path))
        self.overwrite = overwrite
        if self.final_path is not None:
            self._check_destination()
        # each group's running sums, its rows added in arrival order (= stored order within a group), so that they
        # are the same wherever the rows are cut into blocks and an append continues them from the stored ones
        self._group_sums: dict[str, GroupSums] = {}
        self._square_sum = 0.0  # of every entry so far, in float64: it must stay representable in ``dtype``
        self._staged: list[dict] = []
        self.first_key = 0  # blocks are keyed by arrival number, from here (an append continues the store's)
        self.row_offset = 0  # added to the source row numbers (an append numbers its rows after the store's)
        self._root = None
        if self.final_path is not None:
            parent, name = os.path.split(self.final_path)
            os.makedirs(parent, exist_ok=True)
            self.tmp_path = os.path.join(parent, f".{name}.partial-{uuid.uuid4().hex[:8]}")
            self._root = zarr.open_group(store=chunks.ChecksummingStore(zarr_storage.LocalStore(self.tmp_path)),
                                         mode="w", zarr_format=3)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()
        return False

    def abort(self) -> None:
        if self._root is not None and os.path.exists(self.tmp_path):
            shutil.rmtree(self.tmp_path, ignore_errors=True)
        self._root = None

    def add_block(self, group_name: str, block, source_rows: np.ndarray) -> None:
        """Validate one block of rows of ``group_name`` (``source_rows``: their caller row numbers), then stage it."""
        if block.shape[0] == 0:
            return
        if self.layout == "csr":
            block = sp.csr_matrix(block, dtype=self.dtype)
        else:  # a sparse block is densified only when the caller asked for the dense layout
            block = np.ascontiguousarray(block.toarray() if sp.issparse(block) else block, dtype=self.dtype)
        if block.shape[1] != self.n_cols:
            raise ValueError(f"{self.where}: rows {int(source_rows[0])}.. have {block.shape[1]} columns, expected {self.n_cols}")
        if sp.issparse(block):
            block.sum_duplicates()
            block.eliminate_zeros()
        block, mask = self._block_mask(block, source_rows)
        stats = block_stats(block)
        check_block_values(block, group_name, source_rows, self.where, self.signed,
                           square_sum=self._square_sum + stats["sq_norm"])
        self._square_sum += stats["sq_norm"]
        if group_name not in self._group_sums:
            self._group_sums[group_name] = GroupSums.zeros(self.n_cols)
        sums = self._group_sums[group_name]
        from ..kernels.running_sums import add_rows  # numba's: what writing needs, not opening a store (``info``)

        add_rows(block, sums.column_sums, sums.running)
        key = f"{self.first_key + len(self._staged):06d}"
        entry = {"key": key, "group": group_name, "rows": block.shape[0], "stats": stats, "arrays": ()}
        source_rows = np.ascontiguousarray(source_rows, dtype=np.int64) + np.int64(self.row_offset)
        if mask is not None:  # X_b as a fit reads it (aligned, as in memory and by the readers)
            form, P = mask
            entry["mask"] = BlockMask(FORM_NAMES[form], P.nnz, block_observed_total(
                block if sp.issparse(block) else aligned(block), form, P))
        if self._root is None:  # dense blocks aligned once here rather than copied by every pass
            entry["data"], entry["source_rows"], entry["mask_data"] = aligned(block), source_rows, mask
        else:
            arrays = ({"data": block.data, "indices": block.indices, "indptr": block.indptr} if sp.issparse(block)
                      else {"X": block})
            arrays["rows"] = source_rows
            write_arrays(self._root.create_group(f"blocks/{key}"), **arrays)
            entry["arrays"] = array_records(self._root.store.written, f"blocks/{key}", **arrays)
            if mask is not None:  # an empty complement (nothing missing) is written at commit, if the store has a mask
                entry["mask_data"] = mask
                if mask[1].nnz or FORM_NAMES[mask[0]] != "complement":
                    self._write_mask(entry)
        self._staged.append(entry)

    def _write_mask(self, entry: dict) -> None:
        """Write a staged block's mask (CSR arrays) into its sub-group ``mask`` and record them."""
        P = entry.pop("mask_data")[1]
        parts = {"data": P.data, "indices": P.indices, "indptr": P.indptr}
        write_arrays(self._root.create_group(f"blocks/{entry['key']}/mask"), **parts)
        entry["mask"] = replace(entry["mask"], arrays=array_records(self._root.store.written,
                                                                   f"blocks/{entry['key']}/mask", **parts))

    def _block_mask(self, block, source_rows: np.ndarray):
        """(X_b with 0 at its missing entries, the block's mask (form, P) or None) for a writer with a mask;
        (X_b, None) without one. NaN is allowed only with ``mask="nan"`` (and refused afterwards otherwise)."""
        if self.mask_kind is None:
            return block, None
        if self.mask_kind == "nan":
            block, missing = nan_missing(block)
            mask = ComplementMask(sp.csr_matrix(block.shape, dtype=np.float64)) if missing is None else missing
            return block, block_form(mask, np.arange(block.shape[0]))
        if self.weights is None:  # every entry observed (an append of rows without weights to a store with weights)
            return block, block_form(ComplementMask(sp.csr_matrix(block.shape, dtype=np.float64)),
                                     np.arange(block.shape[0]))
        n_rows = self.weights.shape[0]
        if int(source_rows.max()) >= n_rows:
            raise ValueError(f"mask has {n_rows} rows, but {self.where} has a row {int(source_rows.max())}: give "
                             "one weight per entry of X")
        weights = self.weights[np.asarray(source_rows)]
        return zero_missing(block, weights), block_form(weights, np.arange(block.shape[0]))

    def commit(self, group_order: list[str], feature_names=None, source: dict | None = None, *,
               idf: np.ndarray | None = None, ingest: dict | None = None) -> GroupedMatrix:
        """Order the blocks by group, write metadata last, move the store into place.

        ``idf``: a tf-idf corpus's weights, kept for appends; ``ingest``: what the metadata's ``ingests`` records of
        this ingest beside its version and rows (the fingerprints of its source files)."""
        self.check_groups(group_order, group_order)
        mask_kind = self.settle_masks(keep=False)
        order = {name: i for i, name in enumerate(group_order)}
        blocks = self.staged_blocks(order, [[] for _ in group_order])
        groups = self.group_records(group_order, blocks)
        m = sum(b.n_rows for b in blocks)
        meta = Metadata((m, self.n_cols), str(self.dtype), self.layout, groups, blocks,
                        has_feature_names=feature_names is not None, source=source or {}, signed=self.signed,
                        mask=mask_kind, ingests=[] if ingest is None else [{"version": 0, "rows": m, **ingest}])
        own = self.own_arrays(group_order, feature_names, idf)
        meta.check(self.where)
        if self._root is None:
            by_key = {e["key"]: e for e in self._staged}
            return GroupedMatrix(meta, own["column_sums"], blocks=[by_key[b.key]["data"] for b in blocks],
                                 block_rows=[by_key[b.key]["source_rows"] for b in blocks],
                                 feature_names=own.get("feature_names"), group_column_sums=own["group_column_sums"],
                                 idf=idf, masks=None if mask_kind is None else [dict([by_key[b.key]["mask_data"]])
                                                                                for b in blocks])
        try:
            write_arrays(self._root, **own)
            meta.arrays = array_records(self._root.store.written, "", **own)
            self._root.attrs["distfact"] = meta.to_json()
            self._replace_destination()
        except BaseException:
            self.abort()
            raise
        return GroupedMatrix.open(self.final_path)

    def settle_masks(self, keep: bool) -> str | None:
        """The mask kind of the staged blocks as committed: the writer's, or None when no staged entry is missing
        and not ``keep`` (an ingest: a store without a mask, as if none had been given; an append to a store with
        a mask keeps it). With a mask, writes the empty masks :meth:`add_block` left for the commit."""
        if self.weights is not None and self.weights.shape[0] != sum(e["rows"] for e in self._staged):
            raise ValueError(f"mask has {self.weights.shape[0]} rows, {self.where} has "
                             f"{sum(e['rows'] for e in self._staged)}: give one weight per entry of X")
        if self.mask_kind is None:
            return None
        if not keep and all(e["mask"].form == "complement" and e["mask"].nnz == 0 for e in self._staged):
            for entry in self._staged:
                entry.pop("mask")
            return None
        if self._root is not None:
            for entry in self._staged:
                if "mask_data" in entry:
                    self._write_mask(entry)
        return self.mask_kind

    def check_groups(self, group_order: list[str], required) -> None:
        """Every staged block's group is in ``group_order``, and every group of ``required`` has rows."""
        staged_groups = {e["group"] for e in self._staged}
        for name in required:
            if name not in staged_groups:
                raise ValueError(f"group {name!r} is empty: it has no rows")
        unknown = staged_groups - set(group_order)
        if unknown:
            raise ValueError(f"rows carry groups not in the group list: {sorted(unknown)}")

    def staged_blocks(self, order: dict, earlier: list[list[Block]], version: int = 0) -> list[Block]:
        """The store's blocks in order: group by group (``order``: name -> index), each group's ``earlier`` blocks
        (an append's: the store's) then its staged ones in arrival order, numbered and placed anew."""
        staged = [[] for _ in earlier]
        for entry in self._staged:
            staged[order[entry["group"]]].append(Block(0, entry["key"], order[entry["group"]], 0, entry["rows"],
                                                       **entry["stats"], arrays=entry["arrays"], version=version,
                                                       mask=entry.get("mask")))
        blocks, row = [], 0
        for g in range(len(earlier)):
            for block in earlier[g] + staged[g]:
                blocks.append(replace(block, index=len(blocks), row_start=row, row_stop=row + block.n_rows))
                row += block.n_rows
        return blocks

    def group_records(self, group_order: list[str], blocks: list[Block]) -> list[GroupStats]:
        """Each group's record: its rows and non-zeros from its ``blocks`` (the store's, in order), its squared
        norm and sum the running sums of its rows (the same wherever its rows are cut into blocks)."""
        from ..kernels.running_sums import SQ_NORM, TOTAL

        records = []
        for g, name in enumerate(group_order):
            mine = [b for b in blocks if b.group == g]
            running = self._group_sums[name].running
            records.append(GroupStats(name, mine[0].row_start, mine[-1].row_stop, float(running[SQ_NORM]),
                                      float(running[TOTAL]), sum(b.nnz for b in mine)))
        return records

    def own_arrays(self, group_order: list[str], feature_names, idf) -> dict:
        """The store's own arrays: each group's column sums, their sum over the groups in order, and the feature
        names and idf weights when given."""
        group_sums = np.zeros((len(group_order), self.n_cols), dtype=np.float64)
        for g, name in enumerate(group_order):
            if name in self._group_sums:
                group_sums[g] = self._group_sums[name].column_sums
        column_sums = np.zeros(self.n_cols, dtype=np.float64)
        for sums in group_sums:
            column_sums += sums
        own = {"column_sums": column_sums, "group_column_sums": group_sums}
        if feature_names is not None:
            own["feature_names"] = np.asarray([str(f) for f in feature_names])
            if own["feature_names"].shape != (self.n_cols,):
                raise ValueError(f"feature_names has {own['feature_names'].shape[0]} names, "
                                 f"X has {self.n_cols} columns")
        if idf is not None:
            own["idf"] = np.ascontiguousarray(idf, dtype=np.float64)
        return own

    def _check_destination(self) -> None:
        check_destination(self.final_path, self.overwrite)

    def _replace_destination(self) -> None:
        self._check_destination()  # again: something may have appeared while we were writing
        if os.path.exists(self.final_path):
            trash = f"{self.tmp_path}.old"
            os.rename(self.final_path, trash)
            os.rename(self.tmp_path, self.final_path)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.rename(self.tmp_path, self.final_path)
        self._root = None




def group_codes(groups, n_rows: int, group_names=None, where: str = "groups"):
    """Map labels to group indices. Returns ``(codes, names)``.

    Without ``group_names`` the groups are the sorted distinct labels; with it, the
    labels must all be listed there and every listed group must have rows.
    """
    if groups is None:
        return np.zeros(n_rows, dtype=np.intp), ["all"]
    labels = check_groups(groups, n_rows, where)
    if group_names is None:
        uniq, codes = np.unique(labels, return_inverse=True)
        return codes.astype(np.intp), [str(u) for u in uniq]
    lookup = group_lookup(group_names)
    names = list(lookup)
    str_labels = labels.astype(str)
    codes = np.array([lookup.get(v, -1) for v in str_labels], dtype=np.intp)
    if (codes < 0).any():
        row = int(np.flatnonzero(codes < 0)[0])
        raise ValueError(f"{where}[{row}] = {str(str_labels[row])!r} is not one of group_names {names}")
    counts = np.bincount(codes, minlength=len(names))
    if (counts == 0).any():
        raise ValueError(f"group {names[int(np.flatnonzero(counts == 0)[0])]!r} is empty: it has no rows")
    return codes, names


def rows_per_block(n_cols: int, itemsize: int, nnz_per_row: float | None, block_rows, block_bytes) -> int:
    if block_rows is not None:
        if int(block_rows) < 1:
            raise ValueError(f"block_rows must be a positive integer, got {block_rows!r}")
        return int(block_rows)
    row_bytes = n_cols * itemsize if nnz_per_row is None else nnz_per_row * (itemsize + 4) + 8
    return max(1, int(block_bytes // max(row_bytes, 1)))


def split_rows(rows: np.ndarray, block_rows: int) -> list[np.ndarray]:
    """Split one group's rows into nearly equal blocks of at most ``block_rows`` rows."""
    n_parts = -(-len(rows) // block_rows)
    return np.array_split(rows, n_parts) if n_parts else []


def _csr_row_range(X, lo: int, hi: int):
    """Rows lo..hi of the CSR matrix X, its entries copied (a block's duplicates are summed in place) as they are
    stored: scipy's row slice checks every entry's column (issue 19: 8 against 3 ms for a 20,000-row corpus)."""
    start, stop = int(X.indptr[lo]), int(X.indptr[hi])
    return type(X)((X.data[start:stop].copy(), X.indices[start:stop].copy(), X.indptr[lo:hi + 1] - start),
                   shape=(hi - lo, X.shape[1]))


def _take_rows(X, rows: np.ndarray):
    contiguous = rows[-1] - rows[0] + 1 == len(rows) and (np.diff(rows) == 1).all()
    if contiguous and sp.issparse(X) and X.format == "csr":
        return _csr_row_range(X, int(rows[0]), int(rows[-1]) + 1)
    index = slice(int(rows[0]), int(rows[-1]) + 1) if contiguous else rows
    part = X[index]
    if hasattr(part, "compute"):  # a dask array: materialise this block only
        part = part.compute()
    if hasattr(part, "to_scipy_sparse"):  # pydata sparse chunk
        part = part.to_scipy_sparse()
    return part


def from_arrays(X, groups=None, path=None, *, group_names=None, feature_names=None, layout=None,
                block_rows=None, block_bytes=DEFAULT_BLOCK_BYTES, overwrite=False,
                column_blocks=False, signed=False, mask=None, missing=None, progress=None,
                ingest=None) -> GroupedMatrix:
    """Build a grouped matrix from X (numpy, scipy.sparse, dask array or DataFrame) and row labels.

    Parameters
    ----------
    X : array-like of shape (m, n), non-negative unless ``signed``
    groups : array-like of shape (m,), optional
        One label per row; ``None`` puts all rows in one group ``"all"``.
    path : str or os.PathLike, optional
        Where to write the Zarr store; ``None`` keeps the blocks in memory (dense blocks as copies at a
        64-byte boundary: X's memory again, so that no pass copies a block).
    group_names : list of str, optional
        The groups and their order; every label must be among them and none may be empty.
    feature_names : list of str, optional
        One name per column (taken from a DataFrame's columns by default).
    layout : {"dense", "csr"}, optional
        Defaults to "csr" for sparse input and "dense" otherwise.
    block_rows, block_bytes : int, optional
        Rows per block, or the target size of a block in bytes (default 128 MiB).
    overwrite : bool
        Replace an existing store at ``path``.
    column_blocks : bool
        Also store X by column blocks (CSC, about ``block_bytes`` each), for methods that
        sweep over columns: see :meth:`GroupedMatrix.with_column_blocks`. They are added
        to the committed store, so if building them fails the store is left without them.
    signed : bool
        Allow negative entries (for :class:`distfact.MultigroupSVD`); the store records it and
        the NMF methods refuse such a store.
    mask : array-like or sparse matrix of shape (m, n), optional
        Entry weights (0 = missing), stored beside X (see ``docs/format.md``, "Masks"); a fit of the store
        uses them as ``fit(X, mask=mask)`` would. X is stored with 0 at the entries of weight 0.
    missing : {None, "nan"}
        ``"nan"``: X's NaN entries are missing (X is stored with 0 there, the mask records them), as
        ``fit(X, mask="nan")``. Not with ``mask``. A mask that marks no entry writes a store without a mask.
    progress : callable or None
        ``progress(rows done, rows)`` after each block written (the command line's display).
    ingest : dict, optional
        What the metadata's ``ingests`` records of this ingest besides its version and rows (``distfact ingest``:
        the fingerprint of the .npz file, so that appending it again is recognised).

    Rows are stored group by group (stable within a group); values are validated
    block by block (NaN, infinite and negative values, and data whose sum of squares
    overflows X's dtype, are refused with the row and column named) and a failure leaves
    nothing at ``path``. A store records the checksum of every array it holds (see
    ``docs/format.md``), checked whenever it is read. Each group's squared norm, sum and
    column sums are running sums of its rows in order (``docs/format.md``, "Group
    statistics"): the same whatever ``block_rows`` or ``block_bytes``, and what an
    append of more rows continues.
    """
    mask = writer_mask(mask, missing)
    X, feature_names = input_rows(X, feature_names, missing)
    m, n = X.shape
    dtype = working_dtype(X.dtype)
    sparse_input = sp.issparse(X) or type(getattr(X, "_meta", None)).__module__.startswith("sparse")
    layout = layout or ("csr" if sparse_input else "dense")
    if layout not in ("dense", "csr"):
        raise ValueError(f"layout must be 'dense' or 'csr', got {layout!r}")
    if mask is not None and not isinstance(mask, str):
        mask = check_weights(mask, X.shape)
    codes, names = group_codes(groups, m, group_names)
    with StoreWriter(path, n, dtype, layout, overwrite=overwrite, signed=signed, mask=mask) as writer:
        write_rows(writer, X, codes, names, block_rows, block_bytes, progress)
        store = writer.commit(names, feature_names, source={"kind": "arrays"}, ingest=ingest)
    return store.with_column_blocks(block_bytes) if column_blocks else store


def writer_mask(mask, missing):
    """What a writer's ``mask`` is given as, from an ingest's ``mask`` (weights) and ``missing`` ("nan"), not both."""
    if missing is not None and mask is not None:
        raise ValueError("give either mask (weights) or missing='nan', not both")
    return missing if mask is None else mask


def input_rows(X, feature_names=None, missing=None):
    """``(X, feature_names)`` of rows given to an ingest or an append: a DataFrame's values (checked numeric, with no
    missing value unless ``missing="nan"``, then NaN there) and, unless given, its column names; a 2-D numpy
    array, a CSR matrix, or a dask array."""
    if isinstance(X, GroupedMatrix):
        raise ValueError("X is already a GroupedMatrix; pass it to the estimator directly")
    if hasattr(X, "columns") and hasattr(X, "dtypes"):  # a pandas DataFrame
        from pandas.api.types import is_bool_dtype, is_numeric_dtype

        bad = [c for c, t in X.dtypes.items() if not (is_numeric_dtype(t) or is_bool_dtype(t))]
        if bad:
            raise ValueError(f"column {bad[0]!r} is not numeric (dtype {X.dtypes[bad[0]]})")
        absent = X.isna().to_numpy()
        if absent.any() and missing != "nan":  # nullable columns (Int64, Float64, boolean) hold pd.NA
            row, col = divmod(int(np.flatnonzero(absent)[0]), X.shape[1])
            raise ValueError(f"X has a missing value ({X.iat[row, col]!r}) at row {row}, column {X.columns[col]!r}"
                             " (pass missing='nan' to treat missing values as missing entries)")
        if feature_names is None:
            feature_names = [str(c) for c in X.columns]
        dtype = np.result_type(*(getattr(t, "numpy_dtype", t) for t in X.dtypes))
        X = X.to_numpy(dtype=np.result_type(dtype, np.float32), na_value=np.nan) if absent.any() else \
            X.to_numpy(dtype=dtype)
    if not (sp.issparse(X) or hasattr(X, "compute")):
        X = np.asarray(X)
    if len(X.shape) != 2:
        raise ValueError(f"X must be 2-D (samples x features), got shape {X.shape}")
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise ValueError(f"X is empty (shape {X.shape})")
    if sp.issparse(X):
        check_csr_structure(X)  # before scipy converts it: its conversions trust the indices
        X = X.tocsr()
    return X, feature_names


def write_rows(writer: StoreWriter, X, codes: np.ndarray, names: list[str], block_rows, block_bytes,
               progress=None) -> None:
    """The rows of X (sparse already CSR) into ``writer``, group by group (``codes`` index ``names``), each group's
    rows in their order, cut into nearly equal blocks of at most the block size."""
    m, n = X.shape
    nnz_per_row = X.nnz / m if sp.issparse(X) else (n if writer.layout == "csr" else None)
    per_block = rows_per_block(n, writer.dtype.itemsize, nnz_per_row, block_rows, block_bytes)
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(names) + 1))
    done = 0
    for g, name in enumerate(names):
        for rows in split_rows(order[bounds[g]:bounds[g + 1]], per_block):
            writer.add_block(name, _take_rows(X, rows), rows)
            done += len(rows)
            if progress is not None:
                progress(done, m)


def stored_mask(mask, n_cols: int) -> tuple[str | None, object]:
    """(kind, weights) of a writer's ``mask``: (None, None) without one (or for weights all 1), ("nan", None), or
    ("weights", a float64 array or CSR matrix of ``n_cols`` columns, checked: finite and non-negative)."""
    if mask is None:
        return None, None
    if isinstance(mask, str):
        if mask != "nan":
            raise ValueError(f"missing must be None or 'nan' (X's NaN entries are the missing ones), got {mask!r}")
        return "nan", None
    weights = check_weights(mask, None)
    if weights is None:
        return None, None
    if weights.shape[1] != n_cols:
        raise ValueError(f"mask has {weights.shape[1]} columns, X has {n_cols}: give one weight per entry of X")
    return "weights", weights
