"""Why attention moved what a graph's edges say it moved: the attention-mediated edges split by the heads they
cross, and each head's attention score at the position pair that carries it explained by pairs of nodes.

An attribution graph freezes the attention patterns, so an edge from a source at position q to a target at a
later position says that attention moved the source's vector, not why the heads looked there. For the edges a
reader selects (by default the n strongest whose source sits before its target: only attention moves between
positions), this module gives, each from the floors below:

    the heads it passes through, each head's part and share     heads.split_edge: the parts add up to the edge
    the (query, key) position pairs that carry each head's part  (the key is the source's position)
    why each of its strongest heads attended there               qk.qk_attributions: that head's score at that
                                                                 pair as (query-side node, key-side node) terms

    edges = explain_attention(model, transcoders, graph, n=20)   # [AttentionEdge]; graph.meta["attention"] = the record

The record (attention_record) is plain JSON: every writer of a graph reads it (the page, Neuronpedia's
qk_tracing_results, the safetensors file's header).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from .graph import Graph, Node
from .heads import HeadSplit, refuse_post_norm, split_edge
from .qk import QKAttribution, qk_attributions
from .stream import NodeStream


@dataclass
class AttentionEdge:
    """One edge split by head (HeadSplit), and the QK attributions of its strongest heads at their strongest
    position pair: qk {(layer, head): QKAttribution}."""

    split: HeadSplit
    qk: dict = field(default_factory=dict)


def attention_mediated(graph: Graph, n: int, nodes: list[int] | None = None) -> list[tuple[Node, Node]]:
    """(target, source) of the n strongest edges (by |weight|) whose source sits at an earlier position than its
    target: edges only attention can carry (into or out of one of `nodes`, their indices, if given)."""
    targets, sources = graph.adjacency.nonzero(as_tuple=True)
    device = graph.adjacency.device  # the graph's data: the CPU's, wherever the model ran
    columns = torch.tensor([node.column for node in graph.nodes], device=device)
    across = columns[sources] < columns[targets]
    if nodes is not None:
        chosen = torch.zeros(len(graph), dtype=torch.bool, device=device)
        chosen[torch.tensor(nodes, dtype=torch.long, device=device)] = True
        across &= chosen[targets] | chosen[sources]
    targets, sources = targets[across], sources[across]
    weights = graph.adjacency[targets, sources].abs()
    chosen = weights.topk(min(n, len(weights))).indices
    return [(graph.nodes[int(targets[i])], graph.nodes[int(sources[i])]) for i in chosen]


@torch.no_grad()
def explain_attention(model: nn.Module, transcoders, graph: Graph, n: int = 20, *, edges=None, nodes=None,
                      heads: int = 3, top: int = 10, stream: NodeStream | None = None) -> list[AttentionEdge]:
    """Edges of an attribution graph split by head, with the QK attribution of each edge's `heads` largest heads at
    the position pair carrying most of each (top: the pairs and marginals kept); the record is put in
    graph.meta["attention"]. The edges: `edges` ((target, source) nodes or ids) if given, else the n strongest
    attention-mediated ones (attention_mediated), into or out of `nodes` (nodes or ids) if given.
    Raises ValueError for a graph that is not an attribution graph, n or heads below 1 (n may be 0 when edges are
    given), an edge whose target is not a feature or a logit, or a post-norm model (heads.refuse_post_norm: its
    edges have no first moves; qk.qk_attribution still explains its heads' scores); KeyError for a node not in
    the graph."""
    if graph.kind != "attribution graph" or "prompt_ids" not in graph.meta:
        raise ValueError(f"attention is explained on an attribution graph (with its prompt); this is a {graph.kind}")
    refuse_post_norm(model)
    for name, value in (("n", n), ("heads", heads), ("top", top)):
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "n" else 1):
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    chosen = attention_mediated(graph, n, None if nodes is None else [graph.index(node) for node in nodes]) \
        if edges is None else [(graph.nodes[graph.index(t)], graph.nodes[graph.index(s)]) for t, s in edges]
    for target, _ in chosen:
        if target.kind not in ("feature", "logit"):
            raise ValueError(f"an edge's target is a feature or a logit, not a {target.kind}")
    stream = stream or NodeStream(model, transcoders, graph.meta["prompt_ids"], labels=graph.columns)
    result = [AttentionEdge(split_edge(stream, t, s, float(graph.adjacency[graph.index(t), graph.index(s)])))
              for t, s in chosen]
    wanted = {}  # (layer, head, query, key) -> the QK attribution's index: each head and pair explained once
    for edge in result:
        for (layer, head), _ in edge.split.heads(heads):
            (query, key), _ = edge.split.positions(layer, head)[0]
            wanted.setdefault((layer, head, query, key), len(wanted))
    explained = qk_attributions(stream, list(wanted), top)
    for edge in result:
        for (layer, head), _ in edge.split.heads(heads):
            (query, key), _ = edge.split.positions(layer, head)[0]
            edge.qk[(layer, head)] = explained[wanted[(layer, head, query, key)]]
    graph.meta["attention"] = attention_record(result, graph)
    return result


def attention_record(edges: list[AttentionEdge], graph: Graph) -> dict:
    """The plain JSON of explained edges: {"edges": [...], "qk": [...], "nodes": {id: what a reader needs to name it},
    "check": the worst identity of them all} (module docstring). Each edge's heads point into "qk" by index."""
    qk_list: list[QKAttribution] = []
    index: dict[int, int] = {}
    named: dict[str, Node] = {}
    records = []
    for edge in edges:
        split = edge.split
        named.update({split.target.id: split.target, split.source.id: split.source})
        head_records = []
        for (layer, head), part in split.heads():
            qk = edge.qk.get((layer, head))
            if qk is not None and id(qk) not in index:
                index[id(qk)] = len(qk_list)
                qk_list.append(qk)
            head_records.append({
                "layer": layer, "head": head, "part": part, "share": part / split.edge if split.edge else None,
                "pairs": [[query, key, value] for (query, key), value in split.positions(layer, head)[:8]],
                "qk": None if qk is None else index[id(qk)]})
        records.append({
            "target": split.target.id, "source": split.source.id, "edge": split.edge,
            "residual": split.parts.get("residual", 0.0),
            "skips": sum(v for part, v in split.parts.items() if isinstance(part, tuple) and part[1] == "skip"),
            "heads": head_records, "check": split.check, "error": split.error})
    qk_records = []
    for qk in qk_list:
        named.update({node.id: node for pair in qk.pairs for node in pair[:2]})
        named.update({node.id: node for node, _ in qk.query_marginals + qk.key_marginals})
        qk_records.append({
            "layer": qk.layer, "head": qk.head, "kv_head": qk.kv_head, "query": qk.query, "key": qk.key,
            "pattern": qk.pattern, "score": qk.score, "capped": qk.capped, "bias": qk.bias,
            "pairs": [[q.id, k.id, value] for q, k, value in qk.pairs],
            "query_marginals": [[node.id, value] for node, value in qk.query_marginals],
            "key_marginals": [[node.id, value] for node, value in qk.key_marginals],
            "position_pairs": [list(pair) for pair in qk.position_pairs],
            "query_positions": [list(p) for p in qk.query_positions], "key_positions": [list(p) for p in qk.key_positions],
            "no_node": qk.no_node, "pair_total": qk.pair_total, "check": qk.check, "error": qk.error, "notes": qk.notes})
    worst = max([r["error"] for r in records] + [r["error"] for r in qk_records], default=0.0)
    return {"edges": records, "qk": qk_records, "error": worst,
            "check": f"every edge = the sum of its parts, every score = its pair terms + the terms of no node: at most "
                     f"{worst:.2g} of the terms' sizes",
            "nodes": {node_id: {"kind": node.kind, "layer": node.layer, "column": node.column, "index": node.index,
                                "name": node.name, "label": node.label or (graph.columns[node.column] if node.kind == "token" else ""),
                                "value": node.value} for node_id, node in named.items()}}
