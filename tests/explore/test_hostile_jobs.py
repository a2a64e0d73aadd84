"""The explorer's jobs under hostile use: a cancel stops the analysis within one forward pass of at
most TOKENS_PER_PASS tokens, a cancelled job counts against the cap until its thread has ended,
start-then-cancel storms run at most MAX_JOBS threads, and finished jobs (and traced passes) kept
are bounded."""

from __future__ import annotations

import threading

import pytest
import torch
from explore_servers import TOKEN
from starlette.testclient import TestClient

import anatomy
from anatomy.analysis.lens import stack_of
from anatomy.explore import create_app
from anatomy.explore.jobs import ENDED, MAX_JOBS, MAX_KEPT, TOKENS_PER_PASS, Cancelled, Jobs, Refused, runs_per_pass

LONG = "Hello World, this is Alejandro! " * 3  # 15 of the toy's 16 positions


def wait_end(job, seconds: float = 60.0):
    """The job once it has ended (a liveness bound, not a timing check)."""
    ended = threading.Event()
    for _ in range(int(seconds / 0.01)):
        if job.state in ENDED:
            return job
        ended.wait(0.01)
    raise AssertionError(f"job {job.id} did not end: {job.status()}")


@pytest.fixture()
def fresh():
    """An app of its own (its toy's hooks are this test's), its client, its explorer."""
    app = create_app(["toy", "toy-seq2seq"], token=TOKEN, hosts=["testserver"])
    with TestClient(app, base_url="http://testserver") as client:
        client.headers["Authorization"] = f"Bearer {TOKEN}"
        yield client, app.state.explorer


@pytest.mark.parametrize("body", [
    {"kind": "patch", "text": LONG, "corrupt": LONG.replace("this", "that")},
    {"kind": "ig", "text": LONG},
    {"kind": "heads"},
])
def test_a_cancel_stops_every_kind_of_job_within_one_pass_of_at_most_tokens_per_pass(fresh, body):
    client, explorer = fresh
    model = explorer.models.slot("toy").get()
    passes, after_cancel, job_ids = [], [], []

    def watch(block, args):  # every forward pass enters the first block, whatever path it takes
        if threading.current_thread().name.startswith("anatomy-job-"):
            tokens = args[0].shape[0] * args[0].shape[1]  # hidden (B, T, E)
            passes.append(tokens)
            job = explorer.jobs.get(job_ids[0]) if job_ids else None
            if job is not None and job.cancel.is_set():
                after_cancel.append(tokens)
            elif len(passes) == 2 and job is not None:  # the cancel comes while the second pass runs
                explorer.jobs.cancel(job.id)

    handle = stack_of(model).blocks[0].register_forward_pre_hook(watch)
    try:
        started = threading.Event()
        original = explorer.jobs.start

        def start(kind, work):  # learn the id before the thread's first pass
            def noted(progress):
                started.wait(30)
                return work(progress)
            job = original(kind, noted)
            job_ids.append(job.id)
            started.set()
            return job

        explorer.jobs.start = start
        job = client.post("/api/jobs", json={"model": "toy", **body}).json()
        ended = wait_end(explorer.jobs.get(job["id"]))
    finally:
        handle.remove()
    assert ended.state == "cancelled", ended.status()
    assert after_cancel == []  # no pass began once the job was told to stop
    assert max(passes) <= TOKENS_PER_PASS  # and the pass it waited for was a short one


def test_the_analyses_results_do_not_depend_on_how_many_runs_share_a_pass():
    toy = anatomy.from_pretrained("toy")
    whole = anatomy.patch(toy, LONG, LONG.replace("this", "that"))
    split = anatomy.patch(toy, LONG, LONG.replace("this", "that"), runs_per_pass=runs_per_pass(15))
    torch.testing.assert_close(split.values, whole.values, atol=1e-5, rtol=1e-5)
    heads = anatomy.detect_heads(toy, "induction")
    torch.testing.assert_close(anatomy.detect_heads(toy, "induction", runs_per_pass=3).values, heads.values,
                               atol=1e-6, rtol=0)
    seen = []
    anatomy.detect_heads(toy, "duplicate", runs_per_pass=3, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(0, 8), (3, 8), (6, 8), (8, 8)]
    with pytest.raises(ValueError, match="runs_per_pass"):
        anatomy.detect_heads(toy, runs_per_pass=0)


