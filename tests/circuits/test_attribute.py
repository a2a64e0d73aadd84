"""The attribution graph's edges are the direct effects of the local replacement model: checked against the
model itself, frozen, one source at a time (frozen_reference.py: float64, every attention pattern, norm scale
and MLP output held at the prompt's values, no code of the sweep under test); and bad input is refused before
computing. test_families.py does the same for every decoder family.
"""

from __future__ import annotations

import pytest
import torch

import anatomy
from anatomy.circuits.attribute import attribution_graph
from anatomy.circuits.graph import Node
from family_models import family_transcoders
from frozen_reference import frozen_reference

PROMPT = [3, 17, 5, 29, 11, 8, 40]


def tiny(*, norm="rmsnorm", pos="rotary", bias=False, kind="jumprelu", skip=False, cross_layer=False,
         input_point="blocks.L.mlp_norm.out", n_layers=3, d_model=24, features=20, plus_one=False, seed=0):
    config = anatomy.ModelConfig(arch="decoder", vocab_size=61, d_model=d_model, n_heads=4, n_kv_heads=2,
                                 n_layers=n_layers, d_ff=48, max_seq_len=32, pos_encoding=pos, norm=norm,
                                 activation="gelu" if norm == "layernorm" else "swiglu", attn_bias=bias,
                                 attn_out_bias=bias, mlp_bias=bias, norm_plus_one=plus_one)
    model = anatomy.build_model(config, seed=seed).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():  # larger than the init's 0.02: patterns that vary
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * (0.3 if parameter.dim() > 1 else 0.2)
                            + (1.0 if name.endswith("norm.weight") and not plus_one else 0.0))
    reads = input_point.split(".", 2)[2]
    return model, family_transcoders(model, reads, "mlp.out", features=features, kind=kind, skip=skip,
                                     cross_layer=cross_layer, generator=generator)


