"""A full cache keeps some points as recipes (anatomy/analysis/derived.py): every name still answers,
in the same order, with bitwise the value a cache that stores every tensor holds."""

from __future__ import annotations

import pytest
import torch

import anatomy
from anatomy.analysis import as_batch, run_with_cache
from anatomy.analysis.derived import Derivations

from analysis_models import FAMILIES, ids, inputs_for, tiny

PADDING = torch.tensor([[True] * 9, [True] * 6 + [False] * 3])

BLOCKS = {  # every block layout, norm and activation the recipes distinguish
    "pre, gelu": {},
    "post (BERT)": dict(arch="encoder", norm_position="post"),
    "sandwich, rmsnorm, geglu": dict(norm_position="sandwich", norm="rmsnorm", norm_plus_one=True,
                                     activation="geglu_tanh"),
    "post_sublayer": dict(norm_position="post_sublayer", norm="rmsnorm"),
    "parallel (NeoX), rotary": dict(parallel_residual=True, pos_encoding="rotary"),
    "parallel shared norm (GPT-J)": dict(parallel_residual=True, parallel_shared_norm=True),
    "alibi, grouped-query, softcap": dict(pos_encoding="alibi", n_kv_heads=2, attn_softcap=20.0),
    "sliding window, relu": dict(layer_types=("sliding", "full"), sliding_window=4, activation="relu"),
    **{f"family {name}": overrides for name, overrides in FAMILIES.items()},
}


def stored_everything(model, inputs):
    """The cache as it was before recipes: every point's tensor (named explicitly, nothing derived)."""
    names = [name for name, point in anatomy.trace_points(model).items() if not point.on_request]
    return run_with_cache(model, inputs, names)[1]


def mb(tensors) -> float:
    """MB of the distinct storages behind `tensors`."""
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values()) / 1e6


@pytest.mark.parametrize("overrides", BLOCKS.values(), ids=list(BLOCKS))
def test_full_cache_answers_every_name_with_the_stored_value(overrides):
    model = tiny(**overrides)
    inputs = inputs_for(model)
    output, cache = run_with_cache(model, inputs)
    reference = stored_everything(model, inputs)
    assert list(cache) == list(reference) and len(cache) == len(reference)
    assert set(cache.keys()) == set(reference.keys())
    for name in reference:
        assert torch.equal(cache[name], reference[name]), name
        assert cache[name].shape == reference[name].shape and cache.axes(name) == reference.axes(name)
    assert torch.equal(output.logits, reference["logits"])


def test_padded_batch_is_bitwise_the_stored_cache():
    model = tiny()
    batch = as_batch(model, ids(2, 9))
    batch.target.padding_mask = PADDING
    _, cache = run_with_cache(model, batch)
    reference = stored_everything(model, batch)
    for name in reference:
        assert torch.equal(cache[name], reference[name]), name
    assert cache["blocks.1.attn.pattern"][1, :, :, 6:].abs().max() == 0  # no weight on padding


def test_a_full_gpt2_shaped_cache_holds_less_until_read():
    model = tiny(n_layers=3)
    _, cache = run_with_cache(model, ids(1, 16))
    everything = stored_everything(model, ids(1, 16))
    held, full = mb(cache.stored()), mb(everything.values())
    # pattern, mlp.post, resid_mid and two norms per layer are recipes until read
    assert held < 0.75 * full
    _ = cache["blocks.0.mlp.post"]
    assert mb(cache.stored()) > held  # a value read is kept, like a stored one
    assert cache["blocks.0.mlp.post"] is cache["blocks.0.mlp.post"]
    read = mb(cache.values())
    assert abs(mb(cache.stored()) - read) < 1e-9 and abs(read - full) < 1e-9  # every value read: all of it held


def test_transformer_lens_names_answer_derived_points():
    model = tiny()
    _, cache = run_with_cache(model, ids())
    reference = stored_everything(model, ids())
    for name in ("blocks.0.attn.hook_pattern", "blocks.1.mlp.hook_post", "blocks.1.hook_resid_mid",
                 "blocks.0.ln1.hook_normalized", "blocks.1.ln2.hook_normalized", "ln_final.hook_normalized"):
        assert name in cache
        assert torch.equal(cache[name], reference[name]), name


def test_derived_norm_outputs_keep_the_passes_weights():
    model = tiny()
    _, cache = run_with_cache(model, ids())
    reference = stored_everything(model, ids())
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(2.0)  # e.g. an optimiser step after the cache was taken
    for name in ("blocks.0.attn_norm.out", "blocks.1.mlp_norm.out", "final_norm.out"):
        assert torch.equal(cache[name], reference[name]), name


def test_interventions_are_recorded_not_derived():
    model = tiny()
    derive = Derivations(model)

    def flat(x):
        return torch.full_like(x, 0.25)

    def double(x):
        return 2 * x

    with derive.capturing(), torch.no_grad():
        with anatomy.trace(model, None, {"blocks.0.attn.pattern": flat, "blocks.1.attn.scores": double},
                           derive=derive) as t:
            model(ids())
    with torch.no_grad():
        with anatomy.trace(model, None, {"blocks.0.attn.pattern": flat, "blocks.1.attn.scores": double}) as stored:
            model(ids())
    assert (t["blocks.0.attn.pattern"] == 0.25).all()  # the replacement, not softmax(scores)
    for name in stored:
        assert torch.equal(t[name], stored[name]), name  # blocks.1's pattern: softmax of the doubled scores


def test_with_grad_the_cache_holds_the_graphs_own_tensors():
    model = tiny()
    output, cache = run_with_cache(model, ids(), grad=True)
    gradient, = torch.autograd.grad(output.logits[0, -1, 3], cache["blocks.0.attn.pattern"])
    assert gradient.shape == cache["blocks.0.attn.pattern"].shape and gradient.abs().sum() > 0


def test_resid_mid_is_stored_while_dropout_is_active():
    model = tiny(dropout=0.5).train()
    _, cache = run_with_cache(model, ids())
    held = mb(cache.stored())
    _ = cache["blocks.0.resid_mid"]
    assert mb(cache.stored()) == held  # it was a tensor already: x + Dropout(update) is not x + update