def blocking_work(gate: threading.Event, ran: list):
    """A job's work that holds its thread, as a long pass does, until `gate` opens."""

    def work(progress):
        ran.append(threading.current_thread().name)
        gate.wait(60)
        progress(1, 1)
        return {"ok": True}

    return work


def test_a_cancelled_job_counts_against_the_cap_until_its_thread_has_ended():
    jobs, gate, ran = Jobs(), threading.Event(), []
    first = jobs.start("patch", blocking_work(gate, ran))
    jobs.cancel(first.id)
    assert first.state == "cancelling"  # told to stop; its pass is not over
    jobs.start("patch", blocking_work(gate, ran)).cancel.set()
    with pytest.raises(Refused, match=f"at most {MAX_JOBS}") as refused:
        jobs.start("patch", blocking_work(gate, ran))
    assert refused.value.status == 429
    gate.set()
    assert wait_end(first).state == "cancelled"
    assert jobs.start("patch", lambda progress: {}) is not None  # its thread has ended: room again


def test_start_then_cancel_storms_run_at_most_max_jobs_threads():
    jobs, gate, ran, refused = Jobs(), threading.Event(), [], 0
    for _ in range(8):
        try:
            job = jobs.start("patch", blocking_work(gate, ran))
            jobs.cancel(job.id)
        except Refused:
            refused += 1
    try:
        assert jobs.running() == MAX_JOBS and refused == 8 - MAX_JOBS
        assert len(ran) <= MAX_JOBS  # the threads that began their work
    finally:
        gate.set()


def test_a_job_cancelled_before_its_first_pass_runs_none():
    jobs, ran = Jobs(), []
    gate = threading.Event()

    def work(progress):
        ran.append(1)
        return {}

    def held(progress):
        gate.wait(60)
        progress(0, 1)
        return work(progress)

    job = jobs.start("patch", held)
    jobs.cancel(job.id)
    gate.set()
    assert wait_end(job).state == "cancelled" and ran == []


def test_finished_jobs_kept_are_bounded():
    jobs = Jobs()
    started = [wait_end(jobs.start("heads", lambda progress: {"n": 1})) for _ in range(MAX_KEPT + 10)]
    jobs.start("heads", lambda progress: {})
    assert jobs.get(started[0].id) is None and jobs.get(started[-1].id) is not None
    assert len([j for j in started if jobs.get(j.id) is not None]) <= MAX_KEPT


def test_an_error_inside_a_job_is_reported_and_cancelled_is_never_caught_as_one():
    jobs = Jobs()

    def broken(progress):
        raise KeyError("inside")

    def refusing(progress):
        raise ValueError("bad")

    assert "KeyError" in wait_end(jobs.start("patch", broken)).error
    assert wait_end(jobs.start("patch", refusing)).error == "bad"  # the user's to fix: the message alone

    def cancelled(progress):
        raise Cancelled

    assert wait_end(jobs.start("patch", cancelled)).state == "cancelled"


def test_cancel_and_status_of_any_job_id(fresh):
    client, explorer = fresh
    assert client.delete("/api/jobs/nope").status_code == 404
    assert client.get("/api/jobs/nope").status_code == 404
    assert client.get("/api/jobs/nope/events").status_code == 404
    assert client.get("/api/jobs/" + "x" * 5000).status_code == 404
    job = client.post("/api/jobs", json={"model": "toy", "kind": "heads"}).json()
    wait_end(explorer.jobs.get(job["id"]))
    for _ in range(2):  # a finished job stays finished, however often it is cancelled
        assert client.delete(f"/api/jobs/{job['id']}").json()["state"] == "done"
    for kind in (None, 1, ["patch"], {"a": 1}, "", "patch" * 100, "PATCH"):
        response = client.post("/api/jobs", json={"model": "toy", "text": "Hello", "kind": kind})
        assert response.status_code == 400 and "'kind' must be one of" in response.json()["error"]


def test_the_passes_kept_are_bounded_in_number_as_well_as_in_bytes(fresh):
    from anatomy.explore.state import MAX_PASSES

    client, explorer = fresh
    for index in range(MAX_PASSES + 40):  # a person typing: a new text at every keystroke
        assert client.post("/api/run", json={"model": "toy", "text": f"Hello World {index}"}).status_code == 200
    assert len(explorer.passes) == MAX_PASSES  # the toy's passes are tiny: bytes alone would keep them all
