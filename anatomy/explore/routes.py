"""The JSON API's handlers (docs/explore.md): one small named function per route, and what they share.

Every handler finds the explorer's state on its app (`request.app.state.explorer`, server.py), reads
its settings (guard.json_settings: depth, numbers, Unicode checked), and runs the model's work in the
model's quick or slow lane (lanes.py); long analyses are jobs (job_routes.py).
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from ..viz.html import page as page_shell
from . import analyses
from . import compare as comparing
from .assets import EXPORT_POLICY
from .exports import export_file
from .guard import HEADERS, json_settings, query_settings, reply
from .lanes import SLOW
from .state import check_text, give_back_memory
from .values import ExploreError

if TYPE_CHECKING:
    from .server import Explorer


def explorer_of(request: Request) -> Explorer:
    """The state behind the app that received `request` (create_app puts it on the app)."""
    return request.app.state.explorer


async def settings_of(request: Request) -> dict:
    """The request's JSON object (guard.json_settings: depth, numbers, Unicode checked); a client
    that leaves before its body has arrived raises starlette's ClientDisconnect (answered by `left`)."""
    try:
        return json_settings(await request.body())
    except ValueError as error:
        raise ExploreError(str(error)) from None


async def with_model(request: Request, settings: dict, work: Callable, key: str = "model", lane: str = SLOW):
    """Run work(slot) in the model's quick or slow lane (lanes.py: the newest request first, the two
    lanes at once); a request whose browser went away while it waited is dropped before it costs
    anything (Gone)."""
    explorer = explorer_of(request)
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


def panel_route(panel: Callable, lane: str = SLOW) -> Callable:
    """A POST route: {"model", "text", ...settings} -> panel(slot, pass, settings), in that lane."""

    async def route(request: Request) -> Response:
        settings = await settings_of(request)
        text, target = text_settings(settings)
        passes = explorer_of(request).passes
        data = await with_model(request, settings, lambda slot: panel(slot, passes.get(slot, text, target), settings),
                                lane=lane)
        return reply(data)

    return route


async def list_models(request: Request) -> Response:
    models = explorer_of(request).models
    return reply({"models": [slot.describe() for slot in models.listed()], "allow_open": models.allow_open})


async def open_model(request: Request) -> Response:
    settings = await settings_of(request)
    slot = await run_in_threadpool(explorer_of(request).models.open, settings.get("model"))
    return reply(slot.describe())


async def heads(request: Request) -> Response:
    settings = await settings_of(request)
    return reply(await with_model(request, settings, lambda slot: analyses.heads(slot, settings)))


async def compare(request: Request) -> Response:
    settings = await settings_of(request)
    text, target = text_settings(settings)
    other = check_text(settings.get("text_b", text), "text_b")
    settings.setdefault("model_b", settings.get("model"))
    passes = explorer_of(request).passes
    a = await with_model(request, settings, lambda slot: (slot, passes.get(slot, text, target)))
    b = await with_model(request, settings, lambda slot: (slot, passes.get(slot, other, target)), key="model_b")
    return reply(await with_model(request, settings, lambda slot: comparing.compare(*a, *b, settings)))


# ---- exports: the pages `anatomy viz` and `anatomy analyze` write, a PNG, the JSON ----------------
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
    passes = explorer_of(request).passes

    def work(slot):
        p = passes.get(slot, text, target)
        return export_file(slot, p, what, fmt, settings)

    try:
        body, media, name = await with_model(request, settings, work)
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
