"""Tiny GGUF files for the tests, written with the `gguf` package the way llama.cpp's converter does.

A random transformers model (hidden 32, 2 layers) is saved under llama.cpp's tensor names (from
gguf's own name map, not from anatomy's table), with llama's q/k rows permuted as the converter
permutes them, each tensor in the quant type the test asks for, and a tokenizer trained on a few
sentences (byte-level BPE, "gpt2", or SentencePiece-style BPE with byte fallback, "llama").

K-quants (Q2_K..Q6_K) have no quantizer in gguf-py: their blocks are random bytes whose f16 scales
are set to small finite values, a valid tensor of that type whatever the other bytes are.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf.quants import quantize
from tokenizers import SentencePieceBPETokenizer, Tokenizer, decoders, models, pre_tokenizers, trainers

CORPUS = [
    "The capital of France is Paris. The capital of Italy is Rome.",
    "Hello world! Hello, hello, hello: the world says hello back.",
    "Numbers 0 1 2 3 4 5 6 7 8 9 10 42 100 2024 3.14 and more numbers.",
    "café naïve résumé über straße Ελληνικά 東京 🙂 unicode everywhere",
    "spaces  and   tabs\tand\nnew lines\n\nare text too",
]
# Strings every tokenizer test encodes: unicode, runs of spaces, digits, special tokens.
TEXTS = [
    "Hello world",
    "The capital of France is",
    "  two leading spaces, then  double   and triple",
    "digits 12345 and 3.14159, year 2024",
    "unicode: café, naïve, 東京, Ελληνικά 🙂",
    "tabs\tand\nnewlines\n\nend",
    "<|im_start|>user\nhi there<|im_end|>",
    "",
]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"

NORMAL, CONTROL, BYTE = 1, 3, 6  # llama.cpp's token types

# byte offsets of the f16 scale fields inside one block of each K-quant (ggml-common.h)
K_QUANT_SCALES = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def byte_level_vocab(vocab_size: int = 320) -> dict:
    """A byte-level BPE ("gpt2") trained on CORPUS: tokens in id order, merges, token types."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(CORPUS, trainer)
    model = json.loads(tokenizer.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return dict(model="gpt2", tokens=tokens, merges=merges,
                types=[CONTROL if t in SPECIALS else NORMAL for t in tokens],
                bos=SPECIALS.index("<|im_start|>"), eos=SPECIALS.index("<|im_end|>"), unk=None, pad=0)


def sentencepiece_vocab(vocab_size: int = 330) -> dict:
    """A SentencePiece-style BPE ("llama"): <unk> <s> </s>, the 256 byte tokens <0x00>..<0xFF>, then
    pieces with "▁" for a space, scored so that a piece learned earlier scores higher (merged first)."""
    trained = SentencePieceBPETokenizer(add_prefix_space=True)
    trained.train_from_iterator(CORPUS, vocab_size=vocab_size, min_frequency=1, show_progress=False,
                                special_tokens=[], limit_alphabet=200)
    learned = json.loads(trained.to_str())["model"]["vocab"]
    pieces = sorted(learned, key=learned.get)
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    tokens = ["<unk>", "<s>", "</s>"] + bytes_ + [p for p in pieces if p not in bytes_]
    scores = [0.0] * 259 + [-float(i) for i in range(len(tokens) - 259)]
    types = [2, CONTROL, CONTROL] + [BYTE] * 256 + [NORMAL] * (len(tokens) - 259)
    return dict(model="llama", tokens=tokens, scores=scores, types=types, bos=1, eos=2, unk=0, pad=None)


def llama_cpp_permute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """What llama.cpp's converter does to llama q/k rows (convert_hf_to_gguf.py, LlamaModel.permute):
    within each head, rows (j, j + D/2) become neighbours (2j, 2j + 1)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _encode(array: np.ndarray, qtype: str, rng: np.random.Generator) -> tuple[np.ndarray, object]:
    kind = gguf.GGMLQuantizationType[qtype]
    try:
        return quantize(array, kind), kind
    except NotImplementedError:  # the K-quants: random blocks, made valid below
        pass
    block, size = gguf.GGML_QUANT_SIZES[kind]
    rows, cols = array.shape
    blocks = rng.integers(0, 256, size=(rows * cols // block, size), dtype=np.uint8)
    for offset in K_QUANT_SCALES.get(qtype, ()):
        blocks[:, offset:offset + 2] = (rng.uniform(0.002, 0.02, size=(len(blocks), 1))
                                        .astype(np.float16).view(np.uint8))
    return blocks.reshape(rows, cols // block * size), kind


def write_gguf(path: Path, model, *, arch: str, vocab: dict, types: dict[str, str] | None = None, default: str = "F32",
               seed: int = 0, extra: dict | None = None, skip: tuple[str, ...] = (),
               extra_tensors: dict[str, np.ndarray] | None = None, drop: tuple[str, ...] = ()) -> Path:
    """Write `model` (a transformers decoder) as llama.cpp would: metadata, tokenizer, tensors.

    types: GGUF tensor-name suffix ("attn_q.weight", "token_embd.weight") -> quant type name;
    everything else is stored as `default`. `extra` (key -> (value, GGUFValueType)) adds or replaces
    metadata; keys in `drop` are left out. Tensors named in `skip` are left out; `extra_tensors`
    (GGUF name -> array) are added as they are.
    """
    config = model.config
    rng = np.random.default_rng(seed)
    arch_enum = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = gguf.get_tensor_name_map(arch_enum, config.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("tiny test model")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    rope = config.rope_parameters.get("full_attention", config.rope_parameters)  # Gemma 3: per layer type
    writer.add_rope_freq_base(rope["rope_theta"])
    if rope.get("rope_type", "default") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["factor"])
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_rope_dimension_count(head_dim)
    writer.add_key_length(head_dim)  # as llama.cpp's converter writes it for a config with head_dim
    writer.add_value_length(head_dim)
    writer.add_vocab_size(config.vocab_size)
    writer.add_tokenizer_model(vocab["model"])
    writer.add_tokenizer_pre(vocab.get("pre", "default"))
    writer.add_token_list(vocab["tokens"])
    writer.add_token_types(vocab["types"])
    if "merges" in vocab:
        writer.add_token_merges(vocab["merges"])
    if "scores" in vocab:
        writer.add_token_scores(vocab["scores"])
    for key in ("bos", "eos", "unk", "pad"):
        if vocab.get(key) is not None:
            getattr(writer, {"bos": "add_bos_token_id", "eos": "add_eos_token_id", "unk": "add_unk_token_id",
                             "pad": "add_pad_token_id"}[key])(vocab[key])
    if arch.startswith("gemma"):
        writer.add_add_space_prefix(False)  # llama.cpp's Gemma converters write this
    writer.add_chat_template(CHAT_TEMPLATE)
    if arch in ("gemma2", "gemma3"):  # what llama.cpp's Gemma converters add
        writer.add_sliding_window(config.sliding_window)
    if arch == "gemma2":
        writer.add_attn_logit_softcapping(config.attn_logit_softcapping)
        writer.add_final_logit_softcapping(config.final_logit_softcapping)
    for key, value in (extra or {}).items():
        writer.add_key_value(key, *value)
    for key in drop:
        del writer.kv_data[0][key]
    for hf_name, tensor in model.state_dict().items():
        stem, suffix = hf_name.rsplit(".", 1)
        name = f"{names.get_name(stem)}.{suffix}"
        if name in skip or (stem == "lm_head" and config.tie_word_embeddings):
            continue
        w = tensor.detach().float()
        if arch.startswith("gemma") and name.endswith("norm.weight"):
            w = w + 1  # llama.cpp stores Gemma's (1 + w) norm gains as w + 1
        if arch == "llama" and (".attn_q." in name or ".attn_k." in name):
            heads = config.num_attention_heads if ".attn_q." in name else config.num_key_value_heads
            w = llama_cpp_permute(w, heads)
        qtype = next((t for s, t in (types or {}).items() if name.endswith(s)), default) if w.ndim == 2 else "F32"
        data, kind = _encode(w.numpy(), qtype, rng)
        writer.add_tensor(name, data, raw_dtype=kind)
    for name, array in (extra_tensors or {}).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
