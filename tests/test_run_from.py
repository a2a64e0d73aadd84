"""The stack run from any layer (Stack.run_from): given the residual stream a full pass holds at a block's
input, it gives the full pass's hidden states, for every block layout, position encoding and family, with
padding; the trace points from that block on fire as in the full pass; bad arguments are named."""

from __future__ import annotations

import pytest
import torch

import anatomy
from anatomy.analysis.inputs import Batch, Text
from anatomy.trace import trace

SMALL = dict(vocab_size=50, d_model=16, n_heads=4, n_layers=3, d_ff=24, max_seq_len=32)
VARIANTS = {  # name -> the config's flags: every block layout and position encoding the stack has
    "llama (pre, rotary, GQA)": dict(arch="decoder", pos_encoding="rotary", norm="rmsnorm", activation="swiglu",
                                     n_kv_heads=2),
    "gpt2 (pre, learned)": dict(arch="decoder", pos_encoding="learned", norm="layernorm", activation="gelu_tanh"),
    "neox (parallel)": dict(arch="decoder", pos_encoding="rotary", norm="layernorm", parallel_residual=True),
    "gptj (parallel, one norm)": dict(arch="decoder", pos_encoding="rotary", norm="layernorm", parallel_residual=True,
                                      parallel_shared_norm=True),
    "gemma2 (sandwich, sliding, soft-caps)": dict(
        arch="decoder", pos_encoding="rotary", norm="rmsnorm", norm_position="sandwich", activation="geglu_tanh",
        layer_types=("sliding", "full", "sliding"), sliding_window=3, attn_softcap=5.0, final_logit_softcap=8.0),
    "olmo2 (post-sublayer, q/k norms)": dict(arch="decoder", pos_encoding="rotary", norm="rmsnorm",
                                             norm_position="post_sublayer", qk_norm="across_heads"),
    "mixtral (experts)": dict(arch="decoder", pos_encoding="rotary", norm="rmsnorm", activation="swiglu", n_experts=4,
                              n_experts_per_token=2),
    "bloom (alibi)": dict(arch="decoder", pos_encoding="alibi", norm="layernorm", embed_norm=True),
    "post-norm decoder": dict(arch="decoder", pos_encoding="sinusoidal", norm="layernorm", norm_position="post",
                              final_norm=False),
    "bert (encoder, post-norm, token types)": dict(arch="encoder", pos_encoding="learned", norm="layernorm",
                                                   norm_position="post", type_vocab_size=2, embed_norm=True,
                                                   head="masked-lm"),
    "t5 (encoder-decoder, relative)": dict(arch="encoder-decoder", pos_encoding="relative", norm="rmsnorm",
                                           relative_buckets=8, relative_max_distance=16),
}


def model_of(flags: dict) -> torch.nn.Module:
    return anatomy.build_model(anatomy.ModelConfig(**SMALL, **flags), seed=0).double().eval()


def batch_of(model) -> Batch:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 50, (3, 7), generator=generator)
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[1, 5:] = False  # a right-padded row
    target = Text(ids, mask, [[""] * 7] * 3)
    if model.config.arch == "encoder-decoder":
        return Batch(Text(ids[:, :5], mask[:, :5], [[""] * 5] * 3), target)
    return Batch(target)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_stack_from_any_layer_gives_the_full_pass(variant):
    model = model_of(VARIANTS[variant])
    batch = batch_of(model)
    prefix = "decoder." if batch.source is not None else ""
    n_layers = model.config.decoder_n_layers if batch.source is not None else model.config.n_layers
    names = [f"{prefix}blocks.{layer}.resid_pre" for layer in range(n_layers)]
    names.append(f"{prefix}blocks.{n_layers - 1}.resid_post")
    with torch.no_grad(), trace(model, names) as t:
        full = batch.hidden(model)
        full_logits = batch.last_logits(model)
    for layer in range(n_layers + 1):
        with torch.no_grad():
            resumed = batch.hidden(model, (layer, t[names[layer]]))
            logits = batch.last_logits(model, (layer, t[names[layer]]))
        assert (resumed - full).abs().max() < 1e-12, layer
        assert (logits - full_logits).abs().max() < 1e-12, layer


def test_a_changed_stream_changes_the_run_and_only_later_trace_points_fire():
    """The layers before the start are not run (their points do not fire); a stream changed at the start
    changes what follows (the resumed run reads the given stream, not a cached one)."""
    model = model_of(VARIANTS["llama (pre, rotary, GQA)"])
    batch = batch_of(model)
    with torch.no_grad(), trace(model, ["blocks.1.resid_pre"]) as t:
        full = batch.hidden(model)
    fired = []
    interventions = {f"blocks.{layer}.resid_pre": (lambda x, layer=layer: fired.append(layer)) for layer in range(3)}
    with torch.no_grad(), trace(model, [], interventions=interventions):
        changed = batch.hidden(model, (1, t["blocks.1.resid_pre"] * 1.5))
    assert fired == [1, 2]
    assert (changed - full).abs().max() > 1e-3


def test_bad_arguments_are_named():
    model = model_of(VARIANTS["llama (pre, rotary, GQA)"])
    resid = torch.zeros(2, 5, 16, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"layer must be an integer from 0 to 3 \(the stack's blocks\), got 4"):
        model.run_from(4, resid)
    with pytest.raises(ValueError, match=r"layer must be an integer from 0 to 3 .* got True"):
        model.run_from(True, resid)
    with pytest.raises(ValueError, match=r"resid must be the residual stream \[batch, pos, 16\], got \(2, 5, 8\)"):
        model.run_from(0, torch.zeros(2, 5, 8))
    with pytest.raises(Exception, match="padding_mask"):
        model.run_from(0, resid, padding_mask=torch.ones(2, 4, dtype=torch.bool))
