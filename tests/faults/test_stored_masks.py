"""A store's mask damaged on disk (issue 20, masks stored beside X): a fit that reads it stops with an error
naming the store, the block and the mask's array, and changes nothing on disk; never a fit over a mask read as
fill values, nor a fit as if every entry were observed."""

import re
import shutil

import google_crc32c
import numpy as np
import pytest
import zarr

import distfact
from conftest import grouped_data
from distfact.store.format import metadata_checksum
from test_stores import chunk_file, cli_fit, damage, edit_json, edited, file_hashes, one_line_error, set_field


@pytest.fixture(scope="module")
def masked_store(tmp_path_factory):
    """A store ingested with missing="nan", several blocks per group, every block's mask holding entries."""
    X, groups = grouped_data(m=36, n=9, seed=0)
    X[np.random.default_rng(1).random(X.shape) < 0.2] = np.nan
    path = tmp_path_factory.mktemp("masked") / "x.zarr"
    store = distfact.from_arrays(X, groups, path, block_rows=5, missing="nan")
    assert all(block.mask.nnz for block in store.blocks)
    return path, store.blocks[2]


@pytest.mark.parametrize("array,how", [("indices", "delete"), ("data", "truncate"), ("indptr", "flip")])
def test_a_damaged_mask_chunk_is_an_error_naming_the_block_and_array(masked_store, tmp_path, capsys, array, how):
    source, block = masked_store
    path = tmp_path / "x.zarr"
    shutil.copytree(source, path)
    damage(chunk_file(path, f"blocks/{block.key}/mask/{array}"), how)
    before = file_hashes(tmp_path)
    expected = (rf"store '{re.escape(str(path))}' is corrupt: block {block.index} \(key '{block.key}'\), mask, "
                rf"array '{array}': " + (r"its chunk file '[\w/]+' is missing$" if how == "delete" else
                                         r"checksum mismatch: its chunk file '[\w/]+' is truncated or damaged$"))
    with pytest.raises(ValueError, match=f"^{expected}"):
        distfact.NMF(2, max_iter=2, tol=0, random_state=0).fit(str(path))
    output = tmp_path / "fit-output"
    assert cli_fit(path, output, "nmf") == 2
    assert re.search(expected, one_line_error(capsys.readouterr().err, "fit"))
    assert file_hashes(tmp_path) == before and not output.exists()


def test_a_missing_mask_is_named_when_the_store_is_opened(masked_store, tmp_path):
    source, block = masked_store
    path = tmp_path / "x.zarr"
    shutil.copytree(source, path)
    shutil.rmtree(path / "blocks" / block.key / "mask")
    with pytest.raises(ValueError, match=rf"^store '{re.escape(str(path))}' is corrupt: block {block.index} "
                                         rf"\(key '{block.key}'\), its mask is missing$"):
        distfact.open(path)


@pytest.mark.parametrize("change,message", [
    (lambda meta: meta.pop("mask"), r"field 'mask' is missing$"),  # a mask dropped: not a fit as if unmasked
    (lambda meta: meta["blocks"][1].pop("mask"), r"block 1 \(key '\d+'\), field 'mask' is missing$"),
    (set_field("blocks", 1, "mask", "form", value="dense"),
     r"block 1 \(key '\d+'\), mask, field 'form': must be one of complement, observed, not 'dense'"),
    (set_field("blocks", 1, "mask", "arrays", "data", "dtype", value="float32"),
     r"block 1 \(key '\d+'\), mask, array 'data', field 'dtype' must be float64, not 'float32'"),
    (set_field("mask", "kind", value="zeros"), r"field 'mask' kind must be one of nan, weights, not 'zeros'"),
    (set_field("blocks", 1, "mask", "nnz", value=10**6), r"block 1 \(key '\d+'\), mask, field 'nnz': 1000000 "),
    (set_field("blocks", 1, "mask", "observed_total", value=1.5), r"its checksum does not match its content"),
    (set_field("format_version", value=3), r"field 'mask' is not in format version 3"),
])
def test_edited_mask_metadata_is_refused_naming_the_field(masked_store, tmp_path, change, message):
    path = edited(masked_store[0], tmp_path / "x.zarr", change)
    with pytest.raises(ValueError, match=rf"^store '{re.escape(str(path))}': corrupt metadata: .*{message}"):
        distfact.open(path)


