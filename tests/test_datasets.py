"""The data sets shipped inside distfact, against a second reading of their files."""

import os

import numpy as np
import pandas as pd

import distfact.datasets as datasets


def test_movielens_ratings_are_the_shipped_table_pivoted():
    X, groups, films, users = datasets.load_movielens_ratings()
    frame = pd.read_csv(os.path.join(os.path.dirname(datasets.__file__), "movielens_50.csv.gz"))
    table = frame.pivot(index="movieId", columns="userId", values="rating")  # NaN where no rating was given
    assert X.shape == table.shape == (453, 670) and X.nnz == 43_083 == table.notna().to_numpy().sum()
    np.testing.assert_array_equal(X.toarray(), table.fillna(0.0).to_numpy())
    np.testing.assert_array_equal(films, table.index)
    np.testing.assert_array_equal(users, table.columns)
    genre = frame.drop_duplicates("movieId").set_index("movieId")["genre"]
    np.testing.assert_array_equal(groups, genre.loc[films].to_numpy())
    assert dict(zip(*np.unique(groups, return_counts=True))) == {
        "Action": 142, "Adventure": 51, "Comedy": 118, "Crime": 29, "Drama": 71, "Other": 42}
