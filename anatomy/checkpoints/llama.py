"""Llama: pre-norm with RMSNorm, rotary positions (the rotate_half layout), SwiGLU, grouped-query
attention, no biases; the LM head is tied to the embeddings or not, as the config says. RoPE
scaling ("linear", "llama3") as the config's rope_parameters say.

The Llama lineage (Mistral, Mixtral, Qwen2/3, Gemma 1/2/3, OLMo 2, Phi-3) keeps these names and
this config vocabulary, so its files build on the readers and rule groups here: `read_decoder`
and `write_decoder` for the config fields they share, `embedding_rules`, `norm_rules`,
`attention_rules` and `mlp_rules` for the weights.
"""

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
# Hugging Face norm name in a layer -> anatomy's, for a pre-norm block.
PRE_NORMS = {"input_layernorm": "attn_norm", "post_attention_layernorm": "mlp_norm"}
# rope_type -> the rope_parameters fields it reads, and the ModelConfig fields they fill.
ROPE_SCALING_FIELDS = {
    "default": {},
    "linear": {"factor": "rope_scaling_factor"},
    "llama3": {"factor": "rope_scaling_factor", "low_freq_factor": "rope_low_freq_factor",
               "high_freq_factor": "rope_high_freq_factor",
               "original_max_position_embeddings": "rope_original_max_len"},
}


# config.json <-> ModelConfig ---------------------------------------------------------------------

def rope_fields(hf: dict, model_type: str, rope: dict | None = None) -> dict:
    """rope_parameters (or the older rope_scaling / rope_theta) -> ModelConfig fields."""
    rope = rope if rope is not None else (hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ROPE_SCALING_FIELDS:
        raise CheckpointError(f"this {model_type} checkpoint uses rope_type={kind!r}; "
                              f"anatomy implements {', '.join(map(repr, ROPE_SCALING_FIELDS))}")
    fields = {"rope_theta": float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))}
    if kind != "default":
        fields["rope_scaling"] = kind
    for hf_name, name in ROPE_SCALING_FIELDS[kind].items():
        if hf_name not in rope:
            raise CheckpointError(f"this {model_type} checkpoint's {kind} rope_parameters lack {hf_name!r}")
        fields[name] = int(rope[hf_name]) if name == "rope_original_max_len" else float(rope[hf_name])
    return fields


def rope_parameters(config: ModelConfig) -> dict:
    """The inverse of rope_fields: rope_parameters for config.json."""
    kind = "default" if config.rope_scaling == "none" else config.rope_scaling
    return {"rope_type": kind, "rope_theta": config.rope_theta,
            **{hf_name: getattr(config, name) for hf_name, name in ROPE_SCALING_FIELDS[kind].items()}}


def layer_types(hf: dict) -> dict:
    """sliding_window and layer_types ("full_attention" / "sliding_attention") -> ModelConfig fields.

    Without layer_types, a sliding_window applies to every layer (Mistral, Phi-3)."""
    window, kinds = hf.get("sliding_window"), hf.get("layer_types")
    if kinds is None:
        return {"sliding_window": window}
    names = {"full_attention": "full", "sliding_attention": "sliding"}
    unknown = sorted(set(kinds) - set(names))
    if unknown:
        raise CheckpointError(f"layer_types has {unknown}; anatomy implements {sorted(names)}")
    kinds = tuple(names[k] for k in kinds)
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
        **rope_fields(hf, model_type),
    )
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


def write_decoder(config: ModelConfig) -> dict:
    """The config.json fields every Llama-lineage model shares."""
    return dict(
        vocab_size=config.vocab_size, hidden_size=config.d_model, num_attention_heads=config.n_heads,
        num_key_value_heads=config.n_kv_heads, head_dim=config.d_head, num_hidden_layers=config.n_layers,
        intermediate_size=config.d_ff, max_position_embeddings=config.max_seq_len,
        rope_parameters=rope_parameters(config), rms_norm_eps=config.norm_eps,
        attention_dropout=config.effective_attn_dropout, tie_word_embeddings=config.tie_embeddings,
        pad_token_id=config.pad_token_id,
    )


def write_layer_types(config: ModelConfig) -> dict:
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
    return dict(write_decoder(config), hidden_act="silu", attention_bias=config.attn_bias, mlp_bias=config.mlp_bias)


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
