"""GGUF files (llama.cpp, Ollama, LM Studio) opened as anatomy models.

    model = anatomy.from_pretrained("model.gguf")          # or a folder holding one, or "smollm2"
    tokenizer = anatomy.load_tokenizer("model.gguf")

One .gguf file holds what a Hugging Face folder holds, under llama.cpp's names:
    metadata   "llama.block_count" = 30, "llama.attention.head_count" = 9, "tokenizer.ggml.tokens" = [...]
    tensors    "blk.0.attn_q.weight" Q4_1 [576, 576], "token_embd.weight" Q8_0 [49152, 576], ...

Opening one is three translations, each a table below, and then the same road as a folder
(hf.model_from_hf: the architecture's own table, llama.py, qwen2.py, ..., and the engine's checks):
    1. metadata -> the Hugging Face config dict of its model_type     GGUF_ARCHITECTURES, CONFIG_KEYS
    2. tensor names -> Hugging Face names                             TENSOR_NAMES (+ per architecture)
    3. values: dequantized by the `gguf` package, one tensor at a time; what llama.cpp's converter
       changed is undone (llama's q/k row order, Gemma's norm gains stored as w + 1)
The tokenizer, built from the same metadata, is in gguf_tokenizer.py.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .files import CheckpointError
from .gguf_tokenizer import tokenizer_from_metadata
from .hf import model_from_hf
from .registry import ARCHITECTURES
from .tokenizer import Tokenizer

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
        "gemma2", permuted_qk=False, norm_offset=1.0, fixed={"hidden_act": "gelu_pytorch_tanh"}, swa_pattern=2,
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


# 3. values ---------------------------------------------------------------------------------------
def unpermute_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row order. Within each head of D rows, llama.cpp stored
        W'[2j + s] = W[s * D/2 + j]        (j < D/2, s in {0, 1})
    so W = W' viewed as (H, D/2, 2, ...) with the last two axes swapped back."""
    rest = w.shape[1:]
    # (H*D, ...) -> (H, D/2, 2, ...) -> (H, 2, D/2, ...) -> (H*D, ...)
    return w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, *rest).transpose(1, 2).reshape(w.shape)


DEQUANTIZE_CHUNK = 1 << 20  # values dequantized at once (4 MB of float32)


