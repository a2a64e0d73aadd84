"""The values circuit discovery's options take, named once for the library and for `anatomy circuits discover`.

This module imports nothing heavy, so that the command line checks --method, --nodes, --task and the
rest before torch loads.
"""

EDGE_METHODS = ("eap", "eap-ig")  # edges.attribute_edges: a circuit of edges
CIRCUIT_METHODS = ("acdc",)  # acdc.acdc: a circuit of edges pruned by their exact effect
NODE_METHODS = ("atp", "atp*", "ig")  # nodes.attribute_nodes: a ranking of nodes
NODE_KINDS = ("heads", "q", "k", "v", "mlp", "neurons")  # nodes.KINDS: what a node is (features need an SAE)
ACDC_METRICS = ("kl", "task")  # acdc: how far a circuit is from the model, KL of the next token or the task's metric
PATHS = ("inputs", "edges")  # eap-ig: the input embeddings interpolated, or every edge moved together
MAX_STEPS = 256  # ig and eap-ig: each step is a forward and a backward pass
ABLATIONS = ("corrupt", "mean")  # faithfulness: what an ablated edge carries
TASKS = ("ioi", "greater-than", "capital-country", "sva")  # generators.TASKS: the built-in tasks
MAX_PAIRS = 100_000  # pairs a task holds at most


def edge_refusal(config) -> str | None:
    """Why a model of `config` has no residual graph of edges (residual.ResidualGraph), in words, or None."""
    if config.arch != "decoder" or config.head != "lm":
        return f"edge attribution needs a decoder with an LM head; this model is arch={config.arch!r}, head={config.head!r}"
    if config.norm_position == "post" and not config.parallel_residual:
        return ("edge attribution needs a residual stream that is a sum of the components' outputs; a post-norm block "
                "(norm_position='post') renormalises it after every sublayer (attribute_nodes and verify_nodes work)")
    return None


def node_refusal(config) -> str | None:
    """Why node attribution (nodes.attribute_nodes) cannot score a model of `config`, in words, or None: it reads a
    decoder's next token or a sequence classifier's labels."""
    if (config.arch == "decoder" and config.head == "lm") or config.head == "sequence-classification":
        return None
    return (f"node attribution scores the next token or a sequence's label: it needs a decoder with an LM head or a "
            f"sequence classifier; this model is arch={config.arch!r}, head={config.head!r}")


__all__ = ["ABLATIONS", "ACDC_METRICS", "CIRCUIT_METHODS", "EDGE_METHODS", "MAX_PAIRS", "MAX_STEPS", "NODE_KINDS", "NODE_METHODS", "PATHS", "TASKS",
           "edge_refusal", "node_refusal"]
