"""Circuit discovery over datasets: which components carry a behaviour across many prompts.

    task = ioi(model, 100)                                  # clean/corrupted pairs the model gets right
    nodes = attribute_nodes(model, task, kind="heads", method="atp*")   # [layer, head]
    edges = attribute_edges(model, task, method="eap-ig", steps=5)      # [source, destination]
    verify_edges(model, task, edges, k=50)                  # exact path patching: Spearman, worst miss
    curve = faithfulness(model, task, edges)                # the share of the gap the top-n circuits recover
    save(circuit_for_page(model, task, edges, curve), "circuit.html")   # the page: the smallest circuit, a slider
    save(circuit_graph(edges, kept_masks(edges.extra["graph"], edges, [n])[0]), "circuit.safetensors")
"""

from ...lazy import lazy_names

# Imported on first use, so that `anatomy circuits discover` checks its arguments before torch loads.
__all__ = lazy_names(__name__, {
    "circuit_for_page": ".circuit", "circuit_graph": ".circuit",
    "attribute_edges": ".edges", "top_edges": ".edges",
    "faithfulness": ".faithfulness", "kept_masks": ".faithfulness",
    "attribute_nodes": ".nodes",
    "ResidualGraph": ".residual",
    **{name: ".generators" for name in ("build_task", "capital_country", "greater_than", "ioi", "subject_verb")},
    "Task": ".tasks", "load_pairs": ".tasks", "make_task": ".tasks",
    "spearman": ".verify", "verify_edges": ".verify", "verify_nodes": ".verify",
})
