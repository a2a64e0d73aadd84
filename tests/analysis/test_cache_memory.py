"""A full cache keeps some points as recipes (anatomy/analysis/derived.py): every name still answers,
in the same order, with bitwise the value a cache that stores every tensor holds."""

from __future__ import annotations

import inspect
import sys

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
    "T5 relative bias, encoder-decoder, rmsnorm": dict(arch="encoder-decoder", pos_encoding="relative", norm="rmsnorm"),
    "qk norm, query_pre_attn_scalar, rotary, grouped-query": dict(
        qk_norm="across_heads", query_pre_attn_scalar=12.0, pos_encoding="rotary", n_kv_heads=1, norm="rmsnorm"),
    "per-head qk norm, sandwich, mixture of experts": dict(qk_norm="per_head", norm_position="sandwich", n_experts=4),
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
    attention = [name for name in cache if name.endswith(("attn.scores", "attn.pattern", "attn.z"))]
    assert attention and not any(torch.is_tensor(cache._values[name]) for name in attention)  # all recipes
    if model.config.norm_position != "post":
        assert not any(torch.is_tensor(cache._values[name]) for name in cache if name.endswith("resid_post"))
    assert list(cache) == list(reference) and len(cache) == len(reference)
    assert set(cache.keys()) == set(reference.keys())
    for name in reference:
        assert torch.equal(cache[name], reference[name]), name
        assert cache[name].shape == reference[name].shape and cache.axes(name) == reference.axes(name)
    assert torch.equal(output.logits, reference["logits"])


PADDED = {"decoder": {}, "alibi, grouped-query": dict(pos_encoding="alibi", n_kv_heads=2),
          "encoder-decoder, T5 bias": dict(arch="encoder-decoder", pos_encoding="relative")}


@pytest.mark.parametrize("overrides", PADDED.values(), ids=list(PADDED))
def test_padded_batch_is_bitwise_the_stored_cache(overrides):
    model = tiny(**overrides)
    batch = as_batch(model, (ids(2, 9, seed=1), ids(2, 9)) if model.config.arch == "encoder-decoder" else ids(2, 9))
    batch.target.padding_mask = PADDING
    if batch.source is not None:
        batch.source.padding_mask = PADDING.flip(0)  # the cross-attention's memory mask pads the first row
    _, cache = run_with_cache(model, batch)
    reference = stored_everything(model, batch)
    for name in reference:
        assert torch.equal(cache[name], reference[name]), name
    prefix = "decoder." if batch.source is not None else ""
    assert cache[f"{prefix}blocks.1.attn.pattern"][1, :, :, 6:].abs().max() == 0  # no weight on padding
    if batch.source is not None:
        assert cache["decoder.blocks.1.cross_attn.pattern"][0, :, :, 6:].abs().max() == 0


def _stored_kinds(cache) -> set[str]:
    """The kinds of point (`attn.q`, `resid_post`) the cache holds as tensors, not recipes."""
    return {name.split(".", 2)[2] if name.startswith("blocks.") else name
            for name, value in cache._values.items() if torch.is_tensor(value)}


def test_a_gpt2_cache_stores_products_and_derives_the_rest():
    model = tiny(n_layers=4)
    _, cache = run_with_cache(model, ids())
    # attn.scores, pattern, z, mlp.post, resid_mid, resid_post, resid_pre (after the first) and the norms are recipes
    assert _stored_kinds(cache) == {"embed", "pos_embed", "resid_pre", "attn.q", "attn.k", "attn.v", "attn.out",
                                    "mlp.pre", "mlp.out", "logits"}
    assert [name for name in cache._values if name.endswith("resid_pre") and torch.is_tensor(cache._values[name])] \
        == ["blocks.0.resid_pre"]


def test_the_last_layer_reads_first_through_a_deep_chain():
    """resid_post of the last layer is a chain through every layer below (about 70 links here): computed
    in a loop, within a few frames of the caller's depth, not one call per link."""
    model = tiny(n_layers=24, d_model=8, n_heads=2, d_ff=16)
    _, cache = run_with_cache(model, ids(1, 4))
    reference = stored_everything(model, ids(1, 4))
    depth = len(inspect.stack(0))
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(depth + 40)
    try:
        last = cache["blocks.23.resid_post"]
    finally:
        sys.setrecursionlimit(limit)
    assert torch.equal(last, reference["blocks.23.resid_post"])
    for name in ("final_norm.out", "blocks.23.attn.z", "blocks.12.resid_pre"):
        assert torch.equal(cache[name], reference[name]), name
    assert cache["blocks.12.resid_pre"] is cache["blocks.11.resid_post"]  # one tensor, as in the pass


