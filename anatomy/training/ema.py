"""An exponential moving average (EMA) of the weights: the final model as a running mean of the
weights along the whole trajectory, not of a few saved checkpoints (averaging.py).

After every optimizer step t = 1, 2, ... (Polyak & Juditsky, 1992; TensorFlow's
ExponentialMovingAverage with num_updates):

    d_t = min(decay, (1 + t) / (10 + t))
    theta_ema <- d_t theta_ema + (1 - d_t) theta        theta_ema = theta_0 before the first step

A weight seen k steps ago counts with d^k: the mean spans about 1 / (1 - decay) steps (1000 for
0.999). The warm-up d_t keeps the random initial weights from lingering in a short run. Buffers
that are not parameters (rotary tables, masks) are not averaged: the model's own are used.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["WeightAverage"]


class WeightAverage:
    """The EMA of `model`'s parameters (float32, on the model's device); `update()` after each step."""

    def __init__(self, model: nn.Module, decay: float):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"the EMA decay must be strictly between 0 and 1, not {decay}")
        self.model, self.decay, self.updates = model, decay, 0
        self.params = [p for p in model.parameters()]  # parameters() yields a tied weight once
        self.average = [p.detach().float().clone() for p in self.params]

    @torch.no_grad()
    def update(self) -> None:
        self.updates += 1
        d = min(self.decay, (1 + self.updates) / (10 + self.updates))
        torch._foreach_lerp_(self.average, [p.detach().float() for p in self.params], 1.0 - d)

    @torch.no_grad()
    def copy_to_model(self) -> None:
        """The model's weights become the average (for good: the end of training)."""
        for p, average in zip(self.params, self.average):
            p.copy_(average)

