"""Pruning by influence, and the scores of a graph: pure functions of its adjacency matrix.

Shape letters: N nodes, B a block of rows, n the nodes a pruning keeps.

Ameisen et al. 2025 ("Circuit Tracing", Appendix: graph pruning) rank nodes by their influence on the
outputs. With Â the row-normalised |A| (each target's inputs as shares of its total input),

    Â[t, s] = |A[t, s]| / sum_s' |A[t, s']|
    influence = w Â + w Â^2 + w Â^3 + ...          w [N]: the outputs' weights (logit probabilities)

the Neumann series of Â: every path from a node to an output, each hop weighted by its share. A graph's
nodes are in topological order (graph.py), so Â is strictly lower triangular and the series is finite;
`influence` sums it exactly in one pass over the rows, as a back-substitution (below), instead of one
pass per path length.

Pruning keeps the fewest nodes that hold `node_threshold` (0.8) of the total influence, then, among the
edges between them, the fewest that hold `edge_threshold` (0.98) of the edge influence (an edge's
share of its target's input times the target's influence), then drops nodes left without an edge out
(or, for a node that receives edges, without one in) until nothing changes. Inputs and outputs stay.
These are circuit-tracer 0.5's `prune_graph` and `compute_graph_scores`, with equal results (tests).

The scores of a graph (same paper):

    replacement  = influence of the tokens / influence of the tokens and the errors
                   (the share of the inputs' effect on the outputs that flows through features)
    completeness = sum_t (1 - Â[t, errors]) (influence_t + w_t) / sum_t (influence_t + w_t)
                   (each node's input not from errors, weighted by how much that node matters)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import checks
from .graph import INPUT_KINDS, OUTPUT_KINDS, SOURCE_KINDS, Graph
from .identity import identity_gaps

BLOCK = 1024  # rows of the adjacency read at a time: no [N, N] temporary is ever made
MAX_EDGES = 50_000  # the strongest edges a page draws and a JSON file holds (anatomy bench: page)


def normalized(rows: torch.Tensor, in_place: bool = False) -> torch.Tensor:
    """[B, N] -> [B, N]: |A[t, s]| / sum_s |A[t, s]|, each row's inputs as shares (a row without input stays 0);
    in_place: in rows' own memory."""
    absolute = rows.abs_() if in_place else rows.abs()
    return absolute.div_(absolute.sum(dim=1, keepdim=True).clamp(min=1e-10))


def neumann_influence(adjacency: torch.Tensor, weights: torch.Tensor, max_terms: int = 1000) -> torch.Tensor:
    """[N]: sum_{k>=1} w Â^k term by term, the definition (for small graphs and for testing `influence`).
    Raises RuntimeError when the series has not ended after max_terms (a graph with a cycle)."""
    normal = normalized(adjacency)
    term = weights @ normal
    total = term.clone()
    for _ in range(max_terms):
        if not term.any():
            return total
        term = term @ normal
        total += term
    raise RuntimeError(f"the influence series did not end after {max_terms} terms: the graph has a cycle")


