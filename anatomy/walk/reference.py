"""The float64 reference implementation the walkthrough checks the model against.

Each function is the textbook definition, written out, computed in float64 with the module's own
weights; the walkthrough compares its result with the tensor the model traced in float32.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from ..layers import LayerNorm, RMSNorm
from .types import Check

# How the recomputation may differ from the model: float32 against float64 round-off.
RELATIVE_TOLERANCE = 1e-5


def f64(x: torch.Tensor) -> torch.Tensor:
    return x.detach().to("cpu", torch.float64)


# Outputs of a linear map computed this many at a time: an LM head's 49,152 rows in float64 would be
# a 226 MB copy of the weight; a block of rows is converted, used and dropped.
LINEAR_BLOCK = 4096


def linear(x: torch.Tensor, module: nn.Linear, rows: slice | None = None) -> torch.Tensor:
    """y = x W^T + b with the module's weights (rows of W: one head's slice of the output)."""
    weight = module.weight.detach()
    bias = module.bias.detach() if module.bias is not None else None
    if rows is not None:
        weight = weight[rows]
        bias = bias[rows] if bias is not None else None
    y = torch.cat([x @ f64(weight[i:i + LINEAR_BLOCK]).T for i in range(0, weight.size(0), LINEAR_BLOCK)], dim=-1)
    return y + f64(bias) if bias is not None else y


def gain(module: nn.Module) -> torch.Tensor:
    """A norm's γ: its weight, or 1 + weight for a Gemma-style RMSNorm (plus_one)."""
    weight = f64(module.weight)
    return 1.0 + weight if getattr(module, "plus_one", False) else weight


def norm(x: torch.Tensor, module: nn.Module) -> torch.Tensor:
    """LayerNorm or RMSNorm over the last axis, from the definition and the module's weights.

        LayerNorm(x) = (x − mean(x)) / √(var(x) + ε) · γ + β     (biased variance)
        RMSNorm(x)   = x / √(mean(x²) + ε) · γ
    """
    if isinstance(module, LayerNorm):
        mean = x.mean(dim=-1, keepdim=True)
        var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + module.eps) * gain(module) + f64(module.bias)
    if isinstance(module, RMSNorm):
        return x / torch.sqrt((x ** 2).mean(dim=-1, keepdim=True) + module.eps) * gain(module)
    raise TypeError(f"unknown norm module {type(module).__name__}")


def softmax(scores: torch.Tensor, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """Row-wise exp(s − max) / Σ exp(s − max); blocked entries (allowed False) get weight 0,
    and a row with nothing allowed is all zeros."""
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    top = scores.max(dim=-1, keepdim=True).values.clamp(min=-1e300)
    e = torch.exp(scores - top)
    total = e.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, e / total.clamp(min=1e-300), torch.zeros_like(e))


def softcap(scores: torch.Tensor, cap: float | None) -> torch.Tensor:
    """c · tanh(s / c): scores bounded to (−c, c) (Gemma 2); the identity when cap is None."""
    return scores if cap is None else cap * torch.tanh(scores / cap)


def _gelu(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


# activation name -> (the function in float64, its equation, its name)
ACTIVATIONS: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], str, str]] = {
    "relu": (lambda x: x.clamp(min=0.0), "max(0, x)", "ReLU"),
    "gelu": (_gelu, "x·Φ(x)", "GELU"),
    "gelu_tanh": (_gelu_tanh, "½x(1 + tanh(√(2/π)(x + 0.044715x³)))", "GELU"),
    "silu": (lambda x: x * torch.sigmoid(x), "x·σ(x)", "SiLU"),
    "swiglu": (lambda x: x * torch.sigmoid(x), "x·σ(x)", "SiLU"),
    "geglu": (_gelu, "x·Φ(x)", "GELU"),
    "geglu_tanh": (_gelu_tanh, "½x(1 + tanh(√(2/π)(x + 0.044715x³)))", "GELU"),
}


def activation(name: str) -> tuple[Callable[[torch.Tensor], torch.Tensor], str, str]:
    """(function, equation, display name) of a config's activation; ValueError names the known ones."""
    if name not in ACTIVATIONS:
        raise ValueError(f"the walkthrough has no float64 reference for activation {name!r}; "
                         f"it knows {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def compare(recomputed: str, against: str, mine: torch.Tensor, theirs: torch.Tensor,
            tolerance: float | None = None) -> Check:
    """A Check of `mine` against `theirs`: max |diff| within RELATIVE_TOLERANCE × max(1, max |theirs|)
    unless `tolerance` is given. A shape mismatch or a NaN on either side fails, and says so."""
    mine, theirs = f64(mine), f64(theirs)
    if mine.shape != theirs.shape:
        return Check(f"{recomputed} (shape {tuple(mine.shape)})", f"{against} (shape {tuple(theirs.shape)})",
                     float("inf"), 0.0)
    if not mine.numel():
        return Check(recomputed, against, 0.0, tolerance or 0.0)
    diff = float((mine - theirs).abs().max())
    if bool(mine.isnan().any() | theirs.isnan().any()):
        diff = float("nan")
    scale = float(theirs.abs().nan_to_num(0.0, 0.0, 0.0).max())
    return Check(recomputed, against, diff, tolerance if tolerance is not None else RELATIVE_TOLERANCE * max(1.0, scale))
