"""GPT-NeoX (Pythia): pre-norm LayerNorms with biases, attention and MLP in parallel
(use_parallel_residual: x + Attn(LN1(x)) + MLP(LN2(x))), rotary positions on the first
rotary_pct of each head only (rotary_dim), GELU, an untied output matrix embed_out.

Its query_key_value matrix fuses q, k and v head by head, [h0: q k v, h1: q k v, ...]; the
table's `heads` splits it so."""

from __future__ import annotations

from ..config import ModelConfig
from .common import activation, field, pad_id, to_hf_activation, unsupported
from .engine import Architecture, Rule, require
from .llama import options_off
from .rope import read_rope, write_rope

FLAGS = dict(
    arch="decoder", pos_encoding="rotary", rotary_layout="halves", norm="layernorm", norm_position="pre",
    final_norm=True, embed_norm=False, scale_embeddings=False, type_vocab_size=0, mlp_bias=True,
    lm_head_bias=False, lm_head_transform=False,
)
CLASSES = {"GPTNeoXForCausalLM": "lm", "GPTNeoXModel": "none"}


def to_config(hf: dict, class_name: str, keys: set[str]) -> ModelConfig:
    unsupported("gpt_neox", hf, is_decoder=False, add_cross_attention=False)
    n_heads, d_model = field(hf, "num_attention_heads", "gpt_neox"), field(hf, "hidden_size", "gpt_neox")
    d_head = d_model // n_heads
    rope = read_rope(hf, "gpt_neox")  # rotary_emb_base and rotary_pct, or rope_parameters
    bias = bool(hf.get("attention_bias", True))
    return ModelConfig(
        **FLAGS,
        vocab_size=field(hf, "vocab_size", "gpt_neox"), d_model=d_model, n_heads=n_heads, d_head=d_head,
        rotary_dim=int(d_head * rope.pop("fraction")), n_layers=field(hf, "num_hidden_layers", "gpt_neox"),
        d_ff=field(hf, "intermediate_size", "gpt_neox"), max_seq_len=field(hf, "max_position_embeddings", "gpt_neox"),
        activation=activation(hf, "hidden_act", "gpt_neox", "gelu"), norm_eps=hf.get("layer_norm_eps", 1e-5),
        attn_bias=bias, attn_out_bias=bias, parallel_residual=bool(hf.get("use_parallel_residual", True)),
        dropout=hf.get("hidden_dropout", 0.0), attn_dropout=hf.get("attention_dropout", 0.0),
        head=CLASSES[class_name], tie_embeddings=hf.get("tie_word_embeddings", False), pad_token_id=pad_id(hf),
        **rope,
    )


def to_hf_config(config: ModelConfig, class_name: str) -> dict:
    require("gpt_neox", config, **{
        **options_off(config), **FLAGS, "rotary_dim": config.rotary_dim, "activation": config.activation,
        "parallel_residual": config.parallel_residual, "attn_out_bias": config.attn_bias, "n_kv_heads": config.n_heads,
        "d_head": config.d_model // config.n_heads,
    })
    return dict(
        vocab_size=config.vocab_size, hidden_size=config.d_model, num_attention_heads=config.n_heads,
        num_hidden_layers=config.n_layers, intermediate_size=config.d_ff, max_position_embeddings=config.max_seq_len,
        hidden_act=to_hf_activation(config.activation, "gpt_neox"), layer_norm_eps=config.norm_eps,
        attention_bias=config.attn_bias, use_parallel_residual=config.parallel_residual,
        hidden_dropout=config.dropout, attention_dropout=config.effective_attn_dropout,
        **write_rope(config, "gpt_neox"), tie_word_embeddings=config.tie_embeddings, pad_token_id=config.pad_token_id,
    )


def table(config: ModelConfig) -> list[Rule]:
    layer, block = "gpt_neox.layers.{i}", "blocks.{i}"
    qkv = tuple(f"{block}.attn.{p}_proj" for p in "qkv")
    attn_params = ("weight", "bias") if config.attn_bias else ("weight",)
    rules = [
        Rule("gpt_neox.embed_in.weight", "token_embedding.weight"),
        Rule("gpt_neox.final_layer_norm.weight", "final_norm.weight"),
        Rule("gpt_neox.final_layer_norm.bias", "final_norm.bias"),
    ]
    for p in ("weight", "bias"):
        rules += [
            Rule(f"{layer}.input_layernorm.{p}", f"{block}.attn_norm.{p}"),
            Rule(f"{layer}.post_attention_layernorm.{p}", f"{block}.mlp_norm.{p}"),
            Rule(f"{layer}.mlp.dense_h_to_4h.{p}", f"{block}.mlp.fc_in.{p}"),
            Rule(f"{layer}.mlp.dense_4h_to_h.{p}", f"{block}.mlp.fc_out.{p}"),
        ]
    for p in attn_params:
        rules += [
            # [H * 3D, E]: q, k, v of head 0, then of head 1, ...
            Rule(f"{layer}.attention.query_key_value.{p}", tuple(f"{n}.{p}" for n in qkv), heads=config.n_heads),
            Rule(f"{layer}.attention.dense.{p}", f"{block}.attn.o_proj.{p}"),
        ]
    if config.head == "lm":
        rules.append(Rule("embed_out.weight", "lm_head.proj.weight", derived=config.tie_embeddings))
    return rules


ARCHITECTURE = Architecture(
    model_type="gpt_neox", classes=CLASSES, base_prefix="gpt_neox", base_classes=("GPTNeoXModel",),
    to_config=to_config, to_hf_config=to_hf_config, table=table,
    # buffers older versions saved: the causal mask and the rotary frequencies
    ignore=(r"attention\.(masked_)?bias$", r"rotary_emb\.inv_freq$"),
)
