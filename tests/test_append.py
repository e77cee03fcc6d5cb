"""Appending rows to a store (issue 21): the appended store against a fresh ingest of the same rows, readers of the
previous version, fixed vocabularies, idempotent partitions, the command line.

"Equal to a fresh ingest" is checked in two parts. Whatever the block cuts (``assert_same_groups_as_fresh``, against a
fresh ingest with its default options in particular): shape, dtype, layout, signedness, mask kind; every group's
record (name, rows, squared norm, sum, non-zeros); the column sums, the per-group column sums, the idf weights
(bitwise); the row index and the feature names. With blocks cut at the same rows (``assert_same_as_fresh``: the
fresh ingest given ``block_rows`` dividing each group's first rows) also every block's record but its key and
version (index, group, rows, non-zeros, squared norm, sum, smallest value, mask, and each array's dtype and CRC32C:
the stored bytes), and every block's data. What must differ is not compared: block keys (arrival numbers), block and
store versions, ``source``, ``ingests``, the checksum and the column blocks (an append drops them). The fresh ingest
is given the appended store's group order (new groups follow the store's; with names that sort after them, the
default order is that one)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from sklearn.feature_extraction.text import TfidfVectorizer

import distfact
from conftest import cli_in_process
from distfact.store import from_arrays, from_corpus, from_table
from distfact.store.writing import StoreLocked, lock_store
from distfact.store.sources import append_source


# -- helpers --------------------------------------------------------------------
def assert_same_groups_as_fresh(appended, fresh, appends: int = 1):
    """The appended store (after ``appends`` appends) has the group-level and store-level records of a fresh ingest
    of the same rows, cut into blocks anywhere (see the module docstring)."""
    a, f = appended.meta, fresh.meta
    assert (a.shape, a.dtype, a.layout, a.signed, a.has_feature_names, a.mask) == \
        (f.shape, f.dtype, f.layout, f.signed, f.has_feature_names, f.mask)
    assert a.groups == f.groups
    for name in ("column_sums", "group_column_sums", "idf", "feature_names"):
        x, y = getattr(appended, name), getattr(fresh, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert x.dtype == y.dtype and np.array_equal(x, y), name
    np.testing.assert_array_equal(appended.row_index(), fresh.row_index())
    assert a.version == f.version + appends and a.column_blocks == []


def assert_same_as_fresh(appended, fresh):
    """The appended store holds what a fresh ingest of the same rows, cut into blocks at the same rows, holds: its
    group-level records and every block (see the module docstring)."""
    assert_same_groups_as_fresh(appended, fresh)
    a, f = appended.meta, fresh.meta
    assert len(a.blocks) == len(f.blocks)
    for x, y in zip(a.blocks, f.blocks):
        assert dataclasses.replace(x, key="", version=0) == dataclasses.replace(y, key="", version=0)
    for j in range(appended.n_blocks):
        x, y = appended.load_block(j), fresh.load_block(j)
        if sp.issparse(x):
            x, y = x.toarray(), y.toarray()
        np.testing.assert_array_equal(x, y)


def assert_cut_elsewhere(appended, fresh):
    """The two stores' blocks are cut at different rows (so that equal group records say something)."""
    assert [b.row_stop for b in appended.blocks] != [b.row_stop for b in fresh.blocks]


