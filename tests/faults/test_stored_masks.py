"""A store's mask damaged on disk (issue 20, masks stored beside X): a fit that reads it stops with an error
naming the store, the block and the mask's array, and changes nothing on disk; never a fit over a mask read as
fill values, nor a fit as if every entry were observed."""

import re
import shutil

import numpy as np
import pytest

import distfact
from conftest import grouped_data
from test_stores import chunk_file, cli_fit, damage, edited, file_hashes, one_line_error, set_field


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
