"""A graph in one safetensors file: every number of it, nothing pickled, read back as the same Graph.

    adjacency [N, N], output_weights [N], values [N], unexplained [N]   float32 tensors
    kind, layer, column, index [N]                                      the node table, int64
    value [N]                                                           each node's value, float64 (NaN: none)
    header: labels, ports, columns and meta as JSON; n_layers, kind, about, check, error as text
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from .graph import KINDS, Graph, Node

FORMAT = "anatomy graph 1"


def save_graph(graph: Graph, path: str | Path) -> Path:
    """Write every number of the graph to a safetensors file (nothing pickled): adjacency, output weights
    and the node table as tensors; labels, ports, columns and meta as JSON in the header."""
    from safetensors.torch import save

    from ..viz.html import write_atomically

    nodes = graph.nodes
    tensors = {
        "adjacency": graph.adjacency.float().contiguous(),
        "output_weights": graph.output_weights.float().contiguous(),
        "kind": torch.tensor([KINDS.index(node.kind) for node in nodes], dtype=torch.int64),
        "layer": torch.tensor([node.layer for node in nodes], dtype=torch.int64),
        "column": torch.tensor([node.column for node in nodes], dtype=torch.int64),
        "index": torch.tensor([node.index for node in nodes], dtype=torch.int64),
        "value": torch.tensor([math.nan if node.value is None else node.value for node in nodes], dtype=torch.float64),
    }
    tensors.update({name: getattr(graph, name).float().contiguous() for name in ("values", "unexplained")
                    if getattr(graph, name) is not None})
    header = {
        "format": FORMAT,
        "labels": json.dumps([node.label for node in nodes], ensure_ascii=False),
        "ports": json.dumps([node.port for node in nodes]),
        "columns": json.dumps(graph.columns, ensure_ascii=False),
        "n_layers": str(graph.n_layers),
        "kind": graph.kind, "about": graph.about, "check": graph.check, "error": repr(graph.error),
        "meta": json.dumps(graph.meta, ensure_ascii=False, default=float),
    }
    return write_atomically(path, save(tensors, metadata=header))


def load_graph(path: str | Path) -> Graph:
    """A graph written by save_graph (circuits.save(graph, "x.safetensors")). Raises ValueError for a file that is
    not one, naming what is missing."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as handle:
        header = handle.metadata() or {}
        if header.get("format") != FORMAT:
            raise ValueError(f"{path} is not a graph anatomy wrote (its header has no 'format: anatomy graph 1')")
        t = {name: handle.get_tensor(name) for name in handle.keys()}
    labels, ports = json.loads(header["labels"]), json.loads(header["ports"])
    nodes = [Node(KINDS[k], layer, column, index, port, label, None if math.isnan(value) else value)
             for k, layer, column, index, port, label, value in zip(
                 t["kind"].tolist(), t["layer"].tolist(), t["column"].tolist(), t["index"].tolist(), ports, labels,
                 t["value"].tolist())]
    return Graph(nodes, t["adjacency"], json.loads(header["columns"]), int(header["n_layers"]),
                 output_weights=t["output_weights"], kind=header["kind"], about=header["about"],
                 meta=json.loads(header["meta"]), check=header["check"], error=float(header["error"]),
                 values=t.get("values"), unexplained=t.get("unexplained"))
