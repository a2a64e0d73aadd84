"""Writing a graph, by the file's suffix: the one place that knows every writer.

The graph is data (graph.py) and each writer imports it (graph_file.py, neuronpedia.py, page.py); this
dispatcher sits a floor above them all, so that no writer is imported back through the graph.

    save(graph, "graph.html")          the offline page, pruned (page.graph_view)
    save(graph, "graph.json")          Neuronpedia's graph JSON, pruned (neuronpedia.save_neuronpedia)
    save(graph, "graph.safetensors")   every number, to read back with load_graph (graph_file.save_graph)
"""

from __future__ import annotations

from pathlib import Path

from .graph import Graph
from .graph_file import save_graph
from .neuronpedia import save_neuronpedia
from .page import graph_view

SUFFIXES = (".html", ".htm", ".json", ".safetensors")


def save(graph: Graph, path: str | Path, **options) -> Path:
    """Write `graph` to `path` by its suffix: .html/.htm (the page; options go to page.graph_view), .json
    (Neuronpedia's format; options go to neuronpedia.neuronpedia_json) or .safetensors (all of it).
    Raises ValueError for another suffix, before anything is written."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        return save_graph(graph, path)
    if suffix == ".json":
        return save_neuronpedia(graph, path, **options)
    if suffix in (".html", ".htm"):
        return graph_view(graph, **options).save(path)
    raise ValueError(f"cannot write a graph to {path.name!r}: the suffix must be one of {', '.join(SUFFIXES)}")
