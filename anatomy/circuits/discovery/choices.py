"""The values circuit discovery's options take, named once for the library and for `anatomy circuits discover`.

This module imports nothing heavy, so that the command line checks --method, --nodes, --task and the
rest before torch loads.
"""

EDGE_METHODS = ("eap", "eap-ig")  # edges.attribute_edges: a circuit of edges
NODE_METHODS = ("atp", "atp*", "ig")  # nodes.attribute_nodes: a ranking of nodes
NODE_KINDS = ("heads", "q", "k", "v", "mlp", "neurons")  # nodes.KINDS: what a node is (features need an SAE)
PATHS = ("inputs", "edges")  # eap-ig: the input embeddings interpolated, or every edge moved together
MAX_STEPS = 256  # ig and eap-ig: each step is a forward and a backward pass
ABLATIONS = ("corrupt", "mean")  # faithfulness: what an ablated edge carries
TASKS = ("ioi", "greater-than", "capital-country", "sva")  # generators.TASKS: the built-in tasks
MAX_PAIRS = 100_000  # pairs a task holds at most

__all__ = ["ABLATIONS", "EDGE_METHODS", "MAX_PAIRS", "MAX_STEPS", "NODE_KINDS", "NODE_METHODS", "PATHS", "TASKS"]
