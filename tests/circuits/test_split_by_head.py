"""An edge split by the heads its paths first cross: the parts add up to the edge, and a head that cannot move
the source's vector to the target's position gets nothing."""

from __future__ import annotations

import pytest
import torch

from anatomy.circuits.attribute import attribution_graph
from anatomy.circuits.heads import split_by_head
from family_models import family_model, family_transcoders
from test_attribute import CASES, PROMPT, tiny


def strongest_edges(graph, n):
    values = graph.adjacency.abs()
    flat = values.flatten().topk(n).indices
    return [(int(i) // len(graph), int(i) % len(graph)) for i in flat]


@pytest.mark.parametrize("case", ["llama-like", "gpt2-like: LayerNorm, biases, learned positions",
                                  "relu with a skip", "cross-layer with LayerNorm and a skip"])
def test_the_parts_add_up_to_the_edge(case):
    model, transcoders = tiny(**CASES[case])
    graph = attribution_graph(model, torch.tensor(PROMPT), transcoders)
    pairs = strongest_edges(graph, 12)
    # and the first token's edges, and an edge across positions into a logit
    logit = graph.index(next(n for n in graph.nodes if n.kind == "logit"))
    pairs += [(logit, 0), (logit, graph.index(next(n for n in graph.nodes if n.kind == "token" and n.column == 2)))]
    for t, s in pairs:
        split = split_by_head(model, transcoders, graph, graph.nodes[t], graph.nodes[s])
        assert split.error < 1e-5, (graph.nodes[s].name, graph.nodes[t].name, split.check)


@pytest.mark.parametrize("family, reads, writes, options", [
    ("gemma2", "mlp_norm.normalized", "mlp.out", dict(kind="relu", skip=True)),  # sandwich: through the out norms
    ("gpt_neox", "mlp_norm.out", "mlp.out", dict(kind="relu", skip=True)),  # parallel: the skip reads resid_pre
    ("gptj", "attn_norm.out", "mlp.out", dict(cross_layer=True)),
    ("olmo2", "resid_mid", "mlp.out", dict(kind="relu", skip=True)),  # no norm before, one on each output
])
def test_the_parts_add_up_to_the_edge_in_every_family(family, reads, writes, options):
    model = family_model(family)
    transcoders = family_transcoders(model, reads, writes, **options)
    graph = attribution_graph(model, torch.tensor(PROMPT), transcoders)
    logit = graph.index(next(n for n in graph.nodes if n.kind == "logit"))
    for t, s in strongest_edges(graph, 10) + [(logit, 0), (logit, 2)]:
        split = split_by_head(model, transcoders, graph, graph.nodes[t], graph.nodes[s])
        assert split.error < 1e-5, (family, graph.nodes[s].name, graph.nodes[t].name, split.check)


def test_a_post_norm_model_is_refused_in_words():
    model = family_model("opt-post")
    transcoders = family_transcoders(model, "resid_mid", "mlp.out")
    graph = attribution_graph(model, torch.tensor(PROMPT), transcoders)
    with pytest.raises(ValueError, match="post-norm model does not split by heads"):
        split_by_head(model, transcoders, graph, graph.nodes[-1], graph.nodes[1])


def test_an_edge_across_positions_has_no_residual_part_and_every_head_is_named():
    model, transcoders = tiny()
    graph = attribution_graph(model, torch.tensor(PROMPT), transcoders)
    logit = next(n for n in graph.nodes if n.kind == "logit")
    token = next(n for n in graph.nodes if n.kind == "token" and n.column == 1)
    split = split_by_head(model, transcoders, graph, logit, token)
    assert "residual" not in split.parts
    assert {part for part in split.parts if part != "residual"} == \
        {(layer, head) for layer in range(model.config.n_layers) for head in range(model.config.n_heads)}
    assert split.largest(3)[0][0].startswith("L")


def test_an_edge_within_one_position_keeps_its_residual_part():
    model, transcoders = tiny()
    graph = attribution_graph(model, torch.tensor(PROMPT), transcoders)
    last = len(PROMPT) - 1
    logit = next(n for n in graph.nodes if n.kind == "logit")
    token = next(n for n in graph.nodes if n.kind == "token" and n.column == last)
    split = split_by_head(model, transcoders, graph, logit, token)
    assert split.parts["residual"] != 0.0 and split.error < 1e-5
