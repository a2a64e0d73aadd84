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
from .paths import edge_effects
from .residual import ResidualGraph
from .tasks import Task

Progress = Callable[[int, int], None]


def ranks(values: torch.Tensor) -> torch.Tensor:
    """[n] -> [n]: 1-based ranks, ties given the mean of the ranks they span."""
    order = values.argsort()
    ranked = torch.empty(len(values), dtype=torch.float64, device=values.device)
    ranked[order] = torch.arange(1, len(values) + 1, dtype=torch.float64, device=values.device)
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
    exact = torch.zeros(k, dtype=torch.float64, device="cpu")
    for rows in task.batches(batch_size):
        clean, corrupt = task.inputs(rows)

        def metric(logits: torch.Tensor) -> torch.Tensor:
            return task.score(logits[:, -1], rows)

        with torch.no_grad():
            base = task.score(clean.last_logits(model)[:, 0], rows).double().mean()
        # the clean run is the one patched, with the corrupted value at one cell at a time
        patched = patch_cells(model, corrupt, clean, cells, metric, progress=progress)
        exact += (base - patched.double()).cpu() * len(rows)
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


def verify_edges(model: nn.Module, task: Task, result: Result, k: int = 50, *, sample: int = 0, seed: int = 0,
                 max_tokens: int = 4096, max_bytes: int = 2**29, progress: Progress | None = None) -> Result:
    """Path-patch the k edges of an edge attribution with the largest |score| exactly, one at a time,
    over the task's pairs, each run started at its edge's destination layer (paths.edge_effects); and
    `sample` edges outside the top k, drawn at random from bands of rank (outside_sample), to see what
    the estimate missed: extra["outside"] names the largest exact effect found outside the top k, and
    extra["recall"] is the share of the exact top k among all verified edges that the estimate's top k
    holds. Raises ValueError when k is not in 1..the edge count or sample is negative."""
    edges = top_edges(result, k)
    graph: ResidualGraph = result.extra["graph"]
    if isinstance(sample, bool) or not isinstance(sample, int) or sample < 0:
        raise ValueError(f"sample={sample!r}: the number of edges outside the top k to verify, 0 or more")
    outside = outside_sample(result, k, sample, seed)
    checked = [(u, v) for u, v, _ in edges] + [(u, v) for _, u, v, _ in outside]
    per_pair = 2 * len(graph.sources) * int(task.lengths.max()) * graph.model.config.d_model * 4  # ablated, clean
    chunks = task.batches(max(1, min(len(task), max_bytes // per_pair)))
    exact = torch.zeros(len(checked), dtype=torch.float64, device="cpu")
    done = [0]

    def tick(runs: int, total: int) -> None:
        if progress is not None:
            progress(done[0] + runs, len(chunks) * len(checked))

    for rows in chunks:
        clean, corrupt = task.inputs(rows)
        ablation = graph.source_values(model, corrupt)
        metric = lambda logits: task.score(logits[:, 0], rows)  # noqa: E731
        patched, base = edge_effects(model, graph, clean, ablation, checked, metric, max_tokens=max_tokens,
                                     progress=tick)
        exact += (base.double()[None] - patched.double()).sum(1).cpu()
        done[0] += len(checked)
    exact /= len(task)
    names = [graph.edge_name(u, v) for u, v in checked]
    estimates = torch.tensor([s for _, _, s in edges] + [s for _, _, _, s in outside], dtype=torch.float64, device="cpu")
    verified = _verification("edges", names[:k], estimates[:k], exact[:k], result.about)
    if outside:
        _outside(verified, names, estimates, exact, k, [rank for rank, _, _, _ in outside])
    return verified


def outside_sample(result: Result, k: int, sample: int, seed: int = 0) -> list[tuple[int, int, int, float]]:
    """`sample` edges outside the top k by |score|, (rank, source, destination, score), rank 1 the largest:
    the edges ranked k+1 .. all cut into bands of doubling width (ranks k+1..2k, 2k+1..4k, ...; the last
    band the rest), an equal share of the sample drawn uniformly from each (the remainder from the bands
    nearest the top k; a band too narrow for its share gives the rest to the edges not yet drawn),
    without replacement, by a generator seeded with `seed`. The bands put more of the sample near the
    cut, where a miss is likeliest, and still reach the tail."""
    count = int(result.extra["allowed"].sum())
    if sample == 0 or k >= count:
        return []
    ranked = top_edges(result, count)  # every edge, largest |score| first
    bands, start, width = [], k, k
    while start < count:
        bands.append(range(start, min(count, start + width)))
        start, width = start + width, width * 2
    sample = min(sample, count - k)
    generator = torch.Generator().manual_seed(seed)
    shares = [sample // len(bands) + (1 if i < sample % len(bands) else 0) for i in range(len(bands))]
    chosen = []
    for band, share in zip(bands, shares):
        take = min(share, len(band))
        chosen += [band[int(i)] for i in torch.randperm(len(band), generator=generator, device="cpu")[:take]]
    short = sample - len(chosen)  # bands narrower than their share: the rest from the edges not yet drawn
    if short:
        left = sorted(set(range(k, count)) - set(chosen))
        chosen += [left[int(i)] for i in torch.randperm(len(left), generator=generator, device="cpu")[:short]]
    return [(rank + 1, *ranked[rank]) for rank in sorted(chosen)]


def _outside(verified: Result, names: list[str], estimates: torch.Tensor, exact: torch.Tensor, k: int,
             ranks: list[int]) -> None:
    """Add what the sample outside the top k shows to a verification: the largest exact effect outside,
    and the recall of the exact top k among the verified edges by the estimate's top k."""
    outside = exact[k:].abs()
    largest = int(outside.argmax())
    truth = set(exact.abs().argsort(descending=True)[:k].tolist())  # the exact top k of every edge verified
    recall = len(truth & set(range(k))) / k
    verified.extra.update(
        outside={"edge": names[k + largest], "exact": float(exact[k + largest]), "estimated": float(estimates[k + largest]),
                 "rank": ranks[largest], "sampled": len(outside)},
        recall=recall, sample=[{"edge": name, "rank": rank, "estimated": float(e), "exact": float(x)}
                               for name, rank, e, x in zip(names[k:], ranks, estimates[k:], exact[k:])])
    kth = float(exact[:k].abs().min())
    verified.check += (f"; outside the top {k}, {len(outside)} sampled edges: the largest exact effect "
                       f"{names[k + largest]} {float(exact[k + largest]):.4g} (rank {ranks[largest]}, estimated "
                       f"{float(estimates[k + largest]):.4g}; the top {k}'s smallest |exact| {kth:.4g}); recall of "
                       f"the exact top {k} among the verified: {recall:.2f}")
