"""The KV cache: decoding with it gives the logits of the full pass, position by position."""

import pytest
import torch

import anatomy
from anatomy import CacheFullError, KVCache, ModelConfig

TINY = dict(vocab_size=23, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_seq_len=24)
POSITIONS = ("learned", "sinusoidal", "rotary", "alibi", "none")


def decoder(**changes):
    return anatomy.build_model(ModelConfig(arch="decoder", **{**TINY, **changes}), seed=0).eval()


def seq2seq(**changes):
    return anatomy.build_model(ModelConfig(arch="encoder-decoder", **{**TINY, **changes}), seed=0).eval()


def ids(batch, length, seed=1):
    return torch.randint(0, TINY["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(seed))


def chunked_logits(forward, tokens, chunks):
    """Run `tokens` [B, T] through `forward(chunk, end)` in pieces of the given sizes; concat the logits."""
    out, end = [], 0
    for size in chunks:
        out.append(forward(tokens[:, end:end + size], end + size))
        end += size
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("pos", POSITIONS)
@pytest.mark.parametrize("chunks", [(1,) * 6, (3, 1, 2)], ids=["token-by-token", "chunked-3-1-2"])
def test_decoder_cache_equals_full_pass(pos, chunks):
    model = decoder(pos_encoding=pos)
    tokens = ids(2, 6)
    with torch.no_grad():
        full = model(tokens).logits  # (B, T, V)
        cache = model.new_cache()
        stepped = chunked_logits(lambda chunk, end: model(chunk, cache=cache).logits, tokens, chunks)
    assert cache.length == 6
    torch.testing.assert_close(stepped, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("changes", [dict(n_kv_heads=2, pos_encoding="rotary"), dict(n_kv_heads=1),
                                     dict(attn_impl="eager", norm_position="post"),
                                     dict(norm="rmsnorm", activation="swiglu", pos_encoding="rotary")],
                         ids=["gqa-rotary", "mqa", "eager-postnorm", "llama-like"])
def test_decoder_cache_variants(changes):
    model = decoder(**changes)
    tokens = ids(2, 6)
    with torch.no_grad():
        full = model(tokens).logits
        cache = model.new_cache()
        stepped = chunked_logits(lambda chunk, end: model(chunk, cache=cache).logits, tokens, (3, 1, 2))
    torch.testing.assert_close(stepped, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pos", POSITIONS)
def test_decoder_cache_with_padding_mask(pos):
    """Left padding, [B, past + T] masks at every step, position ids counting real tokens."""
    model = decoder(pos_encoding=pos)
    tokens = ids(2, 6)
    mask = torch.tensor([[False, False, True, True, True, True], [True] * 6])
    positions = (mask.long().cumsum(1) - 1).clamp(min=0)
    position_ids = None if pos in ("alibi", "none") else positions  # ALiBi: column distance = token distance
    with torch.no_grad():
        full = model(tokens, padding_mask=mask, position_ids=position_ids).logits
        cache = model.new_cache()

        def step(chunk, end):
            start = end - chunk.size(1)
            pos_ids = None if position_ids is None else position_ids[:, start:end]
            return model(chunk, padding_mask=mask[:, :end], position_ids=pos_ids, cache=cache).logits

        stepped = chunked_logits(step, tokens, (3, 1, 2))
        alone = model(tokens[:1, 2:]).logits  # row 0 without its padding
    real = mask[:, :, None].expand_as(full)
    torch.testing.assert_close(stepped[real], full[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(full[0, 2:], alone[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pos", ("sinusoidal", "learned", "rotary", "alibi"))
@pytest.mark.parametrize("chunks", [(1,) * 5, (3, 1, 1)], ids=["token-by-token", "chunked"])
def test_encoder_decoder_cache_equals_full_pass(pos, chunks):
    model = seq2seq(pos_encoding=pos, n_kv_heads=2)
    src, tgt = ids(2, 7, seed=2), ids(2, 5, seed=3)
    src_mask = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])  # the second source is shorter
    with torch.no_grad():
        full = model(src, tgt, src_padding_mask=src_mask).logits
        memory = model.encode(src, src_mask)
        cache = model.new_cache()
        stepped = chunked_logits(
            lambda chunk, end: model(None, chunk, src_padding_mask=src_mask, cache=cache, memory=memory).logits,
            tgt, chunks)
    torch.testing.assert_close(stepped, full, atol=1e-5, rtol=1e-5)


def test_cache_overflow_raises():
    model = decoder()
    cache = model.new_cache(capacity=4)
    with torch.no_grad():
        model(ids(1, 3), cache=cache)
        model(ids(1, 1), cache=cache)
        with pytest.raises(CacheFullError, match="holds 4 positions"):
            model(ids(1, 1), cache=cache)


def test_cache_append_and_reorder_keep_the_right_rows():
    cache = KVCache(n_layers=1, capacity=5)
    # row b, position t holds the value 10 b + t in every entry
    values = (10 * torch.arange(3)[:, None] + torch.arange(2)[None, :]).float()  # (B, T)
    kv = values[:, None, :, None].expand(3, 2, 2, 4)  # (B, K, T, D)
    keys, vals = cache.append(0, kv, kv + 0.5)
    cache.advance()
    assert cache.length == 2 and keys.shape == (3, 2, 2, 4)
    cache.reorder(torch.tensor([2, 2, 0]))
    new = torch.full((3, 2, 1, 4), 99.0)
    keys, vals = cache.append(0, new, new)
    cache.advance()
    assert keys.shape == (3, 2, 3, 4)
    assert keys[:, 0, :2, 0].tolist() == [[20, 21], [20, 21], [0, 1]]
    assert vals[:, 0, :2, 0].tolist() == [[20.5, 21.5], [20.5, 21.5], [0.5, 1.5]]
    assert (keys[:, :, 2] == 99).all()


def test_reorder_in_a_model_equals_running_the_chosen_rows():
    """After reorder, continuing with the cache is the same as having run the chosen rows."""
    model = decoder(pos_encoding="rotary")
    tokens = ids(3, 5)
    rows = torch.tensor([1, 1, 2])
    with torch.no_grad():
        cache = model.new_cache()
        model(tokens[:, :4], cache=cache)
        cache.reorder(rows)
        stepped = model(tokens[rows, 4:], cache=cache).logits[:, -1]
        full = model(tokens[rows]).logits[:, -1]
    torch.testing.assert_close(stepped, full, atol=1e-5, rtol=1e-5)
