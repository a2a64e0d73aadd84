"""The explorer's ASGI application: the page, its assets, and the JSON API the page itself uses
(documented in docs/explore.md, so that scripts and tests drive the same thing).

Safe by default, as a local server must be: the token, Host, Origin and size checks of guard.py run
before any route; texts and analyses are bounded (state.py); the page's Content-Security-Policy
allows nothing but its own origin: no CDN, no request out (assets.py).

The routes are a table of small named handlers: the page and its files (assets.py), the panels and
exports (routes.py), the jobs (job_routes.py). Each finds the explorer's state on its app.
"""

from __future__ import annotations

import logging
import os

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..checkpoints import CheckpointError
from . import assets, features, job_routes, lens, panels, routes
from .analyses import attribution, intervene
from .assets import EXPORT_POLICY, PAGE_POLICY, STATIC
from .guard import Access, Guard, refuse
from .jobs import Jobs
from .lanes import QUICK, Gone, Lanes
from .models import Models
from .state import CACHE_BYTES, Passes
from .values import ExploreError

LOG = logging.getLogger("anatomy.explore")


class Explorer(Access):
    """The state behind the app: models, traced passes, jobs, and (Access) the token and the names it
    answers to."""

    def __init__(self, models: list[str], *, token: str | None = None, hosts: list[str] | None = None,
                 allow_open: bool = False, cache_bytes: int = CACHE_BYTES, saes: list[str] = (),
                 transcoders: list[str] = ()):
        if not models:
            raise ValueError("the explorer needs at least one model")
        super().__init__(token, hosts)
        self.models = Models(models, allow_open=allow_open, saes=saes, transcoders=transcoders)
        self.passes = Passes(cache_bytes)
        self.jobs = Jobs()
        self.lanes = Lanes()


POST = ["POST"]
# path, handler, methods (GET when none): the API of docs/explore.md
ROUTES = [
    ("/", assets.page, None),
    ("/api/models", routes.list_models, None),
    ("/api/open", routes.open_model, POST),
    ("/api/run", routes.panel_route(panels.run, QUICK), POST),
    ("/api/walk", routes.panel_route(panels.walk), POST),
    ("/api/attention", routes.panel_route(panels.attention, QUICK), POST),
    ("/api/lens", routes.panel_route(lens.lens, QUICK), POST),
    ("/api/attribution", routes.panel_route(attribution), POST),
    ("/api/intervene", routes.panel_route(intervene), POST),
    ("/api/features", routes.panel_route(features.features), POST),
    ("/api/feature", routes.panel_route(features.feature), POST),
    ("/api/steer", routes.panel_route(features.steer), POST),
    ("/api/heads", routes.heads, POST),
    ("/api/compare", routes.compare, POST),
    ("/api/jobs", job_routes.start_job, POST),
    ("/api/jobs/{job}", job_routes.job_status, None),
    ("/api/jobs/{job}", job_routes.cancel_job, ["DELETE"]),
    ("/api/jobs/{job}/events", job_routes.job_events, None),
    ("/api/jobs/{job}/page", job_routes.job_page, None),
    ("/api/export", routes.export, None),
    ("/static/walk.css", assets.walk_css, None),
    ("/static/viz/{name}", assets.viz_asset, None),
    ("/static/analysis/{name}", assets.analysis_asset, None),
    ("/favicon.ico", assets.favicon, None),
]


async def explore_error(request: Request, error: Exception) -> Response:
    status = getattr(error, "status", 400)
    return refuse(str(error), status)


async def gone(request: Request, error: Exception) -> Response:
    return Response(status_code=499)  # nobody reads it: the browser cancelled the request


async def left(request: Request, error: Exception) -> Response:
    # A client that leaves mid-body is no error of the server's: one line, for whoever asks for it.
    LOG.info("a client left before its request's body arrived: %s %r", request.method, request.url.path[:200])
    return Response(status_code=499)


EXCEPTION_HANDLERS = {ExploreError: explore_error, CheckpointError: explore_error, ValueError: explore_error,
                      Gone: gone, ClientDisconnect: left}


def create_app(models: list[str], *, token: str | None = None, hosts: list[str] | None = None,
               allow_open: bool = False, cache_bytes: int = CACHE_BYTES, saes: list[str] = (),
               transcoders: list[str] = ()) -> Starlette:
    """The explorer for `models` (names `anatomy models` lists, folders, .gguf files, Hub ids).

    token: the access token (default: a random one, `app.state.explorer.token`); hosts: names
    besides 127.0.0.1, localhost and [::1] the Host header may carry; allow_open: whether the page
    may open a model it names; cache_bytes: the traced passes' memory budget; saes: sparse
    autoencoders for the features panel, each "MODEL=PATH" (or PATH, on the first model); transcoders: transcoder
    sets for the circuit panel, each "MODEL=RUN" (or RUN)."""
    explorer = Explorer(models, token=token, hosts=hosts, allow_open=allow_open, cache_bytes=cache_bytes, saes=saes,
                        transcoders=transcoders)
    table = [Route(path, handler, methods=methods) for path, handler, methods in ROUTES]
    table.append(Mount("/static", StaticFiles(directory=str(STATIC)), name="static"))
    app = Starlette(routes=table, exception_handlers=EXCEPTION_HANDLERS)
    app.state.explorer = explorer
    app.add_middleware(Guard, explorer=explorer)
    return app


def app_from_environment() -> Starlette:
    """`uvicorn anatomy.explore:app`: the models in ANATOMY_EXPLORE_MODELS (comma-separated), the
    token in ANATOMY_EXPLORE_TOKEN (required: every worker must share it), the extra host names in
    ANATOMY_EXPLORE_HOSTS."""
    token = os.environ.get("ANATOMY_EXPLORE_TOKEN")
    if not token:
        raise RuntimeError("set ANATOMY_EXPLORE_TOKEN to the access token every worker shares")
    models = [m for m in os.environ.get("ANATOMY_EXPLORE_MODELS", "toy").split(",") if m]
    hosts = [h for h in os.environ.get("ANATOMY_EXPLORE_HOSTS", "").split(",") if h]
    return create_app(models, token=token, hosts=hosts, allow_open=os.environ.get("ANATOMY_EXPLORE_ALLOW_OPEN") == "1")


__all__ = ["EXPORT_POLICY", "Explorer", "PAGE_POLICY", "app_from_environment", "create_app"]