class GgufWeights:
    """The tensors of a GGUF file under Hugging Face names, dequantized one at a time on `get`
    (the Weights protocol of files.py: `name in w`, iter, shape, get, source)."""

    def __init__(self, reader, path: Path, names: dict[str, str], permuted_heads: dict[str, int],
                 norm_offset: float = 0.0):
        self.source = str(path)
        self._tensors = {hf_name(t.name, names): t for t in reader.tensors}
        self._heads = permuted_heads
        self._norm_offset = norm_offset

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def __iter__(self):
        return iter(self._tensors)

    def shape(self, name: str) -> tuple[int, ...]:
        # ggml lists dimensions fastest-first ([cols, rows]); torch slowest-first.
        return tuple(int(n) for n in reversed(self._tensors[name].shape))

    def dtype(self, name: str) -> torch.dtype:
        return torch.float32

    def get(self, name: str) -> torch.Tensor:
        """The tensor in float32 (the precision every GGUF type dequantizes to), dequantized a few
        rows at a time into its final storage: the temporaries stay small whatever the tensor."""
        t = self._tensors[name]
        w = torch.empty(self.shape(name), dtype=torch.float32)
        blocks = t.data.reshape(-1, t.data.shape[-1])  # one row of blocks (or of values) per tensor row
        out = w.numpy().reshape(len(blocks), -1)  # (rows, cols), the same memory as w
        step = max(1, DEQUANTIZE_CHUNK // out.shape[1])
        for start in range(0, len(blocks), step):
            out[start:start + step] = _gguf().quants.dequantize(blocks[start:start + step], t.tensor_type)
        if name in self._heads:
            w = unpermute_rows(w, self._heads[name])
        if self._norm_offset and name.endswith("norm.weight"):
            w -= self._norm_offset
        return w


@functools.cache
def dequantizable(kind) -> bool:
    """Whether the installed gguf package dequantizes tensors of type `kind` (asked with one block
    of zeros; gguf raises NotImplementedError for the types it cannot read)."""
    gguf = _gguf()
    try:
        gguf.quants.dequantize(np.zeros((1, gguf.GGML_QUANT_SIZES[kind][1]), dtype=np.uint8), kind)
    except NotImplementedError:
        return False
    return True


def supported_types() -> list[str]:
    """The tensor types anatomy reads: every one gguf dequantizes (F32, F16, BF16, Q8_0, Q4_0,
    Q4_1, Q5_0, Q5_1, Q2_K..Q6_K, and the IQ/TQ types of recent gguf versions)."""
    return [kind.name for kind in _gguf().GGMLQuantizationType if dequantizable(kind)]


# reading a file ----------------------------------------------------------------------------------
def gguf_file(path: str | Path) -> Path:
    """`path` itself when it is a file, or the one .gguf file in the folder `path`."""
    path = Path(path)
    if path.is_dir():
        found = sorted(path.glob("*.gguf"))
        if len(found) != 1:
            raise CheckpointError(f"{str(path)!r} holds {len(found)} .gguf files; give the file itself"
                                  + (f" (one of: {', '.join(p.name for p in found)})" if found else ""))
        return found[0]
    if not path.is_file():
        raise CheckpointError(f"GGUF file {str(path)!r} does not exist")
    return path


def read_gguf(path: Path):
    """The file's gguf.GGUFReader, after checking that it is whole: every tensor's bytes lie inside
    the file. Raises CheckpointError naming the file when it is not a GGUF file or is truncated.

    The last file read is kept (keyed by its size and modification time): opening a model reads
    it twice, for the weights and for the tokenizer, and parsing 100 000 vocabulary strings is
    most of the time either takes."""
    stat = path.stat()
    return _read(path, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=1)
def _read(path: Path, size: int, mtime_ns: int):
    gguf = _gguf()
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise CheckpointError(f"{str(path)!r} is not a GGUF file (it starts with {magic!r}, not b'GGUF')")
    try:
        reader = _reader_class()(path)
    except (ValueError, IndexError, KeyError, OSError, UnicodeDecodeError) as error:
        raise CheckpointError(f"GGUF file {str(path)!r} is truncated or corrupt: {error}") from None
    for t in reader.tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size or t.data.nbytes != int(t.n_bytes):
            raise CheckpointError(
                f"GGUF file {str(path)!r} is truncated: tensor {t.name!r} needs bytes up to {end}, "
                f"the file has {size}")
    return reader


@functools.cache
def _reader_class():
    """gguf.GGUFReader reading through a plain ndarray view of its memory map: slicing an np.memmap
    runs Python code per slice, and a file's 100 000 vocabulary strings make that 3x slower."""

    class Reader(_gguf().GGUFReader):
        @property
        def data(self):
            return self._data

        @data.setter
        def data(self, value):
            self._data = value.view(np.ndarray)  # the same mapped bytes, never copied

    return Reader


def metadata(reader) -> dict:
    """Every metadata field as a Python value (strings, numbers, lists), keyed by its GGUF name."""
    return {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}


def readable_architectures() -> list[str]:
    """The GGUF general.architecture values anatomy loads (for `anatomy models` and errors)."""
    return sorted(a for a, spec in GGUF_ARCHITECTURES.items() if spec.model_type in ARCHITECTURES)


def hf_config(meta: dict, tensor_names: set[str], path: Path) -> dict:
    """The Hugging Face config dict the file's metadata describes (model_type, sizes, special ids).

    Raises CheckpointError naming the file for an architecture anatomy cannot read."""
    architecture = meta.get("general.architecture")
    readable = readable_architectures()
    if architecture not in readable:
        raise CheckpointError(
            f"GGUF file {str(path)!r} holds a {architecture!r} model; anatomy reads: {', '.join(readable)}")
    spec = GGUF_ARCHITECTURES[architecture]
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
    if spec.partial_rotary and rotated and hf.get("num_attention_heads") and hf.get("hidden_size"):
        hf["partial_rotary_factor"] = rotated / (hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"])
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


def open_gguf(path: str | Path) -> tuple[dict, GgufWeights]:
    """(Hugging Face config dict, weights under Hugging Face names) of a GGUF file, after checking
    the architecture and every tensor's type, before a single tensor is dequantized."""
    path = gguf_file(path)
    reader = read_gguf(path)
    meta = metadata(reader)
    hf = hf_config(meta, {t.name for t in reader.tensors}, path)
    if any(t.name == "rope_freqs.weight" for t in reader.tensors):
        raise CheckpointError(
            f"GGUF file {str(path)!r} scales each rotary frequency by its own factor (rope_freqs.weight, how "
            "llama.cpp writes Llama 3.1's 'llama3' RoPE); the parameters behind those factors are not in the "
            "file, so anatomy cannot build that RoPE from it: load the model's Hugging Face folder instead")
    unreadable = sorted({t.tensor_type.name for t in reader.tensors if not dequantizable(t.tensor_type)})
    if unreadable:
        raise CheckpointError(
            f"GGUF file {str(path)!r} holds tensors of type {', '.join(unreadable)}, which the installed gguf "
            f"package cannot dequantize; readable types: {', '.join(supported_types())}")
    spec = GGUF_ARCHITECTURES[meta["general.architecture"]]
    names = TENSOR_NAMES | spec.tensors
    heads = {}  # HF name -> the heads whose rows llama.cpp permuted (q: query heads, k: key/value heads)
    n_heads = hf.get("num_attention_heads")  # absent: the Architecture's reader names the missing field
    if spec.permuted_qk and n_heads:
        per_projection = {"q_proj": n_heads, "k_proj": hf.get("num_key_value_heads") or n_heads}
        for name in (hf_name(t.name, names) for t in reader.tensors):
            projection = name.split(".")[-2]
            if ".self_attn." in name and projection in per_projection:
                heads[name] = per_projection[projection]
    return hf, GgufWeights(reader, path, names, heads, spec.norm_offset)


def _gguf():
    """The gguf package (an optional extra), with its quants module."""
    try:
        import gguf
        import gguf.quants  # noqa: F401  (dequantize lives here)
    except ImportError:
        raise CheckpointError("reading GGUF files needs the gguf package: pip install gguf") from None
    return gguf


def load_gguf(path: str | Path, *, dtype: torch.dtype | None = None, device: str | torch.device | None = None,
              attn_impl: str | None = None):
    """The anatomy model a GGUF file (or a folder holding one) describes, its weights loaded.

    The same road as a Hugging Face folder (hf.model_from_hf): every tensor is dequantized to
    float32 one at a time, then stored in `dtype` (default float32) on `device` (default cpu).
    Returns the model in eval mode.
    Raises CheckpointError naming the file, with nothing half-loaded, for: not a GGUF file, a
    truncated file, an architecture or tensor type anatomy cannot read, a tensor that does not fit.
    """
    hf, weights = open_gguf(path)
    return model_from_hf(hf, weights, dtype=dtype, device=device, attn_impl=attn_impl)


def gguf_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer a GGUF file (or a folder holding one) carries, as anatomy's Tokenizer: byte-level
    BPE ("gpt2") or SentencePiece-style BPE ("llama"), with its special ids and chat template."""
    path = gguf_file(path)
    return tokenizer_from_metadata(metadata(read_gguf(path)), str(path))