def referenced_files(store) -> dict:
    """SHA-256 of every file the store's current metadata references (each block's group, arrays and chunks, each
    column block's, the version's own arrays), and of the metadata itself."""
    out = {"metadata": hashlib.sha256(json.dumps(store.meta.to_json(), sort_keys=True).encode()).hexdigest()}
    nodes = [b.node for b in store.blocks] + [c.node for c in store.column_blocks]
    nodes += [os.path.join(store.meta.node, r.name) for r in store.meta.arrays]
    for node in nodes:
        for folder, _, files in os.walk(os.path.join(store.path, node)):
            for name in files:
                path = os.path.join(folder, name)
                with open(path, "rb") as fh:
                    out[os.path.relpath(path, store.path)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def nmf_fit(store):
    model = distfact.NMF(3, solver="mu", max_iter=15, tol=0, random_state=0).fit(store)
    return model.components_, model.group_metrics_


def assert_same_fits(appended, fresh):
    """The same NMF fit of both stores, bitwise (components and per-group metrics)."""
    for x, y in zip(nmf_fit(appended), nmf_fit(fresh)):
        if isinstance(x, pd.DataFrame):
            pd.testing.assert_frame_equal(x, y, check_exact=True)
        else:
            np.testing.assert_array_equal(x, y)


def halves(X, groups, first):
    """X split into the rows of ``first`` (a boolean mask) and the others, in order."""
    return (X[first], groups[first]), (X[~first], groups[~first])


def split_data(sparse: bool, seed=0):
    """60 rows, 30 first (15 of group a, 15 of b, alternating) and 30 appended (5 of a, 10 of b and 15 of a new group
    c, in a random order), so that blocks of 5 rows are the same appended or ingested at once."""
    rng = np.random.default_rng(seed)
    X = rng.random((60, 7)) * (rng.random((60, 7)) < (0.5 if sparse else 1.1))
    later = rng.permutation(np.array(["a"] * 5 + ["b"] * 10 + ["c"] * 15))
    groups = np.concatenate([np.where(np.arange(30) % 2 == 0, "a", "b"), later])
    return (sp.csr_matrix(X) if sparse else X), groups, np.arange(60) < 30


# -- arrays ---------------------------------------------------------------------
@pytest.mark.parametrize("sparse", [False, True])
def test_appending_arrays_equals_a_fresh_ingest_and_fits_bitwise(tmp_path, sparse):
    X, groups, first = split_data(sparse)
    (X1, g1), (X2, g2) = halves(X, groups, first)
    store = from_arrays(X1, g1, tmp_path / "s", block_rows=5, feature_names=[f"f{j}" for j in range(7)])
    appended = store.append(X2, g2, block_rows=5)
    assert appended.group_names == ["a", "b", "c"] and appended.meta.version == 1
    # a: 15 first rows (3 blocks) + 5; b: 15 + 10; c: new, 15 rows
    assert [b.version for b in appended.blocks] == [0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1, 1]
    fresh = from_arrays(X, groups, tmp_path / "f", block_rows=5, feature_names=[f"f{j}" for j in range(7)],
                        group_names=["a", "b", "c"])
    assert_same_as_fresh(appended, fresh)
    assert_same_fits(appended, fresh)


def sequential_sums(rows: np.ndarray) -> tuple[float, float, np.ndarray]:
    """The oracle of a group's running sums, by plain Python: (sum of squares, sum) of the entries of the dense
    ``rows`` added one by one in row order, then column order within a row, in Python floats (IEEE doubles), and
    the column sums as the rows added one after the other (``functools.reduce``) in float64."""
    sq = total = 0.0
    for x in rows.astype(np.float64).ravel().tolist():
        sq += x * x
        total += x
    column_sums = functools.reduce(np.add, rows.astype(np.float64), np.zeros(rows.shape[1]))
    return sq, total, column_sums


@pytest.mark.parametrize("sparse,dtype", [(False, np.float64), (True, np.float32)])
def test_group_statistics_and_column_sums_against_a_sequential_oracle(tmp_path, sparse, dtype):
    """An independent oracle: every group's statistics and column sums from the rows themselves, bitwise the
    running sums of a plain Python loop (``math.fsum``, or numpy's pairwise sums, round otherwise); the store's
    column sums are the groups' added in group order."""
    X, groups, first = split_data(sparse=sparse, seed=3)
    X = X.astype(dtype)
    (X1, g1), (X2, g2) = halves(X, groups, first)
    appended = from_arrays(X1, g1, tmp_path / "s", block_rows=4).append(X2, g2, block_rows=3)
    dense = X.toarray() if sparse else X
    for g, name in enumerate(appended.group_names):
        rows = dense[groups == name]
        record = appended.meta.groups[g]
        sq, total, column_sums = sequential_sums(rows)
        assert record.nnz == np.count_nonzero(rows)
        assert (record.sq_norm, record.total) == (sq, total)
        np.testing.assert_array_equal(appended.group_column_sums[g], column_sums)
    np.testing.assert_array_equal(appended.column_sums, functools.reduce(np.add, appended.group_column_sums))
    np.testing.assert_allclose(appended.column_sums, dense.astype(np.float64).sum(axis=0), rtol=1e-12)
    # stored rows in group order, first-ingested rows of a group before its appended ones, numbered in all the data
    expected = np.concatenate([np.flatnonzero(groups == name) for name in appended.group_names])
    np.testing.assert_array_equal(appended.row_index(), expected)


def test_group_statistics_are_those_of_the_rows_dense_or_csr_however_cut(tmp_path):
    """The same rows stored dense and CSR, in one block a group or in blocks of 1, 2 or 7 rows: the same group
    records and column sums, bitwise."""
    X, groups, _ = split_data(sparse=True, seed=8)
    stores = [from_arrays(X, groups, block_rows=rows, layout=layout)
              for rows in (None, 1, 2, 7) for layout in ("csr", "dense")]
    for store in stores[1:]:
        assert store.meta.groups == stores[0].meta.groups
        np.testing.assert_array_equal(store.group_column_sums, stores[0].group_column_sums)
        np.testing.assert_array_equal(store.column_sums, stores[0].column_sums)
    assert len({len(store.blocks) for store in stores}) == 4


def test_opening_checks_group_records_against_their_blocks_to_within_rounding():
    """A group's squared norm and sum (running sums of its rows) and the ``fsum`` of its blocks' differ by rounding
    only: a record at the blocks' ``fsum`` (what a store written before running sums holds) is accepted, one
    further than the bound of ``group_sum_tolerances`` (relative 2e-13 here) is refused, by name."""
    from distfact.store.format import blocks_group_stats, group_sum_tolerances

    X, groups, _ = split_data(sparse=False, seed=9)
    meta = from_arrays(X, groups, block_rows=3).meta
    by_blocks = [blocks_group_stats(g.name, [b for b in meta.blocks if b.group == i])
                 for i, g in enumerate(meta.groups)]
    assert any((g.sq_norm, g.total) != (f.sq_norm, f.total) for g, f in zip(meta.groups, by_blocks))
    dataclasses.replace(meta, groups=by_blocks).check("old")
    tolerances = group_sum_tolerances(by_blocks[1])
    assert 0 < tolerances["sq_norm"] < 2e-13 * by_blocks[1].sq_norm
    for name, tolerance in tolerances.items():
        edited = [g if i != 1 else dataclasses.replace(g, **{name: getattr(g, name) + 2 * tolerance})
                  for i, g in enumerate(meta.groups)]
        with pytest.raises(ValueError, match=rf"corrupt metadata: group 1 \('b'\), field '{name}': .* its blocks' "
                                             r"add up to .* \(to within .*, rounding\)"):
            dataclasses.replace(meta, groups=edited).check("edited")


@pytest.mark.parametrize("sparse", [False, True])
def test_appending_arrays_equals_a_fresh_ingest_with_default_options(tmp_path, sparse):
    """Rows appended twice (groups a and b grow, a in the middle of the store; c is new, then grows) in blocks of 3
    and 4 rows against one ingest of all of them with default options (one block a group)."""
    X, groups, first = split_data(sparse)
    (X1, g1), (X2, g2) = halves(X, groups, first)
    names = [f"f{j}" for j in range(7)]
    store = from_arrays(X1, g1, tmp_path / "s", block_rows=4, feature_names=names)
    assert "c" in g2[:13] and "c" in g2[13:] and "a" in g2[:13]
    appended = store.append(X2[:13], g2[:13], block_rows=3).append(X2[13:], g2[13:], block_rows=4)
    fresh = from_arrays(X, groups, tmp_path / "f", feature_names=names)
    assert appended.group_names == fresh.group_names == ["a", "b", "c"]
    assert_same_groups_as_fresh(appended, fresh, appends=2)
    assert_cut_elsewhere(appended, fresh)


def test_readers_of_the_previous_version_keep_reading_it(tmp_path):
    X, groups, first = split_data(sparse=True, seed=1)
    (X1, g1), (X2, g2) = halves(X, groups, first)
    store = from_arrays(X1, g1, tmp_path / "s", block_rows=5).with_column_blocks(n_blocks=2)
    before = [store.load_block(j).toarray() for j in range(store.n_blocks)]
    columns_before = [store.column_reader()(c).toarray() for c in store.column_blocks]
    files = referenced_files(store)
    appended = store.append(X2, g2, block_rows=5)
    assert referenced_files(store) == files  # nothing the previous version references was touched
    for j, block in enumerate(before):  # the open matrix still reads its version, checked against its CRCs
        np.testing.assert_array_equal(store.load_block(j).toarray(), block)
    for c, block in zip(store.column_blocks, columns_before):
        np.testing.assert_array_equal(store.column_reader()(c).toarray(), block)
    assert not appended.has_column_blocks  # their rows moved: the new version builds its own
    built = appended.with_column_blocks(n_blocks=2)
    assert all(c.node.startswith("versions/000001/columns/") for c in built.column_blocks)
    stacked = sp.hstack([built.column_reader()(c) for c in built.column_blocks]).toarray()
    np.testing.assert_array_equal(stacked, sp.vstack([built.load_block(j) for j in range(built.n_blocks)]).toarray())
    assert referenced_files(store) == files
    files_built = referenced_files(built)
    again = built.append(X2[:3], np.array(["c"] * 3), block_rows=5)  # a second append: version 2
    assert again.meta.version == 2 and again.shape[0] == 63 and not again.has_column_blocks
    assert referenced_files(built) == files_built and referenced_files(store) == files
    assert distfact.open(store.path).meta.version == 2


def test_an_append_that_fails_leaves_the_store_as_it_was(tmp_path):
    X, groups, first = split_data(sparse=False)
    (X1, g1), (X2, g2) = halves(X, groups, first)
    store = from_arrays(X1, g1, tmp_path / "s", block_rows=5)
    files, listing = referenced_files(store), sorted(os.listdir(store.path))
    bad = X2.copy()
    bad[-1, 2] = np.nan  # in the last block: earlier blocks were staged
    with pytest.raises(ValueError, match="NaN"):
        store.append(bad, g2, block_rows=5)
    with pytest.raises(ValueError, match="columns"):
        store.append(X2[:, :5], g2)
    with pytest.raises(ValueError, match="feature names"):
        store.append(pd.DataFrame(X2, columns=[f"x{j}" for j in range(7)]), g2)
    assert referenced_files(distfact.open(store.path)) == files and sorted(os.listdir(store.path)) == listing
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".s.partial-")]
    with pytest.raises(ValueError, match="in memory"):
        from_arrays(X1, g1).append(X2, g2)


