"""One LM loss: the chunked loss that `anatomy train` runs is F.cross_entropy, smoothing and padding included.

The trainer calls DecoderModel.loss / EncoderDecoderModel.loss, which go through LMHead.loss and
chunked_cross_entropy; each is checked here against F.cross_entropy of the full logits: the loss and
every gradient, with label smoothing, ignored positions and both reductions.
"""

import pytest
import torch
import torch.nn.functional as F

from anatomy import ModelConfig, build_model
from anatomy.losses import chunked_cross_entropy

TINY = dict(vocab_size=99, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_seq_len=32)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1, 1.0])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("softcap", [None, 2.0])
def test_chunked_loss_with_label_smoothing_equals_cross_entropy_of_the_logits(smoothing, reduction, with_bias, softcap):
    """Chunks of 3 rows (the last one short) and ignored rows: same loss and same gradients."""
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(20, 8, generator=generator, requires_grad=True)
    weight = torch.randn(11, 8, generator=generator, requires_grad=True)
    bias = torch.randn(11, generator=generator, requires_grad=True) if with_bias else None
    targets = torch.randint(0, 11, (20,), generator=generator)
    targets[[0, 7, 19]] = -1  # a custom ignore_index
    leaves = [t for t in (hidden, weight, bias) if t is not None]
    logits = F.linear(hidden, weight, bias)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)  # Gemma 2's final soft-cap
    expected = F.cross_entropy(logits, targets, ignore_index=-1, label_smoothing=smoothing, reduction=reduction)
    loss = chunked_cross_entropy(hidden, weight, bias, targets, ignore_index=-1, label_smoothing=smoothing,
                                 reduction=reduction, softcap=softcap, chunk_bytes=3 * 11 * 4)
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-5)
    for ours, plain in zip(torch.autograd.grad(0.7 * loss, leaves), torch.autograd.grad(0.7 * expected, leaves)):
        torch.testing.assert_close(ours, plain, atol=1e-5, rtol=1e-5)
    with torch.no_grad():  # evaluation takes the loss-only path
        evaluated = chunked_cross_entropy(hidden, weight, bias, targets, ignore_index=-1, label_smoothing=smoothing,
                                          reduction=reduction, softcap=softcap, chunk_bytes=3 * 11 * 4)
    torch.testing.assert_close(evaluated, expected.detach(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("extra", [{}, dict(final_logit_softcap=3.0)], ids=["plain", "softcap"])
def test_decoder_loss_with_label_smoothing_equals_cross_entropy_of_forward(extra):
    model = build_model(ModelConfig(arch="decoder", **TINY, **extra), seed=0)
    ids = torch.randint(4, 99, (3, 9), generator=torch.Generator().manual_seed(1))
    targets = F.pad(ids[:, 1:], (0, 1), value=-100)
    expected = F.cross_entropy(model(ids).logits.flatten(0, 1), targets.flatten(), label_smoothing=0.1,
                               reduction="sum")
    loss = model.loss(ids, label_smoothing=0.1, reduction="sum")
    torch.testing.assert_close(loss, expected, atol=1e-4, rtol=1e-5)
    params = list(model.parameters())
    for ours, plain in zip(torch.autograd.grad(loss, params), torch.autograd.grad(expected, params)):
        torch.testing.assert_close(ours, plain, atol=1e-5, rtol=1e-5)


def test_seq2seq_loss_equals_cross_entropy_of_forward_with_padding():
    model = build_model(ModelConfig(arch="encoder-decoder", pad_token_id=0, **TINY), seed=0)
    generator = torch.Generator().manual_seed(2)
    src, tgt = torch.randint(4, 99, (2, 7), generator=generator), torch.randint(4, 99, (2, 5), generator=generator)
    src_mask, tgt_mask = torch.ones(2, 7, dtype=torch.bool), torch.ones(2, 5, dtype=torch.bool)
    src_mask[1, 5:], tgt_mask[1, 3:] = False, False  # right padding
    targets = torch.randint(4, 99, (2, 5), generator=generator).masked_fill(~tgt_mask, -100)
    logits = model(src, tgt, src_padding_mask=src_mask, tgt_padding_mask=tgt_mask).logits
    expected = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), label_smoothing=0.1)
    loss = model.loss(src, tgt, targets, src_padding_mask=src_mask, tgt_padding_mask=tgt_mask, label_smoothing=0.1)
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-5)
    params = list(model.parameters())
    for ours, plain in zip(torch.autograd.grad(loss, params), torch.autograd.grad(expected, params)):
        torch.testing.assert_close(ours, plain, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("bad", [dict(label_smoothing=1.5), dict(label_smoothing=-0.1), dict(reduction="none")])
def test_bad_loss_arguments_are_named(bad):
    model = build_model(ModelConfig(arch="decoder", **TINY), seed=0)
    with pytest.raises(ValueError, match=next(iter(bad))):
        model.loss(torch.randint(4, 99, (1, 5)), **bad)
