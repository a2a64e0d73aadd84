"""Gemma 2: Gemma with sandwich norms (x + Norm'(Sublayer(Norm(x))): four norms a layer), scores
scaled by 1/sqrt(query_pre_attn_scalar), attention scores and final logits soft-capped
(c * tanh(s / c): only the explicit kernel can), and layers alternating between a sliding window
and full attention, as layer_types says (sliding first)."""

from __future__ import annotations

from ..config import ModelConfig
from .engine import require
from .gemma import GEMMA_FLAGS, pre_attn_scalar, read_gemma
from .llama import layer_types, lineage_architecture, options_off, write_decoder, write_layer_types

FLAGS = dict(GEMMA_FLAGS, norm_position="sandwich")
CLASSES = {"Gemma2ForCausalLM": "lm", "Gemma2Model": "none"}
SANDWICH_NORMS = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "attn_out_norm",
    "pre_feedforward_layernorm": "mlp_norm", "post_feedforward_layernorm": "mlp_out_norm",
}


def to_config(hf: dict, class_name: str, keys: set[str]) -> ModelConfig:
    return read_gemma(
        hf, "gemma2", CLASSES[class_name], norm_position="sandwich",
        query_pre_attn_scalar=hf.get("query_pre_attn_scalar", 256), attn_softcap=hf.get("attn_logit_softcapping"),
        final_logit_softcap=hf.get("final_logit_softcapping"), **layer_types(hf, "gemma2"),
    )


def to_hf_config(config: ModelConfig, class_name: str) -> dict:
    require("gemma2", config, **{
        **options_off(config), **FLAGS, "attn_out_bias": config.attn_bias, "mlp_bias": False,
        "query_pre_attn_scalar": config.query_pre_attn_scalar, "attn_softcap": config.attn_softcap,
        "final_logit_softcap": config.final_logit_softcap, "sliding_window": config.sliding_window,
    })
    return dict(
        write_decoder(config, "gemma2"), hidden_activation="gelu_pytorch_tanh", attention_bias=config.attn_bias,
        query_pre_attn_scalar=pre_attn_scalar(config), attn_logit_softcapping=config.attn_softcap,
        final_logit_softcapping=config.final_logit_softcap, **write_layer_types(config),
    )


ARCHITECTURE = lineage_architecture("gemma2", CLASSES, to_config, to_hf_config, norms=SANDWICH_NORMS)
