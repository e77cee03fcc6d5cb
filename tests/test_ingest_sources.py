"""Streaming ingest sources: CSV / Parquet tables and JSONL corpora."""

from __future__ import annotations

import gzip
import json
import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import scipy.sparse as sp
from sklearn.feature_extraction.text import CountVectorizer, HashingVectorizer, TfidfVectorizer

import distfact
from distfact.store import from_arrays, from_corpus, from_table
from distfact.store.sources import ingest_source, source_kind


# -- helpers --------------------------------------------------------------------
def nothing_written(dest) -> bool:
    """No store at ``dest`` and no hidden partial sibling left next to it."""
    dest = os.fspath(dest)
    parent, name = os.path.split(dest)
    leftovers = [f for f in os.listdir(parent) if f.startswith(f".{name}.partial-")] if os.path.isdir(parent) else []
    return not os.path.exists(dest) and not leftovers


def group_rows(G, g: int):
    """Stored rows of group g, stacked, and their source row numbers."""
    parts = [G.load_block(b.index) for b in G.blocks if b.group == g]
    X = sp.vstack(parts).toarray() if G.is_sparse else np.concatenate(parts)
    info = G.meta.groups[g]
    return X, G.row_index()[info.row_start:info.row_stop]


def assert_same_store(G, R):
    """G (streamed) and R (from_arrays) hold the same groups, stats, rows and row order."""
    assert G.shape == R.shape and G.dtype == R.dtype and G.layout == R.layout
    assert G.group_names == R.group_names
    np.testing.assert_array_equal(G.group_sizes, R.group_sizes)
    np.testing.assert_allclose(G.group_sq_norms, R.group_sq_norms, rtol=1e-12)
    np.testing.assert_allclose(G.group_totals, R.group_totals, rtol=1e-12)
    np.testing.assert_array_equal(G.group_nnz, R.group_nnz)
    np.testing.assert_allclose(G.column_sums, R.column_sums, rtol=1e-12)
    np.testing.assert_array_equal(G.row_index(), R.row_index())
    for g in range(G.n_groups):
        Xg, rg = group_rows(G, g)
        Xr, rr = group_rows(R, g)
        np.testing.assert_array_equal(Xg, Xr)
        np.testing.assert_array_equal(rg, rr)


@pytest.fixture
def table():
    rng = np.random.default_rng(0)
    m = 157
    df = pd.DataFrame({
        "a": rng.integers(0, 10, m),
        "grp": rng.choice(["north", "south", "east", "west"], m),  # scattered groups
        "b": rng.random(m).round(6),
        "c": rng.exponential(size=m).round(6),
    })
    return df


# -- tables ---------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["csv", "csv.gz", "tsv", "parquet"])
def test_table_round_trip_matches_from_arrays(tmp_path, table, fmt):
    src = tmp_path / f"data.{fmt}"
    if fmt == "parquet":
        table.to_parquet(src, row_group_size=40)
    else:
        table.to_csv(src, index=False, sep="\t" if fmt == "tsv" else ",")
    G = from_table(src, "grp", tmp_path / "store", block_rows=7, chunk_rows=23)
    values = table.drop(columns="grp")
    R = from_arrays(values, table["grp"].to_numpy(), block_rows=7)
    assert G.n_blocks > 20
    assert all(b.n_rows <= 7 for b in G.blocks)
    assert_same_store(G, R)
    assert list(G.feature_names) == ["a", "b", "c"]
    np.testing.assert_array_equal(G.row_index()[G.meta.groups[0].row_start:G.meta.groups[0].row_stop],
                                  np.flatnonzero(table["grp"].to_numpy() == G.group_names[0]))
    reopened = distfact.open(tmp_path / "store")
    assert reopened.group_names == sorted(["north", "south", "east", "west"])
    assert reopened.meta.source["kind"] == "table"
    assert not [f for f in os.listdir(tmp_path) if ".partial-" in f]


def test_table_in_memory_columns_and_group_names(tmp_path, table):
    src = tmp_path / "data.csv"
    table.to_csv(src, index=False)
    order = ["west", "east", "south", "north"]
    G = from_table(src, "grp", columns=["c", "a"], feature_names=["C", "A"], group_names=order,
                   block_rows=5, chunk_rows=10)
    R = from_arrays(table[["c", "a"]], table["grp"].to_numpy(), group_names=order, block_rows=5)
    assert G.in_memory and G.group_names == order
    assert list(G.feature_names) == ["C", "A"]
    assert_same_store(G, R)


