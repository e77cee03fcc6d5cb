"""Real data sets that ship with distfact or its dependencies (nothing is downloaded)."""

from __future__ import annotations

import os

import numpy as np

HEART_FEATURES = ["age", "cp", "trestbps", "chol", "fbs", "restecg", "thalch", "exang", "oldpeak", "slope",
                  "ca", "thal"]


def load_heart_disease():
    """UCI Heart Disease, Cleveland, as Fairer-NMF's Section 6.3 uses it.

    The 297 rows with no missing value; the target (``num``) and ``sex`` dropped; groups are the
    patients' sex (201 "Male", 96 "Female"; the paper's text swaps the two counts); features scaled
    to unit l2 norm. Returns ``(X, groups, feature_names)``. Source and licence: ``datasets/README.md``.
    """
    import pandas as pd

    frame = pd.read_csv(os.path.join(os.path.dirname(__file__), "heart_cleveland.csv")).dropna()
    X = frame[HEART_FEATURES].to_numpy(dtype=np.float64)
    return X / np.linalg.norm(X, axis=0), frame["sex"].to_numpy(dtype=str), list(HEART_FEATURES)


def load_digits_grouped():
    """scikit-learn's bundled UCI ML hand-written digits (1,797 images of 8 x 8 grey levels 0-16),
    grouped by digit. Returns ``(X, groups, feature_names)``."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    names = [f"pixel_{i}_{j}" for i in range(8) for j in range(8)]
    return digits.data, np.array([f"digit {d}" for d in digits.target]), names


def make_fairer_synthetic(random_state=0):
    """Fairer-NMF's synthetic data (Table 1): groups "A", "B", "C" of 1000, 500 and 250 rows x 20
    columns of ranks 3, 3 and 6; X_l = W_l H_l with entries U[0, 1); columns scaled to unit l2 norm.
    Returns ``(X, groups)``."""
    rng = np.random.default_rng(random_state)
    parts, labels = [], []
    for rows, rank, name in ((1000, 3, "A"), (500, 3, "B"), (250, 6, "C")):
        parts.append(rng.random((rows, rank)) @ rng.random((rank, 20)))
        labels += [name] * rows
    X = np.vstack(parts)
    return X / np.linalg.norm(X, axis=0), np.array(labels)


def make_stratified_synthetic(random_state=0):
    """Stratified-NMF's synthetic data (Section IV-A): 4 strata "1".."4" of 100 x 100, each
    A(i) = W(i) H + 1 v_true(i)^T with W(i) (100 x 5) and one shared H (5 x 100) uniform on [0, 1),
    and v_true(i) uniform on [i - 1, i). Returns ``(X, strata, v_true)`` (v_true: 4 x 100)."""
    rng = np.random.default_rng(random_state)
    H = rng.random((5, 100))
    v_true = np.stack([rng.uniform(i - 1, i, 100) for i in range(1, 5)])
    X = np.vstack([rng.random((100, 5)) @ H + v for v in v_true])
    return X, np.repeat([str(i) for i in range(1, 5)], 100), v_true


def load_digit_strata(per_digit=85, random_state=0):
    """Stratified-NMF's image strata (Section IV-C) from scikit-learn's bundled 8 x 8 digits instead
    of MNIST: stratum "S1" holds ``per_digit`` images of 1 and of 2, "S2" ``per_digit`` other images
    of 2 and of 3 (the strata share no image; the paper takes 100 of each from MNIST, the bundled set
    has 177 twos, so at most 88). Returns ``(X, strata, digits)``, pixels 0-16."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(random_state)
    pick = {d: rng.permutation(np.flatnonzero(digits.target == d)) for d in (1, 2, 3)}
    if len(pick[2]) < 2 * per_digit:
        raise ValueError(f"per_digit={per_digit} is too large: both strata need {per_digit} twos and the "
                         f"bundled digits have {len(pick[2])}")
    rows = np.concatenate([pick[1][:per_digit], pick[2][:per_digit], pick[2][per_digit:2 * per_digit],
                           pick[3][:per_digit]])
    strata = np.repeat(["S1", "S2"], 2 * per_digit)
    return digits.data[rows], strata, digits.target[rows]


def make_false_zeros(zeros, false_share, m=100, n=50, rank=20, diversity=0.1, random_state=0):
    """wL1-NMF's matrix completion with false zeros (wl1-nmf-scd.txt, Section 7.3).

    W (m x rank) and H (rank x n) uniform on [0, 1), the dense ground truth W H, plus Laplace noise of
    scale ``diversity``; then a share ``zeros`` (q1) of the mn entries set to 0: a share
    ``false_share`` (q2) of them are the *smallest* entries (type I, false zeros: low values
    thresholded), the rest chosen at random among the others (type II, missing entries). Negative
    noisy entries (the noise is tiny against W H) are clipped to 0. Returns ``(X, truth)``.
    """
    if not 0 <= zeros < 1 or not 0 <= false_share <= 1:
        raise ValueError(f"need 0 <= zeros < 1 and 0 <= false_share <= 1, got {zeros}, {false_share}")
    rng = np.random.default_rng(random_state)
    truth = rng.random((m, rank)) @ rng.random((rank, n))
    X = np.maximum(truth + rng.laplace(scale=diversity, size=(m, n)), 0.0).ravel()
    n_zero = int(round(zeros * m * n))
    n_false = int(round(false_share * n_zero))
    order = np.argsort(X, kind="stable")
    false = order[:n_false]
    missing = rng.choice(order[n_false:], size=n_zero - n_false, replace=False)
    X[false] = 0.0
    X[missing] = 0.0
    return X.reshape(m, n), truth
