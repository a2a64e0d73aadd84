"""GPT-Neo: GPT-2's block with plain Linear layers, q/k/v without biases, and two differences in
attention. Scores are not divided by sqrt(d_head) (query_pre_attn_scalar=1: the scale is 1/sqrt(1)),
and the layers alternate as attention_types says between "global" (every earlier token) and
"local" (the last window_size tokens, the query's own included): layer_types "full" / "sliding"
with sliding_window = window_size, a mask, so the fused kernel still computes it."""

from __future__ import annotations

from ..config import ModelConfig
from .common import activation, field, pad_id, to_hf_activation
from .engine import Architecture, Rule, require
from .files import CheckpointError
from .table_helpers import plain_heads, weight_and_bias

FLAGS = dict(
    arch="decoder", pos_encoding="learned", norm="layernorm", norm_position="pre", final_norm=True,
    embed_norm=False, scale_embeddings=False, type_vocab_size=0, attn_bias=False, attn_out_bias=True,
    mlp_bias=True, lm_head_bias=False, lm_head_transform=False, query_pre_attn_scalar=1.0, pos_offset=0,
    positions_from_padding=False, lm_head_rescale=False,
)
CLASSES = {"GPTNeoForCausalLM": "lm", "GPTNeoModel": "none"}
LAYER_TYPES = {"global": "full", "local": "sliding"}  # GPT-Neo's names -> anatomy's


def _layer_types(hf: dict, n_layers: int) -> tuple[str, ...]:
    # attention_types: [[["global", "local"], repeats], ...]; both versions expand it into attention_layers,
    # and take attention_layers as config.json gives it where it does
    types = hf.get("attention_types", [[["global"], n_layers]])
    names = hf.get("attention_layers") or [name for kinds, repeats in types for _ in range(repeats) for name in kinds]
    unknown = sorted(set(names) - set(LAYER_TYPES))
    if unknown or len(names) != n_layers:
        raise CheckpointError(
            f"gpt_neo attention layers {names} must name each of the {n_layers} layers "
            f"with one of {sorted(LAYER_TYPES)}"
        )
    return tuple(LAYER_TYPES[name] for name in names)


def to_config(hf: dict, class_name: str, keys: set[str]) -> ModelConfig:
    d_model = field(hf, "hidden_size", "gpt_neo")
    n_layers = field(hf, "num_layers", "gpt_neo")
    layer_types = _layer_types(hf, n_layers)
    return ModelConfig(
        **FLAGS,
        vocab_size=field(hf, "vocab_size", "gpt_neo"), d_model=d_model, n_heads=field(hf, "num_heads", "gpt_neo"),
        n_layers=n_layers, d_ff=hf.get("intermediate_size") or 4 * d_model,
        max_seq_len=field(hf, "max_position_embeddings", "gpt_neo", 2048), layer_types=layer_types,
        sliding_window=field(hf, "window_size", "gpt_neo", 256) if "sliding" in layer_types else None,
        activation=activation(hf, "activation_function", "gpt_neo", "gelu_new"),
        norm_eps=hf.get("layer_norm_epsilon", 1e-5), dropout=hf.get("resid_dropout", 0.0),
        attn_dropout=hf.get("attention_dropout", 0.0), head=CLASSES[class_name],
        tie_embeddings=hf.get("tie_word_embeddings", True), pad_token_id=pad_id(hf),
    )


def to_hf_config(config: ModelConfig, class_name: str) -> dict:
    require("gpt_neo", config, **FLAGS, **plain_heads(config))
    names = [{v: k for k, v in LAYER_TYPES.items()}[kind] for kind in config.layer_types]
    return dict(
        vocab_size=config.vocab_size, hidden_size=config.d_model, num_heads=config.n_heads, num_layers=config.n_layers,
        intermediate_size=config.d_ff, max_position_embeddings=config.max_seq_len,
        attention_types=[[[name], 1] for name in names], attention_layers=names,
        window_size=config.sliding_window or 256,
        activation_function=to_hf_activation(config.activation, "gpt_neo"), layer_norm_epsilon=config.norm_eps,
        resid_dropout=config.dropout, embed_dropout=config.dropout, attention_dropout=config.effective_attn_dropout,
        tie_word_embeddings=config.tie_embeddings, pad_token_id=config.pad_token_id,
    )


def table(config: ModelConfig) -> list[Rule]:
    h, block = "transformer.h.{i}", "blocks.{i}"
    rules = [
        Rule("transformer.wte.weight", "token_embedding.weight"),
        Rule("transformer.wpe.weight", "position_embedding.weight"),
        *[Rule(f"{h}.attn.attention.{p}_proj.weight", f"{block}.attn.{p}_proj.weight") for p in "qkv"],
        Rule(f"{h}.attn.attention.out_proj.weight", f"{block}.attn.o_proj.weight"),
        Rule(f"{h}.attn.attention.out_proj.bias", f"{block}.attn.o_proj.bias"),
    ]
    for hf, ours in [("ln_1", "attn_norm"), ("ln_2", "mlp_norm"),
                     ("mlp.c_fc", "mlp.fc_in"), ("mlp.c_proj", "mlp.fc_out")]:
        rules += weight_and_bias(f"{h}.{hf}", f"{block}.{ours}")
    rules += weight_and_bias("transformer.ln_f", "final_norm")
    if config.head == "lm":
        rules.append(Rule("lm_head.weight", "lm_head.proj.weight", derived=config.tie_embeddings))
    return rules


ARCHITECTURE = Architecture(
    model_type="gpt_neo", classes=CLASSES, base_prefix="transformer", base_classes=("GPTNeoModel",),
    to_config=to_config, to_hf_config=to_hf_config, table=table,
    # attn.attention.bias / masked_bias: the causal (and local) masks, stored as buffers by older versions.
    ignore=(r"h\.\d+\.attn\.attention\.(masked_)?bias$",),
)
