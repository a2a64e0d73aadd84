"""Long analyses off the request path: activation patching, integrated gradients, head scores.

A job runs `work(progress) -> result` in a thread of its own. The analysis calls
`progress(done, total)` after every forward pass (and before its first), as anatomy's analyses do
with their `progress` argument; once the job is cancelled that call raises Cancelled, so the
analysis stops within one pass and nothing is half-written. A job's passes are kept small
(runs_per_pass: at most TOKENS_PER_PASS tokens each), so that one pass is short.

A new kind of job needs nothing more: hand its analysis `progress`, let Cancelled pass through
(never catch Exception around it), and size its batches with runs_per_pass.

Bounds, each refused with 429 past it:
- MAX_JOBS jobs at once; a job counts until its thread has finished, cancelled or not;
- MAX_KEPT finished jobs kept (each for at most KEEP_SECONDS) for the page to read;
- MAX_FOLLOWERS_PER_JOB and MAX_FOLLOWERS_PER_CLIENT event streams (GET /api/jobs/ID/events).
A follower holds no thread: it awaits the job's next change (Job.next_change) on the event loop.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from .state import give_back_memory
from .values import ExploreError

MAX_JOBS = 2  # jobs running at once
MAX_KEPT = 32  # finished jobs kept for the page to read
KEEP_SECONDS = 600  # how long a finished job is kept
MAX_FOLLOWERS_PER_JOB = 4  # event streams on one job
MAX_FOLLOWERS_PER_CLIENT = 16  # event streams from one address
TOKENS_PER_PASS = 128  # tokens a job's forward pass may hold: a cancel waits for at most one such pass
ENDED = ("done", "error", "cancelled")

Progress = Callable[[int, int], None]


class Cancelled(Exception):
    """Raised inside a job's progress callback once the job was cancelled."""


class Refused(ExploreError):
    """A job or a follower past its bound: the server answers 429 with the message."""

    def __init__(self, message: str):
        super().__init__(message, status=429)


