"""The page every report writes: figures as PNG, HTML tables, and one self-contained HTML page embedding them
(readable offline)."""

from __future__ import annotations

import base64
import html
import io
import os


def figure_png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return buf.getvalue()


def html_page(title: str, body: str) -> str:
    """A self-contained HTML page (no external resources; readable on a phone)."""
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:auto;padding:1em}}table{{border-collapse:collapse;display:block;overflow-x:auto;max-width:100%}}
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


def parse_image_shape(text, n_features: int):
    """``HEIGHTxWIDTH`` (e.g. ``8x8``) as (height, width), checked against the data's ``n_features``; None
    for None."""
    if text is None:
        return None
    try:
        height, width = (int(v) for v in text.lower().split("x"))
    except ValueError as exc:
        raise ValueError(f"--image-shape must be HEIGHTxWIDTH, e.g. 8x8; got {text!r}") from exc
    if height * width != n_features:
        raise ValueError(f"--image-shape {text} has {height * width} pixels, the data have {n_features} features")
    return height, width


def integer_ranks(ax) -> None:
    """Rank axes show whole ranks only."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
