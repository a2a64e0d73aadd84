"""The graph page: any Graph (an attribution graph, a discovered circuit) as one offline HTML file.

Shape letters: N nodes of the graph shown, M edges.

The page is viz's page shell (a Content-Security-Policy that allows no request, every label set as text)
with this floor's scripts (SCRIPTS). It draws what the library computed and nothing else:

    layout    one row per layer (inputs at the bottom, outputs at the top), one column per position (an
              attribution graph) or per component slot (a circuit), each as wide as the nodes it holds,
              packed so that the whole graph fits the window as it opens (graph-layout.js); zoom and pan,
              the layer names and the tokens in bands that stay in view (graph-draw.js, one canvas)
    edges     the MAX_EDGES strongest, blue for a positive effect and red for a negative one, as wide
              as |weight|
    a node    a click selects it: its edges lit, the rest faded, until another click or Escape; the
              arrows walk to its neighbours. Its panel (graph-panel.js): value, influence, its strongest
              inputs (a head's by port: a head is one box) and outputs, and for a feature the tokens its
              decoder direction promotes and suppresses, its top contexts when given, and its label
    a circuit the smallest circuit reaching the target at open, a slider over the curve's sizes to grow
              it, the faithfulness curve beside it, the heads' roles as badges (graph-circuit.js)
    attention a selected node's explained edges (attention_edges.py's record): each edge's heads, a head's
              QK attribution, the marks on its inputs that have one (graph-qk.js)
    subgraph  pinned nodes, drawn apart by the same renderer; pinned nodes grouped into supernodes
              (their edges summed)
    export    the graph as JSON (Neuronpedia's format for an attribution graph, with the pinned nodes and
              supernodes in its qParams and the labels as clerps) and the drawing as PNG

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
from .neuronpedia import neuronpedia_json, rounded
from .prune import MAX_EDGES, strongest_edges

ASSETS = resources.files("anatomy.circuits") / "assets"
SCRIPTS = ("graph-layout.js", "graph-draw.js", "graph-panel.js", "graph-circuit.js", "graph-qk.js", "graph.js")
STYLES = ("graph.css", "graph-qk.css")
RELATIVE_TOLERANCE = 1e-4  # the graph's identity holds when its difference is within this share of its terms


@dataclass
class FeatureDetails:
    """What the page shows for a feature node beyond its numbers, keyed by node id (Node.id):
    promoted / suppressed: [(token, logit)] its decoder direction's direct effect on the logits (centred);
    contexts: [{"tokens": [...], "acts": [...], "peak": k}] where it fires hardest on a corpus (the tokens,
    the feature's activation on each, the position of the highest); labels: a short label (the page's
    and the JSON's clerp); scanned: how many tokens the contexts were found in, source: where, seconds:
    the time budget they were found within."""

    promoted: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    suppressed: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    contexts: dict[str, list[dict]] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    scanned: int | None = None
    source: str = ""
    seconds: float | None = None

    def payload(self, graph: Graph) -> dict:
        """{node index in `graph`: its details}, for the nodes of `graph` that have any."""
        keys = (set(self.promoted) | set(self.suppressed) | set(self.contexts) | set(self.labels)) & \
            {node.id for node in graph.nodes}
        return {str(graph.index(key)): {
            "promoted": [[t, rounded(v, 4)] for t, v in self.promoted.get(key, [])],
            "suppressed": [[t, rounded(v, 4)] for t, v in self.suppressed.get(key, [])],
            "contexts": [{"tokens": c["tokens"], "acts": [rounded(a, 4) for a in c["acts"]], "peak": c["peak"]}
                         for c in self.contexts.get(key, [])],
            "label": self.labels.get(key, ""),
        } for key in sorted(keys, key=graph.index)}

    def note(self) -> str | None:
        """Where the contexts come from, in words (None without contexts)."""
        if self.scanned is None:
            return None
        return (f"Top contexts from {self.scanned:,} tokens" + (f" of {self.source}" if self.source else "")
                + (f" (a budget of {self.seconds:g} s)" if self.seconds is not None else "") + ".")


def shown_graph(graph: Graph, prune: bool | None = None, node_threshold: float = 0.8,
                edge_threshold: float = 0.98) -> Graph:
    """The graph the page draws: pruned when `prune` says so (None: an attribution graph not yet pruned)."""
    from .prune import pruned

    if prune is None:
        prune = graph.kind == "attribution graph" and not graph.meta.get("pruned")
    return pruned(graph, node_threshold, edge_threshold) if prune else graph


def node_payload(graph: Graph) -> list[dict]:
    """The nodes as the page reads them; a head's roles (graph.meta["roles"], by "L{layer}H{head}") on it."""
    influence = graph.meta.get("influence") or [None] * len(graph)
    roles = graph.meta.get("roles") or {}
    nodes = []
    for i, node in enumerate(graph.nodes):
        record = {"id": node.id, "kind": node.kind, "layer": node.layer, "column": node.column, "index": node.index,
                  "port": node.port, "label": node.label, "name": node.name, "value": rounded(node.value),
                  "influence": rounded(influence[i])}
        if node.kind == "head" and roles.get(f"L{node.layer}H{node.index}"):
            record["roles"] = list(roles[f"L{node.layer}H{node.index}"])
        nodes.append(record)
    return nodes


def circuit_payload(graph: Graph) -> dict | None:
    """A discovered circuit's faithfulness curve and the size the page opens on (graph.meta "curve", "size"):
    the page's slider grows the circuit by the curve's sizes; None for a graph without one."""
    curve = graph.meta.get("curve")
    if not curve:
        return None
    return {"sizes": list(curve["sizes"]), "values": [rounded(v, 4) for v in curve["values"]],
            "target": curve["target"], "smallest": curve.get("smallest"), "size": graph.meta.get("size"),
            "edges": curve.get("edges")}


def graph_payload(graph: Graph, details: FeatureDetails | None = None, scores: tuple[float, float] | None = None,
                  intervention=None, max_edges: int = MAX_EDGES) -> dict:
    """The page's data: nodes, edges [target, source, weight] (indices into nodes; the max_edges strongest,
    strongest first), the columns' labels, the identity line and the scores; numbers to 6 significant digits."""
    edges = [[t, s, rounded(w)] for t, s, w in strongest_edges(graph, max_edges)]
    neuronpedia = None
    if graph.kind == "attribution graph":
        neuronpedia = neuronpedia_json(graph, slug=graph.meta.get("slug", "anatomy-graph"),
                                       labels=details.labels if details else None, max_links=0)
        neuronpedia.pop("links")  # the page rebuilds them from its edges, with what the reader pinned
    check_ok = math.isfinite(graph.error) and graph.error <= RELATIVE_TOLERANCE if graph.check else None
    return {
        "view": "graph", "kind": graph.kind, "columns": graph.columns, "nLayers": graph.n_layers,
        "tokenLegend": legend_for(graph.columns), "nodes": node_payload(graph), "edges": edges,
        "check": graph.check, "checkOk": check_ok, "logits": graph.meta.get("logits"),
        "scores": None if scores is None else {"replacement": rounded(scores[0], 4), "completeness": rounded(scores[1], 4)},
        "details": details.payload(graph) if details else {},
        "contextsNote": details.note() if details else None,
        "neuronpedia": neuronpedia,
        "circuit": circuit_payload(graph),
        "thresholds": {k: graph.meta[k] for k in ("node_threshold", "edge_threshold") if k in graph.meta},
        "counts": {k: graph.meta[k] for k in ("nodes_before", "edges_before") if k in graph.meta},
        "edgesInGraph": int(torch.count_nonzero(graph.adjacency)),
        "attention": graph.meta.get("attention"),  # attention_edges.explain_attention's record, if made
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
    script = "\n".join([asset("common.js")] + [(ASSETS / name).read_text(encoding="utf-8") for name in SCRIPTS])
    style = "\n".join([asset("view.css")] + [(ASSETS / name).read_text(encoding="utf-8") for name in STYLES])
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
        f" (the {len(payload['edges']):,} strongest on the page)" if len(payload["edges"]) < in_graph else "")
    if payload["circuit"]:
        counts = f"the page holds its top {len(payload['edges']):,} edges, between {len(shown)} nodes"
    if "nodes_before" in shown.meta:
        counts += f" (pruned from {shown.meta['nodes_before']:,} nodes and {shown.meta['edges_before']:,} edges)"
    subtitle = f"{graph.about}: {counts}" if graph.about else counts
    return View("graph", render(payload, title, subtitle), height=820)
