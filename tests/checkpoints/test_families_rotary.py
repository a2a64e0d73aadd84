"""The rotary decoder families (issue 12): each model type equals transformers.

For every case, a tiny random transformers model (hidden 32, 2-3 layers, vocab 99) saved with
save_pretrained and read by anatomy.from_pretrained:
- every intermediate the parity report pairs is within 1e-5 in float32, padded and unpadded;
- anatomy's save_pretrained writes the same tensors back, and transformers computes the same logits;
- the KV cache gives the logits of the full pass (past the sliding window, where there is one);
- greedy generation picks the tokens transformers' generate picks, for a plain and a left-padded batch.
"""

from __future__ import annotations

import json

import pytest
import torch
from checkpoint_cases import VOCAB, assert_written_back, checkpoint_factory, load_theirs, random_ids

import anatomy
from anatomy.checkpoints.parity import parity_rows

TOL = 1e-5
PAD = VOCAB - 1
SMALL = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
             max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=PAD)
LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}

# case -> (transformers class, config class, config fields)
CASES = {
    "llama-linear": ("LlamaForCausalLM", "LlamaConfig", dict(
        SMALL, num_key_value_heads=2, rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0})),
    "llama3": ("LlamaForCausalLM", "LlamaConfig", dict(SMALL, num_key_value_heads=2, rope_parameters=LLAMA3)),
    "mistral": ("MistralForCausalLM", "MistralConfig", dict(SMALL, num_key_value_heads=2, sliding_window=4)),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", dict(SMALL, num_key_value_heads=2)),
    "qwen2-window": ("Qwen2ForCausalLM", "Qwen2Config", dict(
        SMALL, num_hidden_layers=3, num_key_value_heads=4, use_sliding_window=True, sliding_window=4,
        max_window_layers=1, tie_word_embeddings=True)),  # layers: full, sliding, sliding
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", dict(SMALL, num_key_value_heads=2, head_dim=16)),
    "gpt_neox": ("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(SMALL, rotary_pct=0.5)),
    "gpt_neox-sequential": ("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(
        SMALL, rotary_pct=0.25, use_parallel_residual=False, hidden_act="gelu_new")),
    "gemma": ("GemmaForCausalLM", "GemmaConfig", dict(SMALL, num_key_value_heads=1, head_dim=16)),
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config", dict(
        SMALL, num_hidden_layers=3, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24,
        attn_logit_softcapping=2.0, final_logit_softcapping=3.0, sliding_window=4)),  # sliding, full, sliding
    "gemma3_text": ("Gemma3ForCausalLM", "Gemma3TextConfig", dict(
        SMALL, num_hidden_layers=3, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=12, sliding_window=4,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})),
    "olmo2": ("Olmo2ForCausalLM", "Olmo2Config", dict(SMALL, num_key_value_heads=2)),
    "phi3": ("Phi3ForCausalLM", "Phi3Config", dict(
        SMALL, num_key_value_heads=2, sliding_window=5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})),
    "gptj": ("GPTJForCausalLM", "GPTJConfig", dict(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_inner=37, n_positions=64,
        bos_token_id=0, eos_token_id=0, pad_token_id=PAD)),
    "mixtral": ("MixtralForCausalLM", "MixtralConfig", dict(
        SMALL, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, sliding_window=5,
        intermediate_size=40)),  # rows of 16 bytes: transformers' grouped expert kernel needs them
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """checkpoint(case) -> the folder of a saved random transformers model (built once per module)."""
    return checkpoint_factory(CASES, tmp_path_factory)