def test_table_parquet_float32_and_numeric_groups(tmp_path):
    rng = np.random.default_rng(1)
    m = 60
    df = pd.DataFrame({"x": rng.random(m, dtype=np.float32), "y": rng.random(m, dtype=np.float32),
                       "g": rng.choice([2, 10, 1], m)})
    df.to_parquet(tmp_path / "t.pq")
    G = from_table(tmp_path / "t.pq", "g", tmp_path / "s", block_rows=4, chunk_rows=9)
    R = from_arrays(df[["x", "y"]], df["g"].to_numpy(), block_rows=4)
    assert G.dtype == np.float32
    assert G.group_names == ["1", "2", "10"]  # numeric order, as from_arrays
    assert_same_store(G, R)


def test_table_default_block_size_single_block_per_group(tmp_path, table):
    table.to_csv(tmp_path / "d.csv", index=False)
    G = from_table(tmp_path / "d.csv", "grp", chunk_rows=16)
    assert G.n_blocks == G.n_groups == 4


def write_csv(path, text):
    path.write_text(text)
    return path


TABLE_ERRORS = [
    ("no_group.csv", "a,b\n1,2\n", {}, r"no group column 'grp'"),
    ("missing_col.csv", "a,grp\n1,x\n", {"columns": ["a", "zz"]}, r"no column 'zz'"),
    ("text.csv", "a,b,grp\n1,2,x\n3,oops,y\n", {"chunk_rows": 1}, r"column 'b' is not numeric: row 1 has value 'oops'"),
    ("nolabel.csv", "a,grp\n1,x\n2,\n3,y\n", {}, r"missing label at row 1"),
    ("neg.csv", "a,b,grp\n1,2,x\n3,-4,y\n", {}, r"negative value \(-4\.0\) at row 1, column 'b' \(group 'y'\)"),
    ("nan.csv", "a,b,grp\n1,2,x\n3,4,y\n5,,x\n", {"chunk_rows": 2}, r"NaN .* at row 2, column 'b'"),
    ("inf.csv", "a,grp\n1,x\ninf,y\n", {}, r"infinite value .* at row 1, column 'a'"),
    ("empty.csv", "", {}, r"is empty \(no header"),
    ("header.csv", "a,grp\n", {}, r"is empty: it has no data rows"),
    ("only_group.csv", "grp\nx\n", {}, r"no value columns"),
    ("label.csv", "a,grp\n1,x\n2,zz\n", {"group_names": ["x"]}, r"label 'zz' at row 1, which is not one of"),
    ("empty_group.csv", "a,grp\n1,x\n", {"group_names": ["x", "y"]}, r"group 'y' is empty"),
    ("data.xlsx", "", {}, r"cannot tell the format"),
]


@pytest.mark.parametrize("name,text,kwargs,match", TABLE_ERRORS, ids=[e[0] for e in TABLE_ERRORS])
def test_table_errors_leave_nothing(tmp_path, name, text, kwargs, match):
    src = write_csv(tmp_path / name, text)
    dest = tmp_path / "out" / "store"
    with pytest.raises(ValueError, match=match):
        from_table(src, "grp", dest, **kwargs)
    assert nothing_written(dest)


def test_table_error_after_blocks_were_staged(tmp_path):
    """A bad value far into the file, after many blocks were written aside: nothing is left."""
    rows = [f"{i % 5},{'ab'[i % 2]}" for i in range(200)] + ["-1,a"]
    src = write_csv(tmp_path / "late.csv", "v,grp\n" + "\n".join(rows) + "\n")
    dest = tmp_path / "store"
    with pytest.raises(ValueError, match=r"negative value .* at row 200, column 'v' \(group 'a'\)"):
        from_table(src, "grp", dest, block_rows=3, chunk_rows=17)
    assert nothing_written(dest)


