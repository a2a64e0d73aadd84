"""ACDC: a circuit found by removing edges one at a time by their exact effect (Conmy et al. 2023, "Towards
Automated Circuit Discovery for Mechanistic Interpretability", NeurIPS, Algorithm 1).

Shape letters: U sources, V destinations, C circuits in one pass (copies), B pairs, T positions, E model
width.

Start from every edge, H = G. Visit the edges in reverse topological order (acdc_order): the destinations
from the logits back to the first layer, each destination's sources from the latest to the earliest.
Ablate the edge (its destination's input gets the source's corrupted output, paths.run_ablated); if the
circuit moves away from the model by less than the threshold tau, leave it out:

    H_new = H \\ {e};   if F(H_new) - F(H) < tau:  H = H_new

where F(H), the distance of the circuit from the model over the task's pairs, is

    kl:    mean_pairs KL(p_model || p_H)  of the next token at the last position   (their default)
    task:  - mean_pairs m(H)              the task's metric, negated to be minimised (their appendix C)

Fast: every edge left out so far ends at the tested edge's layer or later, so the circuit equals the
model before that layer, and its run starts there from the model's residual stream (Stack.run_from).
Edges are tested several at a time by speculation: copy c of the batch leaves out the next c edges on
top of H; the decisions are read in order, and the copies past the first edge kept (whose premise, that
edge left out, failed) are dropped. The number tested at once doubles while every edge goes, and falls
back to what the last batch decided when one stays.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from ...analysis.result import Result
from .choices import ACDC_METRICS
from .paths import plan_passes, run_ablated
from .residual import ResidualGraph
from .tasks import Task

Progress = Callable[[int, int], None]  # (edges decided, edges in all)
MAX_SPECULATION = 64  # edges tested at once at most


def acdc_order(graph: ResidualGraph) -> list[tuple[int, int]]:
    """Every allowed edge (source, destination) in reverse topological order: the destinations last to
    first (graph.destinations is topological), each one's sources last to first."""
    return [(u, v) for v in reversed(range(len(graph.destinations)))
            for u in reversed(range(len(graph.sources))) if graph.allowed[u, v]]


class _Chunk:
    """What every test of a chunk of pairs reads: the clean batch, the corrupted and the clean sources'
    outputs [U, B, T, E], the clean residual stream at each block's input, the clean last-position
    log-probabilities [B, vocab] and metric [B]."""

    def __init__(self, model: nn.Module, graph: ResidualGraph, task: Task, rows: range):
        self.rows = rows
        self.clean, corrupt = task.inputs(rows)
        self.ablation = graph.source_values(model, corrupt)
        names = [f"blocks.{layer}.resid_pre" for layer in range(graph.n_layers)]
        self.outputs, logits, stream = graph.recorded_run(model, self.clean, names)  # one clean pass
        self.stream = [stream[name] for name in names]
        self.reference = torch.log_softmax(logits.double(), dim=-1)  # (B, vocab)
        self.metric = task.score(logits, rows).double()  # (B,)