@pytest.mark.parametrize("pad", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("case", list(CASES))
def test_every_intermediate_matches_transformers(checkpoint, case, pad):
    rows = parity_rows(checkpoint(case), pad=pad, tol=TOL)
    names = [r.name for r in rows]
    n_layers = anatomy.from_pretrained(checkpoint(case)).config.n_layers
    assert sum(".attn.pattern" in n for n in names) == n_layers and "logits" in names
    bad = [(r.name, r.reference, r.max_abs_diff) for r in rows if not r.ok]
    assert not bad, f"beyond {TOL}: {bad}"


def _logits(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits


@pytest.mark.parametrize("case", list(CASES))
def test_save_pretrained_gives_transformers_the_same_model(checkpoint, tmp_path, case):
    source = checkpoint(case)
    model = anatomy.from_pretrained(source)
    saved = model.save_pretrained(tmp_path / "saved", format="hf")
    assert_written_back(source, saved, CASES[case][0])
    assert anatomy.from_pretrained(saved).config == model.config
    ids, mask = random_ids((2, 9)), torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:] = 0
    reference = _logits(load_theirs(CASES[case][0], source), ids, mask)
    assert torch.equal(_logits(load_theirs(CASES[case][0], saved), ids, mask), reference)


@pytest.mark.parametrize("case", list(CASES))
def test_the_kv_cache_gives_the_full_pass(checkpoint, case):
    model = anatomy.from_pretrained(checkpoint(case))
    ids = random_ids((2, 11))  # longer than every sliding window in CASES
    with torch.no_grad():
        full = model(ids).logits
        cache = model.new_cache()
        steps = [model(ids[:, :3], cache=cache).logits]
        steps += [model(ids[:, t:t + 1], cache=cache).logits for t in range(3, 11)]
    # The fused kernel sums in another order for one query than for many: float32 rounding, which
    # random weights amplify through the layers, so the tolerance is relative to the logits' scale.
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=TOL * float(full.abs().max().clamp(min=1)))


@pytest.mark.parametrize("padded", [False, True], ids=["plain", "left-padded"])
@pytest.mark.parametrize("case", list(CASES))
def test_greedy_generation_equals_transformers(checkpoint, case, padded):
    directory = checkpoint(case)
    model, theirs = anatomy.from_pretrained(directory), load_theirs(CASES[case][0], directory)
    prompt, mask = random_ids((2, 6)), torch.ones(2, 6, dtype=torch.long)
    if padded:
        prompt[1, :2], mask[1, :2] = PAD, 0
    no_stop = dict(do_sample=False, num_beams=1, eos_token_id=None, pad_token_id=PAD, max_new_tokens=8)
    with torch.no_grad():
        expected = theirs.generate(input_ids=prompt, attention_mask=mask, **no_stop)
        ours = anatomy.generate(model, prompt, padding_mask=mask.bool(), max_new_tokens=8).sequences
    assert torch.equal(ours, expected)


def test_router_logits_are_compared_and_expert_weights_choose_k_experts(checkpoint):
    rows = {r.name: r for r in parity_rows(checkpoint("mixtral"), pad=True, tol=TOL)}
    assert rows["blocks.1.mlp.router_logits"].ok and rows["blocks.1.mlp.router_logits"].reference == "router_logits[1]"
    model = anatomy.from_pretrained(checkpoint("mixtral"))
    ids = random_ids((2, 7))
    with anatomy.trace(model, ["blocks.0.mlp.router_logits", "blocks.0.mlp.expert_weights"]) as t:
        model(ids)
    weights, logits = t["blocks.0.mlp.expert_weights"], t["blocks.0.mlp.router_logits"]
    assert ((weights > 0).sum(-1) == 2).all()  # num_experts_per_tok
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 7))
    chosen = weights > 0  # the two largest router logits of each token
    assert torch.equal(chosen, torch.zeros_like(chosen).scatter(-1, logits.topk(2, dim=-1).indices, True))