CASES = {
    "llama-like": {},
    "gpt2-like: LayerNorm, biases, learned positions": dict(norm="layernorm", pos="learned", bias=True),
    "gemma-like gain (1 + w)": dict(plus_one=True),
    "relu with a skip": dict(kind="relu", skip=True),
    "skip reading resid_mid": dict(kind="relu", skip=True, input_point="blocks.L.resid_mid"),
    "cross-layer": dict(cross_layer=True),
    "cross-layer with LayerNorm and a skip": dict(cross_layer=True, norm="layernorm", bias=True, skip=True, kind="relu"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_edge_is_the_frozen_models_direct_effect(case):
    model, transcoders = tiny(**CASES[case])
    graph = attribution_graph(model, torch.tensor(PROMPT), transcoders)
    assert graph.error < 1e-5, graph.check
    assert sum(node.kind == "feature" for node in graph.nodes) > 20
    reference = frozen_reference(model, transcoders, graph)
    scale = float(reference.abs().max())
    assert scale > 0.1
    assert (graph.adjacency.double() - reference).abs().max() < 1e-5 * max(1.0, scale), case


def test_the_identity_holds_target_by_target():
    model, transcoders = tiny(norm="layernorm", pos="learned", bias=True, skip=True, kind="relu")
    graph = attribution_graph(model, torch.tensor(PROMPT), transcoders)
    targets = ~graph.values.isnan()
    total = graph.adjacency[targets].double().sum(1) + graph.unexplained[targets].double()
    assert torch.allclose(total, graph.values[targets].double(), rtol=1e-5, atol=1e-4)
    # and the unexplained part is not the whole of it: the nodes carry most of each value
    assert (graph.adjacency[targets].abs().sum(1) > graph.unexplained[targets].abs()).float().mean() > 0.5


def test_nodes_are_the_prompts_tokens_active_features_errors_and_top_logits():
    model, transcoders = tiny()
    graph = attribution_graph(model, torch.tensor(PROMPT), transcoders, max_logits=3, logit_probability=0.999)
    T, L = len(PROMPT), model.config.n_layers
    assert [node.index for node in graph.nodes if node.kind == "token"] == PROMPT
    assert sum(node.kind == "error" for node in graph.nodes) == T * L
    logits = [node for node in graph.nodes if node.kind == "logit"]
    assert len(logits) == 3
    with torch.no_grad():
        probabilities = model(torch.tensor([PROMPT])).logits[0, -1].softmax(-1)
    assert [node.index for node in logits] == probabilities.topk(3).indices.tolist()
    features = [node for node in graph.nodes if node.kind == "feature"]
    assert all(node.column > 0 for node in features)  # the first position is no node
    with torch.no_grad(), anatomy.trace(model, ["blocks.1.mlp_norm.out"]) as t:
        model(torch.tensor([PROMPT]))
    fired = transcoders.encode(1, t["blocks.1.mlp_norm.out"][0])
    expected = {(1, q, f) for q, f in fired[1:].nonzero().tolist()}
    assert {(n.layer, n.column - 1, n.index) for n in features if n.layer == 1} == {(1, q, f) for _, q, f in expected}


def test_logits_until_the_probability_is_reached():
    model, transcoders = tiny()
    with torch.no_grad():
        probabilities = model(torch.tensor([PROMPT])).logits[0, -1].softmax(-1).sort(descending=True).values
    target = float(probabilities[:2].sum()) - 1e-4  # the first two hold it
    graph = attribution_graph(model, torch.tensor(PROMPT), transcoders, logit_probability=target)
    assert sum(node.kind == "logit" for node in graph.nodes) == 2


def test_error_ids_never_collide_with_layer_zero_features():
    model, transcoders = tiny()
    graph = attribution_graph(model, torch.tensor(PROMPT), transcoders)
    ids = [node.id for node in graph.nodes]
    assert len(set(ids)) == len(ids)
    assert Node("error", 2, 3).id not in {node.id for node in graph.nodes if node.kind == "feature"}


@pytest.mark.parametrize("prompt, words", [("", "empty"), ("   ", "empty"), (list(range(40)), "at most 32"),
                                          ([5], "at least one token"), ([5, 99], "token ids")])
def test_bad_prompts_are_refused_in_one_line(prompt, words):
    model, transcoders = tiny()
    with pytest.raises(ValueError, match=words) as error:
        attribution_graph(model, prompt if isinstance(prompt, str) else torch.tensor(prompt), transcoders)
    assert "\n" not in str(error.value)


def test_a_set_that_does_not_fit_is_refused_before_anything_runs():
    model, _ = tiny(n_layers=3)
    _, other = tiny(n_layers=2)
    with pytest.raises(ValueError, match="n_layers=2"):
        attribution_graph(model, torch.tensor(PROMPT), other)
    _, narrow = tiny(d_model=16)
    with pytest.raises(ValueError, match="d_model"):
        attribution_graph(model, torch.tensor(PROMPT), narrow)


def test_a_model_whose_logits_are_not_linear_in_the_last_hidden_state_is_refused_in_words():
    """Only what stays non-linear once patterns and norm scales are frozen is refused: here an LM head's own
    transform (dense, activation, norm). Every decoder family's layout has its graph (test_families.py)."""
    config = anatomy.ModelConfig(arch="decoder", vocab_size=61, d_model=24, n_heads=4, n_layers=3, d_ff=48,
                                 max_seq_len=32, lm_head_transform=True, activation="gelu")
    model = anatomy.build_model(config, seed=0).eval()
    _, transcoders = tiny()
    with pytest.raises(ValueError, match="applies a gelu first \\(lm_head_transform=True\\)") as error:
        attribution_graph(model, torch.tensor(PROMPT), transcoders)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("option, value", [("max_logits", 0), ("logit_probability", 1.5), ("max_feature_nodes", -3)])
def test_bad_options_are_refused(option, value):
    model, transcoders = tiny()
    with pytest.raises(ValueError, match=option):
        attribution_graph(model, torch.tensor(PROMPT), transcoders, **{option: value})


def test_a_graph_too_large_for_the_memory_is_refused_before_it_is_made():
    model, transcoders = tiny()
    with pytest.raises(ValueError, match=r"needs [0-9.]+ [KMG]iB, and [0-9.]+ (bytes|[KMG]iB) is the budget "
                                         r"\(--max-memory 9.77 KiB, less the [0-9.]+ (bytes|[KMG]iB) its forward pass took\)"):
        attribution_graph(model, torch.tensor(PROMPT), transcoders, max_bytes=10_000)
