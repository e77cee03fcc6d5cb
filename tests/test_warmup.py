"""The numba cache made by the warm-up (``pip install .``'s build step, ``distfact warmup``) holds every kernel
signature the estimators' fits use: a fresh process after it compiles nothing (numba's dispatcher statistics
count a signature that was not found in the cache as a miss)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

import distfact
from conftest import SESSION_WARMUP, numba_cache_env

# The estimators as a user calls them (every solver and model path, dense and CSR, float64 and float32, transform and
# score included; from arrays, and from stores for the methods the warm-up runs no fits of), in a fresh process;
# prints the kernels that compiled there.
USER_FITS = """
import json, warnings
import numpy as np, scipy.sparse as sp
import distfact
from distfact.warmup import cached_kernels, compilations

warnings.simplefilter("ignore")
kernels = cached_kernels()
rng = np.random.default_rng(1)
dense = rng.random((90, 70))  # wide enough for the thin products' loops (kernels/products.py: THIN_COLUMNS)
dense[dense < 0.6] = 0.0
groups, labels = np.repeat(["a", "b", "c"], 30), np.repeat([0, 1, 2], 30)
for dtype in (np.float64, np.float32):
    for X in (dense.astype(dtype), sp.csr_matrix(dense.astype(dtype))):
        for solver, loss in (("mu", "frobenius"), ("hals", "frobenius"), ("mu", "kullback-leibler")):
            distfact.NMF(3, solver=solver, beta_loss=loss, max_iter=3, random_state=0).fit(X, groups=groups)
        distfact.NMF(3, init="nndsvda", max_iter=3).fit(X, groups=groups).transform(X, groups=groups)
        distfact.StratifiedNMF(3, max_iter=3, random_state=0).fit(X, groups=groups).transform(X, groups=groups)
        for solver in ("mu", "am"):
            distfact.FairerNMF(3, solver=solver, max_iter=2, estimate_max_iter=3, n_estimates=1,
                               random_state=0).fit(X, groups=groups).transform(X, groups=groups)
        distfact.WeightedL1NMF(3, max_iter=2, hals_iter=2, random_state=0).fit(X, groups=groups).transform(X)
        for model in ("FF", "DF", "FD", "DD"):
            distfact.SSNMF(3, model=model, max_iter=3, random_state=0).fit(X, y=labels).transform(X)
        distfact.SSNMFClassifier(3, max_iter=3, random_state=0).fit(X, labels).score(X, labels)
        distfact.MultigroupSVD(2).fit(X, groups=groups).transform(X)
        holes = (rng.random(X.shape) > 0.15) * 1.0  # masked fits: few missing (complement form) and "nonzero"
        for mask in (holes, "nonzero") if sp.issparse(X) else (holes,):
            for solver, loss in (("mu", "frobenius"), ("hals", "frobenius"), ("mu", "kullback-leibler")):
                distfact.NMF(3, solver=solver, beta_loss=loss, max_iter=3, random_state=0).fit(X, groups=groups,
                                                                                              mask=mask)
            distfact.WeightedL1NMF(3, max_iter=2, hals_iter=2, random_state=0).fit(X, groups=groups, mask=mask)
            distfact.StratifiedNMF(3, max_iter=3, random_state=0).fit(X, groups=groups, mask=mask)
            distfact.FairerNMF(3, max_iter=2, estimate_max_iter=3, n_estimates=1, random_state=0).fit(
                X, groups=groups, mask=mask)
    tall = np.tile(dense, (50, 1)).astype(dtype)  # one block of more than one tile (kernels/nmf.py: TILE_BYTES)
    for solver in ("mu", "hals"):
        distfact.NMF(3, solver=solver, max_iter=3, random_state=0).fit(tall).transform(tall)
    # a CSR block in memory wider than one band of the CSR step (kernels/nmf.py: CSR_BAND_BYTES; a text corpus's
    # vocabulary at rank 3), columns sorted: its second pass on goes band by band
    wide = sp.hstack([sp.csr_matrix(dense), sp.random(90, 50_000, density=1e-4, random_state=0)],
                     format="csr").astype(dtype)
    wide.sort_indices()
    for solver in ("mu", "hals"):
        distfact.NMF(3, solver=solver, max_iter=3, random_state=0).fit(wide, groups=groups)
    distfact.NMF(3, max_iter=3, random_state=0).fit(tall, mask=(rng.random(tall.shape) > 0.15) * 1.0)
