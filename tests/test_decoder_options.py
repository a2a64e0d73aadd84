"""The decoder options of the rotary families, as properties of anatomy itself (no transformers):
sliding windows, rotary layouts and scaling, soft-capping, parallel blocks and their validation."""

from __future__ import annotations

import math

import pytest
import torch

import anatomy
from anatomy.config import ConfigError, ModelConfig
from anatomy.positional import RotaryEmbedding, rope_frequencies

BASE = dict(arch="decoder", vocab_size=50, d_model=32, n_heads=4, n_layers=2, d_ff=48, max_seq_len=64,
            pos_encoding="rotary", norm="rmsnorm", activation="swiglu", attn_bias=False, attn_out_bias=False,
            mlp_bias=False, dropout=0.0)


def _model(**changes):
    return anatomy.build_model(ModelConfig(**{**BASE, **changes}), seed=0).eval()


@pytest.mark.parametrize("changes, message", [
    (dict(rotary_layout="spiral"), "allowed values: 'halves', 'interleaved'"),
    (dict(rope_scaling="yarn"), "allowed values: 'none', 'linear', 'llama3'"),
    (dict(qk_norm="yes"), "allowed values: 'none', 'per_head', 'across_heads'"),
    (dict(norm_position="middle"), "'pre', 'post', 'sandwich', 'post_sublayer'"),
    (dict(sliding_window=4, layer_types=("full", "local")), "allowed values: 'full', 'sliding'"),
    (dict(layer_types=("full", "sliding")), "sliding_window is None"),
    (dict(sliding_window=4, layer_types=("full",)), "1 entries for n_layers=2"),
    (dict(rotary_dim=5), "rotary_dim=5 must be even"),
    (dict(rotary_dim=10), "at most d_head=8"),
    (dict(parallel_shared_norm=True), "needs parallel_residual=True"),
    (dict(parallel_residual=True, norm_position="post"), "needs norm_position='pre'"),
    (dict(n_experts=2, n_experts_per_token=3), "at most n_experts=2"),
    (dict(attn_softcap=0.0), "attn_softcap .*> 0"),
    (dict(rope_scaling="llama3", rope_low_freq_factor=4.0, rope_high_freq_factor=1.0), "rope_low_freq_factor <"),
])
def test_each_option_is_validated_and_the_error_names_what_is_allowed(changes, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig(**{**BASE, **changes})


def test_a_config_with_layer_types_survives_json():
    config = ModelConfig(**{**BASE, "sliding_window": 3, "layer_types": ["sliding", "full"], "qk_norm": "per_head"})
    assert config.layer_types == ("sliding", "full")
    assert ModelConfig.from_json(config.to_json()) == config
    assert ModelConfig(**{**BASE, "sliding_window": 3}).layer_types == ("sliding", "sliding")


def test_a_sliding_window_hides_exactly_the_keys_that_slid_out():
    """One layer, window 3: the output at position t depends on tokens t-2..t and on nothing earlier."""
    model = _model(n_layers=1, sliding_window=3)
    ids = torch.randint(0, 50, (1, 10), generator=torch.Generator().manual_seed(0))
    changed = ids.clone()
    changed[0, 4] = (ids[0, 4] + 1) % 50
    with torch.no_grad():
        a, b = model(ids).logits, model(changed).logits
    moved = (a - b).abs().amax(dim=-1)[0] > 1e-6
    assert moved.tolist() == [False] * 4 + [True] * 3 + [False] * 3


@pytest.mark.parametrize("attn_impl", ["sdpa", "eager"])
def test_the_kv_cache_past_the_window_gives_the_full_pass(attn_impl):
    model = _model(sliding_window=3, layer_types=("sliding", "full"), attn_impl=attn_impl)
    ids = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(ids).logits
        cache = model.new_cache()
        steps = [model(ids[:, :2], cache=cache).logits] + [model(ids[:, t:t + 1], cache=cache).logits
                                                          for t in range(2, 9)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-5)


def test_the_fused_and_the_explicit_kernels_agree_on_every_option_but_softcap():
    options = dict(sliding_window=3, layer_types=("sliding", "full"), qk_norm="across_heads", rotary_dim=4,
                   query_pre_attn_scalar=12.0, norm_position="sandwich", norm_plus_one=True)
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 5:] = False
    fused, explicit = _model(**options), _model(**options, attn_impl="eager")
    with torch.no_grad():
        torch.testing.assert_close(fused(ids, mask).logits[mask], explicit(ids, mask).logits[mask], rtol=0, atol=1e-5)
    capped = _model(attn_softcap=1.0)
    assert capped.blocks[0].attn.why_not_fused and fused.blocks[0].attn.why_not_fused is None


