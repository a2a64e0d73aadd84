"""Qwen3: Qwen2 without the q/k/v biases (attention_bias, off by default) and with an RMSNorm on
each query and key head before the rotation (qk_norm="per_head": q_norm, k_norm of width d_head)."""

from __future__ import annotations

from ..config import ModelConfig
from .common import unsupported
from .engine import require
from .llama import (FLAGS, layer_types, lineage_architecture, options_off, read_decoder, write_decoder,
                    write_layer_types)

CLASSES = {"Qwen3ForCausalLM": "lm", "Qwen3Model": "none"}


def to_config(hf: dict, class_name: str, keys: set[str]) -> ModelConfig:
    unsupported("qwen3", hf, hidden_act="silu")
    return read_decoder(hf, "qwen3", CLASSES[class_name], qk_norm="per_head", mlp_bias=False, **layer_types(hf, "qwen3"))


def to_hf_config(config: ModelConfig, class_name: str) -> dict:
    require("qwen3", config, **{**options_off(config), **FLAGS, "qk_norm": "per_head",
                                "attn_out_bias": config.attn_bias, "mlp_bias": False,
                                "sliding_window": config.sliding_window})
    return dict(write_decoder(config, "qwen3"), hidden_act="silu", attention_bias=config.attn_bias,
                use_sliding_window="sliding" in config.layer_types, **write_layer_types(config))


ARCHITECTURE = lineage_architecture("qwen3", CLASSES, to_config, to_hf_config)
