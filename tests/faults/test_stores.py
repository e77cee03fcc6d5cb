"""Store integrity (issue 17): a damaged chunk or metadata file is an error naming the store and the place, never
a different result with exit status 0; data whose squares overflow the dtype are refused at ingest.

Every test works on real Zarr stores written by distfact in ``tmp_path``, damaged on disk as a faulty disk or a
careless edit would."""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import distfact
from conftest import grouped_data
from distfact.cli import main as cli_main

DAMAGES = ("delete", "truncate", "flip")


# ---------------------------------------------------------------------------------------------------- helpers
def write_store(path, layout, dtype=np.float64, column_blocks=True, seed=0, block_rows=5):
    """A small store with blocks of ``block_rows`` rows (5: several blocks per group), feature names and
    (optionally) column blocks."""
    X, groups = grouped_data(m=36, n=9, density=0.6, seed=seed, dtype=dtype)
    X_in = sp.csr_matrix(X) if layout == "csr" else X
    store = distfact.from_arrays(X_in, groups, path, block_rows=block_rows,
                                 feature_names=[f"f{j}" for j in range(9)])
    return store.with_column_blocks(n_blocks=3) if column_blocks else store


def chunk_file(store_path, array: str):
    """The single chunk file of the array at ``array`` (e.g. ``blocks/000001/X``) of a store."""
    files = [p for p in (store_path / array / "c").rglob("*") if p.is_file()]
    assert len(files) == 1, files  # one chunk per array (the block is the unit of I/O)
    return files[0]


def damage(path, how: str, position: float = 0.5, byte: int | None = None) -> None:
    """Delete the file, truncate it at ``position`` of its length, or change its byte at ``position``
    (to ``byte``, or by flipping one bit when ``byte`` is None)."""
    if how == "delete":
        os.remove(path)
        return
    data = bytearray(path.read_bytes())
    at = min(int(position * len(data)), max(len(data) - 1, 0))
    if how == "truncate":
        del data[at:]
    elif data:
        data[at] = data[at] ^ 0x04 if byte is None else byte
    path.write_bytes(bytes(data))


def edit_json(path, change) -> None:
    """Apply ``change`` to the JSON document in the file ``path``."""
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def edited(source, path, change):
    """A copy of the store at ``source`` with ``change(metadata)`` applied to its distfact metadata."""
    shutil.copytree(source, path)
    edit_json(path / "zarr.json", lambda doc: change(doc["attributes"]["distfact"]))
    return path


def set_field(*keys, value):
    """A change that sets the field at the path ``keys`` of a JSON document to ``value``."""
    def change(doc):
        for key in keys[:-1]:
            doc = doc[key]
        doc[keys[-1]] = value
    return change


def file_hashes(directory) -> dict:
    """SHA-256 of every file under ``directory`` (to show that a failed fit changed nothing)."""
    return {os.path.relpath(os.path.join(d, f), directory): hashlib.sha256(open(os.path.join(d, f), "rb").read())
            .hexdigest() for d, _, files in os.walk(directory) for f in files}


def fit_result(estimator, path):
    """What a fit returns that a damaged store could change: H and the per-group errors."""
    model = estimator.fit(str(path))
    return model.components_, model.group_errors_


def nmf():
    return distfact.NMF(2, max_iter=2, tol=0, random_state=0)


def wl1():
    return distfact.WeightedL1NMF(2, max_iter=2, random_state=0)


def cli_fit(path, output, method):
    """``distfact fit`` in this process (main() as the console script runs it): its exit status."""
    return cli_main(["fit", str(path), "--method", method, "--rank", "2", "--max-iter", "2", "--no-progress",
                     "--output", str(output)])


