"""Circuits and their faithfulness: keep the top n edges, ablate every other, and measure what is left.

Shape letters: C circuits in one pass (copies), B pairs, U sources, V destinations, T positions,
E model width.

A circuit is a set of kept edges; every other edge u -> v gets u's ablated output (the corrupted
run's, or the mean over the task's clean runs, per position) at v's input (paths.run_ablated). Its
faithfulness is the share of the clean-minus-corrupted gap it recovers (Hanna et al. 2024; Wang et
al. 2022's "faithfulness"):

    F(circuit) = (m(circuit) - m(corrupt)) / (m(clean) - m(corrupt))

over the task's pairs (means first). The curve is F at growing n, the edges taken in order of
|score|; the smallest circuit is the first n on the curve that reaches the target (80%).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from ...analysis.result import Result
from .choices import ABLATIONS
from .edges import top_edges
from .paths import kv_points, pass_tokens, plan_passes, run_ablated, shared_prefix
from .residual import ResidualGraph
from .tasks import Task

Progress = Callable[[int, int], None]


def default_sizes(edge_count: int) -> list[int]:
    """Circuit sizes for a curve: 1, 2, 5, 10, 20, 50, ... up to every edge."""
    sizes, scale = [], 1
    while scale < edge_count:
        sizes += [n for n in (scale, 2 * scale, 5 * scale) if n < edge_count]
        scale *= 10
    return sizes + [edge_count]


def kept_masks(graph: ResidualGraph, result: Result, sizes: Sequence[int]) -> torch.Tensor:
    """[len(sizes), U, V] bool: the top n edges by |score|, for each n."""
    order = torch.tensor([(u, v) for u, v, _ in top_edges(result, max(sizes))], device="cpu")  # (n, 2), largest first
    masks = torch.zeros(len(sizes), *graph.allowed.shape, dtype=torch.bool, device="cpu")
    for i, n in enumerate(sizes):
        masks[i, order[:n, 0], order[:n, 1]] = True
    return masks


def faithfulness(
    model: nn.Module, task: Task, result: Result, sizes: Sequence[int] | None = None, *,
    ablation: str = "corrupt", target: float = 0.8, max_tokens: int = 4096, max_bytes: int = 2**29,
    progress: Progress | None = None,
) -> Result:
    """[size] faithfulness of the circuits made of the top n edges of an edge attribution, for each n
    in `sizes` (default: 1, 2, 5, 10, ... every edge); extra["smallest"] is the first n that reaches
    `target`. Raises ValueError for an unknown ablation, or a size outside 1..the edge count."""
    if ablation not in ABLATIONS:
        raise ValueError(f"ablation={ablation!r} is not supported; allowed values: {', '.join(ABLATIONS)}")
    graph: ResidualGraph = result.extra["graph"]
    count = graph.edge_count
    sizes = default_sizes(count) if sizes is None else sorted(set(sizes))
    for n in sizes:
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= count:
            raise ValueError(f"a circuit of {n!r} edges: choose 1 to {count}, the edges of this model's graph")
    masks = kept_masks(graph, result, sizes)
    circuit, clean_mean, corrupt_mean = _recovered(model, graph, task, masks, ablation, max_tokens, max_bytes,
                                                   progress)
    gap = clean_mean - corrupt_mean
    values = (circuit - corrupt_mean) / gap if gap != 0 else torch.full_like(circuit, float("nan"))
    reached = [n for n, value in zip(sizes, values.tolist()) if value >= target]
    smallest = reached[0] if reached else None
    full = values[-1].item() if sizes[-1] == count else float("nan")
    check = (f"every edge kept recovers {full:.4f} of the gap (1 exactly: the circuit is the model)" if sizes[-1] == count
             else "the curve stops before every edge is kept")
    return Result(
        f"faithfulness ({ablation} ablation)", values, ("circuit",),
        labels={"circuit": [str(n) for n in sizes]}, check=check,
        error=abs(full - 1.0) * abs(gap) if sizes[-1] == count else float("nan"),
        extra={"sizes": list(sizes), "smallest": smallest, "target": target, "clean": clean_mean,
               "ablated": corrupt_mean, "circuit_metric": circuit.tolist(), "edges": count, "ablation": ablation,
               "view": "grid", "legend": "share of the clean − corrupted gap recovered",
               "caption": "Each cell: the circuit of the top n edges, every other edge ablated."},
        about=result.about,
    )


def circuit_faithfulness(model: nn.Module, task: Task, graph: ResidualGraph, kept: torch.Tensor, *,
                         ablation: str = "corrupt", max_tokens: int = 4096, max_bytes: int = 2**29) -> torch.Tensor:
    """[C]: the faithfulness F of each circuit kept [C, U, V] (its edges kept, every other ablated), as
    faithfulness() measures it: for circuits found otherwise than by ranking edges (acdc)."""
    if ablation not in ABLATIONS:
        raise ValueError(f"ablation={ablation!r} is not supported; allowed values: {', '.join(ABLATIONS)}")
    circuit, clean_mean, corrupt_mean = _recovered(model, graph, task, kept, ablation, max_tokens, max_bytes, None)
    gap = clean_mean - corrupt_mean
    return (circuit - corrupt_mean) / gap if gap != 0 else torch.full_like(circuit, float("nan"))


def _recovered(model, graph: ResidualGraph, task: Task, masks: torch.Tensor, ablation: str, max_tokens: int,
               max_bytes: int, progress) -> tuple[torch.Tensor, float, float]:
    """(mean metric of each circuit masks [C, U, V] kept [C], of the clean runs, of every edge ablated)."""
    pairs_per_chunk, _ = plan_passes(graph, task, len(graph.sources), max_tokens, max_bytes)
    chunks = prefix_chunks(task, pairs_per_chunk)
    means = _means(model, graph, task, chunks) if ablation == "mean" else None
    circuit = torch.zeros(len(masks), dtype=torch.float64, device="cpu")
    clean_sum = corrupt_sum = 0.0
    done, total = 0, len(chunks) * len(masks)  # circuits run over a chunk
    for rows in chunks:
        clean, corrupt = task.inputs(rows)
        corrupt_out, corrupt_logits = graph.source_run(model, corrupt)
        ablated_out = corrupt_out if means is None else means[:, :, :clean.target.ids.size(1)]
        clean_out, clean_logits, t = graph.recorded_run(model, clean, ["blocks.0.resid_pre"] + kv_points(model))
        clean_sum += float(task.score(clean_logits, rows).sum())
        corrupt_sum += float(task.score(corrupt_logits, rows).sum())
        # Every run starts from the clean run's embeddings, at the first position where an ablated output
        # differs from the clean one (IOI: the subject's second mention), the clean run's past before it.
        prefix = shared_prefix(model, ablated_out, clean_out, t)
        start, clean_out = (0, t["blocks.0.resid_pre"], None), None  # (the sources' outputs: none before layer 0)
        width = clean.target.ids.size(1) - (0 if prefix is None else prefix[0])  # the positions a run computes
        copies = max(1, pass_tokens(graph, len(graph.sources), width, max_tokens, max_bytes) // (len(rows) * width))
        for first in range(0, len(masks), copies):
            kept = masks[first:first + copies]  # (C, U, V)
            logits = run_ablated(model, graph, clean, ablated_out, ~kept, start, prefix)
            circuit[first:first + len(kept)] += task.score(logits, rows).double().view(len(kept), len(rows)).sum(1).cpu()
            done += len(kept)
            if progress is not None:
                progress(done, total)
    n = len(task)
    corrupt_mean = corrupt_sum / n
    if ablation == "mean":  # the baseline: every edge ablated
        corrupt_mean = _every_edge_ablated(model, graph, task, chunks, means)
    return circuit / n, clean_sum / n, corrupt_mean


def prefix_chunks(task: Task, size: int) -> list[list[int]]:
    """The rows in chunks of at most `size` pairs, ordered by the first position where the corrupted prompt
    differs from the clean one, then by length: the pairs of a chunk share more of their first positions,
    which its runs do not compute (shared_prefix), and pad fewer."""
    differs = task.clean != task.corrupt  # (N, T)
    first = torch.where(differs.any(1), differs.int().argmax(1), task.lengths)  # (N,): the first that differs
    order = sorted(range(len(task)), key=lambda r: (int(first[r]), int(task.lengths[r])))
    return [order[start:start + size] for start in range(0, len(task), size)]


def _means(model, graph: ResidualGraph, task: Task, chunks) -> torch.Tensor:
    """[U, 1, T, E]: each source's output on the clean prompts, averaged over the pairs at each position
    (over the pairs long enough to have that position)."""
    total, count = None, None
    for rows in chunks:
        clean, _ = task.inputs(rows)
        out = graph.source_values(model, clean)  # (U, B, t, E)
        lengths = task.lengths[list(rows)].to(out.device)  # (B,)
        real = torch.arange(out.size(2), device=out.device)[None, :] < lengths[:, None]  # (B, t)
        summed = (out * real[None, :, :, None]).sum(1)  # (U, t, E)
        if total is None:
            total = out.new_zeros(out.size(0), int(task.lengths.max()), out.size(3))
            count = out.new_zeros(total.size(1))
        total[:, :out.size(2)] += summed
        count[:out.size(2)] += real.sum(0)
    return (total / count.clamp(min=1)[None, :, None])[:, None]  # (U, 1, T, E)


def _every_edge_ablated(model, graph, task, chunks, means) -> float:
    total = 0.0
    for rows in chunks:
        clean, _ = task.inputs(rows)
        every = torch.ones(1, *graph.allowed.shape, dtype=torch.bool, device="cpu")
        logits = run_ablated(model, graph, clean, means[:, :, :clean.target.ids.size(1)], every)
        total += float(task.score(logits, rows).sum())
    return total / len(task)
