"""Mixtral: Mistral whose feed-forward network is a sparse mixture of experts (anatomy/moe.py).
A router (block_sparse_moe.gate) scores num_local_experts SwiGLU experts per token and the
num_experts_per_tok best run, weighted by their renormalised router probabilities. Each expert's
w1, w3, w2 are the gate, up and down projections (fc_gate, fc_in, fc_out)."""

from __future__ import annotations

from ..config import ModelConfig
from .common import field, unsupported
from .engine import Rule, require
from .llama import BLOCK, FLAGS, LAYER, layer_types, lineage_architecture, options_off, read_decoder, write_decoder

CLASSES = {"MixtralForCausalLM": "lm", "MixtralModel": "none"}
EXPERT_WEIGHTS = {"w1": "fc_gate", "w3": "fc_in", "w2": "fc_out"}  # down(silu(w1 x) * w3 x) = w2(...)


def to_config(hf: dict, class_name: str, keys: set[str]) -> ModelConfig:
    unsupported("mixtral", hf, hidden_act="silu", layer_types=None)
    return read_decoder(
        hf, "mixtral", CLASSES[class_name], attn_bias=False, attn_out_bias=False, mlp_bias=False,
        n_experts=field(hf, "num_local_experts", "mixtral"),
        n_experts_per_token=field(hf, "num_experts_per_tok", "mixtral"),
        **layer_types(hf, "mixtral"),
    )


def to_hf_config(config: ModelConfig, class_name: str) -> dict:
    require("mixtral", config, **{
        **options_off(config), **FLAGS, "attn_bias": False, "attn_out_bias": False, "mlp_bias": False,
        "n_experts": max(config.n_experts, 1), "sliding_window": config.sliding_window,
        "layer_types": config.layer_types[:1] * config.n_layers,  # one window for every layer, or none
    })
    return dict(write_decoder(config, "mixtral"), hidden_act="silu", num_local_experts=config.n_experts,
                num_experts_per_tok=config.n_experts_per_token, sliding_window=config.sliding_window)


def expert_rules(config: ModelConfig) -> list[Rule]:
    moe, ours = f"{LAYER}.block_sparse_moe", f"{BLOCK}.mlp"
    rules = [Rule(f"{moe}.gate.weight", f"{ours}.router.weight")]
    for j in range(config.n_experts):
        rules += [Rule(f"{moe}.experts.{j}.{hf}.weight", f"{ours}.experts.{j}.{name}.weight")
                  for hf, name in EXPERT_WEIGHTS.items()]
    return rules


ARCHITECTURE = lineage_architecture("mixtral", CLASSES, to_config, to_hf_config, feed_forward=expert_rules)