def influence(adjacency: torch.Tensor, weights: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """[N]: each node's influence on the outputs, sum_{k>=1} w Â^k, for Â strictly lower triangular.

    y = w + influence satisfies y_s = w_s + sum_{t > s} y_t Â[t, s]: a node's weight plus what it passes
    to the later nodes it feeds. Taken in blocks of rows from the last: the rows below a block are final,
    their contributions are added to every earlier column (acc += y_J Â[J, :a]), and inside the block
    y_J (I - Â[J, J]) = w_J + acc_J is a small triangular system."""
    n = adjacency.size(0)
    y = torch.zeros(n, dtype=torch.float32)
    acc = torch.zeros(n, dtype=torch.float32)  # what the processed rows pass to each earlier column
    weights = weights.float()
    for end in range(n, 0, -block):
        start = max(0, end - block)
        rows = normalized(adjacency[start:end, :end].float())  # (B, end): later columns are 0
        inside = rows[:, start:end]  # (B, B), strictly lower triangular
        eye = torch.eye(end - start)
        rhs = (weights[start:end] + acc[start:end])[:, None]  # (B, 1)
        # y_J (I - inside) = rhs^T  <=>  (I - inside)^T y_J^T = rhs: upper triangular
        y[start:end] = torch.linalg.solve_triangular((eye - inside).T, rhs, upper=True).flatten()
        acc[:start] += y[start:end] @ rows[:, :start]
    return y - weights


def error_share(adjacency: torch.Tensor, is_error: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """[N]: each node's share of input from error nodes, sum over errors s of Â[t, s]."""
    shares = torch.zeros(adjacency.size(0))
    for start in range(0, adjacency.size(0), block):
        shares[start:start + block] = normalized(adjacency[start:start + block].float())[:, is_error].sum(dim=1)
    return shares


def find_threshold(scores: torch.Tensor, fraction: float) -> float:
    """The score s such that the scores >= s are the fewest that hold `fraction` of the total (scores >= 0).
    Sorted over the non-zero scores only (zeros add nothing to the total): 0.0 when even all of them do not
    reach the fraction, so that everything is kept, as circuit-tracer's sort over every score gives."""
    positive = scores[scores > 0].flatten()
    if positive.numel() == 0:
        return 0.0
    if positive.device.type == "cpu":  # sorted in place, without the indices torch.sort makes (8 bytes a score)
        positive.numpy().sort()
        ordered = positive.flip(0)
    else:
        ordered = positive.sort(descending=True).values
    cumulative = ordered.cumsum(0) / ordered.sum()
    index = int(torch.searchsorted(cumulative, torch.tensor(fraction, dtype=cumulative.dtype)))
    if index >= ordered.numel():
        return 0.0 if positive.numel() < scores.numel() else float(ordered[-1])
    return float(ordered[index])


@dataclass
class Pruning:
    """What `prune` decided: node_mask [N]; edge_mask [n, n] over the kept nodes (in graph order);
    influence [N] on the outputs; cumulative [N]: the share of the total influence held by the nodes at
    least as influential as each (what Neuronpedia's pages read as 'influence')."""

    node_mask: torch.Tensor
    edge_mask: torch.Tensor
    influence: torch.Tensor
    cumulative: torch.Tensor
    node_threshold: float
    edge_threshold: float
    node_share: float = float("nan")  # the share of the total influence the kept nodes hold
    edge_share: float = float("nan")  # the share of the edge influence (among the nodes kept) the kept edges hold


def check_threshold(name: str, value: float) -> float:
    return checks.number(name, value, low=0.0, high=1.0)


def prune(graph: Graph, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> Pruning:
    """Keep the nodes holding node_threshold of the influence and the edges holding edge_threshold of the
    edge influence, then drop nodes left unconnected (see the module docstring). Raises ValueError for a
    threshold outside [0, 1]."""
    node_threshold = check_threshold("node_threshold", node_threshold)
    edge_threshold = check_threshold("edge_threshold", edge_threshold)
    weights = graph.output_weights.float()
    node_influence = influence(graph.adjacency, weights)
    node_mask = node_influence >= find_threshold(node_influence, node_threshold)
    node_mask |= graph.mask(*INPUT_KINDS, *OUTPUT_KINDS)

    kept = node_mask.nonzero().flatten()
    sub = graph.adjacency[kept[:, None], kept[None, :]].float()  # (n, n): the edges between kept nodes
    present = sub != 0
    sub_influence = neumann_influence(sub, weights[kept]) if len(kept) <= BLOCK else influence(sub, weights[kept])
    # the edge scores Â[t, s] (influence_t + w_t), made in sub's own memory: of a long prompt's graph, n is tens of
    # thousands and each (n, n) matrix gigabytes
    edge_scores = normalized(sub, in_place=True).mul_((sub_influence + weights[kept])[:, None])  # (n, n)
    edge_mask = edge_scores >= find_threshold(edge_scores, edge_threshold)
    edge_mask &= present
    del present

    kinds = [graph.nodes[i].kind for i in kept.tolist()]
    needs_out = torch.tensor([kind not in INPUT_KINDS + OUTPUT_KINDS for kind in kinds])  # features, errors, components
    needs_in = torch.tensor([kind not in SOURCE_KINDS + OUTPUT_KINDS for kind in kinds])  # what edges point into
    alive = torch.ones(len(kept), dtype=torch.bool)
    while True:
        edge_mask &= alive[:, None] & alive[None, :]
        now = alive & ~(needs_out & ~edge_mask.any(dim=0)) & ~(needs_in & ~edge_mask.any(dim=1))
        if torch.equal(now, alive):
            break
        alive = now
    node_mask[kept[~alive]] = False
    edge_share = float(edge_scores[edge_mask].sum() / edge_scores.sum().clamp(min=1e-30))  # edge_mask: alive nodes' only
    edge_mask = edge_mask[alive][:, alive]
    node_share = float(node_influence[node_mask].sum() / node_influence.sum().clamp(min=1e-30))

    ordered, order = node_influence.sort(descending=True)
    cumulative = torch.zeros_like(node_influence)
    cumulative[order] = ordered.cumsum(0) / ordered.sum().clamp(min=1e-30)
    return Pruning(node_mask, edge_mask, node_influence, cumulative, node_threshold, edge_threshold, node_share, edge_share)


def pruned(graph: Graph, node_threshold: float = 0.8, edge_threshold: float = 0.98,
           decision: Pruning | None = None) -> Graph:
    """The pruned graph itself: the kept nodes and edges, with meta["influence"] (each kept node's
    cumulative influence share, in node order) and the thresholds. decision: prune(graph, ...) if already made.

    Its check is its own: the share of the influence its nodes and edges hold and, for a graph whose targets
    have values, the identity on what it keeps (every kept target = its kept edges + what the pruning dropped +
    what no node carries; the dropped edges join its unexplained part, so that values = adjacency.sum(1) +
    unexplained holds on it as on the graph it came from)."""
    decision = decision or prune(graph, node_threshold, edge_threshold)
    n_edges = int(count_edges(graph.adjacency))
    meta = dict(graph.meta, node_threshold=node_threshold, edge_threshold=edge_threshold, pruned=True,
                influence=[round(float(x), 6) for x in decision.cumulative[decision.node_mask]],
                nodes_before=len(graph), edges_before=n_edges)
    small = graph.subgraph(decision.node_mask, decision.edge_mask, meta=meta)
    check = (f"pruned to {len(small):,} of {len(graph):,} nodes and {count_edges(small.adjacency):,} of {n_edges:,} "
             f"edges, holding {decision.node_share:.1%} of the influence on the outputs and {decision.edge_share:.1%} "
             f"of the edge influence")
    error = float("nan")
    if graph.values is not None and graph.unexplained is not None:
        kept = decision.node_mask.nonzero().flatten()
        total, absolute = torch.zeros(len(kept)), torch.zeros(len(kept))  # every edge into each kept node
        for start in range(0, len(kept), BLOCK):
            rows = graph.adjacency[kept[start:start + BLOCK]]  # (B, N)
            total[start:start + BLOCK], absolute[start:start + BLOCK] = rows.sum(1), rows.abs().sum(1)
        small.unexplained = small.unexplained + total - small.adjacency.sum(1)
        differences, terms = identity_gaps(small.adjacency, small.values, small.unexplained)
        targets = ~small.values.isnan()
        share = float((absolute - small.adjacency.abs().sum(1))[targets].sum() / absolute[targets].sum().clamp(min=1e-30))
        error = float((differences / terms.clamp(min=1e-30)).max()) if len(differences) else 0.0
        check += (f"; every target kept = its kept edges + what the pruning dropped ({share:.1%} of their input) + "
                  f"what no node carries: max |diff| {float(differences.max()) if len(differences) else 0.0:.2g}")
    small.check, small.error = check + checks.products_note(graph.meta.get("attention_products", "float32")), error
    return small


def strongest_edges(graph: Graph, limit: int) -> list[tuple[int, int, float]]:
    """(target, source, weight) of the `limit` edges of largest |weight| (every edge when there are fewer),
    strongest first: what a page draws and a JSON file holds of a graph too large to show whole."""
    targets, sources = graph.adjacency.nonzero(as_tuple=True)
    weights = graph.adjacency[targets, sources]
    order = weights.abs().argsort(descending=True, stable=True)[:limit]
    return list(zip(targets[order].tolist(), sources[order].tolist(), weights[order].tolist()))


def count_edges(adjacency: torch.Tensor) -> int:
    """How many entries are non-zero (count_nonzero: no [N, N] temporary)."""
    return int(torch.count_nonzero(adjacency))


def scores(graph: Graph, node_influence: torch.Tensor | None = None) -> tuple[float, float]:
    """(replacement, completeness) of the graph (module docstring); node_influence: influence(graph's adjacency,
    its output weights) if already computed (Pruning.influence). Raises ValueError for a graph without token
    and error nodes, for which neither is defined."""
    is_error, is_token = graph.mask("error"), graph.mask("token")
    if not is_error.any() or not is_token.any():
        raise ValueError("replacement and completeness need token and error nodes (an attribution graph)")
    weights = graph.output_weights.float()
    if node_influence is None:
        node_influence = influence(graph.adjacency, weights)
    token, error = node_influence[is_token].sum(), node_influence[is_error].sum()
    replacement = float(token / (token + error))
    output_influence = node_influence + weights
    completeness = float(((1 - error_share(graph.adjacency, is_error)) * output_influence).sum() / output_influence.sum())
    return replacement, completeness
