"""A job's followers under hostile clients, on the explorer served by uvicorn (the deadlines shortened):
followers hold no worker thread and are bounded, per job and per client, and a stream ends with its job
and never keeps the server from stopping."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import anyio
import pytest
from explore_servers import Served
from hostile_sockets import LIVENESS, SHORT, answers_200_again, connect, request_head

from anatomy.explore.jobs import MAX_FOLLOWERS_PER_CLIENT, MAX_FOLLOWERS_PER_JOB, Job, Jobs, Refused


def on_loop(served, coroutine_function):
    """Run an async function on the server's own event loop; its result."""
    loop = served.server.servers[0].get_loop()
    return asyncio.run_coroutine_threadsafe(coroutine_function(), loop).result(LIVENESS)


def follow(served, job_id: str) -> socket.socket:
    """An open event stream on a job, its first event read."""
    sock = connect(served)
    sock.sendall(request_head(served, "GET", f"/api/jobs/{job_id}/events"))
    head = sock.recv(65536)
    assert head.startswith(b"HTTP/1.1 200"), head[:200]
    return sock


def status_of(served, path: str, method: str = "GET", body: dict | None = None) -> int:
    data = b"" if body is None else json.dumps(body).encode()
    with connect(served) as sock:
        sock.sendall(request_head(served, method, path, len(data) if body is not None else None) + data)
        return int(sock.recv(65536).split(b" ", 2)[1])


@pytest.fixture()
def blocked_job(server):
    """A job that runs until the test ends (its thread waits on a gate), started on the server."""
    gate = threading.Event()

    def work(progress):
        while not gate.wait(0.05):
            progress(0, 1)
        return {}

    job = server.app.state.explorer.jobs.start("patch", work)
    yield job
    gate.set()


def test_followers_hold_no_worker_thread_and_panels_answer_while_they_stream(server, blocked_job):
    limiter = on_loop(server, _limiter)
    before = limiter.total_tokens
    limiter.total_tokens = 2  # fewer worker threads than followers
    streams = [follow(server, blocked_job.id) for _ in range(MAX_FOLLOWERS_PER_JOB)]
    try:
        assert limiter.borrowed_tokens == 0
        assert status_of(server, "/api/run", "POST", {"model": "toy", "text": "Hello"}) == 200
    finally:
        limiter.total_tokens = before
        for sock in streams:
            sock.close()


async def _limiter():
    return anyio.to_thread.current_default_thread_limiter()


def test_followers_past_the_bound_get_429_and_a_follower_that_leaves_frees_its_place(server, blocked_job):
    streams = [follow(server, blocked_job.id) for _ in range(MAX_FOLLOWERS_PER_JOB)]
    try:
        assert status_of(server, f"/api/jobs/{blocked_job.id}/events") == 429
        streams.pop().close()
        assert answers_200_again(server, f"/api/jobs/{blocked_job.id}/events")  # its place is free
    finally:
        for sock in streams:
            sock.close()


def test_the_follower_bounds_count_per_job_and_per_client():
    jobs = Jobs()
    released = []
    for index in range(MAX_FOLLOWERS_PER_CLIENT):
        released.append(jobs.follow(Job(f"job-{index // MAX_FOLLOWERS_PER_JOB}", "patch"), "10.0.0.1"))
    with pytest.raises(Refused, match="from this address") as refused:
        jobs.follow(Job("another", "patch"), "10.0.0.1")
    assert refused.value.status == 429
    with pytest.raises(Refused, match="follow this job"):
        jobs.follow(Job("job-0", "patch"), "10.0.0.2")
    jobs.follow(Job("another", "patch"), "10.0.0.2")  # another address, another job: room
    released.pop(0)()
    jobs.follow(Job("job-0", "patch"), "10.0.0.1")


def test_a_stream_ends_with_the_jobs_end_and_the_server_stops_with_streams_open():
    served = Served(["toy"], limits=SHORT)
    done, held = threading.Event(), threading.Event()

    def work(gate, result):
        def run(progress):
            gate.wait(LIVENESS)
            progress(1, 1)
            return result
        return run

    jobs = served.app.state.explorer.jobs
    ending, running = jobs.start("patch", work(done, {"answer": 42})), jobs.start("patch", work(held, {}))
    streams = [follow(served, ending.id), follow(served, running.id)]
    try:
        done.set()
        text = b""
        while b"event: result" not in text:
            chunk = streams[0].recv(65536)
            assert chunk, text
            text += chunk
        assert b'"result": {"answer": 42}' in text
        served.stop()  # Ctrl-C with a stream open on a running job: the server still stops
        assert not served.thread.is_alive()
    finally:
        held.set()
        for sock in streams:
            sock.close()


def test_stopping_cancels_the_running_jobs_and_waits_for_their_threads():
    jobs, began = Jobs(), threading.Event()

    def endless(progress):
        began.set()
        while True:  # an analysis that reports after every pass, for ever
            progress(0, 1)
            time.sleep(0.01)

    running = [jobs.start("patch", endless), jobs.start("ig", endless)]
    began.wait(LIVENESS)
    jobs.close(LIVENESS)
    assert [job.state for job in running] == ["cancelled", "cancelled"] and jobs.running() == 0
