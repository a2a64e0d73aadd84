"""OLMo 2: Llama with its norms moved onto the sublayers' outputs (x + Norm(Sublayer(x)),
norm_position="post_sublayer": post_attention_layernorm, post_feedforward_layernorm), and an
RMSNorm over all the heads' queries, and over all the keys, before they are split into heads
(qk_norm="across_heads")."""

from __future__ import annotations

from ..config import ModelConfig
from .common import unsupported
from .engine import require
from .llama import FLAGS as LLAMA_FLAGS
from .llama import lineage_architecture, options_off, read_decoder, write_decoder

FLAGS = dict(LLAMA_FLAGS, norm_position="post_sublayer", qk_norm="across_heads")
CLASSES = {"Olmo2ForCausalLM": "lm", "Olmo2Model": "none"}
OUTPUT_NORMS = {"post_attention_layernorm": "attn_out_norm", "post_feedforward_layernorm": "mlp_out_norm"}


def to_config(hf: dict, class_name: str, keys: set[str]) -> ModelConfig:
    unsupported("olmo2", hf, hidden_act="silu")
    return read_decoder(hf, "olmo2", CLASSES[class_name], **FLAGS, mlp_bias=False,
                        norm_eps=hf.get("rms_norm_eps", 1e-5))


def to_hf_config(config: ModelConfig, class_name: str) -> dict:
    require("olmo2", config, **{**options_off(config), **FLAGS, "attn_out_bias": config.attn_bias, "mlp_bias": False})
    return dict(write_decoder(config, "olmo2"), hidden_act="silu", attention_bias=config.attn_bias)


ARCHITECTURE = lineage_architecture("olmo2", CLASSES, to_config, to_hf_config, norms=OUTPUT_NORMS)
