"""Verification: the top-k nodes or edges of an approximation, patched exactly, and how well they agree.

Shape letters: k items verified, C copies in one pass, B pairs, U sources, V destinations.

Exact values are what the approximations estimate, c = m(clean) - m(clean | item := corrupted), mean
over the pairs: for a node, activation patching of that one cell (analysis.patching.patch_cells,
the clean and corrupted roles swapped: the clean run is the one patched); for an edge, path patching
of that one edge (paths.run_ablated). The agreement is Spearman's rank correlation

    rho = pearson(rank(approx), rank(exact))          (ties get their average rank)

and the worst miss, max |approx - exact|, named.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ...analysis.patching import patch_cells
from ...analysis.result import Result
from .edges import top_edges
from .nodes import KINDS, node_points
from .paths import plan_passes, run_ablated
from .residual import ResidualGraph
from .tasks import Task

Progress = Callable[[int, int], None]


def ranks(values: torch.Tensor) -> torch.Tensor:
    """[n] -> [n]: 1-based ranks, ties given the mean of the ranks they span."""
    order = values.argsort()
    ranked = torch.empty(len(values), dtype=torch.float64)
    ranked[order] = torch.arange(1, len(values) + 1, dtype=torch.float64)
    for value in values.unique():
        tied = values == value
        if int(tied.sum()) > 1:
            ranked[tied] = ranked[tied].mean()
    return ranked


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman's rank correlation of two [n] vectors (nan when either is constant)."""
    ra, rb = ranks(a.double()), ranks(b.double())
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denominator = (ra.norm() * rb.norm()).item()
    return float("nan") if denominator == 0 else (ra @ rb).item() / denominator


def _verification(kind: str, names: list[str], approx: torch.Tensor, exact: torch.Tensor, about: str,
                  compare: str = "values") -> Result:
    """A Result [2, k] (approximation, exact) with rho and the worst miss in its check line."""
    approx, exact = approx.double(), exact.double()
    rho = spearman(approx.abs(), exact.abs()) if compare == "magnitudes" else spearman(approx, exact)
    miss = (approx - (exact.abs() if compare == "magnitudes" else exact)).abs()
    worst = int(miss.argmax())
    check = (f"Spearman ρ {rho:.3f} over the top {len(names)} ({compare}); worst miss {names[worst]}: "
             f"estimated {approx[worst]:.4g}, exact {exact[worst]:.4g}")
    return Result(f"verification of {kind}", torch.stack([approx, exact]), ("estimate", kind),
                  labels={"estimate": ["approximation", "exact"], kind: names}, check=check,
                  extra={"spearman": rho, "worst": names[worst], "worst_miss": float(miss[worst]), "view": "grid",
                         "legend": "the metric lost", "caption": "The approximation and the exact patching of each "
                         "of the top items, over the task's pairs."}, about=about)


def verify_nodes(model: nn.Module, task: Task, result: Result, k: int = 20, *, batch_size: int = 32,
                 progress: Progress | None = None) -> Result:
    """Patch the k nodes of a node attribution with the largest |value| exactly, over the task's pairs.
    AtP* is unsigned, so its ranks are compared with those of |exact|. Raises ValueError when k is not
    in 1..the node count."""
    kind = result.extra["kind"]
    count = result.values.numel()
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= count:
        raise ValueError(f"k={k!r} nodes: choose 1 to {count}, the {kind} nodes of this result")
    if kind == "features":
        raise ValueError("verifying SAE features needs the SAE: use anatomy.sae.analysis's patching by feature")
    order = result.values.flatten().abs().argsort(descending=True)[:k].tolist()
    points = node_points(model, kind)
    width = 1 if result.values.dim() == 1 else result.values.size(1)
    cells = [(points[i // width][0], points[i // width][1], i % width) for i in order]
    names = [_node_name(kind, i // width, i % width) for i in order]
    exact = torch.zeros(k, dtype=torch.float64)
    for rows in task.batches(batch_size):
        clean, corrupt = task.inputs(rows)

        def metric(logits: torch.Tensor) -> torch.Tensor:
            return task.score(logits[:, -1], rows)

        with torch.no_grad():
            base = task.score(clean.last_logits(model)[:, 0], rows).double().mean()
        # the clean run is the one patched, with the corrupted value at one cell at a time
        patched = patch_cells(model, corrupt, clean, cells, metric, progress=progress)
        exact += (base - patched.double()) * len(rows)
    exact /= len(task)
    compare = "magnitudes" if result.extra["method"] == "atp*" else "values"
    return _verification("nodes", names, result.values.flatten()[order], exact, result.about, compare)


def _node_name(kind: str, layer: int, index: int) -> str:
    if kind == "mlp":
        return f"L{layer} MLP"
    if kind == "heads":
        return f"L{layer}H{index}"
    return {"q": f"L{layer}H{index}.q", "k": f"L{layer}KV{index}.k", "v": f"L{layer}KV{index}.v",
            "neurons": f"L{layer}N{index}"}[kind] if kind in KINDS else f"F{index}"


def verify_edges(model: nn.Module, task: Task, result: Result, k: int = 50, *, max_tokens: int = 4096,
                 max_bytes: int = 2**29, progress: Progress | None = None) -> Result:
    """Path-patch the k edges of an edge attribution with the largest |score| exactly, one at a time,
    over the task's pairs: C edges per forward pass (C copies of a chunk of pairs). Raises ValueError
    when k is not in 1..the edge count."""
    edges = top_edges(result, k)
    graph: ResidualGraph = result.extra["graph"]
    pairs_per_chunk, copies = plan_passes(graph, task, len({u for u, _, _ in edges}), max_tokens, max_bytes)
    chunks = task.batches(pairs_per_chunk)
    exact = torch.zeros(k, dtype=torch.float64)
    done, total = 0, len(chunks) * ((k + copies - 1) // copies)
    for rows in chunks:
        clean, corrupt = task.inputs(rows)
        ablation = graph.source_values(model, corrupt)
        with torch.no_grad():
            base = task.score(clean.last_logits(model)[:, 0], rows).double()
        for start in range(0, k, copies):
            part = edges[start:start + copies]
            ablated = torch.zeros(len(part), *graph.allowed.shape, dtype=torch.bool)  # (C, U, V)
            for copy, (u, v, _) in enumerate(part):
                ablated[copy, u, v] = True
            logits = run_ablated(model, graph, clean, ablation, ablated)  # (C*B, vocab)
            patched = task.score(logits, rows).double().view(len(part), len(rows))
            exact[start:start + len(part)] += (base[None] - patched).sum(1)
            done += 1
            if progress is not None:
                progress(done, total)
    exact /= len(task)
    names = [graph.edge_name(u, v) for u, v, _ in edges]
    return _verification("edges", names, torch.tensor([s for _, _, s in edges]), exact, result.about)
