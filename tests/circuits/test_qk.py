"""QK attributions checked against the model: every pair term is the score's change when its two sources' vectors
are added once more, each to its own side only (a mixed difference), every marginal the change when one is, on
the frozen model in float64 (qk_reference.py); the identity holds within 1e-5; the positions, the query head's
own key head (GQA), q/k norms, LayerNorm with biases, learned positions and Gemma 2's soft-cap all taken."""

from __future__ import annotations

import pytest
import torch

import anatomy
from anatomy.circuits.qk import qk_attributions, strongest_pairs
from anatomy.circuits.stream import NodeStream
from anatomy.sae import SAE, TranscoderSet
from family_models import FAMILIES, family_model, family_transcoders
from qk_reference import FrozenModel
from test_families import SETS

PROMPT = [3, 17, 5, 29, 11, 8, 40]
SHAPES = {
    "llama": dict(norm="rmsnorm", pos_encoding="rotary", activation="swiglu"),
    "qwen3: q/k norms": dict(norm="rmsnorm", pos_encoding="rotary", activation="swiglu", qk_norm="per_head"),
    "olmo2-like: q/k norm across heads": dict(norm="rmsnorm", pos_encoding="rotary", activation="swiglu",
                                              qk_norm="across_heads"),
    "gpt2: LayerNorm, biases, learned positions": dict(norm="layernorm", pos_encoding="learned", activation="gelu",
                                                       attn_bias=True, attn_out_bias=True, mlp_bias=True, n_kv_heads=4),
    "bloom-like: ALiBi, LayerNorm": dict(norm="layernorm", pos_encoding="alibi", activation="gelu", attn_bias=True,
                                         attn_out_bias=True, mlp_bias=True, n_kv_heads=4),
    "gemma2: (1 + w) gains, soft-capped scores, query_pre_attn_scalar": dict(
        norm="rmsnorm", pos_encoding="rotary", activation="swiglu", norm_plus_one=True, attn_softcap=2.0,
        query_pre_attn_scalar=12.0),
}


def shaped(name: str, seed: int = 0, *, skip: bool = False, cross_layer: bool = False):
    """A tiny random model shaped as SHAPES[name] (3 layers, 4 heads over 2 key/value heads unless said), with a
    random JumpReLU transcoder on every layer (a skip path, cross-layer); weights large enough that the patterns
    vary."""
    fields = dict(arch="decoder", vocab_size=61, d_model=24, n_heads=4, n_kv_heads=2, n_layers=3, d_ff=48,
                  max_seq_len=32) | SHAPES[name]
    config = anatomy.ModelConfig(**fields)
    model = anatomy.build_model(config, seed=seed).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            gain = parameter_name.endswith("norm.weight") and not config.norm_plus_one
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * (0.3 if parameter.dim() > 1 else 0.2)
                            + (1.0 if gain else 0.0))
    layers, E = [], config.d_model
    for layer in range(config.n_layers):
        d_out = (config.n_layers - layer) * E if cross_layer else E
        sae = SAE(E, 20, kind="jumprelu", d_out=d_out, transcoder=True, skip=skip, seed=None)
        with torch.no_grad():
            for parameter in sae.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
            sae.threshold.copy_(torch.rand(20, generator=generator) * 0.3)
            if cross_layer:  # a CLT's bias and skip write its own layer only
                sae.b_dec[E:] = 0
                if skip:
                    sae.W_skip[E:] = 0
        layers.append(sae)
    return model, TranscoderSet(layers, cross_layer=cross_layer).eval()


HEADS = [(2, 3, 6, 2), (1, 0, 5, 5), (2, 1, 4, 1), (1, 2, 3, 0)]  # (layer, head, query, key): GQA's second group too


CASES = [(name, {}) for name in SHAPES] + [("llama", dict(skip=True)), ("llama", dict(skip=True, cross_layer=True)),
                                           ("gpt2: LayerNorm, biases, learned positions", dict(skip=True, cross_layer=True))]
CASES += [(f"family {case}", {}) for case in SETS]


def made(name: str, transcoder: dict):
    """(model, transcoders): a SHAPES model, or a family's (test_families.SETS) with its set."""
    if not name.startswith("family "):
        return shaped(name, **transcoder)
    case = name.split(" ", 1)[1]
    model = family_model(case if case in FAMILIES else case.rsplit("-", 1)[0])
    reads, writes, options = SETS[case]
    return model, family_transcoders(model, reads, writes, **options)


