"""Edge attribution patching over a dataset: EAP (Syed et al. 2023, "Attribution Patching Outperforms
Automated Circuit Discovery") and EAP-IG (Hanna et al. 2024, "Have Faith in Faithfulness").

Shape letters: U sources, V destinations, N pairs, B pairs in a chunk, T positions, E model width.

The effect of an edge u -> v is what the metric loses when in_v gets the corrupted out_u instead of
the clean one, everything else clean. To first order (EAP):

    score(u -> v) = mean_pairs  sum_t (out_u(clean) - out_u(corrupt)) . d m / d in_v |clean

and EAP-IG averages the gradient along the straight path from the corrupted input embeddings to the
clean ones, at m points (the right Riemann sum, analysis.attribution.riemann; m = 1 is EAP):

    score(u -> v) = mean_pairs  sum_t (out_u(clean) - out_u(corrupt)) . 1/m sum_{k=1..m} d m / d in_v |e_k,
    e_k = e(corrupt) + k/m (e(clean) - e(corrupt))

Positive: the edge carries the behaviour (the metric drops when it is corrupted). The sign is
auto-circuit's; Hanna et al.'s code scores (corrupt - clean), the opposite.

Every score is one matrix product per layer of destinations, [U_l, B*T*E] @ [B*T*E, V_l], after the
gradients of the m points are summed; pairs go through in chunks whose activations and gradients
fit `max_bytes`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ...analysis.attribution import on_path, riemann
from ...analysis.result import Result
from .choices import EDGE_METHODS as METHODS, MAX_STEPS, PATHS
from .residual import ResidualGraph
from .tasks import Task

Progress = Callable[[int, int], None]  # (passes done, passes in all)


def chunk_size(graph: ResidualGraph, task: Task, max_bytes: int) -> int:
    """How many pairs fit one chunk: sources' differences and destinations' gradients, float32."""
    per_pair = (len(graph.sources) + len(graph.destinations)) * int(task.lengths.max()) * graph.model.config.d_model * 4
    return max(1, min(len(task), max_bytes // per_pair))


def attribute_edges(
    model: nn.Module, task: Task, *, method: str = "eap-ig", steps: int = 5, path: str = "inputs",
    max_bytes: int = 2**28, progress: Progress | None = None,
) -> Result:
    """[source, destination] scores of every edge of the model's residual graph (residual.ResidualGraph).

    method "eap" (one gradient, at the clean input) or "eap-ig": `steps` gradients along a path from the
    corrupted run to the clean one. path "inputs" (Hanna et al.): the input embeddings interpolated,
    k/m for k = 1..m. path "edges" (auto-circuit's integrated_grad_samples): every edge moved from clean
    to corrupted together, alpha = k/m for k = 0..m, each point scored with that run's own source
    outputs, (cur_u(alpha) - a_u) . d m / d in_v, and averaged (auto-circuit sums the m + 1 points).
    progress(done, total) is called after every backward pass; an exception it raises stops the work
    (how a caller cancels). Raises ValueError for an unknown method or path, steps outside
    1..MAX_STEPS, or a model whose residual stream is no sum of components (ResidualGraph).
    """
    if method not in METHODS:
        raise ValueError(f"method={method!r} is not supported; allowed values: {', '.join(METHODS)}")
    if path not in PATHS:
        raise ValueError(f"path={path!r} is not supported; allowed values: {', '.join(PATHS)}")
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"steps must be an integer from 1 to {MAX_STEPS}, got {steps!r}")
    graph = ResidualGraph(model)
    model.eval()
    steps = 1 if method == "eap" else steps
    path = "inputs" if method == "eap" else path
    chunks = task.batches(chunk_size(graph, task, max_bytes))
    scores = torch.zeros(len(graph.sources), len(graph.destinations), dtype=torch.float64, device="cpu")  # (U, V)
    clean_total = corrupt_total = embed_total = 0.0
    # inputs: the right Riemann sum (analysis.attribution.riemann); edges: auto-circuit's k/m, k = 0..m, averaged
    alphas, weights = riemann(steps) if path == "inputs" else (torch.arange(steps + 1, device="cpu") / steps,
                                                                 torch.full((steps + 1,), 1 / (steps + 1), device="cpu"))
    done, total = 0, len(chunks) * len(alphas)
    for rows in chunks:
        clean, corrupt = task.inputs(rows)
        (clean_out, clean_logits), (corrupt_out, corrupt_logits) = graph.source_run(model, clean), graph.source_run(model, corrupt)
        delta = clean_out - corrupt_out  # (U, B, T, E)
        gradient = delta.new_zeros(len(graph.destinations), *delta.shape[1:])  # (V, B, T, E): the path's mean
        for alpha, weight in zip(alphas.tolist(), weights.tolist()):
            metric = lambda logits: task.score(logits, rows)  # noqa: E731
            if path == "inputs":
                embed = on_path(corrupt_out[0], clean_out[0], alpha)  # the input embeddings, alpha of the way to clean
                values, g, _ = graph.reader_gradients(model, clean, metric, embed)
                gradient += weight * g
            else:
                values, g, current = graph.reader_gradients(model, clean, metric, mix=(corrupt_out, alpha))
                _accumulate(graph, scores, current - corrupt_out, weight * g)
                gradient += weight * g  # for the completeness line
            done += 1
            if progress is not None:
                progress(done, total)
        if path == "inputs":
            _accumulate(graph, scores, delta, gradient)
        corrupt_total += float(task.score(corrupt_logits, rows).sum())
        clean_total += float(task.score(clean_logits, rows).sum())
        embed_total += float(scores_row_of_embed(delta, gradient))
    n = len(task)
    scores /= n
    gap = (clean_total - corrupt_total) / n
    return _result(graph, task, method, steps, scores, gap, embed_total / n, clean_total / n, corrupt_total / n, path)


def scores_row_of_embed(delta: torch.Tensor, gradient: torch.Tensor) -> torch.Tensor:
    """sum over every destination of the embeddings' edge score: (e(clean) - e(corrupt)) . sum_v G_v. The
    embeddings are a term of every destination's input, so sum_v G_v is the whole gradient at the input
    embeddings, and this is integrated gradients of the input: m(clean) - m(corrupt) as the steps grow."""
    return (delta[0] * gradient.sum(0)).sum()


def _accumulate(graph: ResidualGraph, scores: torch.Tensor, delta: torch.Tensor, gradient: torch.Tensor) -> None:
    """scores[u, v] += sum_{b, t, e} delta[u] gradient[v], one product per layer of destinations
    over the sources that can reach it."""
    flat_delta = delta.reshape(delta.size(0), -1)  # (U, B*T*E)
    flat_gradient = gradient.reshape(gradient.size(0), -1)  # (V, B*T*E)
    for layer in range(graph.n_layers + 1):
        columns = graph.layer_destinations(layer)
        reaching = graph.allowed[:, columns].any(dim=1).nonzero()[:, 0]
        upto = int(reaching.max()) + 1  # sources are in layer order: a prefix
        block = flat_delta[:upto] @ flat_gradient[columns].T  # (U_l, V_l)
        scores[:upto, columns] += block.double().cpu() * graph.allowed[:upto, columns]


def _result(graph, task, method, steps, scores, gap, embed_side, clean, corrupt, path) -> Result:
    # Completeness: the embeddings' edges add up to integrated gradients of the input embeddings, which
    # reaches m(clean) - m(corrupt) as the steps grow (first order only for EAP).
    off = abs(embed_side - gap) / max(abs(gap), 1e-12)
    name = "EAP" if method == "eap" else f"EAP-IG, {steps} steps" + (", edges interpolated" if path == "edges" else "")
    check = (f"the embeddings' edges sum to {embed_side:.4g}; m(clean) − m(corrupt) = {gap:.4g} "
             f"({100 * off:.1f}% apart" + (", first order: no identity holds exactly)" if method == "eap" else
                                          ", integrated gradients' completeness)"))
    return Result(
        f"edge attribution ({name})", scores, ("source", "destination"),
        labels={"source": [node.name for node in graph.sources], "destination": [node.name for node in graph.destinations]},
        check=check, error=float("nan"),
        extra={"method": method, "steps": steps, "path": path, "graph": graph, "allowed": graph.allowed, "task": task.name,
               "pairs": len(task), "dropped": task.dropped, "clean": clean, "corrupt": corrupt, "gap": gap,
               **({"converged": off <= 0.05} if method == "eap-ig" else {}), "view": "grid",
               "legend": "the metric lost when the edge is corrupted",
               "caption": "Each cell: the estimated drop of the metric when the destination's input gets the source's "
                          "corrupted output, averaged over the task's pairs; 0 where no edge runs."},
        about=f"{task.name}, {len(task)} pairs",
    )


def top_edges(result: Result, k: int) -> list[tuple[int, int, float]]:
    """The k allowed edges with the largest |score|: (source index, destination index, score), largest first.
    Raises ValueError when k is not in 1..the number of edges."""
    allowed = result.extra["allowed"]
    count = int(allowed.sum())
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= count:
        raise ValueError(f"k={k!r} edges: choose 1 to {count}, the edges of this model's graph")
    magnitude = torch.where(allowed, result.values.abs(), -1.0)
    order = magnitude.flatten().argsort(descending=True)[:k]
    width = result.values.size(1)
    return [(int(i) // width, int(i) % width, float(result.values.flatten()[i])) for i in order]