# The warm-up runs no fits of a method that declares no numba kernels of its own (numba_kernels=False), so these
# must compile nothing: its defaults from a store of each dtype and layout; each of its settings (as the warm-up
# would have run them) from a store of three groups and of two, 20 columns wide (the multigroup SVD's SDP grows
# with the columns: 8 s a fit at 70); the multigroup SVD's wide-data sketch.
from distfact.registry import methods
from distfact.warmup import _fit_and_transform, _settings

for declaration in (d for d in methods().values() if not d.numba_kernels):
    for dtype in (np.float64, np.float32):
        for X in (dense.astype(dtype), sp.csr_matrix(dense.astype(dtype))):
            store = distfact.from_arrays(X, groups, f"{declaration.name}-{dtype.__name__}-"
                                                    f"{'csr' if sp.issparse(X) else 'dense'}.zarr")
            _fit_and_transform(declaration, {}, store, X)
    for name, rows in (("three", groups != ""), ("two", groups != "c")):
        X = dense[rows][:, :20]
        store = distfact.from_arrays(X, groups[rows], f"{declaration.name}-{name}-groups.zarr")
        for settings in _settings(declaration):
            try:  # each fit as the warm-up would have run it
                _fit_and_transform(declaration, settings, store, X)
            except ValueError:  # a setting these data do not take, as in the warm-up
                pass
distfact.MultigroupSVD(2, max_gram_features=8).fit(dense, groups=groups).transform(dense)
print(json.dumps({"compiled": compilations(kernels), "kernels": len(kernels),
                  "loaded": sum(sum(d.stats.cache_hits.values()) for d in kernels.values())}))
