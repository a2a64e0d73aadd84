"""Gemma: Llama with three changes. The RMSNorms scale by (1 + w) (norm_plus_one); the token
embeddings are multiplied by sqrt(d_model) (scale_embeddings); the MLP is GeGLU with the tanh
approximation of GELU (activation="geglu_tanh"). The LM head is tied to the embeddings.
Gemma 2 and Gemma 3 start from here (GEMMA_FLAGS, read_gemma)."""

from __future__ import annotations

from ..config import ModelConfig
from .common import unsupported
from .engine import require
from .files import CheckpointError
from .llama import FLAGS, lineage_architecture, options_off, read_decoder, write_decoder

GEMMA_FLAGS = dict(FLAGS, activation="geglu_tanh", norm_plus_one=True, scale_embeddings=True)
CLASSES = {"GemmaForCausalLM": "lm", "GemmaModel": "none"}
# "gelu" in a Gemma config is a legacy spelling of the tanh approximation (transformers reads it so).
# (transformers 4.57 reads "gelu" in a Gemma (1) config as the exact GELU: a Hub snapshot that says so
# computes differently there; the folders anatomy writes say gelu_pytorch_tanh.)
GELU_TANH = ("gelu_pytorch_tanh", "gelu_new", "gelu")
# The key each version's classes read the activation from (the other one, where present, is unused).
ACTIVATION_KEYS = {"gemma": "hidden_act", "gemma2": "hidden_activation", "gemma3_text": "hidden_activation"}


def read_gemma(hf: dict, model_type: str, head: str, **fields) -> ModelConfig:
    """The fields Gemma 1, 2 and 3 share (their config.json spell them alike), then `fields`."""
    unsupported(model_type, hf, use_bidirectional_attention=False)
    key = ACTIVATION_KEYS[model_type]
    act = hf.get(key) or "gelu_pytorch_tanh"
    if act not in GELU_TANH:
        raise CheckpointError(f"this {model_type} checkpoint has {key}={act!r}; anatomy implements {GELU_TANH}")
    return read_decoder(hf, model_type, head, **{**GEMMA_FLAGS, "tie_embeddings": hf.get("tie_word_embeddings", True),
                                                 "mlp_bias": False, **fields})


def pre_attn_scalar(config: ModelConfig) -> int:
    """query_pre_attn_scalar for config.json, which holds an integer (Gemma 2 and 3)."""
    value = config.query_pre_attn_scalar
    if value is None or not float(value).is_integer():
        raise CheckpointError("a Gemma 2/3 checkpoint holds query_pre_attn_scalar as an integer; "
                              f"this config has {value!r}")
    return int(value)


def to_config(hf: dict, class_name: str, keys: set[str]) -> ModelConfig:
    return read_gemma(hf, "gemma", CLASSES[class_name])


def to_hf_config(config: ModelConfig, class_name: str) -> dict:
    require("gemma", config, **{**options_off(config), **GEMMA_FLAGS, "attn_out_bias": config.attn_bias,
                                "mlp_bias": False})
    return dict(write_decoder(config, "gemma"), hidden_act="gelu_pytorch_tanh", attention_bias=config.attn_bias)


ARCHITECTURE = lineage_architecture("gemma", CLASSES, to_config, to_hf_config)
