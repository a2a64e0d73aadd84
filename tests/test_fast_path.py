"""Every fast path gives what the plain path gives.

The fast paths of the hot loop (see BENCHMARKS.md for what each one measured):
- Dropout skips its module call where it is the identity (evaluation, or p = 0);
- ...
Each is checked against the slow path it replaces, on every family, within 1e-5.
"""

import pytest
import torch
from torch import nn

import anatomy
from anatomy import ModelConfig, build_model
from anatomy.layers import Dropout

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