def test_a_second_append_waits_for_none_and_is_refused_while_one_runs(tmp_path):
    X, groups, first = split_data(sparse=False)
    (X1, g1), (X2, g2) = halves(X, groups, first)
    store = from_arrays(X1, g1, tmp_path / "s", block_rows=5)
    held = lock_store(store.path)  # as an append under way holds it
    try:
        with pytest.raises(StoreLocked, match="another process is appending"):
            store.append(X2, g2)
    finally:
        os.close(held)
    assert store.append(X2, g2).meta.version == 1


# -- tables ---------------------------------------------------------------------
def test_appending_a_table_equals_a_fresh_ingest(tmp_path):
    X, groups, first = split_data(sparse=False, seed=2)
    frame = pd.DataFrame(X, columns=[f"v{j}" for j in range(7)]).assign(group=groups)
    frame[first].to_csv(tmp_path / "night1.csv", index=False)
    frame[~first].to_parquet(tmp_path / "night2.parquet", index=False)  # float64: the store's dtype
    frame.to_csv(tmp_path / "all.csv", index=False)
    store = from_table(tmp_path / "night1.csv", "group", tmp_path / "s", block_rows=5)
    appended, outcome = append_source(str(tmp_path / "night2.parquet"), str(tmp_path / "s"), block_rows=5)
    assert outcome["version"] == 1 and outcome["rows"] == 30 and outcome["skipped"] == {}
    fresh = from_table(tmp_path / "all.csv", "group", tmp_path / "f", block_rows=5, group_names=["a", "b", "c"])
    assert_same_as_fresh(appended, fresh)
    default = from_table(tmp_path / "all.csv", "group", tmp_path / "d")
    assert_same_groups_as_fresh(appended, default)
    assert_cut_elsewhere(appended, default)
    assert store.shape[0] == 30 and [r["version"] for r in appended.meta.ingests] == [0, 1]
    frame[~first].drop(columns=["v3"]).to_csv(tmp_path / "narrow.csv", index=False)
    with pytest.raises(ValueError, match="v3"):
        append_source(str(tmp_path / "narrow.csv"), str(tmp_path / "s"))


