"""Checkpoint averaging: the final model as the mean of the last N checkpoints' weights.

"For the base models, we used a single model obtained by averaging the last 5 checkpoints"
(Vaswani et al., 2017, section 6.1):

    theta_avg = (1 / N) sum_{i=1..N} theta_i

Late in training the weights wander around a minimum along the directions the gradient noise
excites; their mean sits nearer its centre than any one of them (the idea behind Polyak averaging
and SWA). Only the weights are averaged: optimizer states and RNGs are not part of a model.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import torch
from safetensors.torch import load_model

from ..checkpoints.files import CheckpointError
from .checkpoint import verify_checkpoint

__all__ = ["average_checkpoints", "last_checkpoints"]


def last_checkpoints(run_dir: str | os.PathLike, count: int) -> list[Path]:
    """The run's `count` newest checkpoints whose manifests verify, oldest first.

    Raises CheckpointError when fewer than `count` verify, naming how many there are and why."""
    root = Path(run_dir) / "checkpoints"
    found = sorted(root.glob("step-*"), reverse=True) if root.is_dir() else []
    good = [path for path in found if path.is_dir() and verify_checkpoint(path) is None]
    if len(good) < count:
        raise CheckpointError(f"averaging the last {count} checkpoints needs {count} in {root}, and "
                              f"{len(good)} verify (of {len(found)}): keep more (--keep) or save more often "
                              "(--save-every)")
    return sorted(good[:count])


@torch.no_grad()
def average_checkpoints(model: torch.nn.Module, paths: list[Path]) -> None:
    """Load into `model` the element-wise mean of the weights saved in `paths` (each a checkpoint
    folder holding model.safetensors of this model's shape); the sum is kept in float64, so the
    mean does not depend on the order. Buffers that are not floating point are left as they are.
    Raises CheckpointError when `paths` is empty or a file does not hold this model's weights."""
    if not paths:
        raise CheckpointError("no checkpoints to average")
    scratch = copy.deepcopy(model)
    totals = {name: torch.zeros_like(value, dtype=torch.float64)
              for name, value in model.state_dict().items() if value.is_floating_point()}
    for path in paths:
        try:
            load_model(scratch, str(Path(path) / "model.safetensors"), strict=True)
        except (OSError, RuntimeError, ValueError, KeyError) as error:
            raise CheckpointError(f"{path}: not this model's weights ({' '.join(str(error).split())[:200]})") from None
        for name, value in scratch.state_dict().items():
            if name in totals:
                totals[name] += value.double()
    state = model.state_dict()
    for name, total in totals.items():
        state[name].copy_(total / len(paths))  # a tied weight is one tensor under two names: copied twice, same values
