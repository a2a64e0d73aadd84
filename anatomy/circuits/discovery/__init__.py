"""Circuit discovery over datasets: which components carry a behaviour across many prompts.

    task = ioi(model, 100)                                  # clean/corrupted pairs the model gets right
    nodes = attribute_nodes(model, task, kind="heads", method="atp*")   # [layer, head]
    edges = attribute_edges(model, task, method="eap-ig", steps=5)      # [source, destination]
    verify_edges(model, task, edges, k=50)                  # exact path patching: Spearman, worst miss
    curve = faithfulness(model, task, edges)                # the share of the gap the top-n circuits recover
    save(circuit_for_page(model, task, edges, curve), "circuit.html")   # the page: the smallest circuit, a slider
    save(circuit_graph(edges, kept_masks(edges.extra["graph"], edges, [n])[0]), "circuit.safetensors")
"""

from .circuit import circuit_for_page, circuit_graph
from .edges import attribute_edges, top_edges
from .faithfulness import faithfulness, kept_masks
from .nodes import attribute_nodes
from .residual import ResidualGraph
from .generators import build_task, capital_country, greater_than, ioi, subject_verb
from .tasks import Task, load_pairs, make_task
from .verify import spearman, verify_edges, verify_nodes

__all__ = ["ResidualGraph", "Task", "attribute_edges", "attribute_nodes", "build_task", "capital_country",
           "circuit_for_page", "circuit_graph", "faithfulness", "greater_than", "ioi", "kept_masks", "load_pairs", "make_task",
           "spearman", "subject_verb", "top_edges", "verify_edges", "verify_nodes"]
