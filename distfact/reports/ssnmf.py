"""The views of the SSNMF paper (Haddock et al., 2020, Section 3.2) for a fitted ``SSNMF``.

  Fig. 2   the supervision matrix B (classes x topics, the paper's orientation), each topic's column
           normalised to sum 1: which classes a topic predicts.
  Table 5  the top-weighted features of every topic (row of H), with the class it weighs most.
  and the objective with its reconstruction and supervision parts by iteration.
"""

from __future__ import annotations

import csv
import os

import numpy as np

from ..features import feature_names_of, top_feature_names
from ..outputs import write_json
from .page import figure_png, html_table, write_page


def normalised_B(model) -> np.ndarray:
    """B in the paper's orientation (classes x topics), each topic's column summing to 1."""
    B = np.asarray(model.B_).T
    return B / np.maximum(B.sum(axis=0, keepdims=True), np.finfo(np.float64).tiny)


def class_names(model) -> list[str]:
    if model.classes_ is not None:
        return [str(c) for c in model.classes_]
    return [f"target {j}" for j in range(model.B_.shape[1])]


def topic_table(model, feature_names=None, k: int = 10) -> list[list]:
    """Table 5: per topic, the class it weighs most and its ``k`` largest-weighted features."""
    classes = class_names(model)
    B = normalised_B(model)
    return [[t + 1, classes[int(np.argmax(B[:, t]))], *words]
            for t, words in enumerate(top_feature_names(model.components_, feature_names_of(model, feature_names), k))]


def b_heatmap(model, title: str = "normalised B") -> bytes:
    """Fig. 2."""
    import matplotlib.pyplot as plt

    B = normalised_B(model)
    fig, ax = plt.subplots(figsize=(max(4.0, 0.5 * B.shape[1] + 3), 0.45 * B.shape[0] + 1.4))
    image = ax.imshow(B, cmap="viridis", aspect="auto", vmin=0, vmax=1)
    ax.set_yticks(range(B.shape[0]), class_names(model))
    ax.set_xticks(range(B.shape[1]), [str(t + 1) for t in range(B.shape[1])])
    ax.set_xlabel("topic")
    ax.set_title(title)
    fig.colorbar(image, ax=ax)
    png = figure_png(fig)
    plt.close(fig)
    return png


def loss_plot(model) -> bytes:
    """The objective and its two parts by iteration."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    for column, label in enumerate(("objective", "reconstruction R", "supervision S")):
        ax.semilogy(model.loss_history_[:, column], label=label)
    ax.set_xlabel("iteration")
    ax.legend()
    png = figure_png(fig)
    plt.close(fig)
    return png


def write_ssnmf_report(out_dir, model, *, feature_names=None, top=10, title="SSNMF report") -> dict:
    """Write ``top_features.csv`` (Table 5), ``ssnmf.json``, the figures (PNG) and ``ssnmf.html`` (images
    embedded) for a model fitted with targets."""
    if model.B_ is None:
        raise ValueError("the SSNMF report needs a model fitted with targets (Y or y)")
    os.makedirs(out_dir, exist_ok=True)
    rows = topic_table(model, feature_names, top)
    columns = ["topic", "class", *range(1, len(rows[0]) - 1)]
    paths = {"csv": os.path.join(out_dir, "top_features.csv"), "json": os.path.join(out_dir, "ssnmf.json"),
             "html": os.path.join(out_dir, "ssnmf.html")}
    with open(paths["csv"], "w", newline="") as f:
        csv.writer(f).writerows([columns, *rows])
    write_json(paths["json"], {"classes": class_names(model), "n_components": int(model.n_components_),
                               "n_iter": int(model.n_iter_), "n_passes": int(model.n_passes_),
                               "objective": float(model.loss_history_[-1, 0]),
                               "reconstruction": float(model.loss_history_[-1, 1]),
                               "supervision": float(model.loss_history_[-1, 2]),
                               "normalised_B": normalised_B(model).tolist(), "top_features": rows,
                               "scheduler": model.scheduler_}, indent=1)
    body = (f"<p>{len(class_names(model))} classes, rank {model.n_components_}, {model.n_iter_} iterations "
            f"({model.n_passes_} passes over X); objective {model.loss_history_[-1, 0]:.4g} (reconstruction "
            f"{model.loss_history_[-1, 1]:.4g}, supervision {model.loss_history_[-1, 2]:.4g}).</p>"
            f"<h2>Top features of each topic</h2>{html_table(columns, rows)}")
    return write_page(paths, out_dir, title, body, [("fig2_B.png", b_heatmap(model)), ("loss.png", loss_plot(model))])


def views(model, name: str) -> list[tuple[str, bytes]]:
    """The SSNMF figure in every report of a fit: the normalised B (for a model fitted with labels)."""
    return [] if model.B_ is None else [(f"{name}-B.png", b_heatmap(model, f"{name}: normalised B"))]


def paper_report(data, options: dict, client, out_dir: str, title: str) -> dict:
    """``distfact report STORE --ssnmf``: fit SSNMF with the groups (or ``--labels``) as classes and write its
    report."""
    from ..engine.progress import show_iterations
    from ..estimators import SSNMF
    from ..store.files import class_labels

    labels = class_labels(options["inputs"]["labels"], data)
    if labels is None:
        raise ValueError("the SSNMF report needs classes: --labels groups or a file of labels")
    model = SSNMF(options["rank"], random_state=options["seed"], **options["params"])
    progress = show_iterations(model, shown=options["progress"])
    model.fit(data, y=labels, client=client)
    progress.close()
    return write_ssnmf_report(out_dir, model, top=options["top"], title=title)
