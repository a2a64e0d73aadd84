"""Llama: pre-norm with RMSNorm, rotary positions (the rotate_half layout), SwiGLU, grouped-query
attention, no biases; the LM head is tied to the embeddings or not, as the config says. RoPE
scaling ("linear", "llama3") as the config says (rope.py reads and writes both spellings).

The Llama lineage (Mistral, Mixtral, Qwen2/3, Gemma 1/2/3, OLMo 2, Phi-3) keeps these names and
this config vocabulary, so its files build on the readers and rule groups here: `read_decoder`
and `write_decoder` for the config fields they share, `embedding_rules`, `norm_rules`,
`attention_rules` and `mlp_rules` for the weights.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..config import ModelConfig
from .common import field, pad_id, unsupported
from .engine import Architecture, Rule, require
from .files import CheckpointError
from .rope import read_rope, write_rope

FLAGS = dict(
    arch="decoder", pos_encoding="rotary", norm="rmsnorm", norm_position="pre", final_norm=True,
    activation="swiglu", embed_norm=False, scale_embeddings=False, type_vocab_size=0,
    lm_head_bias=False, lm_head_transform=False,
)
CLASSES = {"LlamaForCausalLM": "lm", "LlamaModel": "none"}
# Hugging Face norm name in a layer -> anatomy's, for a pre-norm block.
PRE_NORMS = {"input_layernorm": "attn_norm", "post_attention_layernorm": "mlp_norm"}


@dataclass(frozen=True)
class Windows:
    """How an architecture's config class fills in sliding windows: `default`, the window when
    config.json has no sliding_window; `switch`, a flag that must be true for any window at all;
    `slides(hf, i)`, whether layer i slides when config.json has no layer_types (None: every layer)."""
    default: int | None = None
    switch: str | None = None
    slides: Callable[[dict, int], bool] | None = None


# model_type -> what its config class puts where config.json is silent about sliding windows
# (both transformers 4.57 and 5 fill them in alike); the others have no window unless one is given.
WINDOWS = {
    "mistral": Windows(default=4096),
    "qwen2": Windows(default=4096, switch="use_sliding_window", slides=lambda hf, i: i >= hf.get("max_window_layers", 28)),
    "qwen3": Windows(default=4096, switch="use_sliding_window", slides=lambda hf, i: i >= hf.get("max_window_layers", 28)),
    "gemma2": Windows(default=4096, slides=lambda hf, i: (i + 1) % 2 != 0),  # sliding, full, sliding, ...
    "gemma3_text": Windows(default=4096, slides=lambda hf, i: (i + 1) % hf.get("sliding_window_pattern", 6) != 0),
}


# config.json <-> ModelConfig ---------------------------------------------------------------------

def layer_types(hf: dict, model_type: str) -> dict:
    """sliding_window and layer_types ("full_attention" / "sliding_attention") -> ModelConfig fields.

    A config.json without layer_types (written before transformers had it: Gemma 2 and 3, Qwen2 on
    the Hub) gets the kinds its config class derives (WINDOWS); without that either, the window
    applies to every layer (Mistral, Mixtral, Phi-3). No window (Qwen's use_sliding_window false):
    every layer attends fully, whatever layer_types says."""
    rule = WINDOWS.get(model_type, Windows())
    window = hf.get("sliding_window", rule.default)
    if rule.switch is not None and not hf.get(rule.switch, False):
        window = None
    kinds = hf.get("layer_types")
    if kinds is None and rule.slides is None:
        return {"sliding_window": window}
    if kinds is None:
        n_layers = field(hf, "num_hidden_layers", model_type)
        kinds = ["sliding_attention" if rule.slides(hf, i) else "full_attention" for i in range(n_layers)]
    names = {"full_attention": "full", "sliding_attention": "sliding"}
    unknown = sorted(set(kinds) - set(names))
    if unknown:
        raise CheckpointError(f"layer_types has {unknown}; anatomy implements {sorted(names)}")
    kinds = tuple(names[k] if window is not None else "full" for k in kinds)
    return {"sliding_window": window if "sliding" in kinds else None, "layer_types": kinds}


def read_decoder(hf: dict, model_type: str, head: str, **fields) -> ModelConfig:
    """The fields every Llama-lineage config.json spells the same way, then `fields` on top."""
    n_heads = field(hf, "num_attention_heads", model_type)
    d_model = field(hf, "hidden_size", model_type)
    bias = bool(hf.get("attention_bias", False))
    values = dict(
        FLAGS,
        vocab_size=field(hf, "vocab_size", model_type), d_model=d_model, n_heads=n_heads,
        n_kv_heads=hf.get("num_key_value_heads") or n_heads, d_head=hf.get("head_dim") or d_model // n_heads,
        n_layers=field(hf, "num_hidden_layers", model_type), d_ff=field(hf, "intermediate_size", model_type),
        max_seq_len=field(hf, "max_position_embeddings", model_type, 2048),
        norm_eps=hf.get("rms_norm_eps", 1e-6), attn_bias=bias, attn_out_bias=bias,
        mlp_bias=bool(hf.get("mlp_bias", False)), dropout=0.0, attn_dropout=hf.get("attention_dropout", 0.0),
        head=head, tie_embeddings=hf.get("tie_word_embeddings", False), pad_token_id=pad_id(hf),
    )
    rope = read_rope(hf, model_type)
    values.update(rope, rotary_dim=int(values["d_head"] * rope.pop("fraction")))
    values.update(fields)
    return ModelConfig(**values)


def options_off(config: ModelConfig) -> dict:
    """Every option of the lineage switched off: what a file requires of a config to write it, bar
    the options its model uses (a checkpoint must not silently drop a feature)."""
    return dict(
        rotary_dim=config.d_head, rotary_layout="halves", rope_local_theta=None, qk_norm="none",
        sliding_window=None, parallel_residual=False, parallel_shared_norm=False, n_experts=0,
        norm_plus_one=False, query_pre_attn_scalar=None, attn_softcap=None, final_logit_softcap=None,
        norm_position="pre", activation="swiglu", pos_encoding="rotary", norm="rmsnorm",
    )


def write_decoder(config: ModelConfig, model_type: str) -> dict:
    """The config.json fields every Llama-lineage model shares, the rotary settings in both spellings."""
    return dict(
        vocab_size=config.vocab_size, hidden_size=config.d_model, num_attention_heads=config.n_heads,
        num_key_value_heads=config.n_kv_heads, head_dim=config.d_head, num_hidden_layers=config.n_layers,
        intermediate_size=config.d_ff, max_position_embeddings=config.max_seq_len,
        **write_rope(config, model_type), rms_norm_eps=config.norm_eps,
        attention_dropout=config.effective_attn_dropout, tie_word_embeddings=config.tie_embeddings,
        pad_token_id=config.pad_token_id,
    )


def write_layer_types(config: ModelConfig) -> dict:
    """sliding_window and layer_types, as transformers 4.57 and 5 both read them."""
    names = {"full": "full_attention", "sliding": "sliding_attention"}
    return {"sliding_window": config.sliding_window, "layer_types": [names[k] for k in config.layer_types]}


# weights ----------------------------------------------------------------------------------------

LAYER, BLOCK = "model.layers.{i}", "blocks.{i}"


def _params(bias: bool) -> tuple[str, ...]:
    return ("weight", "bias") if bias else ("weight",)


def embedding_rules(config: ModelConfig) -> list[Rule]:
    rules = [Rule("model.embed_tokens.weight", "token_embedding.weight"),
             Rule("model.norm.weight", "final_norm.weight")]
    if config.head == "lm":
        rules.append(Rule("lm_head.weight", "lm_head.proj.weight", derived=config.tie_embeddings))
    return rules


def norm_rules(norms: dict[str, str]) -> list[Rule]:
    """norms: the layer's HF norm name -> anatomy's (attn_norm, attn_out_norm, mlp_norm, mlp_out_norm)."""
    return [Rule(f"{LAYER}.{hf}.weight", f"{BLOCK}.{ours}.weight") for hf, ours in norms.items()]


def attention_rules(config: ModelConfig, attn: str = "self_attn") -> list[Rule]:
    rules = []
    for name in ("q_proj", "k_proj", "v_proj"):
        rules += [Rule(f"{LAYER}.{attn}.{name}.{p}", f"{BLOCK}.attn.{name}.{p}") for p in _params(config.attn_bias)]
    rules += [Rule(f"{LAYER}.{attn}.o_proj.{p}", f"{BLOCK}.attn.o_proj.{p}") for p in _params(config.attn_out_bias)]
    if config.qk_norm != "none":
        rules += [Rule(f"{LAYER}.{attn}.{n}.weight", f"{BLOCK}.attn.{n}.weight") for n in ("q_norm", "k_norm")]
    return rules


def mlp_rules(config: ModelConfig, mlp: str = "mlp", ours: str = "mlp") -> list[Rule]:
    # down(act(gate(x)) * up(x)): gate is the gated branch, up the linear one.
    rules = []
    for hf, name in (("gate_proj", "fc_gate"), ("up_proj", "fc_in"), ("down_proj", "fc_out")):
        rules += [Rule(f"{LAYER}.{mlp}.{hf}.{p}", f"{BLOCK}.{ours}.{name}.{p}") for p in _params(config.mlp_bias)]
    return rules


# Llama itself -----------------------------------------------------------------------------------

def to_config(hf: dict, class_name: str, keys: set[str]) -> ModelConfig:
    unsupported("llama", hf, hidden_act="silu")
    return read_decoder(hf, "llama", CLASSES[class_name])


def to_hf_config(config: ModelConfig, class_name: str) -> dict:
    require("llama", config, **{**options_off(config), **FLAGS, "attn_out_bias": config.attn_bias})
    return dict(write_decoder(config, "llama"), hidden_act="silu", attention_bias=config.attn_bias,
                mlp_bias=config.mlp_bias)


def lineage_architecture(model_type: str, classes: dict[str, str], to_config, to_hf_config, *,
                         norms: dict[str, str] = PRE_NORMS, feed_forward=None) -> Architecture:
    """A Llama-lineage Architecture: tensors under "model." (the base class saves them without it),
    a table of the embeddings, the layer's `norms`, attention and `feed_forward` (default: the
    gated MLP's gate_proj, up_proj, down_proj); the saved rotary frequencies are ignored."""
    feed_forward = feed_forward or mlp_rules

    def table(config: ModelConfig) -> list[Rule]:
        return embedding_rules(config) + norm_rules(norms) + attention_rules(config) + feed_forward(config)

    base = [name for name, head in classes.items() if head == "none"]
    return Architecture(
        model_type=model_type, classes=classes, base_prefix="model", base_classes=tuple(base),
        to_config=to_config, to_hf_config=to_hf_config, table=table,
        ignore=(r"rotary_emb(_local)?\.inv_freq$",),  # a buffer some versions saved; recomputed from rope_theta
    )


ARCHITECTURE = lineage_architecture("llama", CLASSES, to_config, to_hf_config)