def test_softcaps_bound_scores_and_logits():
    model = _model(attn_softcap=0.5, final_logit_softcap=0.25)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(20)  # scores and logits far beyond the caps
    with anatomy.trace(model, ["blocks.0.attn.scores", "logits"]) as t:
        model(torch.arange(6)[None])
    assert t["blocks.0.attn.scores"].abs().max() <= 0.5 and t["logits"].abs().max() <= 0.25


def test_interleaved_rotary_is_the_halves_layout_on_permuted_dimensions():
    torch.manual_seed(0)
    x = torch.randn(1, 2, 5, 8)
    halves = RotaryEmbedding(8, 16, rotary_dim=6)
    interleaved = RotaryEmbedding(8, 16, rotary_dim=6, layout="interleaved")
    # interleaved pairs (0,1), (2,3), (4,5) are the halves pairs (0,3), (1,4), (2,5); 6 and 7 pass
    order = torch.tensor([0, 2, 4, 1, 3, 5, 6, 7])
    positions = torch.arange(5)
    torch.testing.assert_close(interleaved(x, positions)[..., order], halves(x[..., order], positions))
    assert torch.equal(halves(x, positions)[..., 6:], x[..., 6:])  # beyond rotary_dim, untouched


@pytest.mark.parametrize("layout", ["halves", "interleaved"])
def test_rotated_scores_depend_on_the_distance_only(layout):
    torch.manual_seed(0)
    rope = RotaryEmbedding(8, 32, rotary_dim=4, layout=layout)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(m, n):
        return float((rope(q, torch.tensor([m])) * rope(k, torch.tensor([n]))).sum())

    assert score(7, 3) == pytest.approx(score(20, 16), abs=1e-5)
    assert score(7, 3) != pytest.approx(score(7, 4), abs=1e-3)


def test_rope_scaling_slows_the_rotations():
    config = ModelConfig(**{**BASE, "rope_scaling": "linear", "rope_scaling_factor": 4.0})
    plain = rope_frequencies(config, 10000.0, "none")
    torch.testing.assert_close(rope_frequencies(config, 10000.0, "linear"), plain / 4)
    config = config.replace(rope_scaling="llama3", rope_original_max_len=64, rope_high_freq_factor=8.0)
    llama3 = rope_frequencies(config, 10000.0, "llama3")
    wavelength = 2 * math.pi / plain
    short, long = wavelength < 64 / 8, wavelength > 64 / 1
    assert short.any() and long.any() and not (short | long).all()
    torch.testing.assert_close(llama3[short], plain[short])  # fast rotations kept
    torch.testing.assert_close(llama3[long], plain[long] / 4)  # slow ones divided by the factor
    between = ~(short | long)
    assert ((llama3[between] < plain[between]) & (llama3[between] > plain[between] / 4)).all()


def test_a_parallel_block_lets_both_sublayers_read_the_same_stream():
    model = _model(n_layers=1, parallel_residual=True, parallel_shared_norm=True, norm="layernorm")
    block = model.blocks[0]
    assert not hasattr(block, "mlp_norm") and not hasattr(block, "resid_mid")
    x = torch.randn(1, 4, 32)
    with torch.no_grad():
        normed = block.attn_norm(x)
        expected = x + block.attn(normed, mask=None, position_ids=torch.arange(4)) + block.mlp(normed)
        torch.testing.assert_close(block(x, position_ids=torch.arange(4)), expected)


def test_qk_norm_gives_unit_rms_queries_and_keys_whatever_the_block_norm():
    """QK-norm is its own RMSNorm, so a LayerNorm model (the char-LM ablation's baseline) can take it."""
    model = _model(norm="layernorm", pos_encoding="learned", qk_norm="per_head")
    with torch.no_grad():  # projections large enough that eps does not matter
        model.blocks[0].attn.q_proj.weight.mul_(100), model.blocks[0].attn.k_proj.weight.mul_(100)
    with anatomy.trace(model, ["blocks.0.attn.q", "blocks.0.attn.k"]) as t:
        model(torch.arange(6)[None] * 7)
    for name in ("blocks.0.attn.q", "blocks.0.attn.k"):  # gains start at 1: each head's vector has RMS 1
        rms = t[name].pow(2).mean(dim=-1).sqrt()
        torch.testing.assert_close(rms, torch.ones_like(rms), atol=1e-4, rtol=0)
