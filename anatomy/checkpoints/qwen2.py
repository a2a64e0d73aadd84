"""Qwen2 (and Qwen2.5): Llama with biases on the query, key and value projections but none on the
output projection (attn_bias=True, attn_out_bias=False). With use_sliding_window, the layers from
max_window_layers on attend through a sliding window (config.json's layer_types says which)."""

from __future__ import annotations

from ..config import ModelConfig
from .common import unsupported
from .engine import require
from .llama import (FLAGS, layer_types, lineage_architecture, options_off, read_decoder, write_decoder,
                    write_layer_types)

CLASSES = {"Qwen2ForCausalLM": "lm", "Qwen2Model": "none"}


def to_config(hf: dict, class_name: str, keys: set[str]) -> ModelConfig:
    unsupported("qwen2", hf, hidden_act="silu")
    return read_decoder(hf, "qwen2", CLASSES[class_name], attn_bias=True, attn_out_bias=False, mlp_bias=False,
                        **layer_types(hf, "qwen2"))


def to_hf_config(config: ModelConfig, class_name: str) -> dict:
    require("qwen2", config, **{**options_off(config), **FLAGS, "attn_bias": True, "attn_out_bias": False,
                                "mlp_bias": False, "sliding_window": config.sliding_window})
    return dict(write_decoder(config, "qwen2"), hidden_act="silu", use_sliding_window="sliding" in config.layer_types,
                **write_layer_types(config))


ARCHITECTURE = lineage_architecture("qwen2", CLASSES, to_config, to_hf_config)
