"""Bad input is refused with a message naming the problem and where, before any work, never silently accepted
(issue 17, case 10 and the unhelpful errors): through the CLI (exit 2, one line, no traceback) and the API, with
every file around hashed before and after."""

import json
import os

import numpy as np
import pandas as pd
import pytest

import distfact
from conftest import cli_here, grouped_data
from damage import assert_refused, cli, snapshot


@pytest.fixture
def npz(tmp_path):
    X, groups = grouped_data(m=60, n=8, n_groups=2, seed=5)
    np.savez(tmp_path / "x.npz", X=X, groups=groups)
    return tmp_path / "x.npz"


@pytest.fixture
def store(tmp_path):
    X, groups = grouped_data(m=60, n=8, n_groups=2, seed=5)
    return distfact.from_arrays(X, groups, tmp_path / "x.zarr", block_rows=20).path


def test_a_csv_row_of_the_wrong_width_is_named(tmp_path, capsys):
    """Case 10: a CSV row with an extra field was silently dropped."""
    rows = ["g,a,b"] + [f"{'xy'[i % 2]},{i},{i + 1}" for i in range(60)]
    rows[51] += ",7"  # data row 50, line 52 of the file
    (tmp_path / "t.csv").write_text("\n".join(rows) + "\n")
    before = snapshot(tmp_path)
    assert_refused(cli_here(capsys, "ingest", tmp_path / "t.csv", tmp_path / "t.zarr", "--group-column", "g",
                            cwd=tmp_path), "line 52 has 4 fields, the header has 3")
    with pytest.raises(ValueError, match="line 52 has 4 fields, the header has 3"):
        distfact.from_table(tmp_path / "t.csv", "g", tmp_path / "t.zarr", chunk_rows=16)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("extra", [",7", ","])
def test_csv_rows_all_one_field_wider_than_the_header_are_named(extra, tmp_path, capsys):
    """With every data row one field wider (a trailing delimiter, or a shifted table), pandas silently took the
    first column as the rows' index: the groups became the first feature's values."""
    rows = ["g,a,b"] + [f"{'xy'[i % 2]},{i},{i + 1}{extra}" for i in range(20)]
    (tmp_path / "t.csv").write_text("\n".join(rows) + "\n")
    before = snapshot(tmp_path)
    assert_refused(cli_here(capsys, "ingest", tmp_path / "t.csv", tmp_path / "t.zarr", "--group-column", "g",
                            cwd=tmp_path), "line 2 has 4 fields, the header has 3 (a trailing delimiter?)")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("labels, outcome", [
    ([1, "1"], "would be one group"),  # merged into one group before
    ([1, 1.0], "would be two groups"),
])
def test_labels_of_mixed_types_that_read_alike_are_refused(labels, outcome, tmp_path, capsys):
    """Case 10: labels 1, '1', 1.0 in one object array: 1 and '1' were merged into one group."""
    X, _ = grouped_data(m=40, n=5)
    groups = np.array([labels[i % 2] for i in range(40)] + [], dtype=object)
    groups[5] = "other"
    with pytest.raises(ValueError, match=f"groups: the labels .* \\(row 0, int\\) and .* \\(row 1, .*\\) {outcome}"):
        distfact.from_arrays(X, groups)
    with pytest.raises(ValueError, match=outcome):
        distfact.NMF(2, max_iter=2).fit(X, groups=groups)
    lines = [json.dumps({"text": "some words here", "group": labels[i % 2]}) for i in range(6)]
    (tmp_path / "c.jsonl").write_text("\n".join(lines) + "\n")
    before = snapshot(tmp_path)
    out = cli_here(capsys, "ingest", tmp_path / "c.jsonl", tmp_path / "c.zarr", cwd=tmp_path)
    assert_refused(out, "c.jsonl: line 2", "line 1")
    assert snapshot(tmp_path) == before


