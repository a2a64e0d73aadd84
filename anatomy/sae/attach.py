"""Interventions on features: the functions to give `anatomy.trace(..., interventions=...)`.

Shape letters: N leading axes (batch, pos), F features, O the width the SAE writes.

An SAE attached to a pass (`anatomy.trace(model, saes={point: sae})`) writes its point back as
x^' + e, the reconstruction of the (possibly changed) features plus the error term of the clean
ones. Changing the features therefore moves the point by exactly sum_i (f'_i - f_i) W_dec[i]:

    with anatomy.trace(model, saes={"blocks.6.resid_post": sae},
                       interventions={"blocks.6.resid_post.sae.features": zero(12, 40)}):
        model(ids)                                        # features 12 and 40 ablated, nothing else

    interventions={"blocks.6.resid_post.sae.features": clamp(12, 8.0)}     # Golden Gate style
    interventions={"blocks.6.resid_post.sae.features": scale(12, 2.0)}
    interventions={"blocks.6.resid_post.sae.error": no_error}              # the SAE alone: what it costs
    interventions={"blocks.6.resid_post": steer(sae, 12, 4.0)}             # x + 4 W_dec[12]; no splice needed
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .modules import SAE

Intervention = Callable[[torch.Tensor], torch.Tensor]


def _features(ids: tuple) -> list[int]:
    if not ids or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
        raise ValueError(f"name one or more features, integers >= 0; got {ids!r}")
    return list(ids)


def zero(*features: int) -> Intervention:
    """f[..., i] = 0 for each named feature (ablation)."""
    ids = _features(features)

    def fn(f: torch.Tensor) -> torch.Tensor:  # (N, F)
        f = f.clone()
        f[..., ids] = 0
        return f

    return fn


def clamp(feature: int, value: float) -> Intervention:
    """f[..., i] = value at every position, active or not."""
    (i,) = _features((feature,))

    def fn(f: torch.Tensor) -> torch.Tensor:
        f = f.clone()
        f[..., i] = value
        return f

    return fn


def scale(feature: int, factor: float) -> Intervention:
    """f[..., i] *= factor (0 ablates; 2 doubles where it fires, leaves it 0 where it does not)."""
    (i,) = _features((feature,))

    def fn(f: torch.Tensor) -> torch.Tensor:
        f = f.clone()
        f[..., i] *= factor
        return f

    return fn


def steer(sae: SAE, feature: int, alpha: float) -> Intervention:
    """x + alpha W_dec[i]: add the feature's decoder direction, alpha times, to the point's value at every
    position (Templeton et al. 2024, "Scaling Monosemanticity", feature steering). For the point the
    SAE writes (or its `.sae.recon`); it needs no SAE attached."""
    direction = sae.feature_direction(feature).detach()  # (O,)

    def fn(x: torch.Tensor) -> torch.Tensor:  # (N, O)
        step = (alpha * direction).to(x.dtype)
        return x + (step.view(x.shape[-2:]) if sae.flatten_heads else step)

    return fn


def no_error(error: torch.Tensor) -> torch.Tensor:
    """The error term replaced by 0: the point becomes the reconstruction alone (the SAE spliced in)."""
    return torch.zeros_like(error)