def runs_per_pass(tokens_per_run: int) -> int:
    """How many runs (patched copies, integration steps) of `tokens_per_run` tokens a job's analysis
    puts in one forward pass: as many as TOKENS_PER_PASS allow, at least one."""
    return max(1, TOKENS_PER_PASS // max(1, tokens_per_run))


@dataclass
class Job:
    """One analysis off the request path: its state and progress, its result once done, and the
    event streams waiting for its next change."""

    id: str
    kind: str
    state: str = "running"  # running, cancelling (told to stop, its pass not over), done, error, cancelled
    done: int = 0
    total: int = 0
    result: dict | None = None
    page: str | None = None  # the result's own HTML page (anatomy analyze's), served at /api/jobs/ID/page
    error: str | None = None
    began: float = field(default_factory=time.monotonic)
    ended: float | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    version: int = 0  # bumped at every change, so that a follower wakes for each
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _waiters: set = field(default_factory=set, repr=False)  # (event loop, asyncio.Event) of each follower

    def progress(self, done: int, total: int) -> None:
        """The analysis's progress callback: stop (raise Cancelled) if cancelled, else record and wake
        the followers."""
        if self.cancel.is_set():
            raise Cancelled
        with self._lock:
            self.done, self.total = done, total
            self._changed()

    def stop(self) -> None:
        """Ask the job to stop: its next progress call raises Cancelled."""
        with self._lock:
            if self.state in ENDED:
                return
            self.cancel.set()
            self.state = "cancelling"
            self._changed()

    def finish(self, state: str, result: dict | None = None, error: str | None = None) -> None:
        """The job's end; a result's "page" (HTML) is kept apart from the JSON the events carry."""
        page = None if result is None else result.pop("page", None)
        with self._lock:
            self.state, self.result, self.page, self.error, self.ended = state, result, page, error, time.monotonic()
            self._changed()

    def status(self) -> dict:
        out = {"id": self.id, "kind": self.kind, "state": self.state, "done": self.done, "total": self.total,
               "seconds": round((self.ended or time.monotonic()) - self.began, 2)}
        if self.error is not None:
            out["error"] = self.error
        return out

    async def next_change(self, version: int, timeout: float) -> int:
        """Wait, on the event loop and without a thread, until the job changes past `version` or
        `timeout` seconds pass; the version now."""
        loop, woken = asyncio.get_running_loop(), asyncio.Event()
        waiter = (loop, woken)
        with self._lock:
            if self.version != version:
                return self.version
            self._waiters.add(waiter)
        try:
            await asyncio.wait_for(woken.wait(), timeout)
        except TimeoutError:
            pass
        finally:
            with self._lock:
                self._waiters.discard(waiter)
        return self.version

    def _changed(self) -> None:
        """Bump the version and wake every follower, each on its own loop (call with _lock held)."""
        self.version += 1
        for loop, woken in self._waiters:
            try:
                loop.call_soon_threadsafe(woken.set)
            except RuntimeError:  # that loop has closed: the server is stopping
                pass


class Jobs:
    """The running and recently finished jobs, and who follows them."""

    def __init__(self, max_jobs: int = MAX_JOBS):
        self.max_jobs = max_jobs
        self._jobs: dict[str, Job] = {}
        self._running: set[str] = set()  # jobs whose thread has not finished
        self._threads: dict[str, threading.Thread] = {}  # their threads
        self._followers: Counter = Counter()  # job id -> event streams open on it
        self._clients: Counter = Counter()  # address -> event streams open from it
        self._lock = threading.Lock()
        self._ids = itertools.count()

    def check_room(self) -> None:
        """Refused when MAX_JOBS jobs run (asked before a job's inputs are prepared)."""
        with self._lock:
            self._check_room()

    def start(self, kind: str, work: Callable[[Progress], dict]) -> Job:
        """Run work(progress) -> result (a dict; its "page", if any, the result's HTML page) in a
        thread; Refused when MAX_JOBS jobs run. work's ValueError is the user's to fix (its message
        shown); any other exception is reported by its type and message, never raised."""
        with self._lock:
            self._check_room()
            self._forget_old()
            job = Job(f"{next(self._ids)}-{secrets.token_hex(4)}", kind)
            self._jobs[job.id] = job
            self._running.add(job.id)

        def run() -> None:
            outcome: tuple = ("error", None, "the job ended without a result")
            try:
                job.progress(0, 0)  # cancelled before it began: no pass at all
                outcome = ("done", work(job.progress), None)
            except Cancelled:
                outcome = ("cancelled", None, None)
            except ValueError as error:  # the analysis refused its inputs: the user's to fix
                outcome = ("error", None, str(error)[:500])
            except Exception as error:  # noqa: BLE001 - reported to the page, never raised into the server
                outcome = ("error", None, f"{type(error).__name__}: {str(error)[:500]}")
            finally:
                give_back_memory()  # the analysis's passes freed in this thread's heap
                # The slot is free before anyone can see the end: a page that reads "done" may start the next.
                with self._lock:
                    self._running.discard(job.id)
                    self._threads.pop(job.id, None)
                job.finish(*outcome)

        thread = threading.Thread(target=run, name=f"anatomy-job-{job.id}", daemon=True)
        with self._lock:
            self._threads[job.id] = thread
        try:
            thread.start()
        except RuntimeError as error:  # no thread to be had
            with self._lock:
                self._running.discard(job.id)
                self._threads.pop(job.id, None)
            job.finish("error", error=f"could not start: {error}")
        return job

    def close(self, seconds: float = 30.0) -> None:
        """Cancel every running job and wait (at most `seconds` in all) for their threads to end: a
        process that exits while a thread is inside torch aborts ("terminate called ...")."""
        with self._lock:
            threads = list(self._threads.items())
        for job_id, _ in threads:
            self.cancel(job_id)
        deadline = time.monotonic() + seconds
        for _, thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            return self._jobs.get(job_id)

    def cancel(self, job_id: str) -> Job | None:
        job = self.get(job_id)
        if job is not None:
            job.stop()
        return job

    def running(self) -> int:
        """Jobs whose thread has not finished."""
        with self._lock:
            return len(self._running)

    def follow(self, job: Job, client: str) -> Callable[[], None]:
        """Count one event stream on `job` from address `client`; the function that uncounts it
        (call it once, when the stream ends). Refused past MAX_FOLLOWERS_PER_JOB or
        MAX_FOLLOWERS_PER_CLIENT."""
        with self._lock:
            if self._followers[job.id] >= MAX_FOLLOWERS_PER_JOB:
                raise Refused(f"{self._followers[job.id]} streams already follow this job (at most "
                              f"{MAX_FOLLOWERS_PER_JOB}); close one, or read GET /api/jobs/{job.id}")
            if self._clients[client] >= MAX_FOLLOWERS_PER_CLIENT:
                raise Refused(f"{self._clients[client]} job streams are open from this address (at most "
                              f"{MAX_FOLLOWERS_PER_CLIENT}); close one")
            self._followers[job.id] += 1
            self._clients[client] += 1

        def release() -> None:
            with self._lock:
                for counts, key in ((self._followers, job.id), (self._clients, client)):
                    counts[key] -= 1
                    if counts[key] <= 0:
                        del counts[key]

        return release

    def _check_room(self) -> None:
        if len(self._running) >= self.max_jobs:
            raise Refused(f"{len(self._running)} analyses are running (a cancelled one until its pass is over); "
                          f"wait for one or cancel it (at most {self.max_jobs} at once)")

    def _forget_old(self) -> None:
        """Forget finished jobs older than KEEP_SECONDS, and the oldest past MAX_KEPT (call with _lock held)."""
        now = time.monotonic()
        finished = sorted((j for j in self._jobs.values() if j.ended is not None and j.id not in self._running),
                          key=lambda j: j.ended)
        excess = len(finished) - MAX_KEPT
        for index, job in enumerate(finished):
            if index < excess or now - job.ended > KEEP_SECONDS:
                del self._jobs[job.id]


class Then:
    """An ASGI response that calls then() once `response` is over: sent, failed, or cancelled when
    the client left (a stream's generator may never start, so its own `finally` cannot count on it)."""

    def __init__(self, response, then: Callable[[], None]):
        self.response, self.then = response, then

    async def __call__(self, scope, receive, send) -> None:
        try:
            await self.response(scope, receive, send)
        finally:
            self.then()


__all__ = ["ENDED", "KEEP_SECONDS", "MAX_FOLLOWERS_PER_CLIENT", "MAX_FOLLOWERS_PER_JOB", "MAX_JOBS", "MAX_KEPT",
           "TOKENS_PER_PASS", "Cancelled", "Job", "Jobs", "Refused", "Then", "runs_per_pass"]
