"""The explorer's ASGI application: the page, its assets, and the JSON API the page itself uses
(documented in docs/explore.md, so that scripts and tests drive the same thing).

Safe by default, as a local server must be: the token, Host, Origin and size checks of guard.py run
before any route; texts and analyses are bounded (state.py); the page's Content-Security-Policy
allows nothing but its own origin: no CDN, no request out.
"""

from __future__ import annotations

import html
import json
import logging
import os
import re
from collections.abc import Callable
from importlib import resources

import torch
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..analysis import integrated_gradients, patch
from ..analysis.heads import LENGTH as HEADS_LENGTH
from ..checkpoints import CheckpointError
from ..viz.html import asset, content_security_policy
from ..viz.html import page as page_shell
from ..walk.render_html import STEP_CSS
from . import compare as comparing
from .discover import discover_work
from . import circuits
from . import features as sae_panels
from . import lens as lens_panel
from . import panels
from .exports import export_file
from .guard import HEADERS, Access, Guard, json_settings, query_settings, refuse, reply
from .jobs import ENDED, KEEP_SECONDS, MAX_KEPT, Jobs, Then, runs_per_pass
from .lanes import QUICK, SLOW, Gone, Lanes
from .panels import finite
from .state import CACHE_BYTES, ExploreError, Models, Passes, check_text, give_back_memory

STATIC = resources.files("anatomy.explore") / "static"
PAGE_POLICY = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
               "connect-src 'self'; frame-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
# An exported view is one of anatomy's self-contained pages: inline script and style, no request.
EXPORT_POLICY = content_security_policy(script=True) + "; frame-ancestors 'self'"
VIZ_ASSETS = ("common.js", "grid.js", "view.css")  # what the page borrows from anatomy.viz
ANALYSIS_ASSETS = resources.files("anatomy.analysis") / "assets"  # analysis.js draws the analysis panels
PATCH_POINTS = ("resid_pre", "resid_mid", "resid_post", "attn.out", "mlp.out")  # what a patch job may patch
LOG = logging.getLogger("anatomy.explore")
HEARTBEAT_SECONDS = 15  # a job's event stream says it is alive this often while nothing changes



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

async def settings_of(request: Request) -> dict:
    """The request's JSON object (guard.json_settings: depth, numbers, Unicode checked); a client
    that leaves before its body has arrived raises starlette's ClientDisconnect (answered by `left`)."""
    try:
        return json_settings(await request.body())
    except ValueError as error:
        raise ExploreError(str(error)) from None


async def with_model(request: Request, explorer: Explorer, settings: dict, work: Callable, key: str = "model",
                     lane: str = SLOW):
    """Run work(slot) in the model's quick or slow lane (lanes.py: the newest request first, the two
    lanes at once); a request whose browser went away while it waited is dropped before it costs
    anything (Gone)."""
    slot = explorer.models.slot(settings.get(key))
    try:
        return await explorer.lanes.lane(slot.name, lane).run(request, lambda: work(slot))
    finally:
        give_back_memory()


def pass_inputs(p) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """A pass's ids as the model's input: [1, T], or an encoder-decoder's ([1, S], [1, T])."""
    return torch.tensor([p.ids]) if p.source_ids is None else (torch.tensor([p.source_ids]), torch.tensor([p.ids]))


def text_settings(settings: dict) -> tuple[str, str | None]:
    text = check_text(settings.get("text", ""))
    target = settings.get("target_text")
    return text, None if target in (None, "") else check_text(target, "target_text")