# -- corpora --------------------------------------------------------------------
WORDS = "apple banana cherry date elder fig grape honey iris jade kiwi lemon mango nectar olive peach".split()


def write_corpus(path, n_docs, groups, seed, extra_words=()):
    rng = np.random.default_rng(seed)
    words = WORDS + list(extra_words)
    with open(path, "w") as f:
        for i in range(n_docs):
            text = " ".join(rng.choice(words, size=rng.integers(0, 9)))
            f.write(json.dumps({"text": text, "group": groups[i % len(groups)]}) + "\n")


@pytest.mark.parametrize("vectorizer", ["count", "hashing"])
def test_appending_a_corpus_equals_a_fresh_ingest_with_the_same_vocabulary(tmp_path, vectorizer):
    parts = tmp_path / "incoming"
    parts.mkdir()
    write_corpus(parts / "night1.jsonl", 24, ["a", "b"], seed=0)  # 12 documents a group: blocks of 4 and 6
    write_corpus(parts / "night2.jsonl", 15, ["a", "c", "b"], seed=1, extra_words=["quince", "rowan"])
    options = {"vectorizer": vectorizer, "n_features": 64, "min_df": 1, "stop_words": None}
    store = from_corpus(parts / "night1.jsonl", tmp_path / "s", block_rows=4, **options)
    appended, outcome = append_source(str(parts), str(tmp_path / "s"), block_rows=4)
    assert outcome["skipped"] == {str(parts / "night1.jsonl"): 0} and outcome["rows"] == 15
    vocabulary = None if vectorizer == "hashing" else list(store.feature_names)
    fresh = from_corpus([parts / "night1.jsonl", parts / "night2.jsonl"], tmp_path / "f", block_rows=4,
                        group_names=["a", "b", "c"], vocabulary=vocabulary, **options)
    assert_same_as_fresh(appended, fresh)
    default = from_corpus([parts / "night1.jsonl", parts / "night2.jsonl"], tmp_path / "d", vocabulary=vocabulary,
                          **options)
    assert_same_groups_as_fresh(appended, default)
    assert_cut_elsewhere(appended, default)
    if vectorizer == "count":  # the words the vocabulary lacks, counted by brute force
        texts = [json.loads(line)["text"].split() for line in open(parts / "night2.jsonl")]
        missed = [sum(w not in set(store.feature_names) for w in words) for words in texts]
        assert outcome["out_of_vocabulary"] == {"tokens": sum(missed), "documents": int(np.count_nonzero(missed))}
        assert appended.meta.ingests[-1]["out_of_vocabulary"] == outcome["out_of_vocabulary"] and sum(missed) > 0
    again, outcome = append_source(str(parts), str(tmp_path / "s"))  # a rerun: every partition is in the store
    assert outcome["version"] is None and len(outcome["skipped"]) == 2 and again.meta == appended.meta


