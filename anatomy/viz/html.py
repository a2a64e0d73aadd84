"""Self-contained HTML: one file per view, with its CSS, JavaScript and data inline.

Shape letters: L layers, H heads, T query positions, S key positions, D head width.

The file makes no network request. The data sits in a `<script type="application/json">`
block, with every `<` written as `\\u003c` so that no token (`</script>`, `<!--`) can close it;
the page reads it with JSON.parse and puts tokens into the page only as text (textContent,
canvas fillText), never as HTML.

Weights are compact: per layer, quantised to one byte (round(255 w)), deflated and base64
encoded, so a 512-token x 12-layer x 12-head model is a few megabytes and the page decodes only
the layers it shows.
"""

from __future__ import annotations

import base64
import html
import json
import math
import numbers
import zlib
from importlib import resources
from pathlib import Path
from string import Template

import numpy as np

from ..checkpoints.writing import write_atomically
from .data import AttentionMap

ASSETS = resources.files("anatomy.viz") / "assets"


def pack(array: np.ndarray) -> str:
    """base64(deflate(bytes)) of a contiguous array; the page inflates it with DecompressionStream."""
    # Level 1: several times faster than the default and within a third of its size on attention.
    return base64.b64encode(zlib.compress(np.ascontiguousarray(array).tobytes(), 1)).decode("ascii")


def quantise(weights: np.ndarray) -> np.ndarray:
    """Weights in [0, 1] -> uint8 round(255 w); the page reads byte / 255."""
    return (np.clip(weights, 0.0, 1.0) * 255 + 0.5).astype(np.uint8)


def map_payload(attention: AttentionMap, vectors: bool = False) -> dict:
    """The JSON for one AttentionMap: tokens, and one packed [H, T, S] uint8 block per layer.

    With vectors, also the exact float32 weights and the q [H, T, D] and k [H, S, D] vectors per
    layer, for the neuron view.
    """
    payload = {
        "name": attention.name,
        "queries": attention.queries,
        "keys": attention.keys,
        "nLayers": attention.n_layers,
        "nHeads": attention.n_heads,
        "sentenceBStart": attention.sentence_b_start,
        "cross": attention.cross,
        "weights": [pack(quantise(layer)) for layer in attention.weights],
    }
    if vectors:
        payload["dHead"] = attention.q.shape[-1]
        payload["exact"] = [pack(layer.astype("<f4")) for layer in attention.weights]
        payload["q"] = [pack(layer.astype("<f4")) for layer in attention.q]
        payload["k"] = [pack(layer.astype("<f4")) for layer in attention.k]
    return payload


def json_text(data, **options) -> str:
    """json.dumps(data), with every number that is not finite written as null: JSON has no NaN nor Infinity
    (Python writes them, JSON.parse refuses the file). Containers are walked without recursion."""
    def finite(value):
        if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):  # numpy's floats too
            value = float(value)
            return value if math.isfinite(value) else None
        return value

    root = [data]
    pending = [(root, 0)]
    while pending:
        holder, key = pending.pop()
        value = holder[key]
        if isinstance(value, dict):
            value = holder[key] = dict(value)
            pending += [(value, k) for k in value]
        elif isinstance(value, (list, tuple)):
            value = holder[key] = list(value)
            pending += [(value, i) for i in range(len(value))]
        else:
            holder[key] = finite(value)
    return json.dumps(root[0], allow_nan=False, **options)


def script_json(payload: dict) -> str:
    """JSON that is safe inside <script>: no '<' (so no '</script>' or '<!--'), no '>' or '&', and no NaN
    (the page reads it with JSON.parse, which refuses one)."""
    text = json_text(payload, ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def asset(name: str) -> str:
    return (ASSETS / name).read_text(encoding="utf-8")


# The page shell every HTML output of anatomy uses (views, the walk, the analyses) ----------------


def content_security_policy(script: bool) -> str:
    """Nothing may be fetched, framed or submitted; inline styles (and inline scripts, for a page
    that has one) run; images only from data: and blob: URLs drawn by the page itself."""
    return ("default-src 'none'; style-src 'unsafe-inline'; img-src data: blob:; base-uri 'none'; "
            "form-action 'none'" + ("; script-src 'unsafe-inline'" if script else ""))


def page(title: str, body: str, *, style: str = "", script: str = "", body_class: str = "") -> str:
    """One self-contained HTML document: charset, viewport, the Content-Security-Policy, `title`
    (escaped here), inline `style` and `script`, and `body` (HTML the caller has escaped)."""
    csp = content_security_policy(bool(script))  # a constant: no quotes, nothing from the user
    classes = f' class="{html.escape(body_class, quote=True)}"' if body_class else ""
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title>",
        f"<style>\n{style}\n</style>" if style else "",
        "</head>",
        f"<body{classes}>",
        body,
        f"<script>\n{script}\n</script>" if script else "",
        "</body>",
        "</html>",
    ])


def view_document(view: str, title: str, subtitle: str, payload: dict, *, scripts: list[str], style: str) -> str:
    """A view's whole HTML document: the views' body (view.html: `title` and `subtitle`, escaped here, and
    `payload` as JSON no token can break out of) in the page shell, with the view's `scripts` (joined by
    new lines) and `style`. Every view of anatomy's floors (attention, analyses, features) is one."""
    body = Template(asset("view.html")).substitute(
        title=html.escape(title), subtitle=html.escape(subtitle), data=script_json(payload))
    return page(title, body, style=style, script="\n".join(scripts), body_class=f"view-{view}")


def render(view: str, title: str, subtitle: str, payload: dict) -> str:
    """The whole HTML document for `view` ("head", "model", "neuron" or "generation")."""
    return view_document(view, title, subtitle, payload, scripts=[asset("common.js"), asset("grid.js"), asset(f"{view}.js")],
                         style=asset("view.css"))


class View:
    """A rendered view: `.html` is the full document; shows itself in Jupyter; `.save(path)` writes it."""

    def __init__(self, view: str, document: str, height: int = 720):
        self.view = view
        self.html = document
        self.height = height

    def _repr_html_(self) -> str:
        # An iframe keeps the view's script, styles and element ids apart from the notebook's; the
        # sandbox lets its script run but gives it no access to the notebook (no same origin).
        return (
            f'<iframe sandbox="allow-scripts" srcdoc="{html.escape(self.html, quote=True)}" '
            f'style="width:100%;height:{self.height}px;border:1px solid #e3e5ea;border-radius:8px" '
            f'title="anatomy {html.escape(self.view)} view"></iframe>'
        )

    def save(self, path: str | Path) -> Path:
        return write_atomically(path, self.html)

    def __repr__(self) -> str:
        return f"<anatomy {self.view} view, {len(self.html) / 1e6:.1f} MB of HTML>"
