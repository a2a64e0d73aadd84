"""The graph page: any Graph (an attribution graph, a discovered circuit) as one offline HTML file.

Shape letters: N nodes of the graph shown, M edges.

The page is viz's page shell (a Content-Security-Policy that allows no request, every label set as text)
with this floor's graph.js. It draws what the library computed and nothing else:

    layout    one row per layer (inputs at the bottom, outputs at the top), one column per position (an
              attribution graph) or per component slot (a circuit); the tokens as text under their columns
    edges     one curve per edge, blue for a positive effect and red for a negative one, as wide as |weight|
    a node    on hover, its edges; on click, its numbers: value, influence, its strongest inputs and outputs,
              and for a feature the tokens its decoder direction promotes and suppresses and, when given,
              its top contexts
    subgraph  pinned nodes, drawn apart with the edges between them; pinned nodes grouped into supernodes
              (their edges summed)
    export    the graph as JSON (Neuronpedia's format for an attribution graph, with the pinned nodes and
              supernodes in its qParams) and the drawing as PNG

An attribution graph is drawn pruned (prune.pruned) unless it already is; a circuit as it is given.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from importlib import resources
from string import Template

import torch

from ..checkpoints.token_text import legend_for
from ..viz.html import View, asset, page, script_json
from .graph import Graph

ASSETS = resources.files("anatomy.circuits") / "assets"
RELATIVE_TOLERANCE = 1e-4  # the graph's identity holds when its difference is within this share of its terms
MAX_EDGES = 10_000  # edges a page draws at most, the strongest: a browser draws that many curves in about a second


def rounded(x: float | None, digits: int = 6) -> float | None:
    """x to `digits` significant digits (None for None or a non-finite number)."""
    if x is None or not math.isfinite(x):
        return None
    return float(f"{x:.{digits}g}")


@dataclass
class FeatureDetails:
    """What the page shows for a feature node beyond its numbers, keyed by node id (Node.id):
    promoted / suppressed: [(token text, logit)] its decoder direction's direct effect on the logits;
    contexts: [{"tokens": [...], "acts": [...]}] where it fires hardest on a corpus (token texts, and the
    feature's activation on each)."""

    promoted: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    suppressed: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    contexts: dict[str, list[dict]] = field(default_factory=dict)

    def payload(self, graph: Graph) -> dict:
        """{node index in `graph`: its details}, for the nodes of `graph` that have any."""
        keys = (set(self.promoted) | set(self.suppressed) | set(self.contexts)) & {node.id for node in graph.nodes}
        return {str(graph.index(key)): {
            "promoted": [[t, rounded(v, 4)] for t, v in self.promoted.get(key, [])],
            "suppressed": [[t, rounded(v, 4)] for t, v in self.suppressed.get(key, [])],
            "contexts": [{"tokens": c["tokens"], "acts": [rounded(a, 4) for a in c["acts"]]} for c in self.contexts.get(key, [])],
        } for key in sorted(keys, key=graph.index)}


def shown_graph(graph: Graph, prune: bool | None = None, node_threshold: float = 0.8,
                edge_threshold: float = 0.98) -> Graph:
    """The graph the page draws: pruned when `prune` says so (None: an attribution graph not yet pruned)."""
    from .prune import pruned

    if prune is None:
        prune = graph.kind == "attribution graph" and not graph.meta.get("pruned")
    return pruned(graph, node_threshold, edge_threshold) if prune else graph


def strongest_edges(graph: Graph, limit: int) -> list[tuple[int, int, float]]:
    """(target, source, weight) of the `limit` edges of largest |weight|, in row order."""
    targets, sources = graph.adjacency.nonzero(as_tuple=True)
    weights = graph.adjacency[targets, sources]
    if len(weights) > limit:
        kept = weights.abs().topk(limit).indices.sort().values
        targets, sources, weights = targets[kept], sources[kept], weights[kept]
    return list(zip(targets.tolist(), sources.tolist(), weights.tolist()))


def graph_payload(graph: Graph, details: FeatureDetails | None = None, scores: tuple[float, float] | None = None,
                  intervention=None, max_edges: int = MAX_EDGES) -> dict:
    """The page's data: nodes, edges [target, source, weight] (indices into nodes; the max_edges strongest),
    the columns' labels, the identity line and the scores; every number rounded to 6 significant digits."""
    from .neuronpedia import neuronpedia_json

    influence = graph.meta.get("influence") or [None] * len(graph)
    nodes = [{"id": node.id, "kind": node.kind, "layer": node.layer, "column": node.column, "index": node.index,
              "port": node.port, "label": node.label, "name": node.name, "value": rounded(node.value),
              "influence": rounded(influence[i])} for i, node in enumerate(graph.nodes)]
    edges = [[t, s, rounded(w)] for t, s, w in strongest_edges(graph, max_edges)]
    neuronpedia = None
    if graph.kind == "attribution graph":
        neuronpedia = neuronpedia_json(graph, slug=graph.meta.get("slug", "anatomy-graph"))
        neuronpedia.pop("links")  # the page rebuilds them from its edges, with what the reader pinned
    check_ok = math.isfinite(graph.error) and graph.error <= RELATIVE_TOLERANCE if graph.check else None
    return {
        "view": "graph", "kind": graph.kind, "columns": graph.columns, "nLayers": graph.n_layers,
        "tokenLegend": legend_for(graph.columns), "nodes": nodes, "edges": edges,
        "check": graph.check, "checkOk": check_ok, "logits": graph.meta.get("logits"),
        "scores": None if scores is None else {"replacement": rounded(scores[0], 4), "completeness": rounded(scores[1], 4)},
        "details": details.payload(graph) if details else {},
        "neuronpedia": neuronpedia,
        "thresholds": {k: graph.meta[k] for k in ("node_threshold", "edge_threshold") if k in graph.meta},
        "counts": {k: graph.meta[k] for k in ("nodes_before", "edges_before") if k in graph.meta},
        "edgesInGraph": int(torch.count_nonzero(graph.adjacency)),
        "intervention": None if intervention is None else {
            "freeze": intervention.freeze, "changes": [str(c) for c in intervention.changes],
            "unseen": [str(c) for c in intervention.unseen],
            "rows": [{k: (rounded(v, 4) if isinstance(v, float) else v) for k, v in row.items()} for row in intervention.rows()]},
    }



def render(payload: dict, title: str, subtitle: str) -> str:
    """The whole HTML document for a graph payload."""
    logits = payload.get("logits")
    body = Template((ASSETS / "graph.html").read_text(encoding="utf-8")).substitute(
        title=html.escape(title), subtitle=html.escape(subtitle), data=script_json(payload),
        logits="" if not logits else f'<p class="note" id="logits-line">{html.escape(logits[0].upper() + logits[1:])}.</p>')
    script = "\n".join([asset("common.js")] + [(ASSETS / name).read_text(encoding="utf-8")
                                                 for name in ("graph-draw.js", "graph.js")])
    style = asset("view.css") + "\n" + (ASSETS / "graph.css").read_text(encoding="utf-8")
    return page(title, body, style=style, script=script, body_class="view-graph")


def graph_view(graph: Graph, *, prune: bool | None = None, node_threshold: float = 0.8, edge_threshold: float = 0.98,
               details: FeatureDetails | None = None, scores: tuple[float, float] | None = None,
               intervention=None, title: str | None = None) -> View:
    """The page of `graph` as a viz View (`.save("graph.html")`, shown in Jupyter). details: what to show
    for its feature nodes (FeatureDetails, by node id);
    scores: (replacement, completeness) to show (prune.scores of the unpruned graph); intervention: an
    interventions.InterventionResult to show beside the graph's predictions."""
    shown = shown_graph(graph, prune, node_threshold, edge_threshold)
    payload = graph_payload(shown, details, scores, intervention)
    title = title or ("Attribution graph" if graph.kind == "attribution graph" else "Circuit")
    in_graph = payload["edgesInGraph"]
    counts = f"{len(shown)} nodes, {in_graph:,} edges" + (
        f" (the {len(payload['edges']):,} strongest drawn)" if len(payload["edges"]) < in_graph else "")
    if "nodes_before" in shown.meta:
        counts += f" (pruned from {shown.meta['nodes_before']:,} nodes and {shown.meta['edges_before']:,} edges)"
    subtitle = f"{graph.about}: {counts}" if graph.about else counts
    return View("graph", render(payload, title, subtitle), height=820)