def test_a_tfidf_append_weighs_new_documents_with_the_first_ingests_idf(tmp_path):
    write_corpus(tmp_path / "night1.jsonl", 30, ["a", "b"], seed=4)
    write_corpus(tmp_path / "night2.jsonl", 10, ["b", "a"], seed=5, extra_words=["quince"])
    store = from_corpus(tmp_path / "night1.jsonl", tmp_path / "s", vectorizer="tfidf", min_df=1, stop_words=None,
                        dtype=np.float64)
    appended, outcome = append_source(str(tmp_path / "night2.jsonl"), str(tmp_path / "s"))
    docs = [[json.loads(line) for line in open(tmp_path / name)] for name in ("night1.jsonl", "night2.jsonl")]
    oracle = TfidfVectorizer(vocabulary=list(store.feature_names)).fit([d["text"] for d in docs[0]])
    np.testing.assert_allclose(appended.idf, oracle.idf_, rtol=1e-14)
    expected = oracle.transform([d["text"] for d in docs[1]]).toarray()
    rows = appended.row_index()
    new = rows >= 30
    stacked = sp.vstack([appended.load_block(j) for j in range(appended.n_blocks)]).toarray()
    np.testing.assert_allclose(stacked[new], expected[rows[new] - 30], rtol=1e-12, atol=1e-15)
    vocabulary = set(store.feature_names)
    assert "quince" not in vocabulary and outcome["out_of_vocabulary"]["tokens"] == \
        sum(w not in vocabulary for d in docs[1] for w in d["text"].split()) > 0


