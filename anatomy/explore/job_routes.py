"""The jobs' routes: start a long analysis, read its state, follow its events, cancel it, open its page.

A kind of job is async (request, settings, slot) -> work(progress) -> result. It checks its settings
and prepares its inputs on the request path (a 400 at once), and leaves the long analysis to work,
which hands it `progress` (jobs.py: a cancel stops it within one pass).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import torch
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ..analysis import integrated_gradients, patch
from ..analysis.heads import LENGTH as HEADS_LENGTH
from . import analyses, circuits, panels
from .assets import EXPORT_POLICY
from .discover import discover_work
from .guard import HEADERS, reply
from .jobs import ENDED, KEEP_SECONDS, MAX_KEPT, Then, runs_per_pass
from .routes import explorer_of, pass_inputs, settings_of, text_settings, with_model
from .state import check_text
from .values import ExploreError, finite, rounded

PATCH_POINTS = ("resid_pre", "resid_mid", "resid_post", "attn.out", "mlp.out")  # what a patch job may patch
HEARTBEAT_SECONDS = 15  # a job's event stream says it is alive this often while nothing changes


async def job_inputs(request: Request, settings: dict, slot):
    """(model, the text's pass, the model's inputs for it) of a job on a text."""
    text, target = text_settings(settings)
    passes = explorer_of(request).passes
    pass_ = await with_model(request, settings, lambda s: passes.get(s, text, target))
    return slot.get(), pass_, pass_inputs(pass_)


async def heads_job(request: Request, settings: dict, slot) -> Callable:
    def work(progress):
        return analyses.heads(slot, {}, progress, runs_per_pass=runs_per_pass(2 * HEADS_LENGTH))
    return work


async def discover_job(request: Request, settings: dict, slot) -> Callable:
    # a circuit over a dataset (discover.py): the text box plays no part
    return await run_in_threadpool(discover_work, slot, settings)


async def ig_job(request: Request, settings: dict, slot) -> Callable:
    model, pass_, inputs = await job_inputs(request, settings, slot)
    position = panels.default_position(model, pass_)
    if position is None:
        raise ExploreError("integrated gradients explain a predicted token: this model predicts none here")
    target_id = analyses.target_id(model, pass_, settings, position)

    def work(progress):
        result = integrated_gradients(model, inputs, target_id, position=position, progress=progress,
                                      steps_per_pass=runs_per_pass(len(pass_.ids) + len(pass_.source_ids or ())))
        return analyses.result_json(result, tokens=result.tokens[0], values=rounded(result.values[0], 5),
                                    target=model.tokenizer.labels([target_id])[0], steps=result.extra["steps"],
                                    page=result.view(title="Integrated gradients").html)
    return work


async def patch_job(request: Request, settings: dict, slot) -> Callable:
    point = settings.get("point", "resid_pre")
    if point not in PATCH_POINTS:
        raise ExploreError(f"'point' must be one of {', '.join(PATCH_POINTS)}")
    model, pass_, inputs = await job_inputs(request, settings, slot)
    corrupt_text = check_text(settings.get("corrupt", ""), "corrupt")
    passes = explorer_of(request).passes
    corrupt = await with_model(request, settings, lambda s: passes.get(s, corrupt_text, pass_.target))
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
        return analyses.result_json(result, rows=result.labels["layer"], cols=pass_.tokens,
                                    corrupt_tokens=corrupt.tokens, values=rounded(result.values, 5),
                                    point=point, top=model.tokenizer.labels([top])[0], **bounds,
                                    page=result.view(title="Activation patching").html)
    return work


async def circuit_job(request: Request, settings: dict, slot) -> Callable:
    # an attribution graph of the text over the attached transcoders (circuits.py)
    _, pass_, _ = await job_inputs(request, settings, slot)
    return circuits.circuit_work(slot, pass_, {**settings, "text": pass_.text})


JOB_KINDS = {"patch": patch_job, "ig": ig_job, "heads": heads_job, "circuit": circuit_job, "discover": discover_job}


async def start_job(request: Request) -> Response:
    settings = await settings_of(request)
    kind = settings.get("kind")
    if not isinstance(kind, str) or kind not in JOB_KINDS:
        raise ExploreError(f"'kind' must be one of {', '.join(JOB_KINDS)}, got {str(kind)[:100]!r}")
    explorer = explorer_of(request)
    slot = explorer.models.slot(settings.get("model"))
    explorer.jobs.check_room()  # before the inputs cost a pass
    work = await JOB_KINDS[kind](request, settings, slot)
    return reply(explorer.jobs.start(kind, work).status(), 202)


def job_of(request: Request):
    job = explorer_of(request).jobs.get(request.path_params["job"])
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
    job = explorer_of(request).jobs.cancel(request.path_params["job"])
    if job is None:
        raise ExploreError("no such job", status=404)
    return reply(job.status())


async def job_events(request: Request) -> Response:
    """Server-Sent Events: the job's state at once and at every change ("progress"), then one
    "result", "error" or "cancelled" event; a comment line every HEARTBEAT_SECONDS of quiet.
    Each stream awaits the job on the event loop (no worker thread), within the followers' bounds."""
    job = job_of(request)
    # 429 past the bounds
    release = explorer_of(request).jobs.follow(job, request.client.host if request.client else "unknown")

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
