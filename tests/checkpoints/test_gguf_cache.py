"""The GGUF cache: the first load of a file writes its dequantized copy, every later load of the same
bytes reads that copy (no GGUF parsing, no dequantizing) and computes the same logits bit for bit."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

from gguf_files import byte_level_vocab, write_gguf  # noqa: E402

import anatomy  # noqa: E402
from anatomy.checkpoints import gguf_cache, resolver  # noqa: E402


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ANATOMY_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("ANATOMY_GGUF_CACHE", raising=False)
    monkeypatch.setattr(gguf_cache, "MIN_BYTES", 0)  # the tiny test file is cached too
    return tmp_path / "cache"


def tiny_gguf(path, seed: int = 0):
    vocab = byte_level_vocab()
    config = transformers.LlamaConfig(vocab_size=len(vocab["tokens"]), hidden_size=32, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                                      max_position_embeddings=64)
    torch.manual_seed(seed)
    return write_gguf(path, transformers.LlamaForCausalLM(config).eval(), arch="llama", vocab=vocab, default="Q8_0")


def logits(model):
    ids = torch.tensor([model.tokenizer.encode("The capital of France is")])
    with torch.no_grad():
        return model(ids).logits


def test_the_second_load_reads_the_cache_and_computes_the_same(cache, tmp_path, monkeypatch):
    path = tiny_gguf(tmp_path / "m.gguf")
    first = anatomy.from_pretrained(path)
    entry = gguf_cache.entry(path)
    assert (entry / "model.safetensors").is_file() and (entry / "tokenizer.json").is_file()

    def no_gguf(*args, **kwargs):
        raise AssertionError("the GGUF file was read again")

    monkeypatch.setattr(resolver, "load_gguf", no_gguf)
    monkeypatch.setattr(resolver, "gguf_tokenizer", no_gguf)
    second = anatomy.from_pretrained(path)
    assert torch.equal(logits(first), logits(second))
    assert second.tokenizer.encode("hello <|im_start|>") == first.tokenizer.encode("hello <|im_start|>")
    assert second.tokenizer.special_ids == first.tokenizer.special_ids
    assert second.tokenizer.chat_template == first.tokenizer.chat_template
    assert anatomy.load_tokenizer(path).encode("x y") == first.tokenizer.encode("x y")


def test_the_key_is_the_files_bytes(cache, tmp_path):
    a, b = tiny_gguf(tmp_path / "a.gguf", seed=0), tiny_gguf(tmp_path / "b.gguf", seed=1)
    assert gguf_cache.entry(a) != gguf_cache.entry(b)
    anatomy.from_pretrained(a)
    assert gguf_cache.lookup(a) is not None and gguf_cache.lookup(b) is None
    assert not torch.equal(logits(anatomy.from_pretrained(a)), logits(anatomy.from_pretrained(b)))


def test_the_cache_can_be_turned_off_and_keeps_only_float32(cache, tmp_path, monkeypatch):
    path = tiny_gguf(tmp_path / "m.gguf")
    anatomy.from_pretrained(path, dtype=torch.bfloat16)
    assert gguf_cache.lookup(path) is None  # a bfloat16 copy would change later float32 loads
    monkeypatch.setenv("ANATOMY_GGUF_CACHE", "0")
    anatomy.from_pretrained(path)
    assert not cache.exists() or not any(cache.rglob("model.safetensors"))
