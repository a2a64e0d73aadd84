"""How llama.cpp wrote each Hugging Face model_type into a GGUF file, as data.

    metadata   "llama.attention.head_count" = 9        -> config.json's "num_attention_heads": 9
    tensors    "blk.0.attn_q.weight"                   -> "model.layers.0.self_attn.q_proj.weight"
    values     llama's q/k rows permuted, Gemma's norm gains stored as w + 1 (undone in gguf.py)

`hf_config` turns a file's metadata into the Hugging Face config dict of its model_type, which the
architecture's own reader (llama.py, qwen2.py, ...) then reads as it reads a config.json.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .files import CheckpointError, shorten
from .registry import ARCHITECTURES

# 1. metadata -> config ---------------------------------------------------------------------------
# GGUF key (after "<architecture>.") -> Hugging Face config field, shared by every architecture below.
CONFIG_KEYS = {
    "block_count": "num_hidden_layers",
    "context_length": "max_position_embeddings",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.key_length": "head_dim",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "rope.freq_base": "rope_theta",
    "vocab_size": "vocab_size",
}
# tokenizer.ggml.* ids -> config fields
SPECIAL_IDS = {"bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id", "padding_token_id": "pad_token_id"}
# What each value read from "<architecture>.*" must be, checked before anything is computed from it:
# counts and widths are integers >= 1 (llama.cpp writes some per layer, as arrays: anatomy reads
# one value for every layer), scales are numbers.
INTEGER_KEYS = ("block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
                "attention.head_count_kv", "attention.key_length", "vocab_size", "rope.dimension_count",
                "attention.sliding_window")
NUMBER_KEYS = ("attention.layer_norm_rms_epsilon", "rope.freq_base", "attn_logit_softcapping",
               "final_logit_softcapping", "rope.scaling.factor")


@dataclass(frozen=True)
class GgufArchitecture:
    """How llama.cpp wrote one Hugging Face model_type.

    permuted_qk: llama.cpp's graph for this architecture rotates adjacent pairs (x0, x1), (x2, x3), ...
    where Hugging Face's rotate_half pairs x_j with x_{j + D/2}; its converter reorders the rows of
    W_q and W_k (and their biases) so that the same pairs meet. Loading puts them back.
    norm_offset: Gemma's RMSNorms scale by (1 + w); llama.cpp stores w + 1 (its norms scale by the
    stored gain), so loading subtracts the offset from every norm gain.
    keys: extra metadata keys for this architecture; fixed: config fields the file does not state;
    same_as: config fields llama.cpp's graph takes from another field (field -> that field).
    tensors: names that differ from TENSOR_NAMES for this architecture.
    swa_pattern: every swa_pattern-th layer attends fully, the others through the sliding window
    (llama.cpp's n_swa_pattern; 0: no sliding window).
    partial_rotary: rope.dimension_count is the rotated width, a part of each head.
    local_rope_theta: the sliding layers' own rotary base, which the file does not state (llama.cpp
    fixes it); the rotary settings are then given per layer type.
    """

    model_type: str
    permuted_qk: bool
    norm_offset: float = 0.0
    keys: dict[str, str] = field(default_factory=dict)
    fixed: dict = field(default_factory=dict)
    same_as: dict[str, str] = field(default_factory=dict)
    tensors: dict[str, str] = field(default_factory=dict)
    swa_pattern: int = 0
    partial_rotary: bool = False
    local_rope_theta: float | None = None


# general.architecture -> how to read it. An architecture loads when its model_type is in the registry.
GGUF_ARCHITECTURES = {
    # llama rotates whole heads: the rotary width is the head width (older files state only that)
    "llama": GgufArchitecture("llama", permuted_qk=True, keys={"rope.dimension_count": "head_dim"},
                              fixed={"hidden_act": "silu"}),
    # Qwen's graphs rotate halves (NEOX style), as Hugging Face does: no permutation.
    "qwen2": GgufArchitecture("qwen2", permuted_qk=False, fixed={"hidden_act": "silu", "use_sliding_window": False}),
    "qwen3": GgufArchitecture("qwen3", permuted_qk=False, fixed={"hidden_act": "silu", "use_sliding_window": False}),
    "gemma": GgufArchitecture("gemma", permuted_qk=False, norm_offset=1.0, fixed={"hidden_act": "gelu_pytorch_tanh"}),
    # Gemma 2's four norms a layer; llama.cpp scales scores by 1/sqrt(head width) (its 27B excepted)
    "gemma2": GgufArchitecture(
        "gemma2", permuted_qk=False, norm_offset=1.0, fixed={"hidden_activation": "gelu_pytorch_tanh"}, swa_pattern=2,
        keys={"attention.sliding_window": "sliding_window", "attn_logit_softcapping": "attn_logit_softcapping",
              "final_logit_softcapping": "final_logit_softcapping"},
        same_as={"query_pre_attn_scalar": "head_dim"},
        tensors={"blk.{i}.post_attention_norm": "model.layers.{i}.post_attention_layernorm",
                 "blk.{i}.ffn_norm": "model.layers.{i}.pre_feedforward_layernorm",
                 "blk.{i}.post_ffw_norm": "model.layers.{i}.post_feedforward_layernorm"}),
    # Gemma 3: Gemma 2's norms plus a norm on each q and k head; five sliding layers to one full,
    # the sliding ones rotating with base 10 000
    "gemma3": GgufArchitecture(
        "gemma3_text", permuted_qk=False, norm_offset=1.0, fixed={"hidden_activation": "gelu_pytorch_tanh"},
        swa_pattern=6, local_rope_theta=10_000.0, keys={"attention.sliding_window": "sliding_window"},
        same_as={"query_pre_attn_scalar": "head_dim"},
        tensors={"blk.{i}.post_attention_norm": "model.layers.{i}.post_attention_layernorm",
                 "blk.{i}.ffn_norm": "model.layers.{i}.pre_feedforward_layernorm",
                 "blk.{i}.post_ffw_norm": "model.layers.{i}.post_feedforward_layernorm"}),
    # OLMo 2: norms on the sublayers' outputs, and over all the heads' queries (and keys) at once
    "olmo2": GgufArchitecture(
        "olmo2", permuted_qk=False, fixed={"hidden_act": "silu"},
        tensors={"blk.{i}.post_attention_norm": "model.layers.{i}.post_attention_layernorm",
                 "blk.{i}.post_ffw_norm": "model.layers.{i}.post_feedforward_layernorm"}),
    # Phi-3 keeps transformers' fused q/k/v and gate/up matrices (phi3.py splits them)
    "phi3": GgufArchitecture(
        "phi3", permuted_qk=False, fixed={"hidden_act": "silu"}, partial_rotary=True,
        keys={"attention.sliding_window": "sliding_window"},
        tensors={"blk.{i}.attn_qkv": "model.layers.{i}.self_attn.qkv_proj",
                 "blk.{i}.ffn_up": "model.layers.{i}.mlp.gate_up_proj"}),
}

# 2. tensor names ---------------------------------------------------------------------------------
# llama.cpp name (without .weight/.bias) -> Hugging Face name; "{i}" is the layer index.
TENSOR_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
    "blk.{i}.attn_norm": "model.layers.{i}.input_layernorm",
    "blk.{i}.attn_q": "model.layers.{i}.self_attn.q_proj",
    "blk.{i}.attn_k": "model.layers.{i}.self_attn.k_proj",
    "blk.{i}.attn_v": "model.layers.{i}.self_attn.v_proj",
    "blk.{i}.attn_output": "model.layers.{i}.self_attn.o_proj",
    "blk.{i}.attn_q_norm": "model.layers.{i}.self_attn.q_norm",
    "blk.{i}.attn_k_norm": "model.layers.{i}.self_attn.k_norm",
    "blk.{i}.ffn_norm": "model.layers.{i}.post_attention_layernorm",
    "blk.{i}.ffn_gate": "model.layers.{i}.mlp.gate_proj",
    "blk.{i}.ffn_up": "model.layers.{i}.mlp.up_proj",
    "blk.{i}.ffn_down": "model.layers.{i}.mlp.down_proj",
}
_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")


def hf_name(gguf_name: str, names: dict[str, str] = TENSOR_NAMES) -> str:
    """"blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight"; a name the table lacks
    is kept as it is, so that the engine reports it as unexpected."""
    stem, dot, suffix = gguf_name.rpartition(".")
    if suffix not in ("weight", "bias"):
        return gguf_name
    layer = _LAYER.match(stem)
    key, index = (f"blk.{{i}}.{layer[2]}", layer[1]) if layer else (stem, None)
    if key not in names:
        return gguf_name
    return names[key].format(i=index) + dot + suffix


def readable_architectures() -> list[str]:
    """The GGUF general.architecture values anatomy loads (for `anatomy models` and errors)."""
    return sorted(a for a, spec in GGUF_ARCHITECTURES.items() if spec.model_type in ARCHITECTURES)


def check_values(meta: dict, architecture: str, n_tensors: int, path: Path) -> None:
    """Each "<architecture>.*" value anatomy reads has its type (INTEGER_KEYS, NUMBER_KEYS), and
    block_count is at most the number of tensors (a block holds at least one): a claim of 2**31
    blocks is refused before a per-layer list is made. CheckpointError naming the key otherwise."""
    for key in INTEGER_KEYS + NUMBER_KEYS + ("rope.scaling.type",):
        name = f"{architecture}.{key}"
        if name not in meta:
            continue
        value = meta[name]
        if key in INTEGER_KEYS:
            wrong = isinstance(value, bool) or not isinstance(value, int) or value < 1
            allowed = "an integer >= 1" + (" (one for every layer)" if isinstance(value, list) else "")
        elif key in NUMBER_KEYS:
            wrong, allowed = isinstance(value, bool) or not isinstance(value, (int, float)), "a number"
        else:
            wrong, allowed = not isinstance(value, str), "a string"
        if wrong:
            raise CheckpointError(f"GGUF file {str(path)!r} gives {name} = {shorten(repr(value), 60)}; "
                                  f"it must be {allowed}")
    blocks = meta.get(f"{architecture}.block_count")
    if blocks is not None and blocks > n_tensors:
        raise CheckpointError(f"GGUF file {str(path)!r} gives {architecture}.block_count = {blocks}, but holds "
                              f"{n_tensors} tensors (a block holds at least one)")


def hf_config(meta: dict, tensor_names: set[str], path: Path) -> dict:
    """The Hugging Face config dict the file's metadata describes (model_type, sizes, special ids).

    Raises CheckpointError naming the file for an architecture anatomy cannot read."""
    architecture = meta.get("general.architecture")
    readable = readable_architectures()
    if not isinstance(architecture, str) or architecture not in readable:
        raise CheckpointError(f"GGUF file {str(path)!r} holds a {shorten(repr(architecture), 60)} model; "
                              f"anatomy reads: {', '.join(readable)}")
    spec = GGUF_ARCHITECTURES[architecture]
    check_values(meta, architecture, len(tensor_names), path)
    classes = ARCHITECTURES[spec.model_type].classes
    hf = {"model_type": spec.model_type, "architectures": [next(c for c, head in classes.items() if head == "lm")]}
    hf.update(spec.fixed)
    for key, name in (spec.keys | CONFIG_KEYS).items():  # CONFIG_KEYS last: key_length wins over rope width
        if f"{architecture}.{key}" in meta:
            hf[name] = meta[f"{architecture}.{key}"]
    hf.setdefault("vocab_size", len(meta.get("tokenizer.ggml.tokens", ())) or None)
    for key, name in SPECIAL_IDS.items():
        if f"tokenizer.ggml.{key}" in meta:
            hf[name] = meta[f"tokenizer.ggml.{key}"]
    hf.update({name: hf[other] for name, other in spec.same_as.items() if other in hf})
    rotated = meta.get(f"{architecture}.rope.dimension_count")
    head_width = hf.get("head_dim") or hf.get("hidden_size", 0) // hf.get("num_attention_heads", 1)
    if spec.partial_rotary and rotated and head_width:  # no width: the config's own check says why
        hf["partial_rotary_factor"] = rotated / head_width
    if spec.swa_pattern and hf.get("sliding_window") and "num_hidden_layers" in hf:
        hf["layer_types"] = ["full_attention" if (i + 1) % spec.swa_pattern == 0 else "sliding_attention"
                             for i in range(hf["num_hidden_layers"])]
    # Rotary settings as transformers 5 writes them; the Architecture's reader accepts a scaling or
    # refuses it, with the reason.
    scaling = meta.get(f"{architecture}.rope.scaling.type", "none")
    rope = {"rope_type": "default"} if scaling == "none" else {
        "rope_type": scaling, "factor": meta.get(f"{architecture}.rope.scaling.factor")}
    if "rope_theta" in hf:
        rope["rope_theta"] = hf.pop("rope_theta")
    hf["rope_parameters"] = rope if spec.local_rope_theta is None else {
        "full_attention": rope, "sliding_attention": {"rope_type": "default", "rope_theta": spec.local_rope_theta}}
    # llama.cpp leaves the output projection out when it is the embedding matrix.
    hf["tie_word_embeddings"] = "output.weight" not in tensor_names
    return hf