"""


def in_fresh_process(args, cache_dir, tmp_path):
    """``python ARGS`` in ``tmp_path`` with ``cache_dir`` as numba's cache, importing the distfact these tests import
    (the checkout's under ``python -m pytest``; the session's warm-up is of that copy, ``conftest.py``)."""
    return subprocess.run([sys.executable, *args], cwd=tmp_path, env=numba_cache_env(distfact, cache_dir),
                          check=True, capture_output=True, text=True, timeout=600).stdout


@pytest.fixture(scope="module")
def warmed_cache(tmp_path_factory):
    """A numba cache directory of its own (the source tree's may hold entries from other tests), warmed up in two
    processes side by side (each with its share of the fits), as on a machine of 2 cores or more: the session's
    warm-up where it made one so (``conftest.py: pytest_sessionstart``, on a checkout without a cache), else made
    here."""
    made = os.environ.get(SESSION_WARMUP)
    if made and os.path.isdir(made):
        with open(os.path.join(made, "output.txt")) as f:
            return pathlib.Path(made, "cache"), f.read()
    cache_dir = tmp_path_factory.mktemp("numba-cache")
    out = in_fresh_process(["-c", "from distfact.warmup import main; main(2)"], cache_dir,
                           tmp_path_factory.mktemp("cwd"))
    return cache_dir, out


def test_warmup_compiles_into_the_cache(warmed_cache):
    cache_dir, out = warmed_cache
    compiled = int(out.strip().splitlines()[-1].split("fits; ")[1].split(" kernel signatures")[0])
    assert compiled > 0  # into an empty cache: so a signature missing from the cache counts as compiled
    assert ", 2 processes)" in out.strip().splitlines()[-1]
    assert any(line.startswith("[1/2] ") for line in out.splitlines())  # each share's progress
    assert any(line.startswith("[2/2] ") for line in out.splitlines())
    assert list(cache_dir.rglob("*.nbi")) and list(cache_dir.rglob("*.nbc"))


def test_a_fresh_process_after_the_warmup_compiles_nothing(warmed_cache, tmp_path):
    cache_dir, _ = warmed_cache
    result = json.loads(in_fresh_process(["-c", USER_FITS], cache_dir, tmp_path).strip().splitlines()[-1])
    assert result["kernels"] > 0 and result["loaded"] > 0
    assert result["compiled"] == {}, f"compiled in a fresh process although warmed up: {result['compiled']}"



def test_the_shares_of_the_warmup_are_its_whole_once():
    from distfact.warmup import _data, _share_of

    kinds = len(list(_data()))
    assert _share_of((0, 1), kinds) == list(range(kinds))
    for n in range(2, kinds + 1):
        shares = [_share_of((k, n), kinds) for k in range(n)]
        assert all(shares) and sorted(sum(shares, [])) == list(range(kinds))  # every kind in one share, none twice
    assert _share_of((0, 2), kinds) == [0, 1]  # float64 (dense, CSR) in one process, float32 in the other
    for bad in ((1, 1), (-1, 2), (0, 0)):
        with pytest.raises(ValueError, match="0 <= k < n"):
            _share_of(bad, kinds)


def test_a_failed_share_is_named(monkeypatch, capsys):
    """A process of the side-by-side warm-up that fails (here each exits with a status of its own, as an error
    would) fails the warm-up, naming the share and its status, and nothing is returned as a summary; ``distfact
    warmup`` says so and exits 1 (its ``--processes`` reaching the warm-up: two shares named)."""
    from distfact import warmup
    from distfact.cli import main as cli_main

    monkeypatch.setattr(warmup, "_SHARE_SCRIPT", "import sys\nsys.exit({k} + 2)")
    with pytest.raises(RuntimeError, match=r"share 1/2 \(exit status 2\), 2/2 \(exit status 3\) failed"):
        warmup.warm_up_side_by_side(2)
    with pytest.raises(ValueError, match="processes must be"):
        warmup.warm_up_side_by_side(0)
    assert cli_main(["warmup", "--processes", "2"]) == 1
    assert "distfact warmup: the warm-up's share 1/2 (exit status 2), 2/2 (exit status 3) failed" \
        in capsys.readouterr().err


def test_more_processes_than_kinds_of_data_start_one_a_kind(monkeypatch):
    """Each share fits on its kinds of data (dtype, dense or CSR): processes beyond their number would fit nothing,
    so they are not started. Each process here writes the summary of one fit."""
    from distfact import warmup

    monkeypatch.setattr(warmup, "_SHARE_SCRIPT", "import json\njson.dump({{'fits': 1, 'refused': 0, 'compiled': "
                        "{{'k': 1}}, 'cache': ['c']}}, open({out!r}, 'w'))")
    summary = warmup.warm_up_side_by_side(warmup.KINDS + 3)
    assert summary["processes"] == warmup.KINDS == len(list(warmup._data()))
    assert summary["fits"] == warmup.KINDS and summary["compiled"] == {"k": warmup.KINDS} and summary["cache"] == ["c"]


@pytest.mark.parametrize("deaf", [False, True])
def test_an_interrupted_warmup_leaves_no_process_running(monkeypatch, tmp_path, deaf):
    """When the warm-up stops before its processes end (here the second cannot start; an interrupt the same), those
    started are ended, not left compiling into a scratch directory that is being removed: terminated, or killed when
    they ignore it for STOP_SECONDS (``deaf``: the first process ignores SIGTERM, and says so before the stop)."""
    import signal
    import time

    from distfact import warmup

    ready = tmp_path / "ready"
    monkeypatch.setattr(warmup, "STOP_SECONDS", 0.5)
    monkeypatch.setattr(warmup, "_SHARE_SCRIPT", "import signal, time\n"
                        + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if deaf else "")
                        + f"open({str(ready)!r}, 'w').close()\ntime.sleep(120)")
    started, popen = [], subprocess.Popen

    def popen_once(*args, **kwargs):
        if started:  # once the first is sleeping (and deaf, if it is to be)
            deadline = time.monotonic() + 60
            while not ready.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            raise OSError("Resource temporarily unavailable")
        started.append(popen(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(warmup.subprocess, "Popen", popen_once)
    with pytest.raises(OSError, match="temporarily unavailable"):
        warmup.warm_up_side_by_side(2)
    assert len(started) == 1 and started[0].returncode == (-signal.SIGKILL if deaf else -signal.SIGTERM)


@pytest.mark.skipif(not __import__("distfact.warmup").warmup.can_share(), reason="no flock or numba cache save here")
def test_warmup_processes_add_cache_entries_one_at_a_time(monkeypatch, tmp_path):
    """numba's cache saves under ``_cache_saves_locked`` wait for the lock: with it held elsewhere (another open file
    description, as another process's), a save does not start until it is released."""
    import fcntl
    import threading

    from numba.core.caching import IndexDataCacheFile

    from distfact.warmup import _cache_saves_locked

    saved = []
    monkeypatch.setattr(IndexDataCacheFile, "save", lambda self, key, data: saved.append((key, data)))
    lock_path = str(tmp_path / "cache.lock")
    _cache_saves_locked(lock_path)  # wraps the recording save; monkeypatch puts the class's own back
    with open(lock_path, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        saver = threading.Thread(target=IndexDataCacheFile.save, args=(None, "key", "data"))
        saver.start()
        saver.join(0.5)
        assert saver.is_alive() and saved == []  # waiting for the lock
    saver.join(10)
    assert not saver.is_alive() and saved == [("key", "data")]
