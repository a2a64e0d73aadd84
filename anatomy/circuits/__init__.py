"""Circuits: attribution graphs over transcoder features, the one page that draws any graph, and (in discovery/)
circuits found over datasets.

    graph = anatomy.attribution_graph(model, "The capital of Germany is", transcoders)
    graph.check                                      # every target = its edges + what no node carries: max |diff| ...
    save(graph, "graph.html")                        # the page, pruned; .json: Neuronpedia's format; .safetensors: all
    small = pruned(graph)                            # node threshold 0.8, edge threshold 0.98
    replacement, completeness = scores(graph)
    explain_attention(model, transcoders, small, n=20)  # why its attention attends: small.meta["attention"]

    graph.py          Node, Graph: the graph as plain data (a node list, one adjacency; rows = targets)
    graph_file.py     save_graph, load_graph: every number of a graph in one safetensors file
    save.py           save(graph, path): the writer for the file's suffix (.html, .json, .safetensors)
    prune.py          influence (the Neumann series), find_threshold, prune, pruned, scores, the feature cap
    layout.py         Active, Layout: the active features and where each node sits in the graph's order
    frozen.py         a norm and an attention sublayer with the prompt's scales and patterns frozen, as linear maps
    replacement.py    the local replacement model of every block layout, its transposes
    checks.py         the floor's Python arguments, refused in words before any work
    vectors.py        the features that fire and their vectors, the transcoders read a layer at a time
    attribute.py      attribution_graph: the nodes, their edges, the identity checked
    sweep.py          the direct effects of a bucket of rows, carried down the layers together (no autograd)
    capped.py         max_feature_nodes: the rows of the features circuit-tracer's ranking chooses, batch by batch
    rows.py           RowStore: a capped graph's rows, in memory up to a budget and in a temporary file past it
    footprint.py      the memory a graph will take, said (and refused past the budget) before computing it
    identity.py       what no node carries, and each graph's check (whole, capped)
    heads.py          split_by_head: an edge as the sum of the heads its paths first cross, by (query, key) positions
    stream.py         NodeStream: the stream as the sum of what the nodes write; any reading of it carried back
    qk.py             qk_attribution: a head's attention score at (query, key) as pairs of nodes + terms of none
    attention_edges.py explain_attention: the strongest edges across positions by head, their heads' scores explained
    interventions.py  intervene: ablate, clamp or steer features in the real model, beside the graph's prediction
    neuronpedia.py    Neuronpedia's graph JSON (circuit-tracer's local server opens it)
    features.py       what a graph's features promote and suppress, their top contexts and a label, for the page
    page.py           graph_view: the offline page of any graph (assets/: layout, drawing, panel, a circuit's slider)
    cli.py            `anatomy circuits TEXT ...` (and `anatomy circuits discover ...`, handed to discovery/)
"""

from ..lazy import lazy_names

__all__ = lazy_names(__name__, {
    "attribution_graph": ".attribute",
    "Graph": ".graph", "Node": ".graph", "load_graph": ".graph_file", "save": ".save",
    "HeadSplit": ".heads", "split_by_head": ".heads",
    "QKAttribution": ".qk", "qk_attribution": ".qk", "AttentionEdge": ".attention_edges",
    "explain_attention": ".attention_edges",
    "FeatureChange": ".interventions", "InterventionResult": ".interventions", "intervene": ".interventions",
    "neuronpedia_json": ".neuronpedia",
    "FeatureDetails": ".page", "graph_view": ".page",
    **{name: ".prune" for name in ("Pruning", "find_threshold", "influence", "prune", "pruned", "scores")},
})