ROTARY = {"halves": dict(pos_encoding="rotary"),
          "interleaved, partial": dict(pos_encoding="rotary", rotary_layout="interleaved", rotary_dim=2),
          "grouped-query, positions from padding": dict(pos_encoding="rotary", n_kv_heads=2,
                                                        positions_from_padding=True)}


@pytest.mark.parametrize("overrides", ROTARY.values(), ids=list(ROTARY))
def test_rotated_queries_and_keys_are_recipes_over_the_passes_tables(overrides):
    """q_rot and k_rot are rotary(q) and rotary(k) as the pass computed them, bitwise, even after
    the model's tables have changed (here: the model moved to float64)."""
    model = tiny(**overrides)
    batch = as_batch(model, ids(2, 9))
    batch.target.padding_mask = PADDING.flip(1)  # left padding: row 1's positions start at its first token
    _, cache = run_with_cache(model, batch)
    reference = stored_everything(model, batch)
    assert not {"attn.q_rot", "attn.k_rot"} & _stored_kinds(cache)
    model.double()
    for name in reference:
        if name.endswith(("q_rot", "k_rot", "scores")):
            assert cache[name].dtype == torch.float32 and torch.equal(cache[name], reference[name]), name


def test_attention_dropout_keeps_z_stored_and_the_rest_exact():
    model = tiny(dropout=0.0, attn_dropout=0.5).train()
    torch.manual_seed(0)
    _, cache = run_with_cache(model, ids())
    torch.manual_seed(0)
    reference = stored_everything(model, ids())
    assert "attn.z" in _stored_kinds(cache) and "attn.pattern" not in _stored_kinds(cache)
    for name in reference:
        assert torch.equal(cache[name], reference[name]), name


def test_a_pass_with_a_kv_cache_stores_its_attention():
    model = tiny()
    derive = Derivations(model)
    kv = model.new_cache(16)
    with torch.no_grad():
        model(ids(2, 5), cache=kv)
        with derive.capturing(), anatomy.trace(model, None, derive=derive) as t:
            model(ids(2, 3), cache=kv)  # three new queries over eight keys
    assert t["blocks.0.attn.scores"].shape[-1] == 8
    assert {"attn.scores", "attn.pattern", "attn.z"} <= _stored_kinds(t)


def test_nothing_is_derived_under_autocast():
    model = tiny()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, cache = run_with_cache(model, ids())
        reference = stored_everything(model, ids())
    assert all(torch.is_tensor(value) for value in cache._values.values())
    for name in reference:
        assert torch.equal(cache[name], reference[name]), name


def test_a_full_gpt2_shaped_cache_holds_less_until_read():
    model = tiny(n_layers=3)
    _, cache = run_with_cache(model, ids(1, 16))
    everything = stored_everything(model, ids(1, 16))
    held, full = mb(cache.stored()), mb(everything.values())
    # scores, pattern, z, mlp.post, the residual stream and the norms are recipes until read
    assert held < 0.6 * full
    _ = cache["blocks.0.mlp.post"]
    assert mb(cache.stored()) > held  # a value read is kept, like a stored one
    assert cache["blocks.0.mlp.post"] is cache["blocks.0.mlp.post"]
    read = mb(cache.values())
    assert abs(mb(cache.stored()) - read) < 1e-9 and abs(read - full) < 1e-9  # every value read: all of it held


def test_transformer_lens_names_answer_derived_points():
    model = tiny()
    _, cache = run_with_cache(model, ids())
    reference = stored_everything(model, ids())
    # (hook_normalized, a norm's stream before its gain, is recorded on request only: not in a full cache)
    for name in ("blocks.0.attn.hook_pattern", "blocks.1.mlp.hook_post", "blocks.1.hook_resid_mid"):
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


def test_a_pass_on_another_thread_meanwhile_leaves_the_derived_values_alone():
    """The explorer runs a job's passes and a panel's traced pass on one model at once: the recipes
    of the traced pass read its own mask, never the other thread's (a padded batch of 4 here)."""
    import threading

    model = anatomy.from_pretrained("toy")
    text, other = "Hello World, this is", ["Hello World,", "Hello World, this is Alejandro!"]

    def meanwhile(x):  # inside the traced pass, between the attention's call and its pattern
        thread = threading.Thread(target=lambda: as_batch(model, other).run(model))
        thread.start()
        thread.join()

    derivations = Derivations(model)
    with torch.no_grad(), anatomy.trace(model, None, derive=derivations,
                                        interventions={"blocks.0.attn.q": meanwhile}) as cache, derivations.capturing():
        model(torch.tensor([model.tokenizer.encode_prompt(text)]))
    _, stored = run_with_cache(model, text, names=["blocks.0.attn.pattern"])  # recorded, not derived
    torch.testing.assert_close(cache["blocks.0.attn.pattern"], stored["blocks.0.attn.pattern"], atol=0, rtol=0)
