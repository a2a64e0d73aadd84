"""The discover panel: a behaviour's circuit over a dataset of clean/corrupted pairs, as a job.

POST /api/jobs {"kind": "discover", "model", "task": ioi | greater-than | capital-country | sva | custom,
"pairs": N, "method": eap | eap-ig, "steps": M, "custom": [{clean, corrupt, answer, wrong}, ...]} starts
it; the job scores every edge (circuits.discovery.attribute_edges), runs the faithfulness curve
(faithfulness), and draws the circuit with the circuits floor's one page (served at /api/jobs/ID/page):
the smallest circuit that reaches 80% at open, a slider to grow it beside the curve, the heads' roles. Every number in the reply is the library's, rounded. Settings are checked
here, before the job starts; a model whose residual stream is no sum of components is refused then.
"""

from __future__ import annotations

from collections.abc import Callable

from ..circuits.discovery import (ResidualGraph, attribute_edges, build_task, circuit_for_page, faithfulness, make_task,
                                  top_edges)
from ..circuits.discovery.edges import METHODS
from ..circuits.discovery.generators import TASKS
from ..circuits.page import graph_view
from .models import ModelSlot
from .values import ExploreError, rounded

PAIRS = 100  # generated pairs by default, as `anatomy circuits discover --pairs` has it
MAX_PAIRS = 200  # generated pairs: a job of minutes on SmolLM2, not hours
MAX_CUSTOM = 64  # pairs typed into the page
MAX_TEXT = 400  # characters of one typed prompt
MAX_STEPS = 20
TOP = 20  # edges listed in the reply


def _integer(settings: dict, name: str, default: int, high: int) -> int:
    value = settings.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise ExploreError(f"'{name}' must be an integer from 1 to {high}, got {str(value)[:40]!r}")
    return value


def _custom_pairs(settings: dict) -> list[dict]:
    pairs = settings.get("custom")
    if not isinstance(pairs, list) or not 1 <= len(pairs) <= MAX_CUSTOM:
        raise ExploreError(f"'custom' must be a list of 1 to {MAX_CUSTOM} pairs {{clean, corrupt, answer, wrong}}")
    for index, pair in enumerate(pairs):
        if not isinstance(pair, dict) or any(not isinstance(pair.get(k), str) or not pair.get(k) or len(pair[k]) > MAX_TEXT
                                             for k in ("clean", "corrupt", "answer", "wrong")):
            raise ExploreError(f"custom pair {index}: clean, corrupt, answer and wrong must each be a text of 1 to "
                               f"{MAX_TEXT} characters")
    return [{k: pair[k] for k in ("clean", "corrupt", "answer", "wrong")} for pair in pairs]


def discover_work(slot: ModelSlot, settings: dict) -> Callable[[Callable[[int, int], None]], dict]:
    """The job's work, after every setting is checked: (progress) -> the panel's JSON, with the circuit's page."""
    task_name = settings.get("task", "ioi")
    if task_name not in (*TASKS, "custom"):
        raise ExploreError(f"'task' must be one of {', '.join([*TASKS, 'custom'])}, got {str(task_name)[:40]!r}")
    method = settings.get("method", "eap-ig")
    if method not in METHODS:
        raise ExploreError(f"'method' must be one of {', '.join(METHODS)}, got {str(method)[:40]!r}")
    n = _integer(settings, "pairs", PAIRS, MAX_PAIRS)
    steps = _integer(settings, "steps", 5, MAX_STEPS)
    custom = _custom_pairs(settings) if task_name == "custom" else None
    model = slot.get()
    try:
        graph = ResidualGraph(model)
    except ValueError as error:
        raise ExploreError(str(error)) from None

    def work(progress: Callable[[int, int], None]) -> dict:
        task = make_task(model, "custom", custom) if custom else build_task(model, task_name, n)
        edges = attribute_edges(model, task, method=method, steps=steps, progress=progress)
        curve = faithfulness(model, task, edges, progress=progress)
        size = curve.extra["smallest"] or graph.edge_count
        reached = curve.values[curve.extra["sizes"].index(size)].item()
        about = (f"{slot.name}, {task.name}: {len(task)} pairs, {method}; the top {size} of {graph.edge_count:,} edges "
                 f"recover {reached:.2f} of the gap")
        circuit = circuit_for_page(model, task, edges, curve, size=size, about=about)
        return {
            "kind": edges.kind, "check": edges.check, "task": task.name, "pairs": len(task), "dropped": task.dropped,
            "clean": rounded(edges.values.new_tensor(curve.extra["clean"]), 5),
            "ablated": rounded(edges.values.new_tensor(curve.extra["ablated"]), 5),
            "edges": graph.edge_count, "sizes": curve.extra["sizes"], "faithfulness": rounded(curve.values, 4),
            "smallest": curve.extra["smallest"], "target": curve.extra["target"], "size": size,
            "top": [[graph.edge_name(u, v), rounded(edges.values.new_tensor(score), 4)]
                    for u, v, score in top_edges(edges, min(TOP, graph.edge_count))],
            "page": graph_view(circuit).html,
        }

    return work