# ------------------------------------------------------------------ a mask rewritten wrong, its checksums recomputed
def rewritten_mask(source, path, block, array, change):
    """A copy of the store at ``source`` whose block ``block`` has its mask array ``array`` replaced by
    ``change(values)`` (same shape and dtype) with its chunk's CRC32C and the metadata checksum recomputed: a mask
    written wrong, which only its content tells."""
    shutil.copytree(source, path)
    stored = zarr.open_array(str(path / "blocks" / block.key / "mask" / array), mode="r+")
    stored[...] = change(stored[...].copy())
    crc = google_crc32c.value(chunk_file(path, f"blocks/{block.key}/mask/{array}").read_bytes())

    def change_metadata(meta):
        meta["blocks"][block.index]["mask"]["arrays"][array]["crc32c"] = crc
        meta["checksum"] = metadata_checksum(meta)
    edit_json(path / "zarr.json", lambda doc: change_metadata(doc["attributes"]["distfact"]))
    return path


def set_at(at, value):
    def change(values):
        values[at] = value
        return values
    return change


def decreasing(indptr):
    indptr[1] = indptr[-1]
    assert (np.diff(indptr) < 0).any()
    return indptr


def unsorted_row(indptr):
    """A change of ``indices`` swapping the first two columns of the first row with two entries or more."""
    row = int(np.flatnonzero(np.diff(indptr) >= 2)[0])

    def change(indices):
        at = indptr[row]
        indices[at], indices[at + 1] = indices[at + 1], indices[at]
        return indices
    return change, indptr[row] + 1


def test_a_mask_rewritten_wrong_is_an_error_naming_the_block_array_and_problem(masked_store, tmp_path):
    """Damage the checksums cannot see (they were recomputed): indptr, indices and the complement form's values
    out of what the writer writes. A fit stops with an error naming the store, block, array and problem."""
    source, block = masked_store
    store = distfact.open(source)
    (P,) = store.mask_reader()(block).values()
    swap, swapped_at = unsorted_row(P.indptr)
    cases = [
        ("indptr", set_at(0, 1), r"'indptr': runs from 1 to \d+, not from 0 to the mask's \d+ entries"),
        ("indptr", decreasing, r"'indptr': decreases at row 1 \(\d+ then \d+\)$"),
        ("indices", set_at(0, 9), r"'indices': entry 0 is column 9, outside \[0, 9\)"),
        ("indices", set_at(0, -1), r"'indices': entry 0 is column -1, outside \[0, 9\)"),
        ("indices", swap, rf"'indices': not increasing within a row at entry {swapped_at} "),
        ("data", set_at(1, np.nan), r"'data': entry 1 is nan in form 'complement'"),
        ("data", set_at(1, 1.5), r"'data': entry 1 is 1.5 in form 'complement' \(a complement entry is 1 - weight"),
        ("data", set_at(1, 0.0), r"'data': entry 1 is 0.0 in form 'complement'"),
    ]
    for k, (array, change, problem) in enumerate(cases):
        path = rewritten_mask(source, tmp_path / f"x{k}.zarr", block, array, change)
        assert distfact.open(path).mask_kind == "nan"  # opened: its metadata and checksums agree
        expected = rf"^store '{re.escape(str(path))}' is corrupt: block {block.index} \(key '{block.key}'\), mask, " \
                   rf"array {problem}"
        with pytest.raises(ValueError, match=expected):
            distfact.NMF(2, max_iter=2, tol=0, random_state=0).fit(str(path))


def test_negative_observed_weights_rewritten_are_an_error(tmp_path):
    X, groups = grouped_data(m=20, n=6, seed=1)
    weights = np.where(np.random.default_rng(2).random(X.shape) < 0.2, 0.5, 0.0)  # few observed: "observed" form
    store = distfact.from_arrays(X, groups, tmp_path / "w.zarr", block_rows=5, mask=weights)
    block = store.blocks[1]
    assert block.mask.form == "observed" and block.mask.nnz
    path = rewritten_mask(tmp_path / "w.zarr", tmp_path / "x.zarr", block, "data", set_at(0, -0.5))
    with pytest.raises(ValueError, match=rf"^store '{re.escape(str(path))}' is corrupt: block 1 \(key '{block.key}'\), "
                                         r"mask, array 'data': entry 0 is -0.5 in form 'observed' \(weights must be "
                                         r"finite and non-negative\)"):
        distfact.NMF(2, max_iter=2, tol=0, random_state=0).fit(str(path))
