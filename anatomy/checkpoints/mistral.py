"""Mistral: Llama with sliding-window attention. Each query sees itself and the sliding_window - 1
positions before it, in every layer; the window is a mask (masks.py), so the fused kernel still
computes it, and the KV cache keeps every key while the mask hides those that slid out."""

from __future__ import annotations

from ..config import ModelConfig
from .common import unsupported
from .engine import require
from .llama import FLAGS, layer_types, lineage_architecture, options_off, read_decoder, write_decoder

CLASSES = {"MistralForCausalLM": "lm", "MistralModel": "none"}


def to_config(hf: dict, class_name: str, keys: set[str]) -> ModelConfig:
    unsupported("mistral", hf, hidden_act="silu", layer_types=None)
    return read_decoder(hf, "mistral", CLASSES[class_name], **layer_types(hf, "mistral"),
                        attn_bias=False, attn_out_bias=False, mlp_bias=False)


def to_hf_config(config: ModelConfig, class_name: str) -> dict:
    require("mistral", config, **{**options_off(config), **FLAGS, "attn_bias": False, "attn_out_bias": False,
                                  "mlp_bias": False, "sliding_window": config.sliding_window,
                                  "layer_types": config.layer_types[:1] * config.n_layers})
    return dict(write_decoder(config, "mistral"), hidden_act="silu", sliding_window=config.sliding_window)


ARCHITECTURE = lineage_architecture("mistral", CLASSES, to_config, to_hf_config)