def test_table_parquet_errors(tmp_path):
    t = pa.table({"a": pa.array([1.0, 2.0]), "t": pa.array(pd.to_datetime(["2020-01-01", "2021-01-01"])),
                  "s": pa.array(["1.5", "x"]), "grp": pa.array(["u", None])})
    pq.write_table(t, tmp_path / "t.parquet")
    dest = tmp_path / "store"
    with pytest.raises(ValueError, match=r"column 't' is not numeric"):
        from_table(tmp_path / "t.parquet", "grp", dest)
    with pytest.raises(ValueError, match=r"column 's' is not numeric: row 1 has value 'x'"):
        from_table(_without_null_group(tmp_path), "grp", dest, columns=["a", "s"])
    with pytest.raises(ValueError, match=r"missing label at row 1"):
        from_table(tmp_path / "t.parquet", "grp", dest, columns=["a"])
    pq.write_table(t.slice(0, 0), tmp_path / "empty.parquet")
    with pytest.raises(ValueError, match=r"no data rows"):
        from_table(tmp_path / "empty.parquet", "grp", dest, columns=["a"])
    assert nothing_written(dest)


def _without_null_group(tmp_path):
    t = pa.table({"a": pa.array([1.0, 2.0]), "s": pa.array(["1.5", "x"]), "grp": pa.array(["u", "v"])})
    pq.write_table(t, tmp_path / "t2.parquet")
    return tmp_path / "t2.parquet"


def test_table_existing_destination(tmp_path, table):
    table.to_csv(tmp_path / "d.csv", index=False)
    from_table(tmp_path / "d.csv", "grp", tmp_path / "s")
    with pytest.raises(ValueError, match="already exists"):
        from_table(tmp_path / "d.csv", "grp", tmp_path / "s")
    # a failed overwrite keeps the old store intact
    write_csv(tmp_path / "bad.csv", "a,grp\n-1,x\n")
    with pytest.raises(ValueError, match="negative"):
        from_table(tmp_path / "bad.csv", "grp", tmp_path / "s", overwrite=True)
    assert distfact.open(tmp_path / "s").shape == (len(table), 3)
    assert not [f for f in os.listdir(tmp_path) if ".partial-" in f]


# -- corpus ---------------------------------------------------------------------
WORDS = ("apple banana cherry delta echo foxtrot golf hotel india juliet kilo lima mike "
         "november oscar papa quebec romeo sierra tango uniform victor whiskey xray").split()


def make_docs(n=120, seed=0):
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(n):
        k = int(rng.integers(0, 12))
        words = rng.choice(WORDS, size=k, p=None)
        text = " ".join(words) + (" the and of" if i % 3 == 0 else "")
        if i % 17 == 5:
            text = "the of a"  # only stop words / short tokens: an empty row
        docs.append({"text": text, "group": ["g1", "g2", "g3"][int(rng.integers(0, 3))], "id": i})
    return docs


def write_jsonl(path, docs, blank_every=0):
    with open(path, "w") as fh:
        for i, d in enumerate(docs):
            fh.write(json.dumps(d) + "\n")
            if blank_every and i % blank_every == 0:
                fh.write("\n")
    return path


def corpus_rows(G):
    """All stored rows back in document order (a CSR matrix)."""
    X = sp.vstack([G.load_block(b.index) for b in G.blocks]).tocsr()
    inverse = np.empty(G.shape[0], dtype=np.intp)
    inverse[G.row_index()] = np.arange(G.shape[0])
    return X[inverse]


