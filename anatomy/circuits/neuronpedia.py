"""An attribution graph in Neuronpedia's graph JSON, which its site and circuit-tracer's local server open.

The format (Neuronpedia's graph schema, `apps/webapp/app/api/graph/graph-schema.json`; circuit-tracer's
`create_graph_files`): `metadata` (slug, scan, prompt, prompt_tokens, thresholds), `qParams` (the
saved subgraph: pinned node ids, supernodes), `nodes` and `links` (source, target, weight). Node ids:

    feature   "{layer}_{feature}_{position}"       feature = Cantor pairing of (layer, feature)
    error     "{layer}_-1_{position}"              (circuit-tracer 0.5 wrote "0_{layer}_{position}", the id of
                                                    layer 0's feature number `layer` at that position; its
                                                    upstream has since moved to this one)
    token     "E_{token id}_{position}"
    logit     "{n_layers + 1}_{token id}_{position}"

Only the pruned graph is written (prune.pruned), and of its edges the MAX_EDGES strongest (metadata's
"links" says how many there were): a 19,000-node graph's 100 million edges, or the 2.4 million
a random set's pruned 16-token graph keeps, are no file to open in a browser. Numbers are written to
the precision a float32 graph carries (6 significant digits; its identity holds to about 1e-6 of the
terms it sums).

A graph whose attention was explained (attention_edges.explain_attention, graph.meta["attention"]) carries it in
the schema's `qk_tracing_results` (OpenMOSS's and Neuronpedia's QK tracing, there on attention features): on
each explained edge's target, the QK attribution of the strongest explained edge into it, at its largest head,
as pair_wise_contributors [q id, k id, term], top_q_marginal_contributors and top_k_marginal_contributors [id,
term], with what the schema leaves open said beside them (head, positions, score, the terms of no node, the
check). Contributors pruned out of `nodes` are described in the top-level `qk_only_nodes`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from .. import __version__
from .graph import Graph, Node


DIGITS = 6  # significant digits of a written number: what a float32 graph carries


def rounded(x: float | None, digits: int = DIGITS) -> float | None:
    """x to `digits` significant digits (None for None or a non-finite number)."""
    if x is None or not math.isfinite(x):
        return None
    return float(f"{x:.{digits}g}")


def cantor(x: int, y: int) -> int:
    """(x + y)(x + y + 1)/2 + y: one integer for a pair (layer, feature), as Neuronpedia numbers features."""
    return (x + y) * (x + y + 1) // 2 + y


# Every node carries every field circuit-tracer's `create_graph_files` writes (its frontend/graph_models.py Node),
# in its order, with its defaults: a diff of the two files shows numbers only (and the error ids, above).
NODE_FIELDS = ("node_id", "feature", "layer", "ctx_idx", "feature_type", "token_prob", "is_target_logit", "run_idx",
               "reverse_ctx_idx", "jsNodeId", "clerp", "influence", "activation")
NODE_DEFAULTS = dict(token_prob=0.0, is_target_logit=False, run_idx=0, reverse_ctx_idx=0, clerp="", influence=None,
                     activation=None)


def node_record(node: Node, n_layers: int, influence: float | None, target: bool, clerp: str = "") -> dict:
    """One node as Neuronpedia's schema has it, every field in circuit-tracer's order (NODE_FIELDS); clerp: a
    feature's label. Raises ValueError for a circuit's kinds (head, mlp, ...), which the format has no place
    for."""
    layer, position, index = node.layer, node.column, node.index
    if node.kind == "feature":
        record = dict(node_id=f"{layer}_{index}_{position}", feature=cantor(layer, index), layer=str(layer),
                      feature_type="cross layer transcoder", jsNodeId=f"{layer}_{index}-0", clerp=clerp,
                      activation=rounded(node.value))
    elif node.kind == "error":
        record = dict(node_id=f"{layer}_-1_{position}", feature=-1, layer=str(layer),
                      feature_type="mlp reconstruction error", jsNodeId=f"{layer}_-1-{position}")
    elif node.kind == "token":
        record = dict(node_id=f"E_{index}_{position}", feature=position, layer="E", feature_type="embedding",
                      jsNodeId=f"E_{index}-{position}")
    elif node.kind == "logit":
        probability = rounded(node.value) or 0.0
        record = dict(node_id=f"{n_layers + 1}_{index}_{position}", feature=index, layer=str(n_layers + 1),
                      feature_type="logit", jsNodeId=f"L_{index}-{position}", token_prob=probability,
                      is_target_logit=target, clerp=f'Output "{node.label}" (p={probability:.3f})')
    else:
        raise ValueError(f"Neuronpedia's graph format has tokens, features, errors and logits; not a {node.kind} node")
    record.update(ctx_idx=position, influence=None if node.kind == "logit" else rounded(influence))  # a logit's is no score
    return {key: record.get(key, NODE_DEFAULTS.get(key)) for key in NODE_FIELDS}


def neuronpedia_json(graph: Graph, *, slug: str = "anatomy-graph", scan: str | None = None,
                     node_threshold: float = 0.8, edge_threshold: float = 0.98, pinned: list[str] | None = None,
                     supernodes: list[list[str]] | None = None, labels: dict[str, str] | None = None,
                     max_links: int | None = None) -> dict:
    """The graph as Neuronpedia's JSON (a dict), pruned at the thresholds unless it already is, with its
    max_links strongest edges (default MAX_EDGES). scan: the model (and transcoders) it was made with, as
    Neuronpedia names them (default: the transcoders' scan, or the model's name); labels: {node id: label},
    written as the features' clerp. Raises ValueError for a circuit (heads, MLPs), which the format cannot
    hold."""
    from .prune import MAX_EDGES, count_edges, pruned, strongest_edges

    if graph.kind != "attribution graph":
        raise ValueError(f"Neuronpedia's format holds attribution graphs; this is a {graph.kind} (write .html or .safetensors)")
    if not graph.meta.get("pruned"):
        graph = pruned(graph, node_threshold, edge_threshold)
    node_threshold = graph.meta.get("node_threshold", node_threshold)
    edge_threshold = graph.meta.get("edge_threshold", edge_threshold)
    influence = graph.meta.get("influence") or [None] * len(graph)
    first_logit = next((i for i, node in enumerate(graph.nodes) if node.kind == "logit"), None)
    labels = labels or {}
    records = [node_record(node, graph.n_layers, influence[i], i == first_logit, labels.get(node.id, ""))
               for i, node in enumerate(graph.nodes)]
    max_links = MAX_EDGES if max_links is None else max_links
    links = [{"source": records[s]["node_id"], "target": records[t]["node_id"], "weight": rounded(weight)}
             for t, s, weight in strongest_edges(graph, max_links)]
    meta = graph.meta
    transcoders = meta.get("transcoders") or {}
    scan = scan or transcoders.get("scan") or meta.get("model") or "anatomy"
    metadata = {
        "slug": slug, "scan": str(scan), "transcoder_list": [],
        "prompt_tokens": list(meta.get("prompt_texts") or graph.columns), "prompt": meta.get("prompt", ""),
        "node_threshold": node_threshold, "schema_version": 1,
        "info": {"generator": {"name": "anatomy", "version": __version__}},
        "generation_settings": {"max_n_logits": meta.get("max_logits"), "desired_logit_prob": meta.get("logit_probability"),
                                "max_feature_nodes": meta.get("max_feature_nodes")},
        "pruning_settings": {"node_threshold": node_threshold, "edge_threshold": edge_threshold},
        "links": {"max": max_links, "in_graph": count_edges(graph.adjacency)},  # anatomy's own, after circuit-tracer's keys
    }
    metadata["generation_settings"] = {k: v for k, v in metadata["generation_settings"].items() if v is not None}
    q_params = {"pinnedIds": list(pinned or []), "supernodes": [list(s) for s in supernodes or []],
                "linkType": "both", "clickedId": "", "sg_pos": ""}
    data = {"metadata": metadata, "qParams": q_params, "nodes": records, "links": links}
    qk_only = add_qk_tracing(graph, records)
    if qk_only:
        data["qk_only_nodes"] = qk_only
    return data


def save_neuronpedia(graph: Graph, path: str | Path, **options) -> Path:
    """Write neuronpedia_json(graph, **options) to path (atomically), slug from the file's name unless given,
    and list it in graph-metadata.json beside it (kept, one entry per slug), as circuit-tracer's
    create_graph_files does: that folder is what its local server shows (`circuit_tracer start-server
    --graph_file_dir FOLDER`)."""
    from ..viz.html import json_text, write_atomically

    path = Path(path)
    options.setdefault("slug", path.stem or "anatomy-graph")
    data = neuronpedia_json(graph, **options)
    written = write_atomically(path, json_text(data, ensure_ascii=False, separators=(",", ":")))
    listing = path.parent / "graph-metadata.json"
    graphs = [entry for entry in listed_graphs(listing) if entry.get("slug") != data["metadata"]["slug"]]
    write_atomically(listing, json_text({"graphs": graphs + [data["metadata"]]}, ensure_ascii=False, indent=1))
    return written


MAX_LISTING_BYTES = 16 << 20  # a listing of graphs: a kilobyte of metadata each


def listed_graphs(listing: Path) -> list[dict]:
    """The entries of a graph-metadata.json that this writer can keep; [] for a file it cannot read (too large,
    not UTF-8, not JSON, nested past reading, of another shape), which it then replaces."""
    try:
        if not listing.is_file() or listing.stat().st_size > MAX_LISTING_BYTES:
            return []
        graphs = json.loads(listing.read_text(encoding="utf-8")).get("graphs", [])
    except (OSError, ValueError, AttributeError, RecursionError):
        return []
    return [entry for entry in graphs if isinstance(entry, dict)] if isinstance(graphs, list) else []


def add_qk_tracing(graph: Graph, records: list[dict]) -> dict:
    """Put `qk_tracing_results` on the records of the explained edges' targets (module docstring); returns
    {node_id: descriptor} of the contributors that are not nodes of the graph (the schema's qk_only_nodes)."""
    attention = graph.meta.get("attention")
    if not attention:
        return {}
    row = {node.id: i for i, node in enumerate(graph.nodes)}
    only: dict[str, dict] = {}

    def neuronpedia_id(node_id: str) -> str:
        if node_id in row:
            return records[row[node_id]]["node_id"]
        n = attention["nodes"][node_id]
        record = node_record(Node(n["kind"], n["layer"], n["column"], n["index"], label=n["label"], value=n["value"]),
                             graph.n_layers, None, False)
        record["clerp"] = record["clerp"] or n["name"]
        only.setdefault(record["node_id"], {key: record.get(key) for key in QK_ONLY_FIELDS})
        return record["node_id"]

    done = set()
    for edge in sorted(attention["edges"], key=lambda e: -abs(e["edge"])):
        head = next((h for h in edge["heads"] if h["qk"] is not None), None)
        if edge["target"] in done or edge["target"] not in row or head is None:
            continue
        done.add(edge["target"])
        qk = attention["qk"][head["qk"]]
        records[row[edge["target"]]]["qk_tracing_results"] = {
            "pair_wise_contributors": [[neuronpedia_id(q), neuronpedia_id(k), value] for q, k, value in qk["pairs"]],
            "top_q_marginal_contributors": [[neuronpedia_id(i), value] for i, value in qk["query_marginals"]],
            "top_k_marginal_contributors": [[neuronpedia_id(i), value] for i, value in qk["key_marginals"]],
            "head": f"L{qk['layer']} H{qk['head']}", "query_position": qk["query"], "key_position": qk["key"],
            "source": neuronpedia_id(edge["source"]), "share": head["share"], "score": qk["score"],
            "capped_score": qk["capped"], "no_node": qk["no_node"], "check": qk["check"]}
    return only


QK_ONLY_FIELDS = ("node_id", "feature", "layer", "ctx_idx", "feature_type", "jsNodeId", "clerp", "activation")