def test_the_ingest_command_appends_and_says_when_a_partition_is_already_in(tmp_path, monkeypatch, capsys):
    write_corpus(tmp_path / "night1.jsonl", 20, ["a", "b"], seed=6)
    write_corpus(tmp_path / "night2.jsonl", 8, ["b"], seed=7, extra_words=["quince"])
    monkeypatch.chdir(tmp_path)

    def cli(*args):
        code, out, err = cli_in_process(capsys, *args, "--no-progress")
        return code, out + err

    assert cli("ingest", "night1.jsonl", "s", "--vectorizer", "count")[0] == 0
    code, out = cli("ingest", "--append", "night2.jsonl", "s")
    assert code == 0 and "appended 8 rows as version 1" in out and "out-of-vocabulary tokens" in out
    code, out = cli("ingest", "--append", "night2.jsonl", "s")
    assert code == 0 and "its content is already in the store (version 1)" in out and "nothing appended" in out
    code, out = cli("ingest", "--append", "night2.jsonl", "s", "--vectorizer", "hashing")
    assert code == 2 and "--vectorizer cannot be given" in out
    assert distfact.open(tmp_path / "s").meta.version == 1


# -- stores with a mask (issue 20) ----------------------------------------------
def masked_split(sparse: bool, kind: str, appended_missing: bool, seed=4):
    """``split_data`` with missing entries: NaN in X (``kind="nan"``) or weights (``"weights"``: 0 at 15% of the
    entries, fractional at others), in the first rows and, if ``appended_missing``, in the appended ones too.
    Returns X, groups, first, and the weights (None for "nan")."""
    X, groups, first = split_data(sparse, seed)
    rng = np.random.default_rng(seed + 100)
    hole = rng.random((60, 7)) < 0.15
    hole[~first] &= appended_missing
    if kind == "nan":
        X = X.toarray() if sparse else X.copy()
        X[hole] = np.nan
        return (sp.csr_matrix(X) if sparse else X), groups, first, None
    weights = np.where(hole, 0.0, 1.0)
    weights[first & (rng.random(60) < 0.3)] *= 0.5  # some fractional weights, in the first rows only
    return X, groups, first, weights


@pytest.mark.parametrize("sparse,kind,appended_missing", [
    (False, "nan", True), (True, "nan", True), (False, "nan", False), (True, "weights", True),
    (False, "weights", False)])
def test_appending_to_a_store_with_a_mask_equals_a_fresh_masked_ingest(tmp_path, sparse, kind, appended_missing):
    """New blocks get their masks (under their own node) and observed totals: the store equals a fresh masked
    ingest of all the rows, block masks (form, entries, observed total, CRC32Cs) included, and fits it bitwise."""
    X, groups, first, weights = masked_split(sparse, kind, appended_missing)
    (X1, g1), (X2, g2) = halves(X, groups, first)
    if kind == "nan":
        store = from_arrays(X1, g1, tmp_path / "s", block_rows=5, missing="nan")
        # the appended rows' NaN are missing in a store of kind "nan", whether or not the append says so
        appended = store.append(X2, g2, block_rows=5, missing="nan" if sparse else None)
        fresh = from_arrays(X, groups, tmp_path / "f", block_rows=5, group_names=["a", "b", "c"], missing="nan")
    else:
        store = from_arrays(X1, g1, tmp_path / "s", block_rows=5, mask=weights[first])
        # without weights, every appended entry is observed (weight 1), as in a fresh ingest with those weights
        appended = store.append(X2, g2, block_rows=5, mask=weights[~first] if appended_missing else None)
        fresh = from_arrays(X, groups, tmp_path / "f", block_rows=5, group_names=["a", "b", "c"], mask=weights)
    assert appended.mask_kind == fresh.mask_kind == kind and appended.meta.version == 1
    assert_same_as_fresh(appended, fresh)
    assert appended.mask_identity() == fresh.mask_identity()
    new_blocks = [b for b in appended.blocks if b.version == 1]
    assert new_blocks and all(os.path.isfile(os.path.join(appended.path, b.node, "mask", "zarr.json"))
                              for b in new_blocks)
    assert any(b.mask.nnz for b in new_blocks) == appended_missing
    read, read_fresh = appended.mask_reader(), fresh.mask_reader()
    for a, f in zip(appended.blocks, fresh.blocks):
        (form, P), = read(a).items()
        (form_f, P_f), = read_fresh(f).items()
        assert form == form_f and (P != P_f).nnz == 0
    assert_same_fits(appended, fresh)


