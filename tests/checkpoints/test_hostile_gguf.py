"""Hostile GGUF files: each malformed header, metadata value or tensor offset is refused with one
CheckpointError, before any weight is dequantized (the section of issue 22 on GGUF)."""

from __future__ import annotations

import struct

import pytest
import torch
from bounds import refused
from checkpoint_cases import randomise

import anatomy


@pytest.fixture(scope="module")
def gguf_models():
    """Tiny random transformers decoders to write as GGUF files (hidden 32, 2 layers), by llama.cpp
    architecture, with the byte-level vocabulary their files carry."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    from gguf_files import byte_level_vocab

    vocab = byte_level_vocab()
    common = dict(vocab_size=len(vocab["tokens"]), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64)
    configs = {
        "llama": ("LlamaForCausalLM", transformers.LlamaConfig(**common)),
        "gemma2": ("Gemma2ForCausalLM", transformers.Gemma2Config(**common, head_dim=8, sliding_window=4)),
        "gemma3": ("Gemma3ForCausalLM", transformers.Gemma3TextConfig(**common, head_dim=8, sliding_window=4)),
        "phi3": ("Phi3ForCausalLM", transformers.Phi3Config(**common, pad_token_id=0)),
    }
    models = {}
    for arch, (class_name, config) in configs.items():
        torch.manual_seed(0)
        models[arch] = getattr(transformers, class_name)(config).eval()
        randomise(models[arch])
    return models, vocab


def gguf_file(gguf_models, tmp_path, arch="llama", extra=None, drop=(), vocab_change=None):
    """A tiny GGUF file of `arch`, its metadata changed: extra = {key: (value, type name)}."""
    import gguf
    from gguf_files import write_gguf

    models, vocab = gguf_models
    vocab = dict(vocab, **(vocab_change or {}))
    kinds = {key: (value, getattr(gguf.GGUFValueType, kind)) for key, (value, kind) in (extra or {}).items()}
    return write_gguf(tmp_path / f"{arch}.gguf", models[arch], arch=arch, vocab=vocab, extra=kinds, drop=drop)


def _patch_bytes(path, position: int, value: bytes) -> None:
    data = bytearray(path.read_bytes())
    data[position:position + len(value)] = value
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_gguf_block_count_two_to_the_31_with_a_sliding_window(gguf_models, tmp_path, arch):
    # a 2**31-item layer_types list (5 GB, then MemoryError) before
    path = gguf_file(gguf_models, tmp_path, arch, extra={f"{arch}.block_count": (2**31, "UINT32")})
    refused(lambda: anatomy.from_pretrained(path), rf"{arch}.block_count = 2147483648, but holds \d+ tensors")


def test_gguf_array_of_arrays(gguf_models, tmp_path):
    path = gguf_file(gguf_models, tmp_path, extra={"x.nested": ([[1, 2], [3, 4]], "ARRAY")})
    refused(lambda: anatomy.from_pretrained(path), r"truncated or corrupt: .*an array of arrays")


def test_gguf_array_longer_than_the_file(gguf_models, tmp_path):
    # the reader appended an empty read per item past the end of the file, growing to the cap
    path = gguf_file(gguf_models, tmp_path, extra={"x.items": ([1, 2], "ARRAY")})
    at = path.read_bytes().index(b"x.items") + len(b"x.items") + 8  # after the value type and item type
    _patch_bytes(path, at, struct.pack("<Q", 2**40))
    refused(lambda: anatomy.from_pretrained(path), r"claims 1099511627776 items, more than the rest of the file holds")


def test_gguf_tensor_offset_that_wraps_around_to_the_header(gguf_models, tmp_path):
    """An offset of 2**64 - k: start + offset wrapped in 64 bits to byte 0, passed the truncation
    check, and the file's header and metadata loaded as the embedding matrix."""
    import gguf

    path = gguf_file(gguf_models, tmp_path)
    reader = gguf.GGUFReader(path)
    tensor = next(t for t in reader.tensors if t.name == "token_embd.weight")
    at = tensor.field.offset + sum(int(part.nbytes) for part in tensor.field.parts[:-1])
    start = reader.data_offset
    del reader, tensor
    _patch_bytes(path, at, struct.pack("<Q", 2**64 - start))
    refused(lambda: anatomy.from_pretrained(path),  # 2**64 plus the tensor's size
            r"truncated or corrupt: tensor 'token_embd.weight' needs bytes up to 1844674407370\d{7}, the file has")


def test_gguf_token_types_as_strings(gguf_models, tmp_path):
    # loaded silently, with no special tokens, before
    path = gguf_file(gguf_models, tmp_path, vocab_change={"types": [str(t) for t in gguf_models[1]["types"]]})
    refused(lambda: anatomy.from_pretrained(path), r"tokenizer.ggml.token_type\[0\] = '\d'; it must be an integer")


