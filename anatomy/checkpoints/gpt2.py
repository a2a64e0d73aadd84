"""GPT-2: pre-norm, tanh-GELU, learned positions, a final LayerNorm, an LM head tied to the
token embeddings. Its linear layers are Conv1D, stored [in, out], and q, k, v are one fused
matrix c_attn [E, 3E]: the table transposes and splits them."""

from __future__ import annotations

from ..config import ModelConfig
from .common import activation, field, pad_id, to_hf_activation, unsupported
from .engine import Architecture, Rule, require
from .table_helpers import plain_heads

FLAGS = dict(
    arch="decoder", pos_encoding="learned", norm="layernorm", norm_position="pre", final_norm=True,
    embed_norm=False, scale_embeddings=False, type_vocab_size=0, attn_bias=True, attn_out_bias=True,
    mlp_bias=True, lm_head_bias=False, lm_head_transform=False, pos_offset=0, positions_from_padding=False,
    lm_head_rescale=False,
)
CLASSES = {"GPT2LMHeadModel": "lm", "GPT2Model": "none"}


def to_config(hf: dict, class_name: str, keys: set[str]) -> ModelConfig:
    unsupported("gpt2", hf, scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False, add_cross_attention=False)
    d_model = field(hf, "n_embd", "gpt2")
    return ModelConfig(
        **FLAGS,
        vocab_size=field(hf, "vocab_size", "gpt2"), d_model=d_model, n_heads=field(hf, "n_head", "gpt2"),
        n_layers=field(hf, "n_layer", "gpt2"), d_ff=hf.get("n_inner") or 4 * d_model,
        max_seq_len=field(hf, "n_positions", "gpt2", 1024),
        activation=activation(hf, "activation_function", "gpt2", "gelu_new"),
        norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        dropout=hf.get("resid_pdrop", 0.1), attn_dropout=hf.get("attn_pdrop", 0.1),
        head=CLASSES[class_name], tie_embeddings=hf.get("tie_word_embeddings", True),
        pad_token_id=pad_id(hf),
    )


def to_hf_config(config: ModelConfig, class_name: str) -> dict:
    require("gpt2", config, **FLAGS, **plain_heads(config))
    return dict(
        vocab_size=config.vocab_size, n_embd=config.d_model, n_head=config.n_heads, n_layer=config.n_layers,
        n_inner=config.d_ff, n_positions=config.max_seq_len,
        activation_function=to_hf_activation(config.activation, "gpt2"), layer_norm_epsilon=config.norm_eps,
        resid_pdrop=config.dropout, embd_pdrop=config.dropout, attn_pdrop=config.effective_attn_dropout,
        tie_word_embeddings=config.tie_embeddings, pad_token_id=config.pad_token_id,
        scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False, reorder_and_upcast_attn=False,
    )


def table(config: ModelConfig) -> list[Rule]:
    h, block = "transformer.h.{i}", "blocks.{i}"
    qkv = [f"{block}.attn.{p}_proj" for p in "qkv"]
    rules = [
        Rule("transformer.wte.weight", "token_embedding.weight"),
        Rule("transformer.wpe.weight", "position_embedding.weight"),
        Rule(f"{h}.ln_1.weight", f"{block}.attn_norm.weight"),
        Rule(f"{h}.ln_1.bias", f"{block}.attn_norm.bias"),
        # c_attn [E, 3E] -> transpose -> [3E, E] -> split: q, k, v [E, E]
        Rule(f"{h}.attn.c_attn.weight", tuple(f"{n}.weight" for n in qkv), transpose=True),
        Rule(f"{h}.attn.c_attn.bias", tuple(f"{n}.bias" for n in qkv)),
        Rule(f"{h}.attn.c_proj.weight", f"{block}.attn.o_proj.weight", transpose=True),
        Rule(f"{h}.attn.c_proj.bias", f"{block}.attn.o_proj.bias"),
        Rule(f"{h}.ln_2.weight", f"{block}.mlp_norm.weight"),
        Rule(f"{h}.ln_2.bias", f"{block}.mlp_norm.bias"),
        Rule(f"{h}.mlp.c_fc.weight", f"{block}.mlp.fc_in.weight", transpose=True),
        Rule(f"{h}.mlp.c_fc.bias", f"{block}.mlp.fc_in.bias"),
        Rule(f"{h}.mlp.c_proj.weight", f"{block}.mlp.fc_out.weight", transpose=True),
        Rule(f"{h}.mlp.c_proj.bias", f"{block}.mlp.fc_out.bias"),
        Rule("transformer.ln_f.weight", "final_norm.weight"),
        Rule("transformer.ln_f.bias", "final_norm.bias"),
    ]
    if config.head == "lm":
        rules.append(Rule("lm_head.weight", "lm_head.proj.weight", derived=config.tie_embeddings))
    return rules


ARCHITECTURE = Architecture(
    model_type="gpt2", classes=CLASSES, base_prefix="transformer", base_classes=("GPT2Model",),
    to_config=to_config, to_hf_config=to_hf_config, table=table,
    # attn.bias / attn.masked_bias: the causal mask, stored as a buffer by older versions.
    ignore=(r"h\.\d+\.attn\.(masked_)?bias$",),
)