@pytest.mark.parametrize("sparse,kind", [(False, "nan"), (True, "nan"), (True, "weights"), (False, "weights")])
def test_appending_to_a_store_with_a_mask_equals_a_fresh_masked_ingest_with_default_options(tmp_path, sparse, kind):
    """Group records over the observed entries, column sums and mask kind: those of a fresh masked ingest of all
    the rows with default options (one block a group), the first rows in blocks of 4 and the appended in blocks of
    3."""
    X, groups, first, weights = masked_split(sparse, kind, appended_missing=True, seed=7)
    (X1, g1), (X2, g2) = halves(X, groups, first)
    if kind == "nan":
        appended = from_arrays(X1, g1, tmp_path / "s", block_rows=4, missing="nan").append(X2, g2, block_rows=3)
        fresh = from_arrays(X, groups, tmp_path / "f", missing="nan")
    else:
        appended = from_arrays(X1, g1, tmp_path / "s", block_rows=4, mask=weights[first]).append(
            X2, g2, block_rows=3, mask=weights[~first])
        fresh = from_arrays(X, groups, tmp_path / "f", mask=weights)
    assert appended.mask_kind == kind
    assert_same_groups_as_fresh(appended, fresh)
    assert_cut_elsewhere(appended, fresh)
    observed = np.nan_to_num(X.toarray() if sparse else X) * (1.0 if weights is None else (weights != 0))
    for g, name in enumerate(appended.group_names):  # over the observed entries: X read as 0 at the missing ones
        sq, total, column_sums = sequential_sums(observed[groups == name])
        assert (appended.meta.groups[g].sq_norm, appended.meta.groups[g].total) == (sq, total)
        np.testing.assert_array_equal(appended.group_column_sums[g], column_sums)


def test_an_append_whose_mask_does_not_suit_the_store_is_refused(tmp_path):
    """A store without a mask takes no rows with missing entries (its blocks have no mask to complete), and a
    store's mask kind is kept: each refusal names the store and why, and leaves the store as it was."""
    X, groups, first, _ = masked_split(False, "nan", True)
    (X1, g1), (X2, g2) = halves(X, groups, first)
    plain = from_arrays(np.nan_to_num(X1), g1, tmp_path / "plain", block_rows=5)
    files = referenced_files(plain)
    for options in ({"missing": "nan"}, {"mask": np.isfinite(X2).astype(float)}):
        with pytest.raises(ValueError, match=r"store '.*plain' has no mask, but the appended rows have missing"):
            plain.append(np.nan_to_num(X2) if "mask" in options else X2, g2, **options)
    assert referenced_files(distfact.open(plain.path)) == files
    assert not [f for f in os.listdir(tmp_path) if ".partial-" in f]
    # rows without missing entries: appended as to any store without a mask
    assert plain.append(np.nan_to_num(X2), g2, missing="nan").mask_kind is None

    nan_store = from_arrays(X1, g1, tmp_path / "nan", block_rows=5, missing="nan")
    with pytest.raises(ValueError, match=r"store '.*nan' has a mask of kind 'nan'.*missing='nan', not as weights"):
        nan_store.append(np.nan_to_num(X2), g2, mask=np.isfinite(X2).astype(float))
    weighted = from_arrays(np.nan_to_num(X1), g1, tmp_path / "w", block_rows=5, mask=np.isfinite(X1).astype(float))
    with pytest.raises(ValueError, match=r"store '.*w' has a mask of kind 'weights'.*weights \(mask=\), not as "
                                         r"missing='nan'"):
        weighted.append(X2, g2, missing="nan")
    with pytest.raises(ValueError, match=r"mask has shape \(29, 7\), X has shape \(30, 7\)"):
        weighted.append(np.nan_to_num(X2), g2, mask=np.ones((29, 7)) * 0.5)
    assert distfact.open(nan_store.path).meta.version == distfact.open(weighted.path).meta.version == 0


