"""Llama: pre-norm with RMSNorm, rotary positions (the rotate_half layout), SwiGLU, grouped-query
attention, no biases; the LM head is tied to the embeddings or not, as the config says."""

from __future__ import annotations

from ..config import ModelConfig
from .common import field, pad_id, unsupported
from .engine import Architecture, Rule, require
from .files import CheckpointError

FLAGS = dict(
    arch="decoder", pos_encoding="rotary", norm="rmsnorm", norm_position="pre", final_norm=True,
    activation="swiglu", embed_norm=False, scale_embeddings=False, type_vocab_size=0,
    lm_head_bias=False, lm_head_transform=False,
)
CLASSES = {"LlamaForCausalLM": "lm", "LlamaModel": "none"}


def _rope_theta(hf: dict) -> float:
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise CheckpointError(f"this llama checkpoint uses rope_type={kind!r}; anatomy implements only 'default' RoPE")
    return float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))


def to_config(hf: dict, class_name: str, keys: set[str]) -> ModelConfig:
    unsupported("llama", hf, hidden_act="silu")
    n_heads = field(hf, "num_attention_heads", "llama")
    d_model = field(hf, "hidden_size", "llama")
    return ModelConfig(
        **FLAGS,
        vocab_size=field(hf, "vocab_size", "llama"), d_model=d_model, n_heads=n_heads,
        n_kv_heads=hf.get("num_key_value_heads") or n_heads, d_head=hf.get("head_dim") or d_model // n_heads,
        n_layers=field(hf, "num_hidden_layers", "llama"), d_ff=field(hf, "intermediate_size", "llama"),
        max_seq_len=field(hf, "max_position_embeddings", "llama", 2048), rope_theta=_rope_theta(hf),
        norm_eps=hf.get("rms_norm_eps", 1e-6), attn_bias=bool(hf.get("attention_bias", False)),
        attn_out_bias=bool(hf.get("attention_bias", False)), mlp_bias=bool(hf.get("mlp_bias", False)),
        dropout=0.0, attn_dropout=hf.get("attention_dropout", 0.0), head=CLASSES[class_name],
        tie_embeddings=hf.get("tie_word_embeddings", False),
        pad_token_id=pad_id(hf),
    )


def to_hf_config(config: ModelConfig, class_name: str) -> dict:
    require("llama", config, **FLAGS, attn_out_bias=config.attn_bias)
    return dict(
        vocab_size=config.vocab_size, hidden_size=config.d_model, num_attention_heads=config.n_heads,
        num_key_value_heads=config.n_kv_heads, head_dim=config.d_head, num_hidden_layers=config.n_layers,
        intermediate_size=config.d_ff, max_position_embeddings=config.max_seq_len, hidden_act="silu",
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta}, rms_norm_eps=config.norm_eps,
        attention_bias=config.attn_bias, mlp_bias=config.mlp_bias, attention_dropout=config.effective_attn_dropout,
        tie_word_embeddings=config.tie_embeddings, pad_token_id=config.pad_token_id,
    )


def table(config: ModelConfig) -> list[Rule]:
    layer, block = "model.layers.{i}", "blocks.{i}"
    params = ("weight", "bias") if config.attn_bias else ("weight",)
    mlp_params = ("weight", "bias") if config.mlp_bias else ("weight",)
    rules = [
        Rule("model.embed_tokens.weight", "token_embedding.weight"),
        Rule(f"{layer}.input_layernorm.weight", f"{block}.attn_norm.weight"),
        Rule(f"{layer}.post_attention_layernorm.weight", f"{block}.mlp_norm.weight"),
        Rule("model.norm.weight", "final_norm.weight"),
    ]
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        rules += [Rule(f"{layer}.self_attn.{name}.{p}", f"{block}.attn.{name}.{p}") for p in params]
    # down(silu(gate(x)) * up(x)): gate is the gated branch, up the linear one.
    for hf, ours in (("gate_proj", "fc_gate"), ("up_proj", "fc_in"), ("down_proj", "fc_out")):
        rules += [Rule(f"{layer}.mlp.{hf}.{p}", f"{block}.mlp.{ours}.{p}") for p in mlp_params]
    if config.head == "lm":
        rules.append(Rule("lm_head.weight", "lm_head.proj.weight", derived=config.tie_embeddings))
    return rules


ARCHITECTURE = Architecture(
    model_type="llama", classes=CLASSES, base_prefix="model", base_classes=("LlamaModel",),
    to_config=to_config, to_hf_config=to_hf_config, table=table,
    ignore=(r"rotary_emb\.inv_freq$",),  # a buffer some versions saved; recomputed from rope_theta
)
