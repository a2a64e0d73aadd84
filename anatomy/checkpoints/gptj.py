"""GPT-J: attention and MLP in parallel from one shared LayerNorm (x + Attn(LN(x)) + MLP(LN(x)):
parallel_residual, parallel_shared_norm), rotary positions on the first rotary_dim dimensions of
each head in the interleaved layout (pairs 2j, 2j + 1: rotary_layout="interleaved"), no biases in
attention, tanh-GELU, and an untied LM head with a bias."""

from __future__ import annotations

from ..config import ModelConfig
from .common import activation, field, pad_id, to_hf_activation, unsupported
from .engine import Architecture, Rule, require
from .files import CheckpointError
from .llama import options_off

FLAGS = dict(
    arch="decoder", pos_encoding="rotary", rotary_layout="interleaved", norm="layernorm", norm_position="pre",
    final_norm=True, parallel_residual=True, parallel_shared_norm=True, embed_norm=False, scale_embeddings=False,
    type_vocab_size=0, attn_bias=False, attn_out_bias=False, mlp_bias=True, lm_head_bias=True,
    lm_head_transform=False,
)
CLASSES = {"GPTJForCausalLM": "lm", "GPTJModel": "none"}


def to_config(hf: dict, class_name: str, keys: set[str]) -> ModelConfig:
    unsupported("gptj", hf, add_cross_attention=False)
    if hf.get("rotary_dim") is None:
        raise CheckpointError("this gptj checkpoint has rotary_dim=None (frequencies over the model width); "
                              "anatomy implements a rotary_dim within each head")
    d_model = field(hf, "n_embd", "gptj")
    return ModelConfig(
        **FLAGS,
        vocab_size=field(hf, "vocab_size", "gptj"), d_model=d_model, n_heads=field(hf, "n_head", "gptj"),
        rotary_dim=hf["rotary_dim"], n_layers=field(hf, "n_layer", "gptj"), d_ff=hf.get("n_inner") or 4 * d_model,
        max_seq_len=field(hf, "n_positions", "gptj", 2048),
        activation=activation(hf, "activation_function", "gptj", "gelu_new"),
        norm_eps=hf.get("layer_norm_epsilon", 1e-5), dropout=hf.get("resid_pdrop", 0.0),
        attn_dropout=hf.get("attn_pdrop", 0.0), head=CLASSES[class_name],
        tie_embeddings=hf.get("tie_word_embeddings", False), pad_token_id=pad_id(hf),
    )


def to_hf_config(config: ModelConfig, class_name: str) -> dict:
    require("gptj", config, **{
        **options_off(config), **FLAGS, "rotary_dim": config.rotary_dim, "activation": config.activation,
        "n_kv_heads": config.n_heads, "d_head": config.d_model // config.n_heads, "rope_theta": 10000.0,
        "rope_scaling": "none",
    })
    return dict(
        vocab_size=config.vocab_size, n_embd=config.d_model, n_head=config.n_heads, n_layer=config.n_layers,
        n_inner=config.d_ff, n_positions=config.max_seq_len, rotary_dim=config.rotary_dim,
        activation_function=to_hf_activation(config.activation, "gptj"), layer_norm_epsilon=config.norm_eps,
        resid_pdrop=config.dropout, embd_pdrop=config.dropout, attn_pdrop=config.effective_attn_dropout,
        tie_word_embeddings=config.tie_embeddings, pad_token_id=config.pad_token_id,
    )


def table(config: ModelConfig) -> list[Rule]:
    h, block = "transformer.h.{i}", "blocks.{i}"
    rules = [
        Rule("transformer.wte.weight", "token_embedding.weight"),
        Rule("transformer.ln_f.weight", "final_norm.weight"),
        Rule("transformer.ln_f.bias", "final_norm.bias"),
        Rule(f"{h}.attn.out_proj.weight", f"{block}.attn.o_proj.weight"),
    ]
    rules += [Rule(f"{h}.attn.{p}_proj.weight", f"{block}.attn.{p}_proj.weight") for p in "qkv"]
    for p in ("weight", "bias"):
        rules += [
            Rule(f"{h}.ln_1.{p}", f"{block}.attn_norm.{p}"),  # the one norm both branches read
            Rule(f"{h}.mlp.fc_in.{p}", f"{block}.mlp.fc_in.{p}"),
            Rule(f"{h}.mlp.fc_out.{p}", f"{block}.mlp.fc_out.{p}"),
        ]
    if config.head == "lm":
        rules += [Rule("lm_head.weight", "lm_head.proj.weight", derived=config.tie_embeddings),
                  Rule("lm_head.bias", "lm_head.proj.bias")]
    return rules


ARCHITECTURE = Architecture(
    model_type="gptj", classes=CLASSES, base_prefix="transformer", base_classes=("GPTJModel",),
    to_config=to_config, to_hf_config=to_hf_config, table=table,
    # buffers older versions saved: the causal mask and the sinusoid table
    ignore=(r"attn\.(masked_)?bias$", r"attn\.embed_positions$"),
)
