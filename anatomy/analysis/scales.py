"""Numbers and colour scales for the analysis pages: values to six significant digits, and scales that
a heavy-tailed result does not wash out.

SmolLM2's first position writes 100x more than any other, so a scale set by the largest value would
leave every other cell white. A scale ends at the 98th percentile of |value| instead (the cells
beyond it are marked on the page), unless the largest is within 1.5x of it or there are few values.
"""

from __future__ import annotations

import math

import torch

ROBUST_QUANTILE = 0.98  # a colour scale ends here unless the largest value is within WASH_OUT of it
WASH_OUT = 1.5
ROBUST_FROM = 20  # fewer values than this: the scale ends at the largest (each cell is read on its own)


def rounded(value: float) -> float:
    """Six significant digits: more than any page or figure shows, and the same for a value and the
    end of its scale (so that the largest value is not marked beyond a scale it ends)."""
    return float(f"{value:.6g}")


def as_numbers(values: torch.Tensor) -> list:
    """A tensor as nested lists of floats to six significant digits (None where not finite: JSON has
    no NaN or infinity)."""
    array = values.detach().double().cpu()
    flat = [rounded(v) if math.isfinite(v) else None for v in array.reshape(-1).tolist()]
    for size in reversed(array.shape[1:]):
        flat = [flat[i:i + size] for i in range(0, len(flat), size)]
    return flat


def robust_limit(magnitudes: torch.Tensor) -> float:
    """Where a colour scale of non-negative `magnitudes` ends: the 98th percentile, or the largest
    value when that is within 1.5x of it (nothing to wash out) or there are fewer than 20 values;
    1 when there is nothing."""
    finite = magnitudes[torch.isfinite(magnitudes)].double().reshape(-1)
    if finite.numel() == 0 or finite.max() <= 0:
        return 1.0
    largest = finite.max().item()
    if finite.numel() < ROBUST_FROM:
        return rounded(largest)
    # "lower": a value of the data, never one interpolated towards the largest (on a small grid
    # the 98th percentile lies between the two largest values)
    percentile = torch.quantile(finite, ROBUST_QUANTILE, interpolation="lower").item()
    return rounded(largest if percentile <= 0 or largest <= WASH_OUT * percentile else percentile)


def diverging(values: torch.Tensor) -> dict:
    """A scale centred on zero, red below, blue above, ending at the robust limit of |values|."""
    return {"kind": "diverging", "limit": robust_limit(values.abs())}


def sequential(values: torch.Tensor, lo: float = 0.0) -> dict:
    """A scale from lo (white) to the robust limit above it (blue): norms, shares of a flow."""
    finite = values[torch.isfinite(values)]
    return {"kind": "sequential", "lo": lo, "hi": rounded(lo + robust_limit(finite - lo))}


def spanning(values: torch.Tensor) -> dict:
    """A scale from the smallest value (white) to the largest (blue): a metric of any sign (patching)."""
    finite = values[torch.isfinite(values)]
    if finite.numel() == 0:
        return {"kind": "sequential", "lo": 0.0, "hi": 1.0}
    low, high = rounded(finite.min().item()), rounded(finite.max().item())
    return {"kind": "sequential", "lo": low, "hi": high if high > low else low + 1.0}


__all__ = ["as_numbers", "diverging", "robust_limit", "rounded", "sequential", "spanning"]
