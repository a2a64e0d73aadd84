"""anatomy's attribution graphs equal circuit-tracer 0.5.0's on Gemma 2, Gemma 3 and Qwen3, node for node, and
where circuit-tracer is wrong anatomy equals the frozen model instead.

The fixtures were written by circuit-tracer itself, through its nnsight backend on a local folder
(fixtures/make_family_fixtures.py): a tiny random model of each family and transcoder sets in circuit-tracer's
format (Gemma Scope's ln2.hook_normalized -> hook_mlp_out, a skip, a cross-layer set, Qwen3's mlp.hook_in ->
mlp.hook_out), with the graph, the pruning and the scores circuit-tracer computed. Nodes are matched by what
they are (test_circuit_tracer_parity.py).

Gemma 2's logits are soft-capped: both explain the logits before the cap (circuit-tracer injects its logit
targets at the final norm's output). Gemma 3 scales its embeddings by sqrt(d_model) inside its embedding module;
circuit-tracer multiplies the gradient there by the unscaled row, so its token edges are 1/sqrt(d_model) of the
token's effect on the model. anatomy's are the frozen model's (checked here on the fixture's own weights), so
its token columns are sqrt(d_model) times circuit-tracer's; with those columns divided back, the pruning and
the scores are circuit-tracer's too.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import anatomy
from anatomy.circuits.attribute import attribution_graph
from anatomy.circuits.graph import Graph
from anatomy.sae import load_transcoders
from frozen_reference import frozen_reference
from test_circuit_tracer_parity import SETTINGS, aligned, assert_pruning_and_scores_equal, assert_the_rest_equal

FIXTURES = Path(__file__).parent / "fixtures" / "graphs"
SETS = {"gemma2_plt": "gemma2", "gemma3_skip": "gemma3", "gemma3_clt": "gemma3", "qwen3_plt": "qwen3"}
TOKEN_SCALE = {"gemma3": math.sqrt(32)}  # anatomy's token edges / circuit-tracer's (d_model 32)


def graph_of(name: str):
    model = anatomy.from_pretrained(str(FIXTURES / SETS[name])).eval()
    transcoders = load_transcoders(FIXTURES / name, mlp_out_norm=SETS[name].startswith("gemma"))
    return model, transcoders, attribution_graph(model, SETTINGS["prompt"], transcoders)


def their_convention(graph: Graph, name: str) -> Graph:
    """The graph with its token columns divided by what circuit-tracer's are short of (nothing but for Gemma 3)."""
    adjacency = graph.adjacency.clone()
    tokens = graph.mask("token")
    adjacency[:, tokens] /= TOKEN_SCALE.get(SETS[name], 1.0)
    return Graph(graph.nodes, adjacency, graph.columns, graph.n_layers, output_weights=graph.output_weights,
                 kind=graph.kind, meta=dict(graph.meta))


@pytest.mark.parametrize("name", list(SETS))
def test_the_graph_equals_circuit_tracers(name):
    _, _, graph = graph_of(name)
    expected = load_file(str(FIXTURES / f"{name}.graph.safetensors"))
    assert graph.meta["prompt_ids"] == expected["input_tokens"].tolist()
    order = aligned(graph, expected)
    ours = graph.adjacency[order][:, order]
    theirs = expected["adjacency"]
    tokens = torch.tensor([graph.nodes[i].kind == "token" for i in order.tolist()])
    assert (ours[:, ~tokens] - theirs[:, ~tokens]).abs().max() < 1e-4
    assert (ours[:, tokens] / TOKEN_SCALE.get(SETS[name], 1.0) - theirs[:, tokens]).abs().max() < 1e-4
    if SETS[name] == "gemma3":  # the difference is real: sqrt(d_model) on every token column
        assert (ours[:, tokens] - theirs[:, tokens]).abs().max() > 0.1
    assert_the_rest_equal(graph, expected, order)


@pytest.mark.parametrize("name", list(SETS))
def test_pruning_and_scores_equal_circuit_tracers(name):
    _, _, graph = graph_of(name)
    graph = their_convention(graph, name)
    assert_pruning_and_scores_equal(graph, load_file(str(FIXTURES / f"{name}.graph.safetensors")))


def test_gemma3s_token_edges_are_the_frozen_models_and_circuit_tracers_are_short_by_sqrt_d_model():
    model, transcoders, graph = graph_of("gemma3_skip")
    reference = frozen_reference(model, transcoders, graph)
    tokens = graph.mask("token")
    assert (graph.adjacency.double() - reference).abs().max() < 1e-5 * max(1.0, float(reference.abs().max()))
    expected = load_file(str(FIXTURES / "gemma3_skip.graph.safetensors"))
    order = aligned(graph, expected)
    theirs = torch.zeros_like(reference)
    theirs[order[:, None], order[None, :]] = expected["adjacency"].double()
    assert (theirs[:, tokens] * math.sqrt(model.config.d_model) - reference[:, tokens]).abs().max() < 1e-4
    assert (theirs[:, tokens] - reference[:, tokens]).abs().max() > 0.1


def test_gemma2s_rows_explain_the_logits_before_the_cap_and_say_so():
    model, _, graph = graph_of("gemma2_plt")
    with torch.no_grad():
        hidden = model(torch.tensor([graph.meta["prompt_ids"]])).last_hidden_state[0, -1]
        before_cap = model.lm_head.proj(hidden)
    logits = graph.mask("logit")
    assert torch.allclose(graph.values[logits], (before_cap - before_cap.mean())[[n.index for n in graph.nodes if n.kind == "logit"]],
                          atol=1e-5)
    assert graph.meta["logit_softcap"] == 5.0 and "before the final soft-cap" in graph.meta["logits"]
