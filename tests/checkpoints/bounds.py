"""Bounds for the hostile-input tests: a refusal neither hangs nor takes memory, and says why in a
few hundred characters."""

from __future__ import annotations

import resource
import signal
import tracemalloc
from contextlib import contextmanager

import pytest

from anatomy.checkpoints import CheckpointError

MESSAGE_CHARACTERS = 1000  # a dozen lines: the listing of each kind of problem stops after 3 (engine.PROBLEMS_SHOWN)
PYTHON_BYTES = 64 * 2**20  # tracemalloc's peak of Python allocations
RESIDENT_BYTES = 512 * 2**20  # growth of ru_maxrss: the unguarded cases grew to the cap (gigabytes)
HANG_SECONDS = 60  # refusals take milliseconds; reaching this means a hang, not a slow machine


@contextmanager
def bounded():
    """Fail the test if the block hangs (SIGALRM) or takes memory: tracemalloc's peak of Python
    allocations, and the growth of the process's peak resident size (which covers torch's own
    allocations; it can only grow, so a case that took gigabytes shows whatever ran before)."""

    def hang(signum, frame):
        raise TimeoutError(f"more than {HANG_SECONDS} s")

    previous = signal.signal(signal.SIGALRM, hang)
    signal.alarm(HANG_SECONDS)
    resident = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    tracemalloc.start()
    try:
        yield
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - resident
    assert peak < PYTHON_BYTES, f"Python allocations peaked at {peak / 2**20:.0f} MiB"
    assert grown < RESIDENT_BYTES, f"the resident size grew by {grown / 2**20:.0f} MiB"


def refused(load, match: str) -> CheckpointError:
    """`load()` raises a CheckpointError matching `match`, short, within bounded(); returns it."""
    with bounded(), pytest.raises(CheckpointError, match=match) as error:
        load()
    assert len(str(error.value)) <= MESSAGE_CHARACTERS, f"a {len(str(error.value))}-character message"
    return error.value
