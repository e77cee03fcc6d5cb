"""Per-group reports of a fitted factorisation: a table (CSV/JSON), PNG plots and one
self-contained HTML page embedding them (readable offline)."""

from __future__ import annotations

import base64
import html
import io
import json
import os

import numpy as np

from .metrics import group_table


def figure_png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return buf.getvalue()


def html_page(title: str, body: str) -> str:
    """A self-contained HTML page (no external resources; readable on a phone)."""
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:auto;padding:1em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:.2em .5em;text-align:right}}img{{max-width:100%}}</style></head>
<body><h1>{html.escape(title)}</h1>{body}</body></html>"""


def html_table(columns, rows) -> str:
    """An HTML table; floats shown to 4 significant digits."""
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)
    cells = "".join("<tr>" + "".join(f"<td>{html.escape(f'{v:.4g}' if isinstance(v, float) else str(v))}</td>"
                                     for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{cells}</table>"


def html_figures(images) -> str:
    """Figures embedded as base64 PNGs, from (name, PNG bytes) pairs."""
    return "".join(f'<figure><img alt="{html.escape(name)}" src="data:image/png;base64,'
                   f'{base64.b64encode(png).decode()}"><figcaption>{html.escape(name)}</figcaption></figure>'
                   for name, png in images)


def write_page(paths: dict, out_dir, title: str, body: str, images) -> dict:
    """Write each (name, PNG) of ``images`` into ``out_dir`` (its path added to ``paths``) and the HTML page
    ``paths["html"]``: ``body`` then the figures, embedded. Returns ``paths``."""
    for name, png in images:
        paths[name] = os.path.join(out_dir, name)
        with open(paths[name], "wb") as f:
            f.write(png)
    with open(paths["html"], "w") as f:
        f.write(html_page(title, f"{body}<h2>Figures</h2>{html_figures(images)}"))
    return paths


def _loss_plot(model) -> bytes:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    history = model.group_loss_history_
    for g, name in enumerate(model.group_names_):
        ax.plot(history[:, g], label=str(name))
    ax.set_xlabel("iteration")
    ax.set_ylabel("loss")
    ax.set_yscale("log")
    ax.set_title("Loss per group")
    if len(model.group_names_) <= 12:
        ax.legend(fontsize=7, ncol=2)
    data = figure_png(fig)
    plt.close(fig)
    return data


def _components_plot(model, image_shape=None, feature_names=None, top=8) -> bytes:
    import matplotlib.pyplot as plt

    H = model.components_
    r = H.shape[0]
    cols = min(r, 5)
    rows = -(-r // cols)
    if image_shape is not None:
        fig, axes = plt.subplots(rows, cols, figsize=(1.6 * cols, 1.6 * rows), squeeze=False)
        for k, ax in enumerate(axes.ravel()):
            ax.axis("off")
            if k < r:
                ax.imshow(H[k].reshape(image_shape), cmap="gray_r")
                ax.set_title(f"component {k}", fontsize=7)
    else:
        fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols, 2.0 * rows), squeeze=False)
        names = np.asarray(feature_names if feature_names is not None else [str(j) for j in range(H.shape[1])])
        for k, ax in enumerate(axes.ravel()):
            if k >= r:
                ax.axis("off")
                continue
            idx = np.argsort(H[k])[::-1][:top]
            ax.barh(range(len(idx))[::-1], H[k, idx])
            ax.set_yticks(range(len(idx))[::-1], names[idx], fontsize=6)
            ax.set_title(f"component {k}", fontsize=7)
    data = figure_png(fig)
    plt.close(fig)
    return data


def write_report(out_dir, model, data, *, title="distfact report", image_shape=None, facts=None) -> dict:
    """Write ``metrics.json``, ``groups.csv``, ``loss.png``, ``components.png`` and ``report.html``.

    Returns the paths written.
    """
    os.makedirs(out_dir, exist_ok=True)
    table = group_table(model, data)
    paths = {name: os.path.join(out_dir, name)
             for name in ("metrics.json", "groups.csv", "loss.png", "components.png", "report.html")}
    metrics = {
        "title": title,
        "shape": list(data.shape),
        "n_components": int(model.components_.shape[0]),
        "n_iter": int(model.n_iter_),
        "n_passes": int(model.n_passes_),
        "reconstruction_err": float(model.reconstruction_err_),
        "converged": bool(model.converged_),
        "scheduler": model.scheduler_,
        "groups": table,
        **(facts or {}),
    }
    with open(paths["metrics.json"], "w") as f:
        json.dump(metrics, f, indent=2, default=str)
    columns = list(table[0])
    with open(paths["groups.csv"], "w") as f:
        f.write(",".join(columns) + "\n")
        for row in table:
            f.write(",".join(str(row[c]) for c in columns) + "\n")
    images = {"loss.png": _loss_plot(model),
              "components.png": _components_plot(model, image_shape, data.feature_names)}
    for name, png in images.items():
        with open(paths[name], "wb") as f:
            f.write(png)
    facts_html = "".join(f"<li>{html.escape(str(k))}: {html.escape(str(v))}</li>"
                         for k, v in metrics.items() if k != "groups")
    body = (f"<h2>Per-group results</h2>{html_table(columns, [[row[c] for c in columns] for row in table])}"
            f"<h2>Figures</h2>{html_figures(images.items())}<h2>Run</h2><ul>{facts_html}</ul>")
    page = html_page(title, body)
    with open(paths["report.html"], "w") as f:
        f.write(page)
    return paths