def panel_route(explorer: Explorer, panel: Callable, lane: str = SLOW) -> Callable:
    """A POST route: {"model", "text", ...settings} -> panel(slot, pass, settings), in that lane."""

    async def route(request: Request) -> Response:
        settings = await settings_of(request)
        text, target = text_settings(settings)
        data = await with_model(request, explorer, settings,
                                lambda slot: panel(slot, explorer.passes.get(slot, text, target), settings), lane=lane)
        return reply(data)

    return route


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

    async def list_models(request: Request) -> Response:
        return reply({"models": [slot.describe() for slot in explorer.models.listed()],
                      "allow_open": explorer.models.allow_open})

    async def open_model(request: Request) -> Response:
        settings = await settings_of(request)
        slot = await run_in_threadpool(explorer.models.open, settings.get("model"))
        return reply(slot.describe())

    async def heads(request: Request) -> Response:
        settings = await settings_of(request)
        return reply(await with_model(request, explorer, settings, lambda slot: panels.heads(slot, settings)))

    async def compare(request: Request) -> Response:
        settings = await settings_of(request)
        text, target = text_settings(settings)
        other = check_text(settings.get("text_b", text), "text_b")
        settings.setdefault("model_b", settings.get("model"))
        a = await with_model(request, explorer, settings, lambda slot: (slot, explorer.passes.get(slot, text, target)))
        b = await with_model(request, explorer, settings, lambda slot: (slot, explorer.passes.get(slot, other, target)),
                             key="model_b")
        return reply(await with_model(request, explorer, settings, lambda slot: comparing.compare(*a, *b, settings)))

    # ---- jobs -------------------------------------------------------------------------------------
    # A kind of job: async (request, settings, slot) -> work(progress) -> result. It checks its
    # settings and prepares its inputs on the request path (a 400 at once), and leaves the long
    # analysis to work, which hands it `progress` (jobs.py: a cancel stops it within one pass).

    async def heads_job(request: Request, settings: dict, slot) -> Callable:
        def work(progress):
            return panels.heads(slot, {}, progress, runs_per_pass=runs_per_pass(2 * HEADS_LENGTH))
        return work

    async def discover_job(request: Request, settings: dict, slot) -> Callable:
        # a circuit over a dataset (discover.py): the text box plays no part
        return await run_in_threadpool(discover_work, slot, settings)

    async def ig_job(request: Request, settings: dict, slot) -> Callable:
        model, pass_, inputs = await job_inputs(request, settings, slot)
        position = panels.default_position(model, pass_)
        if position is None:
            raise ExploreError("integrated gradients explain a predicted token: this model predicts none here")
        target_id = panels.target_id(model, pass_, settings, position)

        def work(progress):
            result = integrated_gradients(model, inputs, target_id, position=position, progress=progress,
                                          steps_per_pass=runs_per_pass(len(pass_.ids) + len(pass_.source_ids or ())))
            return panels.result_json(result, tokens=result.tokens[0], values=panels.rounded(result.values[0], 5),
                                       target=model.tokenizer.labels([target_id])[0], steps=result.extra["steps"],
                                       page=result.view(title="Integrated gradients").html)
        return work

    async def patch_job(request: Request, settings: dict, slot) -> Callable:
        point = settings.get("point", "resid_pre")
        if point not in PATCH_POINTS:
            raise ExploreError(f"'point' must be one of {', '.join(PATCH_POINTS)}")
        model, pass_, inputs = await job_inputs(request, settings, slot)
        corrupt_text = check_text(settings.get("corrupt", ""), "corrupt")
        corrupt = await with_model(request, explorer, settings,
                                   lambda s: explorer.passes.get(s, corrupt_text, pass_.target))
        if len(corrupt.ids) != len(pass_.ids) or (corrupt.source_ids and len(corrupt.source_ids) != len(pass_.source_ids)):
            raise ExploreError(f"the corrupted text must have as many tokens as the clean one ({len(pass_.ids)}); "
                               f"it has {len(corrupt.ids)}: {' '.join(corrupt.tokens)[:200]}")
        corrupt_inputs = pass_inputs(corrupt)
        # patch's default metric: the log-prob of the clean run's top token at the last position;
        # its value on the clean and on the corrupted run bound what patching can recover.
        clean_log_probs = torch.log_softmax(pass_.logits_at(len(pass_.ids) - 1), dim=-1)
        top = int(clean_log_probs.argmax())
        bounds = {"clean": float(clean_log_probs[top]),
                  "corrupt": float(torch.log_softmax(corrupt.logits_at(len(corrupt.ids) - 1), dim=-1)[top])}

        def work(progress):
            result = patch(model, inputs, corrupt_inputs, point=point, progress=progress,
                           runs_per_pass=runs_per_pass(len(pass_.ids) + len(pass_.source_ids or ())))
            return panels.result_json(result, rows=result.labels["layer"], cols=pass_.tokens,
                                       corrupt_tokens=corrupt.tokens, values=panels.rounded(result.values, 5),
                                       point=point, top=model.tokenizer.labels([top])[0], **bounds,
                                       page=result.view(title="Activation patching").html)
        return work

    async def circuit_job(request: Request, settings: dict, slot) -> Callable:
        # an attribution graph of the text over the attached transcoders (circuits.py)
        _, pass_, _ = await job_inputs(request, settings, slot)
        return circuits.circuit_work(slot, pass_, {**settings, "text": pass_.text})

    job_kinds = {"patch": patch_job, "ig": ig_job, "heads": heads_job, "circuit": circuit_job,
                 "discover": discover_job}

    async def job_inputs(request: Request, settings: dict, slot):
        """(model, the text's pass, the model's inputs for it) of a job on a text."""
        text, target = text_settings(settings)
        pass_ = await with_model(request, explorer, settings, lambda s: explorer.passes.get(s, text, target))
        return slot.get(), pass_, pass_inputs(pass_)

    async def start_job(request: Request) -> Response:
        settings = await settings_of(request)
        kind = settings.get("kind")
        if not isinstance(kind, str) or kind not in job_kinds:
            raise ExploreError(f"'kind' must be one of {', '.join(job_kinds)}, got {str(kind)[:100]!r}")
        slot = explorer.models.slot(settings.get("model"))
        explorer.jobs.check_room()  # before the inputs cost a pass
        work = await job_kinds[kind](request, settings, slot)
        return reply(explorer.jobs.start(kind, work).status(), 202)

    def job_of(request: Request):
        job = explorer.jobs.get(request.path_params["job"])
        if job is None:
            raise ExploreError(f"no such job (finished jobs are kept for {KEEP_SECONDS // 60} minutes, at most "
                               f"{MAX_KEPT} of them)", status=404)
        return job

    async def job_status(request: Request) -> Response:
        job = job_of(request)
        return reply({**job.status(), "result": job.result})

    async def job_page(request: Request) -> Response:
        job = job_of(request)
        if job.page is None:
            raise ExploreError("this job has no page (yet)", status=404)
        return Response(job.page, media_type="text/html",
                        headers={**HEADERS, "Content-Security-Policy": EXPORT_POLICY})

    async def cancel_job(request: Request) -> Response:
        job = explorer.jobs.cancel(request.path_params["job"])
        if job is None:
            raise ExploreError("no such job", status=404)
        return reply(job.status())

    async def job_events(request: Request) -> Response:
        """Server-Sent Events: the job's state at once and at every change ("progress"), then one
        "result", "error" or "cancelled" event; a comment line every HEARTBEAT_SECONDS of quiet.
        Each stream awaits the job on the event loop (no worker thread), within the followers' bounds."""
        job = job_of(request)
        release = explorer.jobs.follow(job, request.client.host if request.client else "unknown")  # 429 past the bounds

        async def events():
            version = -1
            while True:
                seen, version = version, await job.next_change(version, HEARTBEAT_SECONDS)
                if job.state in ENDED:
                    name = "result" if job.state == "done" else job.state
                    yield f"event: {name}\ndata: {json.dumps(finite({**job.status(), 'result': job.result}))}\n\n"
                    return
                yield f"event: progress\ndata: {json.dumps(job.status())}\n\n" if version != seen else ": still running\n\n"

        return Then(StreamingResponse(events(), media_type="text/event-stream", headers=HEADERS), release)

    # ---- exports: the pages `anatomy viz` and `anatomy analyze` write, a PNG, the JSON ------------
    async def export(request: Request) -> Response:
        try:
            query = query_settings(request.scope.get("query_string", b""), strings=("text", "target_text", "token"))
        except ValueError as error:
            raise ExploreError(str(error)) from None
        settings = {k: v for k, v in query.items() if k != "token"}
        settings.setdefault("text", "")
        what, fmt = settings.get("panel"), settings.get("format", "html")
        if fmt not in ("html", "png", "json"):
            raise ExploreError("'format' must be html, png or json")
        text, target = text_settings(settings)

        def work(slot):
            p = explorer.passes.get(slot, text, target)
            return export_file(slot, p, what, fmt, settings)

        try:
            body, media, name = await with_model(request, explorer, settings, work)
        except (ExploreError, ValueError) as error:
            if not query.get("inline"):
                raise
            # A panel's frame shows why, in words, as a page of its own (not a JSON error).
            message = html.escape(str(error)[:500])
            document = page_shell("anatomy", f'<p class="refused">{message}</p>',
                                  style=".refused { color: #8a4b00; font: 14px system-ui, sans-serif; margin: 16px; }")
            return Response(document, status_code=getattr(error, "status", 400), media_type="text/html",
                            headers={**HEADERS, "Content-Security-Policy": EXPORT_POLICY})
        name = re.sub(r"[^A-Za-z0-9._-]", "_", name)[:100]  # a header: no text of the request's in it
        headers = {**HEADERS, "Content-Disposition": f'attachment; filename="{name}"'}
        if media == "text/html":
            headers["Content-Security-Policy"] = EXPORT_POLICY
            if query.get("inline"):
                headers["Content-Disposition"] = "inline"
        return Response(body, media_type=media, headers=headers)

    routes = [
        Route("/", page),
        Route("/api/models", list_models),
        Route("/api/open", open_model, methods=["POST"]),
        Route("/api/run", panel_route(explorer, panels.run, QUICK), methods=["POST"]),
        Route("/api/walk", panel_route(explorer, panels.walk), methods=["POST"]),
        Route("/api/attention", panel_route(explorer, panels.attention, QUICK), methods=["POST"]),
        Route("/api/lens", panel_route(explorer, lens_panel.lens, QUICK), methods=["POST"]),
        Route("/api/attribution", panel_route(explorer, panels.attribution), methods=["POST"]),
        Route("/api/intervene", panel_route(explorer, panels.intervene), methods=["POST"]),
        Route("/api/features", panel_route(explorer, sae_panels.features), methods=["POST"]),
        Route("/api/feature", panel_route(explorer, sae_panels.feature), methods=["POST"]),
        Route("/api/steer", panel_route(explorer, sae_panels.steer), methods=["POST"]),
        Route("/api/heads", heads, methods=["POST"]),
        Route("/api/compare", compare, methods=["POST"]),
        Route("/api/jobs", start_job, methods=["POST"]),
        Route("/api/jobs/{job}", job_status),
        Route("/api/jobs/{job}", cancel_job, methods=["DELETE"]),
        Route("/api/jobs/{job}/events", job_events),
        Route("/api/jobs/{job}/page", job_page),
        Route("/api/export", export),
        Route("/static/walk.css", walk_css),
        Route("/static/viz/{name}", viz_asset),
        Route("/static/analysis/{name}", analysis_asset),
        Route("/favicon.ico", favicon),
        Mount("/static", StaticFiles(directory=str(STATIC)), name="static"),
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

    app = Starlette(routes=routes, exception_handlers={ExploreError: explore_error, CheckpointError: explore_error,
                                                       ValueError: explore_error, Gone: gone, ClientDisconnect: left})
    app.state.explorer = explorer
    app.add_middleware(Guard, explorer=explorer)
    return app


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
