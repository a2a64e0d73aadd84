"""GGUF files (llama.cpp, Ollama, LM Studio) opened as anatomy models.

    model = anatomy.from_pretrained("model.gguf")          # or a folder holding one, or "smollm2"
    tokenizer = anatomy.load_tokenizer("model.gguf")

One .gguf file holds what a Hugging Face folder holds, under llama.cpp's names:
    metadata   "llama.block_count" = 30, "llama.attention.head_count" = 9, "tokenizer.ggml.tokens" = [...]
    tensors    "blk.0.attn_q.weight" Q4_1 [576, 576], "token_embd.weight" Q8_0 [49152, 576], ...

Opening one is three translations, and then the same road as a folder (hf.model_from_hf: the
architecture's own table, llama.py, qwen2.py, ..., and the engine's checks):
    1. metadata -> the Hugging Face config dict of its model_type     gguf_architectures.py (tables)
    2. tensor names -> Hugging Face names                             gguf_architectures.py (tables)
    3. values: dequantized by the `gguf` package, one tensor at a time; what llama.cpp's converter
       changed is undone (llama's q/k row order, Gemma's norm gains stored as w + 1)   here
The tokenizer, built from the same metadata, is in gguf_tokenizer.py.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import torch

from .files import CheckpointError, shorten
from .gguf_architectures import GGUF_ARCHITECTURES, TENSOR_NAMES, hf_config, hf_name, readable_architectures
from .gguf_tokenizer import check_tokenizer_metadata, tokenizer_from_metadata
from .hf import model_from_hf
from .tokenizer import Tokenizer

__all__ = ["GgufWeights", "gguf_file", "gguf_tokenizer", "load_gguf", "open_gguf", "readable_architectures",
           "supported_types", "unpermute_rows"]


# values: dequantized a tensor at a time, llama.cpp's changes undone --------------------------------
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
        with np.errstate(over="ignore"):  # a wrapped offset is caught below, in exact integers
            reader = _reader_class()(path)
    except Exception as error:  # gguf's reader raises many types for bytes that are not a GGUF file
        raise CheckpointError(f"GGUF file {str(path)!r} is truncated or corrupt: "
                              f"{type(error).__name__}: {shorten(str(error), 200)}") from None
    for t in reader.tensors:
        problem = _tensor_problem(gguf, reader, t, size)
        if problem:
            raise CheckpointError(f"GGUF file {str(path)!r} is truncated or corrupt: tensor {shorten(t.name)!r} "
                                  f"{problem}")
    return reader


def _tensor_problem(gguf, reader, t, size: int) -> str | None:
    """Why a tensor's info does not describe bytes inside the file (None when it does), in exact
    integers: the reader adds the file's uint64 offset to the data section's start in 64 bits, so
    an offset of 2**64 - k wraps around to bytes of the header and would load metadata as weights."""
    dims, offset = t.field.parts[3], t.field.parts[5]
    elements = math.prod(int(n) for n in dims)
    block, block_bytes = gguf.GGML_QUANT_SIZES[t.tensor_type]
    if elements % block:
        return f"has {elements} values, not a whole number of {t.tensor_type.name} blocks of {block}"
    start = reader.data_offset + int(offset[0])
    end = start + elements // block * block_bytes
    if end > size:
        return f"needs bytes up to {end}, the file has {size}"
    if start != int(t.data_offset) or elements != int(t.n_elements) or t.data.nbytes != end - start:
        return f"has an offset or dimensions that overflow 64 bits (data at byte {start}, {elements} values)"
    return None


@functools.cache
def _reader_class():
    """gguf.GGUFReader reading through a plain ndarray view of its memory map (slicing an np.memmap
    runs Python code per slice, and a file's 100 000 vocabulary strings make that 3x slower), and
    refusing what would make it read past the end of the file or grow without bound: a read that
    comes back short, an array whose count its remaining bytes cannot hold, an array of arrays."""
    gguf = _gguf()
    kinds = gguf.GGUFValueType

    class Reader(gguf.GGUFReader):
        @property
        def data(self):
            return self._data

        @data.setter
        def data(self, value):
            self._data = value.view(np.ndarray)  # the same mapped bytes, never copied

        def _get(self, offset, dtype, count=1, override_order=None):
            values = super()._get(offset, dtype, count, override_order)
            if len(values) != int(count):  # numpy slicing stops at the end of the file, silently
                raise ValueError(f"the file ends inside a value at byte {offset}")
            return values

        def _get_field_parts(self, orig_offs, raw_type):
            if raw_type == kinds.ARRAY:
                item_type, count = int(self._get(orig_offs, np.uint32)[0]), int(self._get(orig_offs + 4, np.uint64)[0])
                if item_type == kinds.ARRAY:
                    raise ValueError(f"the metadata value at byte {orig_offs} is an array of arrays, which GGUF "
                                     "files do not hold")
                scalar = self.gguf_scalar_to_np.get(item_type)
                smallest = 8 if item_type == kinds.STRING else np.dtype(scalar).itemsize if scalar else None
                if smallest is None:
                    raise ValueError(f"the metadata array at byte {orig_offs} has items of unknown type {item_type}")
                if count * smallest > len(self.data) - orig_offs - 12:
                    raise ValueError(f"the metadata array at byte {orig_offs} claims {count} items, more than the "
                                     "rest of the file holds")
            return super()._get_field_parts(orig_offs, raw_type)

    return Reader


def metadata(reader) -> dict:
    """Every metadata field as a Python value (strings, numbers, lists), keyed by its GGUF name."""
    return {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}


def open_gguf(path: str | Path) -> tuple[dict, GgufWeights]:
    """(Hugging Face config dict, weights under Hugging Face names) of a GGUF file, after checking
    the architecture and every tensor's type, before a single tensor is dequantized."""
    path = gguf_file(path)
    reader = read_gguf(path)
    meta = metadata(reader)
    hf = hf_config(meta, {t.name for t in reader.tensors}, path)
    check_tokenizer_metadata(meta, str(path))  # before a weight is dequantized
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
