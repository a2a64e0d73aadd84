"""A graph in one safetensors file: every number of it, nothing pickled, read back as the same Graph.

    adjacency [N, N], output_weights [N], values [N], unexplained [N]   float32 tensors
    kind, layer, column, index [N]                                      the node table, int64
    value [N]                                                           each node's value, float64 (NaN: none)
    header: labels, ports, columns and meta as JSON; n_layers, kind, about, check, error as text
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from ..checkpoints.files import CheckpointError, shorten
from ..text import check_text
from .graph import KINDS, Graph, Node

FORMAT = "anatomy graph 1"
GRAPH_KINDS = ("attribution graph", "circuit")


def save_graph(graph: Graph, path: str | Path) -> Path:
    """Write every number of the graph to a safetensors file (nothing pickled): adjacency, output weights
    and the node table as tensors; labels, ports, columns and meta as JSON in the header."""
    from safetensors.torch import save

    from ..viz.html import json_text, write_atomically

    nodes = graph.nodes
    tensors = {
        "adjacency": graph.adjacency.float().contiguous(),
        "output_weights": graph.output_weights.float().contiguous(),
        "kind": torch.tensor([KINDS.index(node.kind) for node in nodes], dtype=torch.int64, device="cpu"),
        "layer": torch.tensor([node.layer for node in nodes], dtype=torch.int64, device="cpu"),
        "column": torch.tensor([node.column for node in nodes], dtype=torch.int64, device="cpu"),
        "index": torch.tensor([node.index for node in nodes], dtype=torch.int64, device="cpu"),
        "value": torch.tensor([math.nan if node.value is None else node.value for node in nodes], dtype=torch.float64,
                              device="cpu"),
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
        "meta": json_text(graph.meta, ensure_ascii=False, default=float),
    }
    return write_atomically(path, save(tensors, metadata=header))


def load_graph(path: str | Path) -> Graph:
    """A graph written by save_graph (circuits.save(graph, "x.safetensors")). Raises ValueError naming the file
    and the problem for anything else: not a regular file, not safetensors, not this format, tensors missing,
    extra, of the wrong dtype or shape, more than memory holds (from the header, before any tensor is read),
    numbers that are not finite, node kinds, ports or places out of range, or metadata of the wrong form."""
    from ..checkpoints.files import read_safetensors_header
    from ..checkpoints.memory import available_memory

    path = Path(path)
    where = repr(shorten(str(path)))
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise ValueError(f"{where} is not a graph file: not a regular file (a folder, a device or a pipe)")
        tensors = read_safetensors_header(path)
    except OSError as error:
        raise ValueError(f"{where} cannot be read: {error.strerror or error}") from None
    except CheckpointError as error:
        raise ValueError(f"{where} is not a graph file: {error}") from None
    kind_shape = tensors.get("kind", (None, ()))[1]
    n = kind_shape[0] if len(kind_shape) == 1 else -1
    expected = {name: (torch.int64, (n,)) for name in ("kind", "layer", "column", "index")}
    expected.update(adjacency=(torch.float32, (n, n)), output_weights=(torch.float32, (n,)), value=(torch.float64, (n,)))
    optional = {"values": (torch.float32, (n,)), "unexplained": (torch.float32, (n,))}
    for name, found in tensors.items():
        if name not in expected and name not in optional:
            raise ValueError(f"{where} is not a graph anatomy wrote: it holds a tensor {shorten(name, 80)!r}")
        if found != (expected.get(name) or optional[name]):
            dtype, shape = expected.get(name) or optional[name]
            raise ValueError(f"{where}: {name} is {found[0]} {list(found[1])}; a graph of {max(n, 0)} nodes has {dtype} {list(shape)}")
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise ValueError(f"{where} is not a graph anatomy wrote: it has no {', '.join(missing)}")
    need = sum(math.prod(shape) * dtype.itemsize for dtype, shape in tensors.values())
    if need > available_memory():
        raise ValueError(f"{where} holds a graph of {n:,} nodes, {need / 2**30:.2f} GiB, more than the "
                         f"{available_memory() / 2**30:.2f} GiB of memory available")
    try:
        with safe_open(str(path), "pt") as handle:
            header = handle.metadata() or {}
            if header.get("format") != FORMAT:
                raise ValueError(f"{where} is not a graph anatomy wrote (its header has no 'format: {FORMAT}')")
            t = {name: handle.get_tensor(name) for name in handle.keys()}
    except (SafetensorError, OSError, RuntimeError) as error:
        raise ValueError(f"{where} cannot be read: {shorten(str(error), 200)}") from None
    fields = _header_fields(header, n, where)
    _check_numbers(t, where)
    try:
        nodes = [Node(KINDS[k], layer, column, index, port, label, None if math.isnan(value) else value)
                 for k, layer, column, index, port, label, value in zip(
                     t["kind"].tolist(), t["layer"].tolist(), t["column"].tolist(), t["index"].tolist(), fields["ports"],
                     fields["labels"], t["value"].tolist())]
        return Graph(nodes, t["adjacency"], fields["columns"], fields["n_layers"], output_weights=t["output_weights"],
                     kind=fields["kind"], about=fields["about"], meta=fields["meta"], check=fields["check"],
                     error=fields["error"], values=t.get("values"), unexplained=t.get("unexplained"))
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None


LIMITS = {"layer": (-1, 100_000), "column": (0, 10_000_000), "index": (-1, 2**40)}
META = {"prompt": str, "model": str, "prompt_ids": list, "prompt_texts": list, "transcoders": dict, "influence": list,
        "pruned": bool, "node_threshold": float, "edge_threshold": float, "max_logits": int, "logit_probability": float,
        "max_feature_nodes": int, "edges_before": int, "nodes_before": int, "slug": str}


def _json(header: dict, key: str, where: str, kind: type):
    """One JSON field of the header, of type `kind`; NaN read as null, nesting past reading refused."""
    try:
        value = json.loads(header[key], parse_constant=lambda constant: None)
    except KeyError:
        raise ValueError(f"{where} is not a graph anatomy wrote: its header has no {key!r}") from None
    except (ValueError, RecursionError):
        raise ValueError(f"{where}: the header's {key!r} is not JSON (or nested past reading)") from None
    if not isinstance(value, kind):
        raise ValueError(f"{where}: the header's {key!r} must be a JSON {kind.__name__}, got {type(value).__name__}")
    return value


def _is(value, kind: type) -> bool:
    """isinstance, where a bool is no number and an int is a float."""
    if kind in (int, float) and isinstance(value, bool):
        return False
    return isinstance(value, (int, float)) if kind is float else isinstance(value, kind)


def _header_fields(header: dict, n: int, where: str) -> dict:
    """The header's text fields, each of its type and size: labels and ports one per node, kind a graph kind."""
    fields = {key: _json(header, key, where, kind) for key, kind in
              (("labels", list), ("ports", list), ("columns", list), ("meta", dict))}
    for key in ("labels", "ports", "columns"):
        if key != "columns" and len(fields[key]) != n:
            raise ValueError(f"{where}: the header's {key!r} must be {n} texts, one per node")
        try:
            for text in fields[key]:
                check_text(text, f"a text of the header's {key!r}", empty=True)
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None
    for key, kind in META.items():
        value = fields["meta"].get(key)
        if value is not None and not _is(value, kind):
            raise ValueError(f"{where}: meta {key!r} must be a {kind.__name__}, got {shorten(repr(value), 80)}")
    if not all(isinstance(x, str) for x in fields["meta"].get("prompt_texts") or []):
        raise ValueError(f"{where}: meta 'prompt_texts' must be texts")
    influence = fields["meta"].get("influence")
    if influence is not None and (len(influence) != n or not all(isinstance(x, (int, float)) or x is None for x in influence)):
        raise ValueError(f"{where}: meta 'influence' must be {n} numbers, one per node")
    texts = {key: header.get(key) for key in ("kind", "about", "check", "error", "n_layers")}
    if any(not isinstance(value, str) for value in texts.values()):
        raise ValueError(f"{where} is not a graph anatomy wrote: its header lacks kind, about, check, error or n_layers")
    if texts["kind"] not in GRAPH_KINDS:
        raise ValueError(f"{where}: kind {shorten(texts['kind'], 80)!r}; allowed: {', '.join(GRAPH_KINDS)}")
    try:
        fields["n_layers"] = int(texts["n_layers"])
        fields["error"] = float(texts["error"])
    except ValueError:
        raise ValueError(f"{where}: n_layers and error must be numbers in its header") from None
    if not 0 <= fields["n_layers"] <= LIMITS["layer"][1] or math.isinf(fields["error"]) or fields["error"] < 0:
        raise ValueError(f"{where}: n_layers must be from 0 to {LIMITS['layer'][1]:,} and error a finite number >= 0")
    return {**fields, "kind": texts["kind"], "about": texts["about"], "check": texts["check"]}


def _check_numbers(t: dict, where: str) -> None:
    """ValueError naming the tensor: a node kind, layer, column or index out of range; an edge, weight or
    what no node carries that is not finite; a value that is infinite (NaN marks a node with none)."""
    if bool(((t["kind"] < 0) | (t["kind"] >= len(KINDS))).any()):
        raise ValueError(f"{where}: a node kind index is outside 0 .. {len(KINDS) - 1}")
    for name, (low, high) in LIMITS.items():
        if bool(((t[name] < low) | (t[name] > high)).any()):
            raise ValueError(f"{where}: a node {name} is outside {low} .. {high:,}")
    for name in ("adjacency", "output_weights", "unexplained"):
        if name in t and not bool(torch.isfinite(t[name]).all()):
            raise ValueError(f"{where}: {name} holds NaN or an infinity; every edge and weight is a finite number")
    for name in ("value", "values"):
        if name in t and bool(t[name].isinf().any()):
            raise ValueError(f"{where}: {name} holds an infinity")