def acdc(
    model: nn.Module, task: Task, *, threshold: float, metric: str = "kl", max_tokens: int = 4096,
    max_bytes: int = 2**29, progress: Progress | None = None,
) -> Result:
    """[source, destination]: ACDC's circuit at threshold tau (module docstring). values[u, v] is the change
    of F when the edge was tested, F(H without it) - F(H) (0 where no edge runs); extra["kept"] [U, V] bool
    is the circuit, extra["distance"] F(circuit) - F(model) (the KL, or the metric lost), extra["runs"] the
    circuits run (speculation included).
    progress(decided, total) after every batch. Raises ValueError for a threshold that is not a finite
    number >= 0, an unknown metric, or a model whose residual stream is no sum of components."""
    if metric not in ACDC_METRICS:
        raise ValueError(f"metric={metric!r} is not supported; allowed values: {', '.join(ACDC_METRICS)}")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold) \
            or threshold < 0:
        raise ValueError(f"threshold must be a finite number >= 0, got {threshold!r}")
    graph = ResidualGraph(model)
    model.eval()
    order = acdc_order(graph)
    pairs_per_chunk, copies = plan_passes(graph, task, len(graph.sources), max_tokens, max_bytes)
    chunks = [_Chunk(model, graph, task, rows) for rows in task.batches(pairs_per_chunk)]
    removed = torch.zeros_like(graph.allowed)  # (U, V)
    effects = torch.zeros(graph.allowed.shape, dtype=torch.float64, device="cpu")  # (U, V)
    current = start = 0.0 if metric == "kl" else -float(sum(chunk.metric.sum() for chunk in chunks)) / len(task)
    done, speculation, runs = 0, 1, 0
    while done < len(order):
        batch = order[done:done + speculation]
        circuits = removed[None].repeat(len(batch), 1, 1)  # (C, U, V): copy c leaves out the next c + 1 edges
        for c, (u, v) in enumerate(batch):
            circuits[c:, u, v] = True
        layer = graph.destinations[batch[-1][1]].layer  # the lowest layer of the batch
        distances = _distances(model, graph, task, chunks, circuits, min(layer, graph.n_layers - 1), metric, copies)
        runs += len(batch)
        decided = 0
        for c, (u, v) in enumerate(batch):
            effects[u, v] = distances[c] - current
            decided += 1
            if effects[u, v] < threshold:
                removed[u, v], current = True, float(distances[c])
            else:
                break  # the copies after this one left it out: their premise failed
        done += decided
        speculation = min(MAX_SPECULATION, 2 * speculation) if decided == len(batch) else decided
        if progress is not None:
            progress(done, len(order))
    return _result(graph, task, effects, graph.allowed & ~removed, threshold, metric, current - start, runs)


def _distances(model, graph, task, chunks: list[_Chunk], circuits: torch.Tensor, layer: int, metric: str,
               copies: int) -> torch.Tensor:
    """[C]: F of each circuit (its left-out edges ablated), over every pair, runs started at `layer`."""
    totals = torch.zeros(circuits.size(0), dtype=torch.float64, device="cpu")
    for chunk in chunks:
        start = (layer, chunk.stream[layer], chunk.outputs)
        for first in range(0, circuits.size(0), copies):
            part = circuits[first:first + copies]
            logits = run_ablated(model, graph, chunk.clean, chunk.ablation, part, start)  # (C*B, vocab)
            if metric == "kl":
                log_p = torch.log_softmax(logits.double(), dim=-1).view(len(part), len(chunk.rows), -1)
                reference = chunk.reference[None]  # (1, B, vocab)
                totals[first:first + len(part)] += (reference.exp() * (reference - log_p)).sum(dim=(1, 2)).cpu()
            else:
                totals[first:first + len(part)] -= task.score(logits, chunk.rows).double().view(len(part), -1).sum(1).cpu()
    return totals / len(task)


def _result(graph: ResidualGraph, task: Task, effects, kept, threshold, metric, distance, runs) -> Result:
    """distance: F(circuit) - F(model), the KL itself or the metric lost."""
    count, left = graph.edge_count, int(kept.sum())
    what = "KL(model || circuit)" if metric == "kl" else "the metric lost, m(model) − m(circuit)"
    return Result(
        f"ACDC (τ = {threshold:g}, {metric})", effects, ("source", "destination"),
        labels={"source": [node.name for node in graph.sources], "destination": [node.name for node in graph.destinations]},
        check=f"{left:,} of {count:,} edges kept; the circuit's distance from the model, {what}: {distance:.4g} "
              f"(every edge left out moved it by less than τ = {threshold:g} when it was tested)",
        extra={"method": "acdc", "graph": graph, "allowed": graph.allowed, "kept": kept, "threshold": threshold,
               "metric": metric, "distance": distance, "runs": runs, "task": task.name, "pairs": len(task),
               "view": "grid", "legend": "F(circuit without the edge) − F(circuit) when the edge was tested",
               "caption": "Each cell: how far leaving the edge out moved the circuit from the model when ACDC "
                          "tested it; the edges kept moved it by τ or more."},
        about=f"{task.name}, {len(task)} pairs",
    )