def test_appending_a_table_with_holes_to_a_store_of_kind_nan(tmp_path, monkeypatch, capsys):
    """The partition path (``ingest --append --missing nan``, which runs ``append_source``): a table's empty fields are
    missing entries, as in a fresh ``from_table(..., missing="nan")`` of both partitions."""
    X, groups, first, _ = masked_split(False, "nan", True, seed=5)
    frame = pd.DataFrame(X, columns=[f"v{j}" for j in range(7)]).assign(group=groups)
    frame[first].to_csv(tmp_path / "night1.csv", index=False)
    frame[~first].to_csv(tmp_path / "night2.csv", index=False)
    frame.to_csv(tmp_path / "all.csv", index=False)
    from_table(tmp_path / "night1.csv", "group", tmp_path / "s", block_rows=5, missing="nan")
    monkeypatch.chdir(tmp_path)
    code, out, err = cli_in_process(capsys, "ingest", "--append", "night2.csv", "s", "--missing", "nan",
                                    "--block-rows", "5", "--no-progress")
    assert code == 0 and "appended 30 rows as version 1" in out, out + err
    appended = distfact.open(tmp_path / "s")
    fresh = from_table(tmp_path / "all.csv", "group", tmp_path / "f", block_rows=5, group_names=["a", "b", "c"],
                       missing="nan")
    assert appended.mask_kind == "nan"
    assert_same_as_fresh(appended, fresh)


def test_an_earlier_version_opens_from_its_metadata_document(tmp_path):
    """``GroupedMatrix.open(path, version_metadata=...)``: what a pipeline run reads after later appends, the
    version it ingested (blocks, own arrays, masks), checked against its CRC32Cs; a damaged document is refused."""
    X, groups, first, _ = masked_split(True, "nan", True, seed=6)
    (X1, g1), (X2, g2) = halves(X, groups, first)
    store = from_arrays(X1, g1, tmp_path / "s", block_rows=5, missing="nan")
    document = store.meta.to_json()
    appended = store.append(X2, g2, block_rows=5).append(X2[:4], g2[:4], block_rows=5)
    assert appended.meta.version == 2
    earlier = distfact.open(tmp_path / "s")  # the current version
    pinned = type(earlier).open(tmp_path / "s", version_metadata=document)
    assert pinned.meta == store.meta and pinned.shape == (30, 7) and earlier.shape == (64, 7)
    np.testing.assert_array_equal(pinned.column_sums, store.column_sums)
    for j in range(store.n_blocks):
        assert (pinned.load_block(j) != store.load_block(j)).nnz == 0
        (P,), (Q,) = pinned.mask_reader()(pinned.blocks[j]).values(), store.mask_reader()(store.blocks[j]).values()
        assert (P != Q).nnz == 0
    assert_same_fits(pinned, store)
    with pytest.raises(ValueError, match=r"store '.*s', version 0: corrupt metadata"):
        type(earlier).open(tmp_path / "s", version_metadata={**document, "shape": [29, 7]})


@pytest.mark.parametrize("newest_has_them", [True, False])
def test_an_earlier_version_gets_no_column_blocks(tmp_path, newest_has_them):
    """Column blocks hold the rows of the version that lists them: asked of an earlier version (a pipeline's rerun
    of an old night), with_column_blocks refuses, naming both versions, rather than return the newest version (when
    that has column blocks) or fail as if the store had been replaced; the store is left as it was."""
    X = sp.random(100, 20, density=0.3, random_state=0, format="csr")
    store = from_arrays(X, np.repeat(["a", "b"], 50), tmp_path / "s")
    document = store.meta.to_json()
    store.append(sp.random(30, 20, density=0.3, random_state=1, format="csr"), np.repeat(["a"], 30))
    if newest_has_them:
        distfact.open(tmp_path / "s").with_column_blocks()
    before = referenced_files(distfact.open(tmp_path / "s"))
    pinned = type(store).open(tmp_path / "s", version_metadata=document)
    with pytest.raises(ValueError, match=r"column blocks can only be added to the store's newest version \(1\), "
                                         r"not to version 0"):
        pinned.with_column_blocks()
    assert referenced_files(distfact.open(tmp_path / "s")) == before
