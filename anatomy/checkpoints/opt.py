"""OPT: a GPT-2-like decoder with ReLU, separate q/k/v/out projections and learned positions whose
table starts 2 rows in (pos_offset=2), numbered over real tokens only (positions_from_padding).
do_layer_norm_before chooses pre-norm (with a final LayerNorm) or post-norm (OPT-350m, without).
When word_embed_proj_dim differs from hidden_size, token embeddings and the tied LM head are
narrower, and project_in / project_out map between the two widths (d_embed)."""

from __future__ import annotations

from ..config import ModelConfig
from .common import activation, field, pad_id, to_hf_activation, unsupported
from .engine import Architecture, Rule, require
from .files import CheckpointError
from .table_helpers import weight_and_bias

FLAGS = dict(
    arch="decoder", pos_encoding="learned", pos_offset=2, positions_from_padding=True, norm="layernorm",
    embed_norm=False, scale_embeddings=False, type_vocab_size=0, lm_head_bias=False, lm_head_transform=False,
    norm_eps=1e-5, lm_head_rescale=False,
)
CLASSES = {"OPTForCausalLM": "lm", "OPTModel": "none"}


def to_config(hf: dict, class_name: str, keys: set[str]) -> ModelConfig:
    unsupported("opt", hf, layer_norm_elementwise_affine=True, _remove_final_layer_norm=False)
    pre_norm = bool(hf.get("do_layer_norm_before", True))
    bias = bool(hf.get("enable_bias", True))
    d_model = field(hf, "hidden_size", "opt")
    return ModelConfig(
        **FLAGS,
        vocab_size=field(hf, "vocab_size", "opt"), d_model=d_model, d_embed=hf.get("word_embed_proj_dim") or d_model,
        n_heads=field(hf, "num_attention_heads", "opt"), n_layers=field(hf, "num_hidden_layers", "opt"),
        d_ff=field(hf, "ffn_dim", "opt"), max_seq_len=field(hf, "max_position_embeddings", "opt", 2048),
        norm_position="pre" if pre_norm else "post", final_norm=pre_norm,
        activation=activation(hf, "activation_function", "opt", "relu"),
        attn_bias=bias, attn_out_bias=bias, mlp_bias=bias,
        dropout=hf.get("dropout", 0.1), attn_dropout=hf.get("attention_dropout", 0.0),
        head=CLASSES[class_name], tie_embeddings=hf.get("tie_word_embeddings", True), pad_token_id=pad_id(hf),
    )


def to_hf_config(config: ModelConfig, class_name: str) -> dict:
    require("opt", config, **FLAGS, n_kv_heads=config.n_heads, d_head=config.d_model // config.n_heads,
            final_norm=config.norm_position == "pre", attn_out_bias=config.attn_bias, mlp_bias=config.attn_bias)
    if config.norm_position not in ("pre", "post"):
        raise CheckpointError(
            f"an opt checkpoint is pre- or post-norm; this config has norm_position={config.norm_position!r}"
        )
    return dict(
        vocab_size=config.vocab_size, hidden_size=config.d_model, word_embed_proj_dim=config.d_embed,
        num_attention_heads=config.n_heads, num_hidden_layers=config.n_layers, ffn_dim=config.d_ff,
        max_position_embeddings=config.max_seq_len, do_layer_norm_before=config.norm_position == "pre",
        activation_function=to_hf_activation(config.activation, "opt"), enable_bias=config.attn_bias,
        dropout=config.dropout, attention_dropout=config.effective_attn_dropout, layerdrop=0.0,
        tie_word_embeddings=config.tie_embeddings, pad_token_id=config.pad_token_id,
    )


def table(config: ModelConfig) -> list[Rule]:
    layer, block = "model.decoder.layers.{i}", "blocks.{i}"
    params = ("weight", "bias") if config.attn_bias else ("weight",)
    rules = [
        Rule("model.decoder.embed_tokens.weight", "token_embedding.weight"),
        Rule("model.decoder.embed_positions.weight", "position_embedding.weight"),
    ]
    if config.d_embed != config.d_model:
        rules += [Rule(f"model.decoder.{p}.weight", f"{p}.weight") for p in ("project_in", "project_out")]
    if config.final_norm:
        rules += weight_and_bias("model.decoder.final_layer_norm", "final_norm")
    for hf, ours in [("self_attn.q_proj", "attn.q_proj"), ("self_attn.k_proj", "attn.k_proj"),
                     ("self_attn.v_proj", "attn.v_proj"), ("self_attn.out_proj", "attn.o_proj"),
                     ("fc1", "mlp.fc_in"), ("fc2", "mlp.fc_out")]:
        rules += [Rule(f"{layer}.{hf}.{p}", f"{block}.{ours}.{p}") for p in params]
    for hf, ours in [("self_attn_layer_norm", "attn_norm"), ("final_layer_norm", "mlp_norm")]:
        rules += weight_and_bias(f"{layer}.{hf}", f"{block}.{ours}")
    if config.head == "lm":
        rules.append(Rule("lm_head.weight", "lm_head.proj.weight", derived=config.tie_embeddings))
    return rules


ARCHITECTURE = Architecture(
    model_type="opt", classes=CLASSES, base_prefix="model", base_classes=("OPTModel",),
    to_config=to_config, to_hf_config=to_hf_config, table=table,
)
