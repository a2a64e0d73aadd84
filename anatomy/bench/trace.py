"""The cost of the trace points when nothing is traced, as a fraction of a 1 x 16 encoder pass."""

from __future__ import annotations

import time

import torch

from ..trace import TracePoint, trace_points
from .common import Row, Settings, alternate, minilm_pair


def bench_trace(settings: Settings) -> list[Row]:
    """What the trace points cost when nothing is traced, as a fraction of a 1 x 16 encoder pass.

    A pass cannot be run without its trace points, so the cost is counted: the number of points
    one pass reaches (each given a counting function for one pass), times the time of one call of
    an idle point through its parent module (attribute lookup included), over the time of a pass;
    both times are the fastest of their runs.
    """
    ours, _ = minilm_pair(tiny=settings.quick)
    ids = torch.randint(1, ours.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
    points = trace_points(ours)
    calls = 0

    def count(x):
        nonlocal calls
        calls += 1
        return x

    for point in points.values():
        point.fn = count
    try:
        with torch.inference_mode():
            ours(ids)
    finally:
        for point in points.values():
            point.fn = None

    point, x = TracePoint("x"), torch.zeros(1)
    holder = torch.nn.Module()
    holder.point = point
    # Noise from other processes only ever adds time: the fastest of several runs is the cost.
    n, loops = 20000, []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            holder.point(x)
        middle = time.perf_counter()
        for _ in range(n):
            pass
        loops.append(((middle - start) - (time.perf_counter() - middle)) / n)
    per_call = min(loops)

    with torch.inference_mode():
        times = alternate({"forward": lambda: ours(ids)}, settings.repeats or 40, warmup=3)
    forward_ms = min(times["forward"]) * 1e3
    overhead = calls * per_call * 1e3 / forward_ms
    row = Row("trace", "trace points off, 1x16", "% overhead", overhead * 100, None, False)
    row.notes = [f"{calls} idle points per pass x {per_call * 1e9:.0f} ns = {calls * per_call * 1e6:.0f} us"
                 f" of a {forward_ms:.2f} ms pass"]
    return [row]