@pytest.mark.parametrize("name, transcoder", CASES, ids=[f"{n[:20]} {' '.join(t)}" for n, t in CASES])
def test_every_term_is_the_frozen_models_change(name, transcoder):
    model, transcoders = made(name, transcoder)
    stream = NodeStream(model, transcoders, torch.tensor(PROMPT))
    results = qk_attributions(stream, HEADS, top=6)
    frozen = FrozenModel(model, transcoders, PROMPT)
    try:
        for result in results:
            assert result.error < 1e-5, result.check
            rest = result.no_node
            by_query = sum(v for _, v in result.query_positions) + rest["rest x key nodes"] + rest["rest x rest"]
            by_key = sum(v for _, v in result.key_positions) + rest["query nodes x rest"] + rest["rest x rest"]
            assert abs(by_query - result.score) < 1e-5 * max(1.0, abs(result.score))
            assert abs(by_key - result.score) < 1e-5 * max(1.0, abs(result.score))
            args = (result.layer, result.head, result.query, result.key)
            clean = frozen.score(*args)
            assert abs(clean - result.score) < 1e-5 * max(1.0, abs(clean)), (result.name, clean, result.score)
            scale = max(1.0, sum(abs(value) for _, value in result.query_marginals))
            side = {}

            def vector(node, position):
                if (node.id, position) not in side:
                    side[(node.id, position)] = frozen.node_vector(node, result.layer)[position]
                return side[(node.id, position)]

            assert result.pairs, result.name
            for q_node, k_node, term in result.pairs:
                vq, vk = vector(q_node, result.query), vector(k_node, result.key)
                mixed = (frozen.score(*args, vq, vk) - frozen.score(*args, vq, None)
                         - frozen.score(*args, None, vk) + clean)
                assert abs(mixed - term) < 1e-5 * scale, (result.name, q_node.name, k_node.name, mixed, term)
            for node, marginal in result.query_marginals:
                change = frozen.score(*args, vector(node, result.query), None) - clean
                assert abs(change - marginal) < 1e-5 * scale, (result.name, node.name, change, marginal)
            for node, marginal in result.key_marginals:
                change = frozen.score(*args, None, vector(node, result.key)) - clean
                assert abs(change - marginal) < 1e-5 * scale, (result.name, node.name, change, marginal)
            traced = float(frozen.clean[f"blocks.{result.layer}.attn.scores"][0, result.head, result.query, result.key])
            assert abs((result.capped if result.capped is not None else result.score) + result.bias - traced) < 1e-5
            if model.config.pos_encoding == "alibi":
                assert (result.bias < 0) == (result.query != result.key) and "ALiBi" in result.notes[-1]
            if model.config.attn_softcap:
                capped = float(frozen.clean[f"blocks.{result.layer}.attn.scores"][0, result.head, result.query, result.key])
                assert result.capped is not None and abs(result.capped - capped) < 1e-5
                assert "before the cap" in result.notes[0]
    finally:
        frozen.restore()


def test_the_terms_of_a_key_on_the_first_position_and_of_one_position():
    model, transcoders = shaped("llama")
    stream = NodeStream(model, transcoders, torch.tensor(PROMPT))
    first, same = qk_attributions(stream, [(1, 0, 5, 0), (2, 2, 3, 3)])
    assert {k.kind for _, k, _ in first.pairs} == {"token"} and {k.column for _, k, _ in first.pairs} == {0}
    assert all(q.column <= 5 for q, _, _ in first.pairs) and first.error < 1e-5
    assert all(q.column <= 3 and k.column <= 3 for q, k, _ in same.pairs) and same.error < 1e-5


def test_the_position_pairs_are_the_node_pairs_summed_by_position():
    model, transcoders = shaped("gpt2: LayerNorm, biases, learned positions")
    stream = NodeStream(model, transcoders, torch.tensor(PROMPT))
    result = qk_attributions(stream, [(2, 1, 6, 4)], top=10**6)[0]  # every pair term
    sums = {}
    for q, k, term in result.pairs:
        sums[(q.column, k.column)] = sums.get((q.column, k.column), 0.0) + term
    assert result.position_pairs and len(result.position_pairs) <= 10**6
    for q, k, term in result.position_pairs:
        assert abs(sums[(q, k)] - term) < 1e-9 * max(1.0, abs(term))
    assert abs(sum(sums.values()) - result.pair_total) < 1e-9 * max(1.0, abs(result.pair_total))


def test_the_strongest_pairs_are_the_largest_products():
    generator = torch.Generator().manual_seed(0)
    Q = torch.randn(300, 8, generator=generator, dtype=torch.float64) * torch.rand(300, 1, generator=generator, dtype=torch.float64) ** 4
    K = torch.randn(700, 8, generator=generator, dtype=torch.float64) * torch.rand(700, 1, generator=generator, dtype=torch.float64)
    full = Q @ K.T
    expected = full.abs().flatten().topk(7).values
    found = strongest_pairs(Q, K, 7)
    assert torch.allclose(torch.tensor([abs(v) for _, _, v in found], dtype=torch.float64), expected)  # in order
    assert all(full[i, j] == v for i, j, v in found)


def test_bad_heads_and_positions_are_refused_in_words():
    model, transcoders = shaped("llama")
    stream = NodeStream(model, transcoders, torch.tensor(PROMPT))
    with pytest.raises(ValueError, match="no head L5 H0"):
        qk_attributions(stream, [(5, 0, 3, 1)])
    with pytest.raises(ValueError, match="key <= query"):
        qk_attributions(stream, [(1, 0, 2, 4)])