N_TOKENS = 320  # byte_level_vocab()'s size
BAD_METADATA = {  # the eleven of the issue, and more of the same kinds
    "block_count-float": ({"llama.block_count": (2.0, "FLOAT32")}, r"llama.block_count = 2.0; it must be an integer"),
    "block_count-string": ({"llama.block_count": ("2", "STRING")}, r"llama.block_count = '2'; it must be an integer"),
    "head_count-0": ({"llama.attention.head_count": (0, "UINT32")}, r"head_count = 0; it must be an integer >= 1"),
    "head_count-100": ({"llama.attention.head_count": (100, "UINT32")}, r"q_proj.weight: checkpoint has \[32, 32\]"),
    "tokens-ints": ({"tokenizer.ggml.tokens": (list(range(N_TOKENS)), "ARRAY")}, r"tokens\[0\] = 0; .* a string"),
    "merges-ints": ({"tokenizer.ggml.merges": ([1, 2], "ARRAY")}, r"merges\[0\] = 1; it must be a string"),
    "merges-no-space": ({"tokenizer.ggml.merges": (["abc"], "ARRAY")}, r"merges\[0\] = 'abc'"),
    "merges-unknown": ({"tokenizer.ggml.merges": (["zz qq"], "ARRAY")}, r"tokenizer that cannot be built"),
    "scores-strings": ({"tokenizer.ggml.scores": (["x"] * N_TOKENS, "ARRAY")}, r"scores\[0\] = 'x'; it must be a num"),
    "scores-count": ({"tokenizer.ggml.scores": ([0.5] * 3, "ARRAY")}, r"gives 3 tokenizer.ggml.scores for 320 tokens"),
    "unknown-id-string": ({"tokenizer.ggml.unknown_token_id": ("zero", "STRING")}, r"unknown_token_id = 'zero'"),
    "bos-id-float": ({"tokenizer.ggml.bos_token_id": (1.5, "FLOAT32")}, r"bos_token_id = 1.5; it must be a token id"),
    "context_length-string": ({"llama.context_length": ("64", "STRING")}, r"context_length = '64'"),
    "embedding_length-float": ({"llama.embedding_length": (32.5, "FLOAT32")}, r"embedding_length = 32.5"),
    "feed_forward-per-layer": ({"llama.feed_forward_length": ([64, 64], "ARRAY")}, r"\(one for every layer\)"),
    "rms-eps-string": ({"llama.attention.layer_norm_rms_epsilon": ("tiny", "STRING")}, r"epsilon = 'tiny'; .* number"),
    "rms-eps-nan": ({"llama.attention.layer_norm_rms_epsilon": (float("nan"), "FLOAT32")}, r"rms_norm_eps = nan"),
    "chat_template-int": ({"tokenizer.chat_template": (5, "UINT32")}, r"chat_template = 5; it must be a string"),
    "add_bos-string": ({"tokenizer.ggml.add_bos_token": ("yes", "STRING")}, r"add_bos_token = 'yes'; .* boolean"),
    "model-int": ({"tokenizer.ggml.model": (1, "UINT32")}, r"tokenizer.ggml.model = 1; it must be a string"),
    "architecture-int": ({"general.architecture": (7, "UINT32")}, r"holds a 7 model; anatomy reads"),
}


@pytest.mark.parametrize("case", list(BAD_METADATA))
def test_gguf_malformed_metadata(gguf_models, tmp_path, case):
    # TypeError, ZeroDivisionError, AttributeError or a bare Exception before; some loaded silently
    extra, match = BAD_METADATA[case]
    refused(lambda: anatomy.from_pretrained(gguf_file(gguf_models, tmp_path, extra=extra)), match)


@pytest.mark.parametrize("arch", ["llama", "phi3"])
def test_gguf_heads_wider_than_the_model_without_a_head_width(gguf_models, tmp_path, arch):
    # no key_length (nor, for llama, a rotary width that gives it): head width = 32 // 100 = 0,
    # which phi3's partial rotary factor divided by (ZeroDivisionError before)
    widths = ("attention.key_length", "attention.value_length") + (("rope.dimension_count",) if arch == "llama" else ())
    path = gguf_file(gguf_models, tmp_path, arch, extra={f"{arch}.attention.head_count": (100, "UINT32")},
                     drop=tuple(f"{arch}.{key}" for key in widths))
    refused(lambda: anatomy.from_pretrained(path), r"cannot build: .*d_head must be a positive integer, got 0")


def test_gguf_tokenizer_is_checked_before_any_weight_is_dequantized(gguf_models, tmp_path, monkeypatch):
    from anatomy.checkpoints import gguf as gguf_module

    def dequantize(*args, **kwargs):
        raise AssertionError("a weight was dequantized before the tokenizer was checked")

    monkeypatch.setattr(gguf_module.GgufWeights, "get", dequantize)
    path = gguf_file(gguf_models, tmp_path, extra={"tokenizer.ggml.scores": (["x"] * N_TOKENS, "ARRAY")})
    refused(lambda: anatomy.from_pretrained(path), r"scores\[0\] = 'x'")
    refused(lambda: anatomy.from_pretrained(path, tokenizer=False), r"scores\[0\] = 'x'")