def test_corpus_tfidf_matches_sklearn(tmp_path):
    docs = make_docs()
    src = write_jsonl(tmp_path / "c.jsonl", docs, blank_every=10)
    G = from_corpus(src, tmp_path / "store", block_rows=8, batch_docs=13, min_df=2, max_features=15)
    texts = [d["text"] for d in docs]
    vocab = list(G.feature_names)
    assert len(vocab) == 15 and vocab == sorted(vocab)
    # the vocabulary: the 15 tokens of highest document frequency
    df = np.asarray((CountVectorizer(stop_words="english").fit_transform(texts) > 0).sum(axis=0)).ravel()
    full = CountVectorizer(stop_words="english").fit(texts).get_feature_names_out()
    ranked = sorted(zip(full, df), key=lambda t: (-t[1], t[0]))
    assert vocab == sorted(t for t, _ in ranked[:15])
    ref = TfidfVectorizer(vocabulary=vocab, stop_words="english").fit_transform(texts)
    X = corpus_rows(G)
    assert G.dtype == np.float32 and G.layout == "csr" and G.n_blocks > 10
    np.testing.assert_allclose(X.toarray(), ref.toarray(), atol=1e-6)
    labels = np.array([d["group"] for d in docs])
    assert G.group_names == ["g1", "g2", "g3"]
    np.testing.assert_array_equal(G.group_sizes, [np.sum(labels == g) for g in G.group_names])
    for g, name in enumerate(G.group_names):  # rows of a group in document order
        info = G.meta.groups[g]
        np.testing.assert_array_equal(G.row_index()[info.row_start:info.row_stop], np.flatnonzero(labels == name))
    empty = [i for i in range(len(docs)) if i % 17 == 5]
    assert X[empty].nnz == 0 and G.meta.source["n_documents"] == len(docs)


def test_corpus_count_matches_sklearn_directory_and_list(tmp_path):
    docs = make_docs(90, seed=3)
    (tmp_path / "dir").mkdir()
    write_jsonl(tmp_path / "dir" / "a.jsonl", docs[:40])
    write_jsonl(tmp_path / "dir" / "b.jsonl", docs[40:])
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as fh:
        fh.writelines(json.dumps(d) + "\n" for d in docs[40:])
    texts = [d["text"] for d in docs]
    G = from_corpus(tmp_path / "dir", vectorizer="count", block_rows=6, batch_docs=7, min_df=1, stop_words=None,
                    max_features=None)
    vocab = list(G.feature_names)
    ref = CountVectorizer(stop_words=None).fit(texts)
    assert vocab == list(ref.get_feature_names_out())
    np.testing.assert_array_equal(corpus_rows(G).toarray(), ref.transform(texts).toarray())
    H = from_corpus([tmp_path / "dir" / "a.jsonl", tmp_path / "b.jsonl.gz"], vectorizer="count", min_df=1,
                    stop_words=None, max_features=None, dtype=np.float64)
    assert H.dtype == np.float64
    np.testing.assert_array_equal(corpus_rows(H).toarray(), corpus_rows(G).toarray())


def test_corpus_hashing_matches_sklearn(tmp_path):
    docs = make_docs(70, seed=5)
    src = write_jsonl(tmp_path / "c.jsonl", docs)
    G = from_corpus(src, tmp_path / "s", vectorizer="hashing", n_features=64, batch_docs=9,
                    group_names=["g3", "g1", "g2"])
    ref = HashingVectorizer(n_features=64, alternate_sign=False, norm=None, stop_words="english")
    assert G.feature_names is None and G.shape == (70, 64) and G.group_names == ["g3", "g1", "g2"]
    np.testing.assert_array_equal(corpus_rows(G).toarray(), ref.transform([d["text"] for d in docs]).toarray())


def test_corpus_numeric_group_field(tmp_path):
    docs = [{"body": f"alpha beta {'gamma ' * i}", "g": [10, 2, 1][i % 3]} for i in range(30)]
    G = from_corpus(write_jsonl(tmp_path / "c.jsonl", docs), text_field="body", group_field="g",
                    vectorizer="count", min_df=1)
    assert G.group_names == ["1", "2", "10"]
    np.testing.assert_array_equal(G.group_sizes, [10, 10, 10])


CORPUS_ERRORS = [
    ('{"text": "a b", "group": "x"}\n{"text": "c", "group": "x"\n', {}, r"line 2: invalid JSON"),
    ('{"text": "a b", "group": "x"}\n\n{"group": "x"}\n', {}, r"line 3: missing text field 'text'"),
    ('{"text": "a b", "group": "x"}\n{"text": "cc dd"}\n', {}, r"line 2: missing group field 'group'"),
    ('{"text": "a b", "group": "x"}\n{"text": 5, "group": "x"}\n', {}, r"line 2: text field 'text' is a int"),
    ('[1, 2]\n', {}, r"line 1: expected a JSON object"),
    ('{"text": "aa bb", "group": "x"}\n{"text": "aa", "group": "y"}\n', {"group_names": ["x"]},
     r"line 2: group 'y' is not one of group_names"),
    ('{"text": "aa bb", "group": "x"}\n', {"group_names": ["x", "z"]}, r"group 'z' is empty"),
    ('\n\n', {}, r"is empty: no documents"),
    ('{"text": "aa bb", "group": "x"}\n{"text": "cc", "group": "x"}\n', {}, r"empty vocabulary"),
]


