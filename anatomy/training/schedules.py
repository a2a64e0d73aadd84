"""Learning-rate schedules, as multipliers of the optimizer's base learning rate.

Each is a pure function of the step (counting optimizer updates from 0), so a resumed run
continues on the same curve: `torch.optim.lr_scheduler.LambdaLR` stores only the step.
All but inverse-sqrt rise linearly from 0 to 1 over `warmup` steps, then:

    cosine    1 -> min_ratio along half a cosine, to max_steps (nanoGPT)
    linear    1 -> min_ratio along a straight line, to max_steps (BERT, with min_ratio 0)
    wsd       warmup-stable-decay: 1 until the last decay_fraction of the steps, then a straight
              line to min_ratio (Hu et al., 2024, MiniCPM; Hägele et al., 2024)
    constant  1
"""

from __future__ import annotations

import math
from functools import partial
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch loads with the trainer, not with `anatomy train --help`
    import torch

SCHEDULES = ("cosine", "linear", "wsd", "inverse-sqrt", "constant")


def _warmup(step: int, warmup: int) -> float | None:
    """The warm-up's ratio (step + 1) / (warmup + 1) while step < warmup, else None."""
    return (step + 1) / (warmup + 1) if step < warmup else None


def warmup_cosine(step: int, warmup: int, max_steps: int, min_ratio: float) -> float:
    """Linear warmup from 0 to 1 over `warmup` steps, then a cosine from 1 down to `min_ratio`
    at `max_steps` (nanoGPT's `get_lr`, as a ratio)."""
    if step < warmup:
        return _warmup(step, warmup)
    if step >= max_steps:
        return min_ratio
    progress = (step - warmup) / max(1, max_steps - warmup)
    return min_ratio + 0.5 * (1.0 + math.cos(math.pi * progress)) * (1.0 - min_ratio)


def warmup_stable_decay(step: int, warmup: int, max_steps: int, min_ratio: float, decay_steps: int) -> float:
    """Linear warmup over `warmup` steps, 1 until `max_steps - decay_steps`, then a straight line
    down to `min_ratio` at `max_steps`. With decay_steps = max_steps - warmup it is linear decay."""
    if step < warmup:
        return _warmup(step, warmup)
    start = max(warmup, max_steps - decay_steps)
    if step < start:
        return 1.0
    progress = min(1.0, (step - start) / max(1, max_steps - start))
    return 1.0 - progress * (1.0 - min_ratio)


def inverse_sqrt(step: int, d_model: int, warmup: int) -> float:
    """"Attention Is All You Need", section 5.3:

        lrate = d_model^-0.5 * min(step_num^-0.5, step_num * warmup_steps^-1.5)

    i.e. a linear rise for `warmup` steps, then decay with the inverse square root of the step.
    The paper counts from 1. With base lr 1.0 this *is* the learning rate."""
    n = step + 1
    return d_model ** -0.5 * min(n ** -0.5, n * warmup ** -1.5)


def make_scheduler(optimizer: torch.optim.Optimizer, name: str, *, warmup: int, max_steps: int,
                   min_ratio: float = 0.1, d_model: int | None = None,
                   decay_fraction: float = 0.2) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR for schedule `name` (one of SCHEDULES); `decay_fraction` is wsd's share of
    max_steps spent decaying. Raises ValueError for an unknown name."""
    if name == "cosine":
        fn = partial(warmup_cosine, warmup=warmup, max_steps=max_steps, min_ratio=min_ratio)
    elif name == "linear":
        fn = partial(warmup_stable_decay, warmup=warmup, max_steps=max_steps, min_ratio=min_ratio,
                     decay_steps=max_steps)
    elif name == "wsd":
        if not 0.0 < decay_fraction <= 1.0:
            raise ValueError(f"decay_fraction must be in (0, 1], not {decay_fraction}")
        fn = partial(warmup_stable_decay, warmup=warmup, max_steps=max_steps, min_ratio=min_ratio,
                     decay_steps=round(decay_fraction * max_steps))
    elif name == "inverse-sqrt":
        if d_model is None:
            raise ValueError("the inverse-sqrt schedule needs d_model")
        fn = partial(inverse_sqrt, d_model=d_model, warmup=max(1, warmup))
    elif name == "constant":
        fn = partial(warmup_cosine, warmup=warmup, max_steps=2**62, min_ratio=1.0)
    else:
        raise ValueError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
    import torch

    return torch.optim.lr_scheduler.LambdaLR(optimizer, fn)
