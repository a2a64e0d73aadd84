"""Qwen2 (and Qwen2.5): Llama with biases on the query, key and value projections but none on the
output projection (attn_bias=True, attn_out_bias=False). With use_sliding_window, the layers from
max_window_layers on attend through a sliding window (config.json's layer_types says which)."""

from __future__ import annotations

from ..config import ModelConfig
from .common import unsupported
from .engine import Architecture, Rule, require
from .llama import (FLAGS, PRE_NORMS, attention_rules, embedding_rules, layer_types, mlp_rules, norm_rules,
                    options_off, read_decoder, write_decoder, write_layer_types)

CLASSES = {"Qwen2ForCausalLM": "lm", "Qwen2Model": "none"}


def to_config(hf: dict, class_name: str, keys: set[str]) -> ModelConfig:
    unsupported("qwen2", hf, hidden_act="silu")
    return read_decoder(hf, "qwen2", CLASSES[class_name], attn_bias=True, attn_out_bias=False, mlp_bias=False,
                        **layer_types(hf))


def to_hf_config(config: ModelConfig, class_name: str) -> dict:
    require("qwen2", config, **{**options_off(config), **FLAGS, "attn_bias": True, "attn_out_bias": False,
                                "mlp_bias": False, "sliding_window": config.sliding_window})
    return dict(write_decoder(config), hidden_act="silu", use_sliding_window="sliding" in config.layer_types,
                **write_layer_types(config))


def table(config: ModelConfig) -> list[Rule]:
    return embedding_rules(config) + norm_rules(PRE_NORMS) + attention_rules(config) + mlp_rules(config)


ARCHITECTURE = Architecture(
    model_type="qwen2", classes=CLASSES, base_prefix="model", base_classes=("Qwen2Model",),
    to_config=to_config, to_hf_config=to_hf_config, table=table, ignore=(r"rotary_emb\.inv_freq$",),
)