def test_a_missing_class_label_is_refused_not_a_class_named_nan(store, tmp_path, capsys):
    """Case 10: a NaN among SSNMF's class labels became a class named 'nan'."""
    X, _ = grouped_data(m=60, n=8, n_groups=2, seed=5)
    y = np.array(["a", "b", "c"] * 20, dtype=object)
    y[7] = np.nan
    with pytest.raises(ValueError, match=r"y has a missing label \(nan\) at row 7; mark unlabelled rows with -1"):
        distfact.SSNMF(2, max_iter=2).fit(X, y=y)
    with pytest.raises(ValueError, match="missing label"):
        distfact.SSNMFClassifier(2, max_iter=2).fit(X, y)
    np.save(tmp_path / "y.npy", np.where(np.arange(60) == 7, np.nan, np.arange(60) % 3))
    before = snapshot(tmp_path)
    out = cli_here(capsys, "fit", store, "--method", "ssnmf", "--rank", 2, "--labels", tmp_path / "y.npy",
                   "--no-progress", "--output", tmp_path / "fit", cwd=tmp_path)
    assert_refused(out, "missing label (nan)")
    assert snapshot(tmp_path) == before


def test_a_text_labels_file_works_as_documented(store, tmp_path, capsys):
    """Unhelpful: --labels labels.txt (one label per line) always failed with a numpy DTypePromotionError."""
    order = distfact.open(store).row_index()
    labels = np.array(["spam", "ham", "-1"] * 20)
    (tmp_path / "labels.txt").write_text("\n".join(labels) + "\n")
    out = cli_here(capsys, "fit", store, "--method", "ssnmf", "--rank", 2, "--max-iter", 3, "--labels",
                   tmp_path / "labels.txt", "--no-progress", "--output", tmp_path / "fit", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "fit" / "metrics.json").read_text())["classes"] == ["ham", "spam"]
    y = labels.astype(object)
    y[y == "-1"] = -1
    here = distfact.SSNMF(2, max_iter=3, random_state=0).fit(store, y=y)
    assert np.array_equal(np.load(tmp_path / "fit" / "components.npy"), here.components_) and order.size == 60


@pytest.mark.parametrize("content, words", [
    (b"just some text\n", "is not an .npz file"),
    (None, "holds an array of Python objects"),
])
def test_an_npz_that_is_not_arrays_of_numbers(content, words, tmp_path, capsys):
    if content is None:
        np.savez(tmp_path / "x.npz", X=np.array([{"a": 1}, None], dtype=object))
    else:
        (tmp_path / "x.npz").write_bytes(content)
    before = snapshot(tmp_path)
    assert_refused(cli_here(capsys, "ingest", tmp_path / "x.npz", tmp_path / "x.zarr", cwd=tmp_path), words)
    assert snapshot(tmp_path) == before


def test_a_jsonl_byte_that_is_not_utf8_is_named_on_its_line(tmp_path, capsys):
    """Unhelpful: a bad UTF-8 byte on line 51 was reported "after line 0"."""
    good = json.dumps({"text": "words words", "group": "a"}).encode()
    (tmp_path / "c.jsonl").write_bytes(b"\n".join([good] * 50 + [b'{"text": "caf\xe9", "group": "a"}', good]) + b"\n")
    before = snapshot(tmp_path)
    assert_refused(cli_here(capsys, "ingest", tmp_path / "c.jsonl", tmp_path / "c.zarr", cwd=tmp_path),
                   "c.jsonl: line 51: not UTF-8 text")
    with pytest.raises(ValueError, match="line 51: not UTF-8"):
        distfact.from_corpus(tmp_path / "c.jsonl", tmp_path / "c.zarr", batch_docs=7)
    assert snapshot(tmp_path) == before


def test_a_dataframe_with_a_missing_value_names_its_row_and_column():
    """Unhelpful: a nullable column's pd.NA was reported as "dtype object"."""
    frame = pd.DataFrame({"a": pd.array([1, 2, None, 4], dtype="Int64"), "b": [1.0, 2.0, 3.0, 4.0]})
    with pytest.raises(ValueError, match=r"X has a missing value \(<NA>\) at row 2, column 'a'"):
        distfact.NMF(1, max_iter=2).fit(frame, groups=["x", "x", "y", "y"])
    filled = frame.fillna(3)
    model = distfact.NMF(1, max_iter=2, random_state=0).fit(filled, groups=["x", "x", "y", "y"])
    assert model.components_.shape == (1, 2) and list(model.feature_names_in_) == ["a", "b"]


