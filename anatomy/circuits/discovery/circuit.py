"""A discovered circuit as the circuits floor's Graph, drawn by its one page (circuits/page.py).

Nodes, in topological order: the embeddings; in each layer, each head's q, k and v inputs (ports of the
head's box; a key/value head's inputs on the box of the first query head it serves), each head's
output, the MLP (one node: its input receives, its output sends); the logits. adjacency[t, s] is the
edge's score (rows = targets), for the kept edges only.
"""

from __future__ import annotations

import torch

from ..graph import Graph, Node
from .residual import ResidualGraph


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
    adjacency = torch.zeros(len(nodes), len(nodes))
    for u, v in kept.nonzero().tolist():
        adjacency[destination_at[v], source_at[u]] = float(result.values[u, v])
    columns = [f"H{h}" for h in range(graph.n_heads)] + ["MLP"]
    # No identity holds for a circuit (its faithfulness is measured, faithfulness.py): no check line.
    return Graph(nodes, adjacency, columns, graph.n_layers, kind="circuit", about=about, meta=dict(meta or {}))
