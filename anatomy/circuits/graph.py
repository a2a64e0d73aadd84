"""A graph as plain data: a list of nodes and one adjacency matrix, rows = targets, columns = sources.

Shape letters: N nodes.

An attribution graph (Ameisen et al. 2025, "Circuit Tracing: Revealing Computational Graphs in Language
Models") explains one output of one prompt as a sum of direct effects between nodes of a local
replacement model; a discovered circuit (edge attribution patching over a dataset) explains a metric
by the same kind of graph over the model's components. Both are this one type, drawn by one page:

    adjacency[t, s]   the direct effect of node s on node t, signed (0: no edge)

For an attribution graph every target's value (a feature's pre-activation, a logit) is the sum of its
row plus what no node carries (biases, the first position): `graph.check` says by how much that holds.

Node kinds, and where the page lays them out (row = layer, column = a position or a component's slot):

    token       an input token, its embedding          layer -1, column = position, index = token id
    feature     a transcoder feature active there      layer L, column = position, index = feature
    error       what the transcoders miss there        layer L, column = position
    logit       an output token                        layer n_layers, column = last position, index = token id
    embedding   the embeddings (a circuit's input)     layer -1
    head        an attention head                      layer L, index = head; port "q", "k" or "v" for an input
    mlp         an MLP                                 layer L
    logits      the output a circuit explains          layer n_layers

A node with a port is one input of the component drawn as one box (an edge into a head's query, key
or value input): its edges are labelled with the port. Nodes are in topological order: every edge
goes from an earlier node to a later one, so the adjacency is strictly lower triangular, which the
pruning (prune.py) relies on and the constructor checks.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

INPUT_KINDS = ("token", "embedding")
OUTPUT_KINDS = ("logit", "logits")
SOURCE_KINDS = INPUT_KINDS + ("error",)  # nodes no edge points into
KINDS = ("token", "feature", "error", "logit", "embedding", "head", "mlp", "logits")
PORTS = ("", "q", "k", "v")


@dataclass(frozen=True)
class Node:
    """One node: what it is (kind), where it is drawn (layer, column), which one (index), and, for one
    input of a component, which (port). label: its text (a token, a component's name); value: a
    feature's activation, a logit's probability (None where there is none)."""

    kind: str
    layer: int
    column: int
    index: int = -1
    port: str = ""
    label: str = ""
    value: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"node kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.port not in PORTS:
            raise ValueError(f"node port {self.port!r} is not one of {', '.join(map(repr, PORTS))}")
        for name in ("layer", "column", "index"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"node {name} must be an integer, got {value!r}")

    @property
    def id(self) -> str:
        """Unique in a graph: kind, layer, column, index and port all take part (an error node can never
        share a feature's id, as circuit-tracer 0.5's error ids did)."""
        port = f".{self.port}" if self.port else ""
        return f"{self.kind}:{self.layer}:{self.column}:{self.index}{port}"

    @property
    def name(self) -> str:
        """What a reader calls it: 'L12 #345 @3', 'error L12 @3', '␣the @3' (a token at position 3), '␣Paris',
        'L4 H2 (q)'."""
        if self.kind == "token":
            return f"{self.label or self.index} @{self.column}"
        if self.kind == "feature":
            return f"L{self.layer} #{self.index} @{self.column}"
        if self.kind == "error":
            return f"error L{self.layer} @{self.column}"
        if self.kind == "head":
            return f"L{self.layer} H{self.index}" + (f" ({self.port})" if self.port else "")
        if self.kind == "mlp":
            return f"MLP {self.layer}"
        return self.label or self.kind


@dataclass
class Graph:
    """nodes [N] and adjacency [N, N] (rows = targets, columns = sources), with what the page and the
    pruning need to read them.

    columns: the label of each layout column (the prompt's tokens as text, or the components' slots);
    n_layers: layers between the inputs (layer -1) and the outputs (layer n_layers); output_weights [N]:
    how much each output node counts in influence (the logits' probabilities; default 1 on every output);
    kind: "attribution graph" or "circuit"; about: what was explained, in words; meta: anything else a
    file should keep (model, prompt, transcoders, scores); check/error: the identity the graph satisfies
    and the measured difference; values [N]: each target's value (a feature's pre-activation, a logit;
    NaN for a source), unexplained [N]: what no node carries of it, so that values = adjacency.sum(1) +
    unexplained on the targets. Raises ValueError for inconsistent sizes, duplicate node ids, or an
    edge that points backwards in the node order.
    """

    nodes: list[Node]
    adjacency: torch.Tensor
    columns: list[str]
    n_layers: int
    output_weights: torch.Tensor | None = None
    kind: str = "attribution graph"
    about: str = ""
    meta: dict = field(default_factory=dict)
    check: str = ""
    error: float = float("nan")
    values: torch.Tensor | None = None
    unexplained: torch.Tensor | None = None

    def __post_init__(self) -> None:
        n = len(self.nodes)
        if tuple(self.adjacency.shape) != (n, n):
            raise ValueError(f"the adjacency must be [{n}, {n}] for {n} nodes, got {tuple(self.adjacency.shape)}")
        ids = [node.id for node in self.nodes]
        if len(set(ids)) != n:
            twice = sorted(node_id for node_id, count in Counter(ids).items() if count > 1)
            raise ValueError(f"node ids must be unique; repeated: {', '.join(twice[:5])}")
        self._index = {node_id: i for i, node_id in enumerate(ids)}
        if self.output_weights is None:
            self.output_weights = torch.tensor([float(node.kind in OUTPUT_KINDS) for node in self.nodes],
                                               device=self.adjacency.device)
        for name in ("output_weights", "values", "unexplained"):
            vector = getattr(self, name)
            if vector is not None and tuple(vector.shape) != (n,):
                raise ValueError(f"{name} must be [{n}], got {tuple(vector.shape)}")
        backwards = first_backward_edge(self.adjacency)
        if backwards is not None:
            t, s = backwards
            raise ValueError(f"nodes must be in topological order (every edge from an earlier node to a later one), "
                             f"but {self.nodes[t].name} (node {t}) receives an edge from {self.nodes[s].name} "
                             f"(node {s}), which is not earlier")

    # ---- reading -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.nodes)

    def index(self, node: Node | str) -> int:
        """The row/column of a node (or of a node id). KeyError names a few ids when absent."""
        node_id = node.id if isinstance(node, Node) else node
        if node_id not in self._index:
            raise KeyError(f"no node {node_id!r} in this graph of {len(self)} nodes, e.g. {', '.join(list(self._index)[:4])}")
        return self._index[node_id]

    def mask(self, *kinds: str) -> torch.Tensor:
        """[N] bool: the nodes of these kinds."""
        return torch.tensor([node.kind in kinds for node in self.nodes], dtype=torch.bool, device=self.adjacency.device)

    def edges(self) -> list[tuple[int, int, float]]:
        """Every non-zero edge as (target, source, weight), in row order."""
        targets, sources = self.adjacency.nonzero(as_tuple=True)
        return list(zip(targets.tolist(), sources.tolist(), self.adjacency[targets, sources].tolist()))

    def subgraph(self, keep: torch.Tensor, edge_mask: torch.Tensor | None = None, **changes) -> "Graph":
        """The graph of the nodes where keep [N] is True (their order kept), with only the edges where
        edge_mask [n, n] (over the kept nodes) is True, if given."""
        kept = keep.nonzero().flatten()
        adjacency = self.adjacency[kept[:, None], kept[None, :]]  # (n, n), with no [n, N] on the way
        if edge_mask is not None:
            adjacency = adjacency * edge_mask
        vectors = {name: None if getattr(self, name) is None else getattr(self, name)[kept]
                   for name in ("output_weights", "values", "unexplained")}
        return replace(self, nodes=[self.nodes[i] for i in kept.tolist()], adjacency=adjacency, **vectors, **changes)

    def __repr__(self) -> str:
        counts = {kind: sum(node.kind == kind for node in self.nodes) for kind in KINDS}
        shown = ", ".join(f"{count} {kind}{'s' if count != 1 else ''}" for kind, count in counts.items() if count)
        n_edges = int(torch.count_nonzero(self.adjacency))
        return f"<{self.kind}: {shown}; {n_edges:,} edges" + (f"; {self.check}" if self.check else "") + ">"


def first_backward_edge(adjacency: torch.Tensor, block: int = 2048) -> tuple[int, int] | None:
    """(target, source) of an edge on or above the diagonal, or None when the adjacency is strictly lower
    triangular; read in blocks of rows, so that no [N, N] temporary is made."""
    n = adjacency.size(0)
    for start in range(0, n, block):
        upper = adjacency[start:start + block, start:].triu()  # (b, N - start): column >= row, not allowed
        if upper.any():
            t, s = upper.nonzero()[0].tolist()
            return start + t, start + s
    return None
