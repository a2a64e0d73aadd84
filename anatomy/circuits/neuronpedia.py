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

Only the pruned graph is written (prune.pruned): a 19,000-node graph's 100 million edges are no file
to open in a browser.
"""

from __future__ import annotations

import json
from pathlib import Path

from .. import __version__
from .graph import Graph, Node


def cantor(x: int, y: int) -> int:
    """(x + y)(x + y + 1)/2 + y: one integer for a pair (layer, feature), as Neuronpedia numbers features."""
    return (x + y) * (x + y + 1) // 2 + y


def node_record(node: Node, n_layers: int, influence: float | None, target: bool) -> dict:
    """One node as Neuronpedia's schema has it. Raises ValueError for a circuit's kinds (head, mlp, ...),
    which the format has no place for."""
    layer, position, index = node.layer, node.column, node.index
    if node.kind == "feature":
        record = dict(node_id=f"{layer}_{index}_{position}", feature=cantor(layer, index), layer=str(layer),
                      feature_type="cross layer transcoder", jsNodeId=f"{layer}_{index}-0", clerp="",
                      activation=node.value)
    elif node.kind == "error":
        record = dict(node_id=f"{layer}_-1_{position}", feature=-1, layer=str(layer),
                      feature_type="mlp reconstruction error", jsNodeId=f"{layer}_-1-{position}", clerp="")
    elif node.kind == "token":
        record = dict(node_id=f"E_{index}_{position}", feature=position, layer="E", feature_type="embedding",
                      jsNodeId=f"E_{index}-{position}", clerp="")
    elif node.kind == "logit":
        probability = node.value or 0.0
        record = dict(node_id=f"{n_layers + 1}_{index}_{position}", feature=index, layer=str(n_layers + 1),
                      feature_type="logit", jsNodeId=f"L_{index}-{position}", token_prob=probability,
                      is_target_logit=target, clerp=f'Output "{node.label}" (p={probability:.3f})')
    else:
        raise ValueError(f"Neuronpedia's graph format has tokens, features, errors and logits; not a {node.kind} node")
    record.update(ctx_idx=position, influence=influence)
    return record


def neuronpedia_json(graph: Graph, *, slug: str = "anatomy-graph", scan: str | None = None,
                     node_threshold: float = 0.8, edge_threshold: float = 0.98, pinned: list[str] | None = None,
                     supernodes: list[list[str]] | None = None) -> dict:
    """The graph as Neuronpedia's JSON (a dict), pruned at the thresholds unless it already is. scan: the
    model (and transcoders) it was made with, as Neuronpedia names them (default: the transcoders' scan, or
    the model's name). Raises ValueError for a circuit (heads, MLPs), which the format cannot hold."""
    from .prune import pruned

    if graph.kind != "attribution graph":
        raise ValueError(f"Neuronpedia's format holds attribution graphs; this is a {graph.kind} (write .html or .safetensors)")
    if not graph.meta.get("pruned"):
        graph = pruned(graph, node_threshold, edge_threshold)
    node_threshold = graph.meta.get("node_threshold", node_threshold)
    edge_threshold = graph.meta.get("edge_threshold", edge_threshold)
    influence = graph.meta.get("influence") or [None] * len(graph)
    first_logit = next((i for i, node in enumerate(graph.nodes) if node.kind == "logit"), None)
    records = [node_record(node, graph.n_layers, influence[i], i == first_logit) for i, node in enumerate(graph.nodes)]
    links = [{"source": records[s]["node_id"], "target": records[t]["node_id"], "weight": weight}
             for t, s, weight in graph.edges()]
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
    }
    metadata["generation_settings"] = {k: v for k, v in metadata["generation_settings"].items() if v is not None}
    q_params = {"pinnedIds": list(pinned or []), "supernodes": [list(s) for s in supernodes or []],
                "linkType": "both", "clickedId": "", "sg_pos": ""}
    return {"metadata": metadata, "qParams": q_params, "nodes": records, "links": links}


def save_neuronpedia(graph: Graph, path: str | Path, **options) -> Path:
    """Write neuronpedia_json(graph, **options) to path (atomically), slug from the file's name unless given,
    and list it in graph-metadata.json beside it (kept, one entry per slug), as circuit-tracer's
    create_graph_files does: that folder is what its local server shows (`circuit_tracer start-server
    --graph_file_dir FOLDER`)."""
    from ..viz.html import json_text, write_atomically

    path = Path(path)
    options.setdefault("slug", path.stem or "anatomy-graph")
    data = neuronpedia_json(graph, **options)
    written = write_atomically(path, json_text(data, ensure_ascii=False))
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
