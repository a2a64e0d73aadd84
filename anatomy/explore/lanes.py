"""Where the panels' computations wait and run: two lanes per model, the newest request first.

A keystroke asks for its tokens and next token (one pass, continued from the last text's), then for
the open panel. Cheap panels (the pass, tokens, next token, lens, attention) run in the `quick` lane;
the expensive ones (the walk, attribution, interventions, features, head scores, comparisons,
exports) in the `slow` lane, so that a walk never holds up a next token. Each lane runs one
computation at a time in a worker thread, and the two lanes of a model run at once (a forward pass
only reads the weights, and a trace belongs to its thread: anatomy/trace.py).

Within a lane the newest request goes first (a stack, not a queue): the page asks for the text it
shows now, and the requests of the texts typed on the way are superseded. A request whose browser
went away while it waited (the page cancels a superseded request) is dropped before it computes;
one that is computing is told (raise_if_gone), and a pass stops at its next trace point.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # state.py imports this module: no web server needed to import it
    from starlette.requests import Request

QUICK = "quick"
SLOW = "slow"
POLL_SECONDS = 0.02  # how often a waiting request checks that its browser is still there


class Gone(Exception):
    """The browser went away (a newer keystroke cancelled the request) before the work began or
    ended."""


_work = threading.local()  # the worker thread's: whether the browser that asked for its work left


def raise_if_gone() -> None:
    """In a lane's worker thread, raise Gone once the browser that asked for the work has left (a
    later keystroke superseded it): a computation calls it between its steps to stop early."""
    gone = getattr(_work, "gone", None)
    if gone is not None and gone.is_set():
        raise Gone


class Lane:
    """One computation at a time, in a thread of the lane's own, the most recent waiting request next.
    (A thread of its own, not a pool's: what a computation keeps per thread, a malloc arena or
    analysis/prefix.py's plan of the model, is kept once per lane.)"""

    def __init__(self, name: str = "lane"):
        self.busy = False
        self.waiting: list[asyncio.Future] = []
        self.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"anatomy-{name}")

    def _next(self) -> None:
        while not self.busy and self.waiting:
            turn = self.waiting.pop()  # the newest
            if not turn.done():
                self.busy = True
                turn.set_result(None)

    async def run(self, request: Request | None, work: Callable):
        """work() in a worker thread once this request's turn comes; Gone if its browser left first."""
        turn = asyncio.get_running_loop().create_future()
        self.waiting.append(turn)
        self._next()
        try:
            while not turn.done():
                try:
                    await asyncio.wait_for(asyncio.shield(turn), POLL_SECONDS)
                except asyncio.TimeoutError:
                    if request is not None and await request.is_disconnected():
                        raise Gone from None
        except BaseException:  # Gone, or the server cancelling the request
            if turn.done():  # the turn came as it left: hand it on
                self.busy = False
                self._next()
            else:
                turn.cancel()
                self.waiting.remove(turn)
            raise
        gone = threading.Event()

        def job():
            _work.gone = gone
            try:
                return work()
            finally:
                _work.gone = None

        try:
            task = asyncio.get_running_loop().run_in_executor(self.thread, job)
            while not task.done():  # the work runs; its browser is watched, to stop it early if it leaves
                finished, _ = await asyncio.wait({task}, timeout=POLL_SECONDS)
                if not finished and request is not None and not gone.is_set() and await request.is_disconnected():
                    gone.set()
            return task.result()
        finally:
            self.busy = False
            self._next()


class Lanes:
    """The quick and the slow lane of every model, made when first used."""

    def __init__(self):
        self._lanes: dict[tuple[str, str], Lane] = {}

    def lane(self, model: str, kind: str) -> Lane:
        if kind not in (QUICK, SLOW):
            raise ValueError(f"a lane is {QUICK!r} or {SLOW!r}, not {kind!r}")
        if (model, kind) not in self._lanes:
            self._lanes[(model, kind)] = Lane(f"{kind}-{model}"[:40])
        return self._lanes[(model, kind)]

    def waiting(self) -> int:
        """Requests waiting for their turn, in every lane."""
        return sum(len(lane.waiting) for lane in self._lanes.values())


__all__ = ["Gone", "Lane", "Lanes", "QUICK", "SLOW", "raise_if_gone"]
