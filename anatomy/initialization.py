"""How a model's weights start, and where their randomness comes from.

GPT-2's and BERT's initialisation: every matrix and embedding drawn from Normal(0, 0.02), every
bias zero, every norm's gain one (its constructor's). A seeded build draws from a generator of its
own, never from torch's global one: builds in parallel threads do not share one stream (where 51 of
80 seeded builds in 4 threads once differed from the same build made alone), and the caller's
global random state is left as it was.

Constructors draw too (nn.Linear's kaiming_uniform_, nn.Embedding's normal_, before the
initialisation above overwrites them): inside `drawing_from(generator)`, every torch.nn.init
initialiser of this thread draws from `generator`. It is a TorchFunctionMode, which torch keeps
per thread; torch.nn.init itself is never replaced. The values are the ones the global generator
gives after torch.manual_seed(seed): the same stream, in the same order.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

# torch.nn.init's in-place initialisers; the ones that draw take a `generator`.
INIT_FUNCTIONS = frozenset(getattr(nn.init, name) for name in (
    "uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
    "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_"))
RANDOM_INIT_FUNCTIONS = frozenset(getattr(nn.init, name) for name in (
    "uniform_", "normal_", "trunc_normal_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
    "kaiming_normal_", "orthogonal_", "sparse_"))
STD = 0.02  # GPT-2, BERT


class _FromGenerator(TorchFunctionMode):
    """torch.nn.init's random initialisers draw from `generator` (unless given one of their own)."""

    def __init__(self, generator: torch.Generator):
        super().__init__()
        self.generator = generator

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in RANDOM_INIT_FUNCTIONS and kwargs.get("generator") is None:
            kwargs = {**kwargs, "generator": self.generator}
        return func(*args, **kwargs)


@contextmanager
def drawing_from(generator: torch.Generator) -> Iterator[torch.Generator]:
    """Inside the block, this thread's torch.nn.init initialisers draw from `generator`; other
    threads, and torch's global generator, are not touched."""
    with _FromGenerator(generator):
        yield generator


def init_weights(model: nn.Module) -> None:
    """Normal(0, STD) for matrices and embeddings, zero biases; norms keep their constructors' gains."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=STD)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)


__all__ = ["INIT_FUNCTIONS", "RANDOM_INIT_FUNCTIONS", "STD", "drawing_from", "init_weights"]
