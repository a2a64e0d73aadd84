"""Every analysis result as an offline HTML page and as a PNG.

`panels(result)` is the view's data: a JSON payload with one panel per sequence, in one of four
layouts (layouts.py), and the identity line (identity.py). One JavaScript function per layout draws
a payload into an element (assets/analysis.js).

The page is viz's one page shell (viz.html.page: a Content-Security-Policy that allows no request,
every label placed as text) with the views' common.js and grid.js and this floor's analysis.js; a
page that fetched a payload (the live explorer) draws it with the same functions. The PNG draws the
same payload with matplotlib.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from ..checkpoints.token_text import legend_for
from ..viz.html import View, asset, view_document
from .identity import identity, identity_line
from .layouts import lens_candidates, lens_panel, layout_of

if TYPE_CHECKING:  # a Result knows its views (Result.view); the views only read a Result's fields
    from .result import Result

ASSETS = resources.files("anatomy.analysis") / "assets"


def panels(result: Result) -> dict:
    """The view's data as a JSON payload: {"kind", "layout" ("heatmap", "lens", "dla" or
    "tokens"), "check": {"text", "status" ("holds", "fails" or "none"), "rule"}, "tokenLegend"
    (the convention for spaces and new lines, when a token shown has one; else None), "panels":
    one per sequence (head scores: one)}. Raises ValueError for a result of no known kind."""
    layout, parts, shown = layout_of(result)
    return {"kind": result.kind, "layout": layout, "check": identity(result), "panels": parts,
            "tokenLegend": legend_for(shown), "about": result.about}


def html_view(result: Result, *, title: str | None = None) -> View:
    """The result as one self-contained, offline HTML page (a viz View)."""
    title = title or result.kind[:1].upper() + result.kind[1:]
    subtitle = " · ".join(part for part in (result.about, result.shape_text) if part)
    return payload_view(panels(result), title, subtitle)


def payload_view(analysis: dict, title: str, subtitle: str = "") -> View:
    """A payload (panels(result)'s form) as one self-contained, offline HTML page (a viz View)."""
    payload = {"view": "analysis", "initial": {}, "analysis": analysis}
    document = view_document("analysis", title, subtitle, payload,
                             scripts=[asset("common.js"), asset("grid.js"), (ASSETS / "analysis.js").read_text(encoding="utf-8")],
                             style=asset("view.css") + (ASSETS / "analysis.css").read_text(encoding="utf-8"))
    return View("analysis", document, height=640)


# ---- the PNG ---------------------------------------------------------------------------------------


def figure(result: Result, panel: int = 0):
    """The result as a matplotlib Figure, from the same payload as the page: a heatmap of at most
    MAX_FIGURE_ROWS labelled rows (the largest by magnitude, and the title says which), ranked bars
    for direct logit attribution, one shaded row of tokens for attributions; titles wrapped, colour
    bars labelled, values beyond a robust scale marked by the colour bar's arrows."""
    from . import figures

    payload = panels(result)
    if not 0 <= panel < len(payload["panels"]):
        raise IndexError(f"panel {panel} is out of range: this result has panels 0..{len(payload['panels']) - 1}")
    return figures.draw(payload, payload["panels"][panel], result.kind)


def save(result: Result, path: str | Path, **options) -> Path:
    """Write `result` as .html (interactive) or .png / .svg (a figure); ValueError for other suffixes."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in (".html", ".htm"):
        return html_view(result, **options).save(path)
    if suffix in (".png", ".svg"):
        from ..viz.plots import save_figure

        return save_figure(figure(result, **options), path)
    raise ValueError(f"cannot write {path.name!r}: the suffix must be .html, .png or .svg")


__all__ = ["figure", "html_view", "identity_line", "lens_candidates", "lens_panel", "panels", "payload_view", "save"]
