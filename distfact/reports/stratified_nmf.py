"""The views of Stratified-NMF's paper (Chapman, Yaniv and Needell, 2023, Section IV) for a fitted
``StratifiedNMF``.

  Fig. 1  normalised loss sqrt(F / sum_i ||A(i)||^2) by iteration (log-log).
  Fig. 3  normalised strata features: v(i) / sum_j v(i)_j, one bar per stratum for each feature.
  Figs. 4-5  when the features are pixels: every v(i) and every topic (row of H) as an image.
  Fig. 6  the top-weighted features of every v(i) (top words per stratum, for text).
"""

from __future__ import annotations

import csv
import os

import numpy as np

from ..features import feature_names_of
from ..outputs import write_json
from .page import figure_png, html_table, write_page


def normalised_strata_features(model) -> np.ndarray:
    """v(i) / sum_j v(i)_j per stratum (Fig. 3's normalisation); a zero v(i) stays zero."""
    v = model.strata_features_
    return v / np.maximum(v.sum(axis=1, keepdims=True), np.finfo(np.float64).tiny)


def _feature_names(model, feature_names):
    return np.asarray([str(f) for f in feature_names_of(model, feature_names)])


def strata_features_plot(model, feature_names=None, max_features=20) -> bytes:
    """Fig. 3: grouped bars of the normalised strata features. With more than ``max_features``
    features, those whose normalised weight varies most across strata are shown."""
    import matplotlib.pyplot as plt

    V = normalised_strata_features(model)
    names = _feature_names(model, feature_names)
    shown = np.arange(V.shape[1])
    if V.shape[1] > max_features:
        shown = np.sort(np.argsort(-V.std(axis=0), kind="stable")[:max_features])
    s = V.shape[0]
    width = 0.8 / s
    fig, ax = plt.subplots(figsize=(min(12.0, max(6.0, 0.45 * len(shown) * max(1, s / 3))), 3.8))
    for i, name in enumerate(model.strata_names_):
        ax.bar(np.arange(len(shown)) + (i - (s - 1) / 2) * width, V[i, shown], width, label=str(name))
    ax.set_xticks(np.arange(len(shown)), names[shown], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("v(i) / sum v(i)")
    ax.set_title("Normalised strata features")
    if s <= 20:
        ax.legend(fontsize=7, ncol=min(s, 4))
    png = figure_png(fig)
    plt.close(fig)
    return png


def image_grid(rows: np.ndarray, titles, image_shape, title: str) -> bytes:
    """Figs. 4-5: each row (a v(i) or a topic) drawn as an ``image_shape`` image."""
    import matplotlib.pyplot as plt

    count = rows.shape[0]
    cols = min(count, 5)
    nrows = -(-count // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(1.8 * cols, 1.9 * nrows + 0.3), squeeze=False)
    for k, ax in enumerate(axes.ravel()):
        ax.axis("off")
        if k < count:
            ax.imshow(rows[k].reshape(image_shape), cmap="gray_r")
            ax.set_title(str(titles[k]), fontsize=8)
    fig.suptitle(title, fontsize=9)
    png = figure_png(fig)
    plt.close(fig)
    return png


def normalised_loss_plot(model) -> bytes:
    """Fig. 1: the normalised loss by iteration, log-log."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.loglog(np.arange(1, len(model.loss_history_) + 1), model.loss_history_[:, 1])
    ax.set_xlabel("iteration + 1")
    ax.set_ylabel("normalised loss")
    ax.set_title(f"final normalised loss {model.loss_history_[-1, 1]:.3g}")
    png = figure_png(fig)
    plt.close(fig)
    return png


def write_stratified_report(out_dir, model, *, feature_names=None, image_shape=None, top=10,
                            title="Stratified-NMF report") -> dict:
    """Write ``top_features.csv`` (per stratum), ``top_topics.csv``, ``stratified.json``, the figures (PNG)
    and ``stratified.html``
    (images embedded). ``image_shape`` (e.g. (8, 8)) draws v(i) and H's rows as images."""
    os.makedirs(out_dir, exist_ok=True)
    names = _feature_names(model, feature_names)
    tops = model.top_features(top, feature_names=names)
    paths = {key: os.path.join(out_dir, name) for key, name in
             (("csv", "top_features.csv"), ("topics_csv", "top_topics.csv"), ("json", "stratified.json"),
              ("html", "stratified.html"))}
    table = [[str(s), *words] for s, words in tops["strata"].items()]
    columns = ["stratum", *range(1, len(table[0]))]
    topics = [[k + 1, *words] for k, words in enumerate(tops["topics"])]  # numbered from 1, as everywhere
    for key, rows, first in (("csv", table, "stratum"), ("topics_csv", topics, "topic")):
        with open(paths[key], "w", newline="") as f:
            csv.writer(f).writerows([[first, *range(1, len(rows[0]))], *rows])
    summary = {"strata": model.strata_names_, "n_components": int(model.n_components_),
               "n_iter": int(model.n_iter_), "n_passes": int(model.n_passes_),
               "loss": float(model.loss_history_[-1, 0]), "normalised_loss": float(model.loss_history_[-1, 1]),
               "stratum_relative_errors": dict(zip(model.strata_names_, model.group_errors_.tolist())),
               "top_features": tops, "scheduler": model.scheduler_}
    write_json(paths["json"], summary, indent=1)
    images = [("fig1_normalised_loss.png", normalised_loss_plot(model)),
              ("fig3_strata_features.png", strata_features_plot(model, names))]
    if image_shape is not None:
        images += [("fig4_strata_features_images.png",
                    image_grid(model.strata_features_, model.strata_names_, image_shape, "strata features v(i)")),
                   ("fig5_topics_images.png",
                    image_grid(model.components_, [f"topic {k + 1}" for k in range(model.n_components_)],
                               image_shape, "topics (rows of H)"))]
    body = (f"<p>{len(model.strata_names_)} strata, rank {model.n_components_}, {model.n_iter_} iterations "
            f"({model.n_passes_} passes over X); normalised loss {model.loss_history_[-1, 1]:.4g}.</p>"
            f"<h2>Top features of each stratum's v(i)</h2>{html_table(columns, table)}"
            f"<h2>Top features of each topic</h2>{html_table(['topic', *range(1, len(topics[0]))], topics)}")
    return write_page(paths, out_dir, title, body, images)


def views(model, name: str) -> list[tuple[str, bytes]]:
    """The Stratified-NMF figure in every report of a fit: the strata features."""
    return [(f"{name}-strata_features.png", strata_features_plot(model))]


def paper_report(data, options: dict, client, out_dir: str, title: str) -> dict:
    """``distfact report STORE --stratified``: fit Stratified-NMF with the groups as strata and write its
    report."""
    from ..engine.progress import show_iterations
    from ..estimators import StratifiedNMF

    model = StratifiedNMF(options["rank"], random_state=options["seed"], **options["params"])
    progress = show_iterations(model, shown=options["progress"])
    model.fit(data, client=client)
    progress.close()
    return write_stratified_report(out_dir, model, image_shape=options["image_shape"], top=options["top"],
                                   title=title)