@pytest.mark.parametrize("params, words", [
    ({"random_state": -1}, "random_state must be None or a non-negative integer (a seed), got -1"),
    ({"tol": float("nan")}, "tol must be a finite non-negative number, got nan"),
    ({"max_iter": True}, "max_iter must be a non-negative integer"),
])
def test_parameters_are_named(params, words, store):
    """Unhelpful: random_state=-1 failed in numpy without naming the parameter; a NaN tolerance was accepted."""
    for cls in (distfact.NMF, distfact.FairerNMF, distfact.StratifiedNMF, distfact.WeightedL1NMF, distfact.SSNMF):
        with pytest.raises(ValueError) as caught:
            cls(2, **params).fit(store)
        assert words in str(caught.value), (cls, caught.value)


@pytest.mark.parametrize("option, value, words", [
    ("--tol", "nan", "argument --tol: 'nan' is not a finite number"),
    ("--local-cluster", "-1", "argument --local-cluster: '-1' must be >= 1"),
    ("--local-cluster", "0", "argument --local-cluster: '0' must be >= 1"),
    ("--seed", "-1", "argument --seed: '-1' must be >= 0"),
    ("--rank", "0", "argument --rank/-r: '0' must be >= 1"),
])
@pytest.mark.timeout(60)  # --local-cluster -1 waited 30 s for a cluster before it was refused
def test_option_values_are_checked_before_any_work(option, value, words, store, tmp_path, capsys):
    """Unhelpful: --tol nan was accepted; --local-cluster -1 waited 30 s and 0 ran in-process silently."""
    args = ["fit", store, "--rank", 2, "--no-progress", "--output", tmp_path / "fit", option, value]
    if option == "--rank":
        args[3] = value
    before = snapshot(tmp_path)
    assert_refused(cli_here(capsys, *args, cwd=tmp_path), words, "(see distfact fit --help)")
    assert snapshot(tmp_path) == before


def test_report_ranks_beyond_the_data_are_refused_before_fitting(store, tmp_path):
    """Unhelpful: `report --fairness --ranks 29:31` fitted ranks 29 and 30 before refusing 31."""
    before = snapshot(tmp_path)
    out = cli("-v", "report", store, "--fairness", "--ranks", "7:9", "--output", tmp_path / "report", cwd=tmp_path)
    assert_refused(out, "n_components=9 is larger than min(n_samples, n_features)")
    assert "pass 0" not in out.stderr  # nothing was fitted
    assert snapshot(tmp_path) == before


SPEC = """name = "s"
# {note}
[input]
dataset = "digits"
[[fit]]
method = "nmf"
rank = 2
"""


def test_a_spec_that_is_not_utf8_names_its_file_and_line(tmp_path, capsys):
    from distfact.pipeline import SpecError, load_spec

    (tmp_path / "spec.toml").write_bytes(SPEC.format(note="caf\xe9").encode("latin-1"))
    before = snapshot(tmp_path)
    out = cli_here(capsys, "run", tmp_path / "spec.toml", "--output", tmp_path / "runs", cwd=tmp_path)
    assert_refused(out, "spec.toml:2: not UTF-8 text (byte b'\\xe9' at column 6)")
    with pytest.raises(SpecError, match="spec.toml:2: not UTF-8"):
        load_spec(tmp_path / "spec.toml")
    assert snapshot(tmp_path) == before


def test_a_non_finite_number_in_a_spec_is_refused_before_any_work(tmp_path, capsys):
    (tmp_path / "spec.toml").write_text(SPEC.format(note="") + "tol = nan\n")
    out = cli_here(capsys, "run", tmp_path / "spec.toml", "--output", tmp_path / "runs", cwd=tmp_path)
    assert_refused(out, "spec.toml:8: [fit] #1 key 'tol': expected a finite number, got nan")
    assert not (tmp_path / "runs").exists()


def test_an_unknown_output_protocol_is_refused_before_any_stage(tmp_path):
    """Unhelpful: `run --output s4://...` ran every stage, then publish failed."""
    from distfact.pipeline import run_pipeline

    (tmp_path / "spec.toml").write_text(SPEC.format(note=""))
    home = {**os.environ, "HOME": str(tmp_path / "home")}  # a remote root's stages run under ~/.cache/distfact
    out = cli("run", tmp_path / "spec.toml", "--output", "s4://bucket/runs", cwd=tmp_path, env=home)
    assert_refused(out, "unknown protocol 's4'")
    assert not (tmp_path / "home").exists()
    with pytest.raises(ValueError, match="unknown protocol 's4'"):
        run_pipeline(tmp_path / "spec.toml", root="s4://bucket/runs")