def test_forcing_every_token_to_one_expert_runs_that_expert_alone(checkpoint):
    model = anatomy.from_pretrained(checkpoint("mixtral"))
    ids = random_ids((1, 5))
    only_expert_3 = lambda w: torch.zeros_like(w).index_fill(-1, torch.tensor([3]), 1.0)  # noqa: E731
    with anatomy.trace(model, ["blocks.0.mlp_norm.out", "blocks.0.mlp.out"],
                       interventions={"blocks.0.mlp.expert_weights": only_expert_3}) as t:
        model(ids)
    expected = model.blocks[0].mlp.experts[3](t["blocks.0.mlp_norm.out"])
    torch.testing.assert_close(t["blocks.0.mlp.out"], expected)


LINEAGE = dict(arch="decoder", vocab_size=VOCAB, d_model=32, n_heads=4, n_kv_heads=2, n_layers=3, d_ff=40,
               max_seq_len=64, pos_encoding="rotary", norm="rmsnorm", activation="swiglu", attn_bias=False,
               attn_out_bias=False, mlp_bias=False, tie_embeddings=False, norm_eps=1e-6, dropout=0.0,
               attn_dropout=0.0)
GEMMA = dict(LINEAGE, activation="geglu_tanh", norm_plus_one=True, scale_embeddings=True, tie_embeddings=True)
# name -> (a config built by anatomy, the transformers class its save_pretrained must name)
FROM_SCRATCH = {
    "mistral": (dict(LINEAGE, sliding_window=4), "MistralForCausalLM"),
    "qwen2": (dict(LINEAGE, attn_bias=True, sliding_window=4, layer_types=("full", "sliding", "sliding")),
              "Qwen2ForCausalLM"),
    "qwen3": (dict(LINEAGE, qk_norm="per_head", rope_scaling="linear", rope_scaling_factor=2.0), "Qwen3ForCausalLM"),
    "gemma2": (dict(GEMMA, norm_position="sandwich", query_pre_attn_scalar=16.0, attn_softcap=3.0,
                    final_logit_softcap=5.0, sliding_window=4, layer_types=("sliding", "full", "sliding")),
               "Gemma2ForCausalLM"),
    "gemma3_text": (dict(GEMMA, norm_position="sandwich", qk_norm="per_head", query_pre_attn_scalar=16.0,
                         sliding_window=4, layer_types=("sliding", "sliding", "full"), rope_local_theta=100.0),
                    "Gemma3ForCausalLM"),
    "olmo2": (dict(LINEAGE, norm_position="post_sublayer", qk_norm="across_heads"), "Olmo2ForCausalLM"),
    "phi3": (dict(LINEAGE, rotary_dim=4), "Phi3ForCausalLM"),
    "mixtral": (dict(LINEAGE, n_experts=3, n_experts_per_token=2), "MixtralForCausalLM"),
    "gpt_neox": (dict(LINEAGE, norm="layernorm", activation="gelu", n_kv_heads=4, attn_bias=True, attn_out_bias=True,
                      mlp_bias=True, parallel_residual=True, rotary_dim=4), "GPTNeoXForCausalLM"),
    "gptj": (dict(LINEAGE, norm="layernorm", activation="gelu_tanh", n_kv_heads=4, mlp_bias=True, lm_head_bias=True,
                  parallel_residual=True, parallel_shared_norm=True, rotary_dim=4, rotary_layout="interleaved"),
             "GPTJForCausalLM"),
}


@pytest.mark.parametrize("name", list(FROM_SCRATCH))
def test_a_model_built_by_anatomy_is_written_for_the_right_transformers_class(tmp_path, name):
    transformers = pytest.importorskip("transformers")
    fields, class_name = FROM_SCRATCH[name]
    model = anatomy.build_model(anatomy.ModelConfig(**fields), seed=0).eval()
    with torch.no_grad():  # norms and biases away from their initial values, so that each must land in its place
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    model.save_pretrained(tmp_path, format="hf")
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [class_name]
    theirs = getattr(transformers, class_name).from_pretrained(tmp_path, attn_implementation="eager").eval()
    ids = random_ids((2, 9))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, theirs(input_ids=ids).logits, rtol=0, atol=TOL)
    assert anatomy.from_pretrained(tmp_path).config.replace(extra={}) == model.config
