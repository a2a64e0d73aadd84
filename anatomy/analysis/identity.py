"""The identity line of an analysis page: whether the identity a result states holds, and by what rule.

A result states its identity and the measured difference (Result.check, Result.error); it holds when
that difference is within RELATIVE_TOLERANCE of the size of the values it compares, so that one rule
fits a toy's logits and a 49,152-token vocabulary's.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .result import Result

RELATIVE_TOLERANCE = 1e-4  # an identity holds when its difference is within this share of the values' size


def _identity_size(result: Result) -> float:
    """The size of what an identity compares, so that its tolerance scales with it."""
    values = result.values.detach().double()
    if result.kind == "decomposition" or result.kind == "direct logit attribution":
        values = values.sum(0)  # the final residual; the logits
    elif result.kind == "logit lens":
        values = values[-1]  # the model's own log-probabilities
    elif result.kind == "attention rollout":
        return 1.0  # rows that sum to 1
    finite = values[torch.isfinite(values)]
    return finite.abs().max().item() if finite.numel() else 1.0


def identity(result: Result) -> dict:
    """{"text", "status", "rule"}: status "holds" when the result's identity holds (its measured
    difference within RELATIVE_TOLERANCE of the compared values' size; integrated gradients: its own
    completeness tolerance), "fails" when it does not, "none" when the result has no identity."""
    text = result.check or "no identity to check"
    if "converged" in result.extra:  # integrated gradients judges its own completeness
        holds = bool(result.extra["converged"])
        return {"text": text, "status": "holds" if holds else "fails",
                "rule": "completeness within the analysis's tolerance" if holds else "completeness not reached"}
    if not math.isfinite(result.error):
        return {"text": text, "status": "none", "rule": "this result has no identity to check"}
    return identity_line(text, result.error, _identity_size(result))


def identity_line(text: str, error: float, size: float) -> dict:
    """{"text", "status", "rule"} of an identity measured to differ by `error` on values of largest
    magnitude `size`: it holds within RELATIVE_TOLERANCE of that size (at least of 1)."""
    tolerance = RELATIVE_TOLERANCE * max(1.0, size)
    status = "holds" if error <= tolerance else "fails"
    return {"text": text, "status": status,
            "rule": f"holds when the difference is within {tolerance:.1e} ({RELATIVE_TOLERANCE:g} of the values' size)"}
