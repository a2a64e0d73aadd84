"""Gemma 3 (the text model): Gemma 2's sandwich norms and 1/sqrt(query_pre_attn_scalar), with an
RMSNorm (1 + w) on each query and key head (qk_norm="per_head"), a per-layer pattern of sliding and
full layers (layer_types: five sliding to one full in the released models), and a rotary base of
the sliding layers' own (rope_parameters["sliding_attention"], rope_local_theta, unscaled) beside
the full layers' (rope_parameters["full_attention"], possibly "linear"-scaled; transformers 4 spells
them rope_local_base_freq, rope_theta and rope_scaling: rope.py). Soft-capping is
off in the released models but read when a config sets it."""

from __future__ import annotations

from ..config import ModelConfig
from .engine import require
from .gemma import GEMMA_FLAGS, pre_attn_scalar, read_gemma
from .gemma2 import SANDWICH_NORMS
from .llama import layer_types, lineage_architecture, options_off, write_decoder, write_layer_types

FLAGS = dict(GEMMA_FLAGS, norm_position="sandwich", qk_norm="per_head")
CLASSES = {"Gemma3ForCausalLM": "lm", "Gemma3TextModel": "none"}


def to_config(hf: dict, class_name: str, keys: set[str]) -> ModelConfig:
    return read_gemma(
        hf, "gemma3_text", CLASSES[class_name], norm_position="sandwich", qk_norm="per_head",
        query_pre_attn_scalar=hf.get("query_pre_attn_scalar", 256), attn_softcap=hf.get("attn_logit_softcapping"),
        final_logit_softcap=hf.get("final_logit_softcapping"), **layer_types(hf, "gemma3_text"),
    )


def to_hf_config(config: ModelConfig, class_name: str) -> dict:
    require("gemma3_text", config, **{
        **options_off(config), **FLAGS, "attn_out_bias": config.attn_bias, "mlp_bias": False,
        "query_pre_attn_scalar": config.query_pre_attn_scalar, "attn_softcap": config.attn_softcap,
        "final_logit_softcap": config.final_logit_softcap, "sliding_window": config.sliding_window,
        "rope_local_theta": config.rope_local_theta,
    })
    return dict(
        write_decoder(config, "gemma3_text"), hidden_activation="gelu_pytorch_tanh", attention_bias=config.attn_bias,
        query_pre_attn_scalar=pre_attn_scalar(config), attn_logit_softcapping=config.attn_softcap,
        final_logit_softcapping=config.final_logit_softcap, **write_layer_types(config),
    )


ARCHITECTURE = lineage_architecture("gemma3_text", CLASSES, to_config, to_hf_config, norms=SANDWICH_NORMS)
