"""Long analyses off the request path: activation patching, integrated gradients, head scores.

A job runs in its own thread, reports progress through the analysis's own `progress(done, total)`
callback, and can be cancelled: the callback raises Cancelled at the next pass, so the analysis
stops between two forward passes and nothing is half-written. The page follows a job by Server-
Sent Events (GET /api/jobs/ID/events): one "progress" event per step, then "result" or "error".
At most MAX_JOBS run at once; a finished job is kept for KEEP_SECONDS for the page to read.
"""

from __future__ import annotations

import itertools
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_JOBS = 2
KEEP_SECONDS = 600


class Cancelled(Exception):
    """Raised inside a job's progress callback once the job was cancelled."""


@dataclass
class Job:
    id: str
    kind: str
    state: str = "queued"  # queued, running, done, error, cancelled
    done: int = 0
    total: int = 0
    result: dict | None = None
    page: str | None = None  # the result's own HTML page (anatomy analyze's), served at /api/jobs/ID/page
    error: str | None = None
    began: float = field(default_factory=time.monotonic)
    ended: float | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    changed: threading.Condition = field(default_factory=threading.Condition)
    version: int = 0  # bumped at every change, so that a follower wakes for each

    def progress(self, done: int, total: int) -> None:
        """The analysis's progress callback: record, wake followers, stop if cancelled."""
        if self.cancel.is_set():
            raise Cancelled
        with self.changed:
            self.done, self.total, self.state = done, total, "running"
            self.version += 1
            self.changed.notify_all()

    def finish(self, state: str, result: dict | None = None, error: str | None = None) -> None:
        """The job's end; a result's "page" (HTML) is kept apart from the JSON the events carry."""
        page = None if result is None else result.pop("page", None)
        with self.changed:
            self.state, self.result, self.page, self.error, self.ended = state, result, page, error, time.monotonic()
            self.version += 1
            self.changed.notify_all()

    def status(self) -> dict:
        out = {"id": self.id, "kind": self.kind, "state": self.state, "done": self.done, "total": self.total,
               "seconds": round((self.ended or time.monotonic()) - self.began, 2)}
        if self.error is not None:
            out["error"] = self.error
        return out

    def wait(self, version: int, timeout: float) -> int:
        """Block until the job changes past `version` (or `timeout`); the version now."""
        with self.changed:
            self.changed.wait_for(lambda: self.version != version, timeout=timeout)
            return self.version


class Jobs:
    """The running and recently finished jobs."""

    def __init__(self, max_jobs: int = MAX_JOBS):
        self.max_jobs = max_jobs
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count()

    def start(self, kind: str, work: Callable[[Callable[[int, int], None]], dict]) -> Job:
        """Run work(progress) -> result (a dict; its "page", if any, the result's HTML page) in a
        thread; ExploreError (429) when MAX_JOBS already run."""
        from .state import ExploreError

        with self._lock:
            self._forget_old()
            # a job told to stop no longer counts: it ends at its next pass
            running = sum(job.state in ("queued", "running") and not job.cancel.is_set() for job in self._jobs.values())
            if running >= self.max_jobs:
                raise ExploreError(f"{running} analyses are running; wait for one or cancel it "
                                   f"(at most {self.max_jobs} at once)", status=429)
            job = Job(f"{next(self._ids)}-{secrets.token_hex(4)}", kind)
            self._jobs[job.id] = job

        def run() -> None:
            try:
                result = work(job.progress)
            except Cancelled:
                job.finish("cancelled")
            except ValueError as error:  # the analysis refused its inputs: the user's to fix
                job.finish("error", error=str(error)[:500])
            except Exception as error:  # noqa: BLE001 - reported to the page, never raised into the server
                job.finish("error", error=f"{type(error).__name__}: {str(error)[:500]}")
            else:
                job.finish("done", result=result)

        threading.Thread(target=run, name=f"anatomy-job-{job.id}", daemon=True).start()
        return job

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            return self._jobs.get(job_id)

    def cancel(self, job_id: str) -> Job | None:
        job = self.get(job_id)
        if job is not None:
            job.cancel.set()
            if job.state == "queued":
                job.finish("cancelled")
        return job

    def _forget_old(self) -> None:
        now = time.monotonic()
        for job_id in [j.id for j in self._jobs.values() if j.ended is not None and now - j.ended > KEEP_SECONDS]:
            del self._jobs[job_id]


__all__ = ["Cancelled", "Job", "Jobs"]
