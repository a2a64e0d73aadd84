"""The circuit panel: the attribution graph of the text's next token, built as a job, drawn by the graph page.

The transcoder sets are the ones `anatomy explore --transcoders MODEL=RUN` attached to a model
(anatomy.load_transcoders: a run folder, circuit-tracer's or Gemma Scope 2's files), checked against the
model when attached. The graph is anatomy.circuits.attribution_graph on the text (a BOS in front, as
circuit-tracer puts one), progress reported layer by layer, cancelled between two layers; its result is the
pruned graph's page (anatomy/circuits/page.py, served at /api/jobs/ID/page) with each feature's promoted
tokens, and its numbers: the check, the scores, the counts, the target tokens. Then the attention of its
`qk` strongest edges across positions (anatomy.circuits.explain_attention: each split by head, its largest
heads' scores by pairs of nodes), which the page shows on a clicked edge.

A graph's adjacency grows with the square of the text's positions: a budget (GRAPH_BYTES) bounds it, and a
text whose graph would not fit is refused in words before it is made.
"""

from __future__ import annotations

from collections.abc import Callable

from .models import ModelSlot
from .state import Pass
from .values import ExploreError, float_setting, int_setting

GRAPH_BYTES = 3 * 2**30  # at most this much held by one graph (SmolLM2, 16 positions: about 1.6 GiB)
MAX_QK = 50  # attention-mediated edges explained at most: seconds each on SmolLM2


def transcoders_of(slot: ModelSlot):
    """The transcoder set attached to the slot's model, or ExploreError saying how to attach one."""
    if slot.transcoders is None:
        raise ExploreError(f"no transcoders are attached to {slot.name}: start the explorer with "
                           f"--transcoders {slot.name}=RUN (an `anatomy sae train-transcoders` run, or circuit-tracer's "
                           f"files)")
    return slot.transcoders


def circuit_work(slot: ModelSlot, p: Pass, settings: dict) -> Callable[[Callable[[int, int], None]], dict]:
    """The job for the pass's text: settings checked now (ExploreError), the graph made when the job runs."""
    from ..circuits import attribution_graph, explain_attention, prune, pruned, scores
    from ..circuits.attribute import check_fits
    from ..circuits.features import promoted_tokens
    from ..circuits.page import graph_view

    transcoders = transcoders_of(slot)
    node_threshold = float_setting(settings, "node_threshold", 0.8, 0.0, 1.0)
    edge_threshold = float_setting(settings, "edge_threshold", 0.98, 0.0, 1.0)
    max_logits = int_setting(settings, "max_logits", 10, 1, 10)
    qk = int_setting(settings, "qk", 20, 0, MAX_QK)
    model = slot.get()
    if p.source_ids is not None:
        raise ExploreError("an attribution graph explains a decoder's next token; this model is an encoder-decoder")
    try:
        check_fits(model, transcoders)
    except ValueError as error:
        raise ExploreError(str(error)) from None
    text = settings.get("text", "")

    def work(progress) -> dict:
        graph = attribution_graph(model, text, transcoders, max_logits=max_logits, max_bytes=GRAPH_BYTES,
                                  progress=progress)
        decision = prune(graph, node_threshold, edge_threshold)
        small = pruned(graph, decision=decision)
        replacement, completeness = scores(graph, decision.influence)
        graph.about = small.about = f"{slot.name} on {text!r}"
        attention = None
        if qk and model.config.norm_position != "post":  # before the page is made: it shows them (a post-norm
            # model's edges have no first moves to split by head)
            explain_attention(model, transcoders, small, n=qk)
            attention = small.meta["attention"]
        page = graph_view(small, details=promoted_tokens(model, transcoders, small), scores=(replacement, completeness))
        return {"kind": "attribution graph", "check": graph.check, "error": graph.error,
                "features": sum(node.kind == "feature" for node in graph.nodes), "nodes": len(small),
                "edges": int(small.meta.get("edges_before", 0)), "kept_edges": len(small.edges()),
                "replacement": replacement, "completeness": completeness,
                "targets": [{"token": node.label, "probability": node.value} for node in graph.nodes if node.kind == "logit"],
                "attention": None if attention is None else {"edges": len(attention["edges"]), "heads": len(attention["qk"]),
                                                             "check": attention["check"], "error": attention["error"]},
                "page": page.html}

    return work
