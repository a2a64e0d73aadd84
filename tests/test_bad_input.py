"""Bad input gets a clear error, naming the problem and what is allowed, before any computation."""

import pytest
import torch

import anatomy
from anatomy import ConfigError, InputError, ModelConfig, build_model


def small(arch="decoder", **overrides):
    return build_model(ModelConfig(arch=arch, vocab_size=10, d_model=8, n_heads=2, n_layers=1, d_ff=16,
                                   max_seq_len=6, **overrides))


@pytest.mark.parametrize("ids, message", [
    (torch.tensor([[1, 2, 10]]), r"id 10, outside \[0, vocab_size=10\)"),
    (torch.tensor([[1, -1, 2]]), r"negative id -1"),
    (torch.tensor([[1.0, 2.0]]), r"integer token ids .* got dtype torch.float32"),
    *[(torch.tensor([[1, 2]], dtype=dtype), rf"dtype torch.long \(or torch.int32\), got dtype {dtype}")
      for dtype in (torch.uint8, torch.int8, torch.int16, torch.uint16, torch.uint32, torch.uint64, torch.bool)],
    (torch.tensor([1, 2, 3]), r"shape \[batch, seq_len\], got shape \(3,\)"),
    (torch.zeros(0, 3, dtype=torch.long), r"empty"),
    (torch.zeros(1, 7, dtype=torch.long), r"at most max_seq_len=6"),
    ([[1, 2, 3]], r"must be a torch.Tensor"),
])
def test_bad_ids(ids, message):
    with pytest.raises(InputError, match=message):
        small()(ids)


@pytest.mark.parametrize("dtype", [torch.long, torch.int32])
def test_ids_of_either_index_dtype_give_the_same_logits(dtype):
    model, ids = small().eval(), torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert torch.equal(model(ids.to(dtype)).logits, model(ids).logits)


def test_bad_masks_are_never_broadcast():
    model = small()
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    with pytest.raises(InputError, match=r"shape \(1, 3\) but must be \(2, 3\)"):
        model(ids, padding_mask=torch.ones(1, 3, dtype=torch.bool))
    with pytest.raises(InputError, match=r"dtype torch.bool .* got torch.int64"):
        model(ids, padding_mask=torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(InputError, match=r"shape \(2, 1, 3\)"):
        model(ids, padding_mask=torch.ones(2, 1, 3, dtype=torch.bool))


def test_encoder_decoder_checks_both_sides():
    model = small("encoder-decoder")
    src, tgt = torch.tensor([[1, 2, 3]]), torch.tensor([[1, 2]])
    with pytest.raises(InputError, match="src_ids"):
        model(src + 20, tgt)
    with pytest.raises(InputError, match="tgt_padding_mask"):
        model(src, tgt, tgt_padding_mask=torch.ones(1, 3, dtype=torch.bool))


def test_token_types_need_a_token_type_table():
    with pytest.raises(InputError, match="type_vocab_size=0"):
        small("encoder")(torch.tensor([[1, 2]]), token_type_ids=torch.tensor([[0, 1]]))
    model = small("encoder", type_vocab_size=2)
    with pytest.raises(InputError, match=r"id 2, outside \[0, vocab_size=2\)"):
        model(torch.tensor([[1, 2]]), token_type_ids=torch.tensor([[0, 2]]))


@pytest.mark.parametrize("fields, message", [
    (dict(d_model=10, n_heads=3), "d_model=10 is not divisible by n_heads=3"),
    (dict(arch="bidirectional"), "arch='bidirectional' is not supported; allowed values: 'encoder', 'decoder', 'encoder-decoder'"),
    (dict(norm="batchnorm"), "allowed values: 'layernorm', 'rmsnorm'"),
    (dict(norm_position="middle"), "allowed values: 'pre', 'post'"),
    (dict(activation="tanh"), "activation='tanh' is not supported"),
    (dict(attn_impl="flash"), "allowed values: 'sdpa', 'eager'"),
    (dict(pos_encoding="absolute"), "'sinusoidal', 'learned', 'rotary', 'alibi', 'relative', 'none'"),
    (dict(n_heads=4, n_kv_heads=3), "multiple of n_kv_heads=3"),
    (dict(vocab_size=0), "vocab_size must be a positive integer"),
    (dict(dropout=1.5), r"dropout must be in \[0, 1\)"),
    (dict(arch="decoder", head="sequence-classification"), "head \\(for arch='decoder'\\)"),
])
def test_bad_config_values(fields, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig(**fields)


def test_unknown_config_fields_and_presets():
    with pytest.raises(ConfigError, match=r"unknown config fields \['hidden_size'\]"):
        ModelConfig.from_dict({"hidden_size": 8})
    with pytest.raises(ConfigError, match="available: bert-base"):
        anatomy.preset("gpt-5")


def test_cache_overflow_is_reported():
    model = small()
    cache = model.new_cache(capacity=4)
    model(torch.tensor([[1, 2, 3]]), cache=cache)
    with pytest.raises(anatomy.CacheFullError, match="holds 4 positions; 3 are used and 2 more"):
        model(torch.tensor([[1, 2]]), cache=cache)
