"""A discovered circuit as the circuits floor's Graph, drawn by its one page (circuits/page.py).

Nodes, in topological order: the embeddings; in each layer, each head's q, k and v inputs (ports of the
head's box; a key/value head's inputs on the box of the first query head it serves), each head's
output, the MLP (one node: its input receives, its output sends); the logits. adjacency[t, s] is the
edge's score (rows = targets), for the kept edges only.

circuit_for_page adds what the page needs to let a reader grow the circuit: the top edges up to the
page's limit, the faithfulness curve, the size to open on, and the heads' roles.
"""

from __future__ import annotations

import torch

from ..graph import Graph, Node
from .residual import ResidualGraph

ROLE_PAIRS = 32  # pairs the page's name-mover scores average over: five passes a batch (SmolLM2: ~15 s of CPU)


def circuit_graph(result, kept: torch.Tensor, *, about: str = "", meta: dict | None = None) -> Graph:
    """The Graph of the kept edges [U, V] bool of an edge attribution `result` (edges.attribute_edges)."""
    graph: ResidualGraph = result.extra["graph"]
    kept = kept & graph.allowed
    used_sources = set(kept.any(dim=1).nonzero()[:, 0].tolist())
    used_destinations = set(kept.any(dim=0).nonzero()[:, 0].tolist())
    group = graph.n_heads // graph.n_kv
    nodes: list[Node] = [Node("embedding", -1, 0, label="embeddings")]
    source_at, destination_at = {0: 0}, {}
    mlp_column = graph.n_heads
    for layer in range(graph.n_layers):
        for v, node in enumerate(graph.destinations):
            if node.layer == layer and node.kind in ("q", "k", "v") and v in used_destinations:
                head = node.index if node.kind == "q" else node.index * group
                destination_at[v] = len(nodes)
                nodes.append(Node("head", layer, head, head, node.kind, label=node.name))
        for u, node in enumerate(graph.sources):
            if node.layer == layer and node.kind == "head" and u in used_sources:
                source_at[u] = len(nodes)
                nodes.append(Node("head", layer, node.index, node.index, label=node.name))
        mlp_source = next(u for u, node in enumerate(graph.sources) if node.layer == layer and node.kind == "mlp")
        mlp_destination = next(v for v, node in enumerate(graph.destinations) if node.layer == layer and node.kind == "mlp")
        if mlp_source in used_sources or mlp_destination in used_destinations:
            source_at[mlp_source] = destination_at[mlp_destination] = len(nodes)
            nodes.append(Node("mlp", layer, mlp_column, label=f"L{layer} MLP"))
    destination_at[len(graph.destinations) - 1] = len(nodes)
    nodes.append(Node("logits", graph.n_layers, 0, label="logits"))
    adjacency = torch.zeros(len(nodes), len(nodes), device="cpu")
    for u, v in kept.nonzero().tolist():
        adjacency[destination_at[v], source_at[u]] = float(result.values[u, v])
    columns = [f"H{h}" for h in range(graph.n_heads)] + ["MLP"]
    # No identity holds for a circuit (its faithfulness is measured, faithfulness.py): no check line.
    return Graph(nodes, adjacency, columns, graph.n_layers, kind="circuit", about=about, meta=dict(meta or {}))


def circuit_for_page(model, task, result, curve, *, size: int | None = None, about: str = "", meta: dict | None = None,
                     roles: bool = True) -> Graph:
    """The circuit as the page shows it: the top edges of `result` up to what a page holds (prune.MAX_EDGES),
    with the faithfulness curve (faithfulness.faithfulness's Result), the size the page opens on (`size`,
    default the smallest circuit reaching the curve's target, else every edge) and, with `roles`, each
    head's roles from the detectors (roles.head_roles: name mover, induction, ...; the name movers' scores
    over the task's first ROLE_PAIRS pairs) in its meta."""
    from ..prune import MAX_EDGES
    from .faithfulness import kept_masks
    from .roles import head_roles

    graph: ResidualGraph = result.extra["graph"]
    size = size or curve.extra["smallest"] or graph.edge_count
    held = min(graph.edge_count, max(MAX_EDGES, size))
    meta = dict(meta or {}, size=size, curve={
        "sizes": list(curve.extra["sizes"]), "values": curve.values.tolist(), "target": curve.extra["target"],
        "smallest": curve.extra["smallest"], "edges": graph.edge_count})
    circuit = circuit_graph(result, kept_masks(graph, result, [held])[0], about=about, meta=meta)
    if roles:
        heads = sorted({(node.layer, node.index) for node in circuit.nodes if node.kind == "head"})
        found = head_roles(model, task, heads, pairs=ROLE_PAIRS)["roles"]
        circuit.meta["roles"] = {f"L{layer}H{head}": names for (layer, head), names in found.items() if names}
    return circuit