def one_line_error(stderr: str, command: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"distfact {command}: error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


# ------------------------------------------------------------------------------- a damaged chunk of each array
def damage_cases(layout):
    """(the array, how a message names its place, the method whose fit reads it) for every array of a store."""
    values = ["X"] if layout == "dense" else ["data", "indices", "indptr"]
    return ([(f"blocks/{{key}}/{name}", f"block 1 \\(key '{{key}}'\\), array '{name}'", "nmf")
             for name in values + ["rows"]]
            + [(f"columns/000001/{name}", f"column block 1 \\(key '000001'\\), array '{name}'", "wl1-nmf")
               for name in ("data", "indices", "indptr")]
            + [(name, f"array '{name}'", "nmf") for name in ("column_sums", "feature_names")])


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """One undamaged store per layout, with column blocks and feature names (copied before each damage), and
    the key of its block 1."""
    root = tmp_path_factory.mktemp("pristine")
    return {layout: (root / f"{layout}.zarr", write_store(root / f"{layout}.zarr", layout).blocks[1].key)
            for layout in ("dense", "csr")}


@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.parametrize("layout,array,place,method",
                         [(layout, *case) for layout in ("dense", "csr") for case in damage_cases(layout)])
def test_a_damaged_chunk_is_an_error_naming_the_store_block_and_array(pristine, tmp_path, capsys, layout, array,
                                                                       place, method, how):
    """Through the library and through ``distfact fit``: an error naming the store, the block and the array
    (exit status 2, one line), and nothing written or changed on disk."""
    source, key = pristine[layout]
    path = tmp_path / "x.zarr"
    shutil.copytree(source, path)
    damage(chunk_file(path, array.format(key=key)), how)
    before = file_hashes(tmp_path)
    expected = rf"store '{re.escape(str(path))}' is corrupt: {place.format(key=key)}" + (
        r": its chunk file '[\w/]+' is missing$" if how == "delete" else
        r": checksum mismatch: its chunk file '[\w/]+' is truncated or damaged$")
    with pytest.raises(ValueError, match=f"^{expected}"):
        (nmf() if method == "nmf" else wl1()).fit(str(path))
    output = tmp_path / "fit-output"
    assert cli_fit(path, output, method) == 2
    assert re.search(expected, one_line_error(capsys.readouterr().err, "fit"))
    assert file_hashes(tmp_path) == before and not output.exists()


@pytest.mark.parametrize("layout,array,how", [("dense", "blocks/{key}/X", "delete"),
                                              ("csr", "blocks/{key}/indices", "truncate"),
                                              ("csr", "blocks/{key}/rows", "flip")])
def test_the_command_line_exits_2_with_one_line(pristine, tmp_path, layout, array, how):
    """The same through a real ``distfact fit`` process: exit status 2, one line on stderr, nothing written."""
    source, key = pristine[layout]
    path = tmp_path / "x.zarr"
    shutil.copytree(source, path)
    damage(chunk_file(path, array.format(key=key)), how)
    before = file_hashes(tmp_path)
    output = tmp_path / "fit-output"
    done = subprocess.run([sys.executable, "-m", "distfact.cli", "fit", str(path), "--rank", "2", "--max-iter", "2",
                           "--no-progress", "--output", str(output)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    line = one_line_error(done.stderr, "fit")
    assert f"store '{path}' is corrupt: block 1 (key '{key}'), array '{array.split('/')[-1]}'" in line
    assert done.stdout == "" and file_hashes(tmp_path) == before and not output.exists()


def test_a_missing_block_or_array_is_named(pristine, tmp_path):
    source, key = pristine["csr"]
    for what, gone, message in [("array", f"blocks/{key}/indptr", rf"block 1 \(key '{key}'\), array 'indptr' is "
                                                                  "missing"),
                                ("block", f"blocks/{key}", rf"block 1 \(key '{key}'\) is missing"),
                                ("column block", "columns/000002", r"column block 2 \(key '000002'\) is missing")]:
        path = tmp_path / f"{what}.zarr"
        shutil.copytree(source, path)
        shutil.rmtree(path / gone)
        with pytest.raises(ValueError, match=rf"^store '{re.escape(str(path))}' is corrupt: {message}$"):
            nmf().fit(str(path))


ZARR_JSON_EDITS = [  # an array's zarr.json: (field, new value, what the message says)
    (("shape",), [4, 10**9], r"has shape \(4, 1000000000\) and dtype float64; the metadata says \(4, 9\) and float64"),
    (("data_type",), "float32", r"has shape \(4, 9\) and dtype float32; the metadata says \(4, 9\) and float64"),
    (("codecs", 0, "configuration", "endian"), "big", r"has codecs .*'big'.*; distfact writes .*'little'"),
    (("chunk_key_encoding", "configuration", "separator"), ".", r": zarr asked for a chunk '[\w/]+/c.0.0' the store "
                                                               "does not have$"),
    (("chunk_grid", "configuration", "chunk_shape"), [4, 3], r": zarr asked for a chunk '[\w/]+/c/0/[12]' the store "
                                                             "does not have$"),
]


@pytest.mark.parametrize("keys,value,message", ZARR_JSON_EDITS)
def test_an_array_whose_zarr_json_disagrees_is_refused(pristine, tmp_path, keys, value, message):
    """A shape, dtype or codec edited in an array's zarr.json is caught before its chunk is read (a huge shape
    would otherwise allocate a huge buffer, another byte order decode the same bytes to other numbers); a chunk
    grid or key encoding edited makes zarr ask for chunks the store does not have."""
    source, key = pristine["dense"]
    path = tmp_path / "x.zarr"
    shutil.copytree(source, path)
    edit_json(path / "blocks" / key / "X" / "zarr.json", set_field(*keys, value=value))
    with pytest.raises(ValueError, match=rf"^store '{re.escape(str(path))}' is corrupt: block 1 \(key '{key}'\), "
                                         rf"array 'X'.*{message}"):
        nmf().fit(str(path))


def test_an_all_zero_block_has_its_chunk_files(tmp_path):
    """Chunks equal to the fill value are written too, so that a missing chunk file is always damage."""
    X = np.zeros((6, 3))
    X[:3] = 1.0
    store = distfact.from_arrays(X, np.repeat(["a", "b"], 3), tmp_path / "x.zarr", block_rows=3)
    key = store.blocks[1].key
    assert chunk_file(tmp_path / "x.zarr", f"blocks/{key}/X").stat().st_size > 0


# ------------------------------------------------------------------------------------------- metadata edits
def scale_group_and_block(meta):
    """An edit that keeps the document consistent: block 0's and its group's sum of squares doubled."""
    meta["blocks"][0]["sq_norm"] *= 2
    group = meta["groups"][meta["blocks"][0]["group"]]
    group["sq_norm"] = float(np.sum([b["sq_norm"] for b in meta["blocks"] if b["group"] == meta["blocks"][0]["group"]]))


METADATA_EDITS = [
    (set_field("groups", 0, "sq_norm", value=-1.0), r"group 0 \('g0'\), field 'sq_norm': -1.0 is negative"),
    (set_field("blocks", 2, "sq_norm", value=-1.0), r"block 2 \(key '\d+'\), field 'sq_norm': -1.0 is negative"),
    (lambda meta: meta["groups"][1].update(sq_norm=meta["groups"][1]["sq_norm"] * 1.001),
     r"group 1 \('g1'\), field 'sq_norm': [\d.e+-]+, but its blocks' add up to [\d.e+-]+ "
     r"\(to within [\d.e+-]+, rounding\)$"),
    (lambda meta: meta["groups"][2].update(nnz=meta["groups"][2]["nnz"] + 1),
     r"group 2 \('g2'\), field 'nnz': \d+, but its blocks' add up to \d+$"),
    (set_field("blocks", 0, "nnz", value=10**6),
     r"block 0 \(key '\d+'\), field 'nnz': 1000000 non-zeros in 4 x 9 entries"),
    (set_field("blocks", 1, "total", value=float("inf")), r"block 1 \(key '\d+'\), field 'total' must be a finite"),
    (set_field("shape", value=[37, 9]), r"field 'shape': 37 rows, the groups cover 36$"),
    (set_field("shape", value=[36.5, 9]), r"field 'shape' must be two non-negative integers \[m, n\], not \[36.5, 9\]"),
    (set_field("shape", value=[36]), r"field 'shape' must be two non-negative integers"),
    (set_field("dtype", value="object"), r"field 'dtype' must be one of float32, float64, not 'object'"),
    (set_field("layout", value="coo"), r"field 'layout' must be one of dense, csr, not 'coo'"),
    (set_field("signed", value="no"), r"field 'signed' must be true or false, not 'no'"),
    (set_field("blocks", 3, "arrays", "X", "dtype", value="float32"),
     r"block 3 \(key '\d+'\), array 'X', field 'dtype' must be float64, not 'float32'"),
    (set_field("blocks", 3, "arrays", "rows", "crc32c", value=2**40),
     r"block 3 \(key '\d+'\), array 'rows', field 'crc32c' must be a 32-bit checksum or null, not 1099511627776"),
    (lambda meta: meta.pop("layout"), r"field 'layout' is missing$"),
    (lambda meta: meta["blocks"][4].pop("nnz"), r"block 4 \(key '\d+'\), field 'nnz' is missing$"),
    (lambda meta: meta["blocks"][4]["arrays"].pop("rows"),
     r"block 4 \(key '\d+'\), field 'arrays' lists \['X'\], the format has \['X', 'rows'\]"),
    (lambda meta: meta["groups"].__setitem__(0, "g0"), r"group 0 is 'g0', not an object"),
    (set_field("format_version", value=1), r"written by an older distfact \(format version 1\), without the checksums"),
    (set_field("format_version", value=5), r"store format version 5 is not supported"),
    (set_field("format_version", value=4), r"field 'mask' is missing$"),  # version 4: a store with a mask
    (lambda meta: meta.update(mask={"kind": "nan"}), r"field 'mask' is not in format version 3"),
    # edits that leave the document consistent: only the checksum tells
    (scale_group_and_block, r"its checksum does not match its content"),
    (set_field("source", "kind", value="table"), r"its checksum does not match its content"),
    (set_field("groups", 0, "name", value="h0"), r"its checksum does not match its content"),
    (set_field("blocks", 0, "arrays", "X", "crc32c", value=12345), r"its checksum does not match its content"),
    (set_field("checksum", value="0" * 64), r"its checksum does not match its content"),
]


@pytest.mark.parametrize("change,message", METADATA_EDITS)
def test_edited_metadata_is_refused_naming_the_field(pristine, tmp_path, change, message):
    path = edited(pristine["dense"][0], tmp_path / "x.zarr", change)
    with pytest.raises(ValueError, match=rf"^store '{re.escape(str(path))}'(: corrupt metadata: | was | )?.*{message}"):
        distfact.open(path)


def test_a_signed_store_relabelled_unsigned_is_refused(tmp_path):
    X, groups = grouped_data(m=30, n=5)
    X[7, 3] = -0.5
    source = tmp_path / "signed.zarr"
    store = distfact.from_arrays(X, groups, source, block_rows=4, signed=True)
    block = next(b for b in store.blocks if b.min_value < 0)
    unsigned = edited(source, tmp_path / "unsigned.zarr", set_field("signed", value=False))
    with pytest.raises(ValueError, match=rf"block {block.index} \(key '{block.key}'\), field 'min_value': -0.5 is "
                                         "negative, but the store is not signed"):
        distfact.NMF(2).fit(str(unsigned))
    # as a version-1 store (what an unsigned store was before version 3)
    older = edited(source, tmp_path / "older.zarr", lambda meta: meta.update(signed=False, format_version=1))
    with pytest.raises(ValueError, match="written by an older distfact .*: ingest it again"):
        distfact.NMF(2).fit(str(older))


def test_metadata_that_is_not_an_object_is_one_line(pristine, tmp_path):
    path = tmp_path / "x.zarr"
    shutil.copytree(pristine["csr"][0], path)
    edit_json(path / "zarr.json", set_field("attributes", "distfact", value=["not", "a", "document"]))
    with pytest.raises(ValueError, match=r"corrupt metadata: the document is \['not', 'a', 'document'\], not an "
                                         r"object$"):
        distfact.open(path)


def test_the_checkpoint_fingerprint_tells_data_with_the_same_statistics_apart(tmp_path):
    """Two entries of a row swapped: every norm, sum and count is the same, the chunks' checksums are not."""
    from distfact.estimators.base import data_fingerprint

    rng = np.random.default_rng(5)
    X = rng.integers(1, 6, size=(12, 4)).astype(np.float64)  # small integers: sums exact in any order
    X[3, :2] = [1.0, 2.0]
    groups = np.repeat(["a", "b"], 6)
    swapped = X.copy()
    swapped[3, :2] = [2.0, 1.0]
    first, second = (data_fingerprint(distfact.from_arrays(A, groups, tmp_path / f"{i}.zarr", block_rows=3))
                     for i, A in enumerate((X, swapped)))
    assert first["checksum"] == distfact.open(tmp_path / "0.zarr").meta.to_json()["checksum"]
    assert {k: v for k, v in first.items() if k != "checksum"} == {k: v for k, v in second.items() if k != "checksum"}
    assert first["checksum"] != second["checksum"]


# ------------------------------------------------------------------------------------------------ overflow
def nothing_written(path):
    parent, name = os.path.split(str(path))
    return not os.path.exists(path) and not [n for n in os.listdir(parent) if n.startswith(f".{name}.")]


def overflowing(kind):
    """X whose sum of squares overflows its dtype, and the (row, column) of the entry a refusal must name (None:
    every entry is too large, and the largest of the first block that crosses the bound is named)."""
    X, groups = grouped_data(m=40, n=6, seed=3, dtype=np.float64 if kind == "1e300" else np.float32)
    if kind == "near float32 max":
        X[17, 4] = 3e38
        return X, groups, (17, 4)
    if kind == "float32 x 1e20":
        return X * np.float32(1e20), groups, None
    X[23, 1] = 1e300
    return X, groups, (23, 1)


def check_named_entry(message: str, X, groups, place) -> None:
    """The entry the message names is X's, with its group, and the one expected if given."""
    value, row, col, group = re.search(r"largest entry is \((.*)\) at row (\d+), column (\d+) \(group '(\w+)'\)",
                                       message).groups()
    assert X[int(row), int(col)] == np.asarray(float(value), dtype=X.dtype) and groups[int(row)] == group
    assert place is None or (int(row), int(col)) == place


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("kind", ["near float32 max", "float32 x 1e20", "1e300"])
def test_data_whose_squares_overflow_are_refused_at_ingest(tmp_path, kind, sparse):
    X, groups, place = overflowing(kind)
    path = tmp_path / "x.zarr"
    dtype = str(X.dtype)
    advice = r" \(or convert it to float64 before ingesting\)" if dtype == "float32" else ""
    with pytest.raises(ValueError, match=rf"^X is too large for {dtype}: the sum of the squares of its entries "
                                         rf"reaches .*, with the block whose largest entry is \(.*\) at row \d+, "
                                         rf"column \d+ \(group '\w+'\); scale X down{advice}$") as refused:
        distfact.from_arrays(sp.csr_matrix(X) if sparse else X, groups, path, block_rows=7)
    check_named_entry(str(refused.value), X, groups, place)
    assert nothing_written(path)


@pytest.mark.parametrize("kind", ["near float32 max", "float32 x 1e20", "1e300"])
def test_the_ingest_command_refuses_overflowing_data(tmp_path, capsys, kind):
    X, groups, place = overflowing(kind)
    np.savez(tmp_path / "x.npz", X=X, groups=groups)
    assert cli_main(["ingest", str(tmp_path / "x.npz"), str(tmp_path / "x.zarr"), "--no-progress"]) == 2
    line = one_line_error(capsys.readouterr().err, "ingest")
    assert f"is too large for {X.dtype}" in line and "; scale X down" in line
    check_named_entry(line, X, groups, place)
    assert nothing_written(tmp_path / "x.zarr")


def test_a_table_with_an_overflowing_value_is_refused(tmp_path):
    frame = pd.DataFrame({"group": ["a", "b", "a", "b"], "x": [1.0, 2.0, 1e300, 3.0], "y": [0.5, 0.0, 1.0, 2.0]})
    frame.to_csv(tmp_path / "t.csv", index=False)
    with pytest.raises(ValueError, match=r"too large for float64: .* at row 2, column 0 \(group 'a'\)"):
        distfact.from_table(tmp_path / "t.csv", "group", tmp_path / "t.zarr")
    assert nothing_written(tmp_path / "t.zarr")


def test_data_just_inside_the_bound_are_accepted_and_the_bound_is_on_the_sum(tmp_path):
    groups = np.array(["a", "a", "b", "b"])
    X = np.zeros((4, 3), dtype=np.float32)
    X[1, 2] = 1.8e19  # its square, 3.24e38, is just below float32's largest number (3.40e38)
    store = distfact.from_arrays(X, groups, tmp_path / "inside32.zarr")
    assert store.group_sq_norms[0] == pytest.approx(3.24e38, rel=1e-6)
    X64 = np.zeros((4, 3))
    X64[3, 0] = 1.3e154  # 1.69e308 < 1.80e308
    distfact.from_arrays(X64, groups, tmp_path / "inside64.zarr")
    X[2, 0] = 0.5e19  # every square fits, their sum (3.49e38) does not
    with pytest.raises(ValueError, match=r"reaches 3.49e\+38, beyond the largest float32 number \(3.4e\+38\)"):
        distfact.from_arrays(X, groups, tmp_path / "sum.zarr")
    assert nothing_written(tmp_path / "sum.zarr")


# ----------------------------------------------------------- property: raise naming the store, or the same result
PROPERTY_STORES = [("dense", np.float64, False), ("csr", np.float32, True), ("dense", np.float32, True)]


@pytest.fixture(scope="module")
def property_stores(tmp_path_factory):
    """The stores of the property test (dense and CSR, float64 and float32, with and without column blocks),
    every file of each, and the undamaged results of the fits run on them."""
    root = tmp_path_factory.mktemp("property")
    out = []
    for i, (layout, dtype, columns) in enumerate(PROPERTY_STORES):
        path = root / f"store-{i}.zarr"
        # blocks of 12 rows: 5 blocks (a group of two), every kind of file of a store, and each fit of the 240
        # examples about a third faster than on blocks of 5 (8 blocks), whose messages the tests above check
        write_store(path, layout, dtype, columns, seed=i, block_rows=12)
        estimators = [property_nmf] + ([property_wl1] if columns else [])
        out.append((path, sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()),
                    [(make, fit_result(make(), path)) for make in estimators]))
    hashes = [file_hashes(path) for path, _, _ in out]
    yield out
    # the examples' copies share these stores' files (hard links): no fit wrote into them
    assert [file_hashes(path) for path, _, _ in out] == hashes


def property_nmf():
    return distfact.NMF(3, max_iter=3, tol=0, random_state=0)


def property_wl1():
    return distfact.WeightedL1NMF(2, max_iter=2, random_state=0)


@settings(max_examples=240, deadline=None, derandomize=True, database=None)
@given(data=st.data())
def test_any_damage_raises_naming_the_store_or_changes_nothing(property_stores, data):
    """Flip or replace a byte of, truncate, or delete one file of a store (a chunk or any zarr.json): a fit then
    raises ``ValueError`` naming the store, or gives bitwise the undamaged result."""
    source, files, fits = data.draw(st.sampled_from(property_stores), label="store")
    name = data.draw(st.sampled_from(files), label="file")
    how = data.draw(st.sampled_from(["flip", "replace", "truncate", "delete"]), label="damage")
    position = data.draw(st.floats(0, 1), label="position")
    byte = data.draw(st.integers(0, 255), label="byte") if how == "replace" else None
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "x.zarr"
        # a copy of hard links to the store's files (a fit only reads them; the fixture checks that none changed),
        # and of the damaged file a copy of its own: a third of the time of copying every file
        shutil.copytree(source, path, copy_function=os.link)
        os.remove(path / name)
        shutil.copyfile(source / name, path / name)
        damage(path / name, "flip" if how == "replace" else how, position, byte)
        for make, (H, errors) in fits:
            try:
                got_H, got_errors = fit_result(make(), path)
            except ValueError as exc:
                assert str(path) in str(exc)
                return
            np.testing.assert_array_equal(got_H, H)
            np.testing.assert_array_equal(got_errors, errors)
