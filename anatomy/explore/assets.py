"""The explorer's page and the files it loads: index.html, the walk's and the views' styles and scripts,
and the Content-Security-Policy of each.

The page's policy allows nothing but its own origin: no CDN, no request out. An exported view (or a
job's page) is one of anatomy's self-contained pages: inline script and style, no request.
"""

from __future__ import annotations

import re
from importlib import resources

from starlette.requests import Request
from starlette.responses import Response

from ..viz.html import asset, content_security_policy
from ..walk.render_html import STEP_CSS
from .guard import HEADERS
from .values import ExploreError

STATIC = resources.files("anatomy.explore") / "static"
PAGE_POLICY = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
               "connect-src 'self'; frame-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
# An exported view is one of anatomy's self-contained pages: inline script and style, no request.
EXPORT_POLICY = content_security_policy(script=True) + "; frame-ancestors 'self'"
VIZ_ASSETS = ("common.js", "grid.js", "view.css")  # what the page borrows from anatomy.viz
ANALYSIS_ASSETS = resources.files("anatomy.analysis") / "assets"  # analysis.js draws the analysis panels


async def page(request: Request) -> Response:
    html = (STATIC / "index.html").read_text(encoding="utf-8")
    return Response(html, media_type="text/html",
                    headers={**HEADERS, "Content-Security-Policy": PAGE_POLICY})


async def favicon(request: Request) -> Response:
    return Response(status_code=204)


async def walk_css(request: Request) -> Response:
    return Response(scoped(STEP_CSS, ".walk"), media_type="text/css", headers=HEADERS)


async def viz_asset(request: Request) -> Response:
    """The views' own scripts (common.js, grid.js: the one heatmap grid) and their style, kept to
    the elements inside `.viz` so that it styles nothing else of the page."""
    name = request.path_params["name"]
    if name not in VIZ_ASSETS:
        raise ExploreError("no such asset", status=404)
    if name == "view.css":
        return Response(scoped(asset("view.css"), ".viz"), media_type="text/css", headers=HEADERS)
    return Response(asset(name), media_type="text/javascript", headers=HEADERS)


async def analysis_asset(request: Request) -> Response:
    """The analysis pages' script (one function per layout, drawing a payload into an element) and
    its style, kept to the elements inside `.viz`."""
    name = request.path_params["name"]
    if name == "analysis.css":
        css = (ANALYSIS_ASSETS / name).read_text(encoding="utf-8")
        return Response(scoped(css, ".viz"), media_type="text/css", headers=HEADERS)
    if name == "analysis.js":
        return Response((ANALYSIS_ASSETS / name).read_text(encoding="utf-8"), media_type="text/javascript",
                        headers=HEADERS)
    raise ExploreError("no such asset", status=404)


def scoped(css: str, scope: str) -> str:
    """Every rule of a flat stylesheet (no @-rules) limited to the elements inside `scope`; rules for
    the whole document (:root, html, body) apply to `scope` itself. Comments are dropped."""
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    rules = []
    for selectors, _, body in (rule.partition("{") for rule in css.split("}") if rule.strip()):
        names = [s.strip() for s in selectors.split(",")]
        rules.append(", ".join(scope if s in (":root", "html", "body") else f"{scope} {s}" for s in names)
                     + " {" + body + "}")
    return "\n".join(rules) + "\n"