CORPUS_CASES = [(v, *e) for v in ("tfidf", "hashing") for e in CORPUS_ERRORS
                if not (v == "hashing" and "vocabulary" in e[2])]  # hashing has no vocabulary


@pytest.mark.parametrize("vectorizer,text,kwargs,match", CORPUS_CASES,
                         ids=[f"{c[0]}-{c[3].split(':')[-1][:24].strip()}" for c in CORPUS_CASES])
def test_corpus_errors_leave_nothing(tmp_path, vectorizer, text, kwargs, match):
    src = tmp_path / "c.jsonl"
    src.write_text(text)
    dest = tmp_path / "out" / "store"
    with pytest.raises(ValueError, match=match):
        from_corpus(src, dest, vectorizer=vectorizer, block_rows=1, batch_docs=1, **kwargs)
    assert nothing_written(dest)


def test_corpus_late_error_after_blocks_staged(tmp_path):
    docs = make_docs(60)
    src = write_jsonl(tmp_path / "c.jsonl", docs)
    with open(src, "a") as fh:
        fh.write('{"text": "late", "group": ["not", "a", "label"]}\n')
    dest = tmp_path / "store"
    with pytest.raises(ValueError, match=r"line 61: group field 'group' is a list"):
        from_corpus(src, dest, vectorizer="hashing", block_rows=2, batch_docs=5)
    assert nothing_written(dest)


def test_corpus_bad_sources(tmp_path):
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(ValueError, match="has no .jsonl"):
        from_corpus(tmp_path / "empty_dir")
    with pytest.raises(ValueError, match="does not exist"):
        from_corpus(tmp_path / "nope.jsonl")
    with pytest.raises(ValueError, match="vectorizer must be"):
        from_corpus(tmp_path / "nope.jsonl", vectorizer="bm25")


# -- the dispatch the CLI and the pipelines share -------------------------------------------------------
def test_source_kind_by_name(tmp_path):
    (tmp_path / "docs").mkdir()
    kinds = {name: source_kind(tmp_path / name) for name in ("a.csv", "a.TSV.gz", "a.parquet", "a.pq", "a.jsonl",
                                                             "a.ndjson", "docs", "a.npz", "a.txt")}
    assert kinds == {"a.csv": "table", "a.TSV.gz": "table", "a.parquet": "table", "a.pq": "table",
                     "a.jsonl": "corpus", "a.ndjson": "corpus", "docs": "corpus", "a.npz": "arrays", "a.txt": None}


def test_ingest_source_dispatches_by_kind(tmp_path, table):
    X, groups = table.drop(columns="grp").to_numpy(dtype=np.float64), table["grp"].to_numpy().astype(str)
    table.to_csv(tmp_path / "t.csv", index=False)
    np.savez(tmp_path / "a.npz", X=X, groups=groups)
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": t, "group": g}) + "\n"
                                              for t, g in [("red fox", "a"), ("red dog", "b"), ("red fox dog", "a")]))
    from_csv = ingest_source(tmp_path / "t.csv", tmp_path / "t.zarr", group_column="grp")
    from_npz = ingest_source(tmp_path / "a.npz", tmp_path / "a.zarr")
    assert from_csv.group_names == from_npz.group_names
    np.testing.assert_array_equal(from_csv.load_block(0), from_npz.load_block(0))
    corpus = ingest_source(tmp_path / "c.jsonl", tmp_path / "c.zarr", vectorizer="count")
    assert corpus.group_names == ["a", "b"] and corpus.shape == (3, 3)
    with pytest.raises(ValueError, match="does not exist"):
        ingest_source(tmp_path / "missing.csv", tmp_path / "m.zarr", group_column="grp")
    (tmp_path / "x.txt").write_text("1\n")
    with pytest.raises(ValueError, match="unknown kind"):
        ingest_source(tmp_path / "x.txt", tmp_path / "x.zarr")
