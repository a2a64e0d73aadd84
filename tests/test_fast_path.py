"""Every fast path gives what the plain path gives.

The fast paths of the hot loop (see BENCHMARKS.md for what each one measured):
- Dropout skips its module call where it is the identity (evaluation, or p = 0);
- DecoderModel.loss / LMHead.loss compute the LM head and the cross-entropy a chunk of positions
  at a time (chunked_cross_entropy), with their gradients, never holding all the logits;
- the LM head projects onto a large vocabulary a block of 1024 rows at a time on the CPU
  (vocabulary_logits): each logit the same dot product, equal to float32 rounding.
Each is checked against the plain path it replaces within 1e-5: outputs, losses and gradients.
"""

import pytest
import torch
from torch import nn

import anatomy
from anatomy import ModelConfig, build_model
import torch.nn.functional as F

from anatomy.layers import Dropout
from anatomy.losses import VOCABULARY_BLOCK, chunked_cross_entropy, vocabulary_logits

TINY = dict(vocab_size=23, d_model=16, n_heads=4, n_layers=2, d_ff=32, max_seq_len=32)
FAMILIES = ["encoder", "decoder", "encoder-decoder"]


def run(model, ids):
    if model.config.arch == "encoder-decoder":
        return model(ids, ids).logits
    return model(ids).logits


def ids(batch=2, length=7, seed=1):
    return torch.randint(0, TINY["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch", FAMILIES)
def test_evaluation_equals_training_with_dropout_zero(arch):
    """eval() skips every dropout call; train() with p = 0 goes through them: same logits."""
    config = ModelConfig(arch=arch, dropout=0.0, **TINY)
    model = build_model(config, seed=0)
    with torch.no_grad():
        trained = run(model.train(), ids())
        evaluated = run(model.eval(), ids())
    torch.testing.assert_close(evaluated, trained, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", FAMILIES)
def test_evaluation_ignores_dropout_rate(arch):
    """In evaluation a model with dropout 0.3 computes exactly what the same weights with 0 do."""
    with_dropout = build_model(ModelConfig(arch=arch, dropout=0.3, **TINY), seed=0).eval()
    without = build_model(ModelConfig(arch=arch, dropout=0.0, **TINY), seed=0).eval()
    with torch.no_grad():
        torch.testing.assert_close(run(with_dropout, ids()), run(without, ids()), atol=1e-5, rtol=1e-5)


def test_dropout_in_training_is_torch_dropout():
    """Where it does something, anatomy's Dropout is nn.Dropout: same mask from the same seed."""
    x = torch.randn(4, 8, 16)
    ours, theirs = Dropout(0.25).train(), nn.Dropout(0.25).train()
    torch.manual_seed(3)
    dropped = ours(x)
    torch.manual_seed(3)
    torch.testing.assert_close(dropped, theirs(x))
    assert (dropped == 0).any(), "p = 0.25 in training must zero some entries"
    assert ours.eval()(x) is x and Dropout(0.0).train()(x) is x


def test_training_with_dropout_differs_from_evaluation():
    """The fast path must not switch dropout off in training."""
    model = build_model(ModelConfig(arch="decoder", dropout=0.5, **TINY), seed=0)
    with torch.no_grad():
        torch.manual_seed(0)
        trained = run(model.train(), ids())
        evaluated = run(model.eval(), ids())
    assert not torch.allclose(trained, evaluated)


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("grad", [True, False])
def test_chunked_cross_entropy_equals_cross_entropy_of_the_logits(with_bias, grad):
    """Many chunks (3 rows each, the last one short), ignored rows included: same loss, same gradients."""
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(20, 8, generator=generator, requires_grad=True)
    weight = torch.randn(11, 8, generator=generator, requires_grad=True)
    bias = torch.randn(11, generator=generator, requires_grad=True) if with_bias else None
    targets = torch.randint(0, 11, (20,), generator=generator)
    targets[[0, 7, 19]] = -100
    leaves = [t for t in (hidden, weight, bias) if t is not None]
    expected = F.cross_entropy(F.linear(hidden, weight, bias), targets, ignore_index=-100)
    with torch.set_grad_enabled(grad):
        loss = chunked_cross_entropy(hidden, weight, bias, targets, chunk_bytes=3 * 11 * 4)
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-5)
    if grad:
        for ours, plain in zip(torch.autograd.grad(2.5 * loss, leaves), torch.autograd.grad(2.5 * expected, leaves)):
            torch.testing.assert_close(ours, plain, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("config", [dict(), dict(tie_embeddings=False, lm_head_bias=True)], ids=["tied", "untied"])
def test_decoder_loss_equals_cross_entropy_of_forward_logits(config):
    """Next-token targets, left padding ignored: the loss and every parameter's gradient match."""
    model = build_model(ModelConfig(arch="decoder", **TINY, **config), seed=0)
    batch = ids(3, 9)
    mask = torch.ones(3, 9, dtype=torch.bool)
    mask[0, :3] = False  # left padding
    targets = F.pad(batch[:, 1:], (0, 1), value=-100)
    targets = targets.masked_fill(~F.pad(mask[:, 1:] & mask[:, :-1], (0, 1), value=False), -100)
    logits = model(batch, padding_mask=mask).logits
    expected = F.cross_entropy(logits.reshape(-1, TINY["vocab_size"]), targets.reshape(-1))
    loss = model.loss(batch, padding_mask=mask)
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-5)
    params = list(model.parameters())
    for ours, plain in zip(torch.autograd.grad(loss, params), torch.autograd.grad(expected, params)):
        torch.testing.assert_close(ours, plain, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("shape", [(5,), (3, 7), (2, 3, 7)])
def test_vocabulary_blocks_equal_the_single_product(with_bias, shape, monkeypatch):
    """Block by block or in one product, every logit is the same dot product, for a vocabulary that
    is not a multiple of the block (the BLAS may pick another kernel for a small block: float32
    rounding, no more)."""
    vocab = 2 * VOCABULARY_BLOCK + 517
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(*shape, 48, generator=generator)
    weight = torch.randn(vocab, 48, generator=generator)
    bias = torch.randn(vocab, generator=generator) if with_bias else None
    products = []
    linear = F.linear
    monkeypatch.setattr(F, "linear", lambda *args: products.append(args[1].shape) or linear(*args))
    logits = vocabulary_logits(hidden, weight, bias)
    monkeypatch.undo()
    assert products == [(VOCABULARY_BLOCK, 48)] * 2 + [(517, 48)]  # three blocks, the last one short
    assert logits.shape == (*shape, vocab)
    torch.testing.assert_close(logits, F.linear(hidden, weight, bias), atol=1e-6, rtol=1e-6)


def test_vocabulary_logits_under_autocast_and_autograd():
    """Under autocast the dtype is the product's; under autograd the gradient flows as through F.linear."""
    vocab = 3 * VOCABULARY_BLOCK
    hidden, weight = torch.randn(4, 32), torch.randn(vocab, 32, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert vocabulary_logits(hidden, weight).dtype == F.linear(hidden, weight).dtype == torch.bfloat16
    vocabulary_logits(hidden, weight).square().sum().backward()
    expected = torch.autograd.grad(F.linear(hidden, weight).square().sum(), weight)[0]
    torch.testing.assert_close(weight.grad, expected, atol=0, rtol=0)


def test_a_large_vocabulary_models_logits_do_not_depend_on_grad_mode():
    """The decoder's logits are the same, to float32 rounding, whether autograd tracks the pass (one
    product) or not (vocabulary blocks)."""
    config = ModelConfig(arch="decoder", **{**TINY, "vocab_size": 2 * VOCABULARY_BLOCK + 3})
    model = build_model(config, seed=0).eval()
    tokens = torch.randint(0, config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    tracked = model(tokens).logits
    assert tracked.requires_grad
    with torch.no_grad():
        torch.testing.assert_close(model(tokens).logits, tracked.detach(), atol=1e-6, rtol=1e-6)


def test_a_hook_on_the_lm_heads_projection_sees_the_logits():
    """The blocked product runs inside lm_head.proj (an nn.Linear), so module hooks there still fire,
    as Captum's layer attributions and hand-written hooks expect."""
    config = ModelConfig(arch="decoder", **{**TINY, "vocab_size": 2 * VOCABULARY_BLOCK + 3})
    model = build_model(config, seed=0).eval()
    assert isinstance(model.lm_head.proj, nn.Linear)
    seen = []
    handle = model.lm_head.proj.register_forward_hook(lambda module, args, output: seen.append(output))
    try:
        with torch.no_grad():
            logits = model(ids()).logits
    finally:
        handle.remove()
    assert len(seen) == 1 and torch.equal(seen[0], logits)


hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(leading=st.lists(st.integers(0, 4), min_size=0, max_size=3), width=st.integers(1, 40),
       vocab=st.integers(2 * VOCABULARY_BLOCK + 1, 3 * VOCABULARY_BLOCK + 7), with_bias=st.booleans(),
       seed=st.integers(0, 2**16))
def test_vocabulary_logits_equal_f_linear_for_any_shape(leading, width, vocab, with_bias, seed):
    """Any leading shape (none, empty axes, one row), any width, any vocabulary past two blocks."""
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(*leading, width, generator=generator)
    weight = torch.randn(vocab, width, generator=generator)
    bias = torch.randn(vocab, generator=generator) if with_bias else None
    logits = vocabulary_logits(hidden, weight, bias)
    assert logits.shape == (*leading, vocab)
    torch.testing.assert_close(logits, F.linear(hidden, weight, bias), atol=1e-5, rtol=1e-5)
