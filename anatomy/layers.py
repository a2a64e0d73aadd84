"""Normalisation and the position-wise feed-forward network.

Shape letters: B batch, T positions, E model width (d_model), F hidden width (d_ff).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .trace import TracePoint


class LayerNorm(nn.Module):
    """LayerNorm(x) = (x - mean(x)) / sqrt(var(x) + eps) * gamma + beta, over the last axis (Ba et al.).

    Trace points: normalized (x - mean(x)) / sqrt(var(x) + eps), before gamma and beta: TransformerLens's
    hook_normalized, on request; out, the norm's output."""

    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))  # gamma
        self.bias = nn.Parameter(torch.zeros(d_model))  # beta
        self.normalized = TracePoint("batch pos d_model", on_request=True)
        self.out = TracePoint("batch pos d_model")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)
        if self.normalized.active:
            # Named in a trace: the normalised stream is computed apart, and gamma and beta follow what the
            # trace leaves there; recorded only, the fused output above stands (the same bits as untraced).
            normed = F.layer_norm(x, self.weight.shape, eps=self.eps)
            kept = self.normalized(normed)
            if kept is not normed:
                out = kept * self.weight + self.bias
        return self.out(out)


class RMSNorm(nn.Module):
    """RMSNorm(x) = x / sqrt(mean(x^2) + eps) * gamma: LayerNorm without centring (Zhang & Sennrich).

    plus_one: gamma = 1 + w (Gemma), so that a weight of zero is the identity gain.
    Trace points: normalized x / sqrt(mean(x^2) + eps), before gamma (TransformerLens's hook_normalized, on
    request); out, the norm's output.
    """

    def __init__(self, d_model: int, eps: float = 1e-6, *, plus_one: bool = False, axes: str = "batch pos d_model"):
        super().__init__()
        self.eps = eps
        self.plus_one = plus_one
        self.weight = nn.Parameter(torch.zeros(d_model) if plus_one else torch.ones(d_model))  # w
        self.normalized = TracePoint(axes, on_request=True)
        self.out = TracePoint(axes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Computed in float32 at least whatever the input dtype, as the Llama reference does (float64 stays float64).
        x32 = x.to(torch.promote_types(x.dtype, torch.float32))
        normed = self.normalized(F.rms_norm(x32, x32.shape[-1:], eps=self.eps))  # x / sqrt(mean(x^2) + eps), PyTorch's own
        if self.plus_one:  # Gemma multiplies by its gain in float32 too
            return self.out(((1.0 + self.weight.to(x32.dtype)) * normed).to(x.dtype))
        return self.out(self.weight * normed.to(x.dtype))


NORMS = {"layernorm": LayerNorm, "rmsnorm": RMSNorm}


class NormParts(NamedTuple):
    """A norm as its parts, norm(x) = centre(x) * scale(x) * gain + bias, with

        centre(x) = x - mean(x)  (LayerNorm)  or  x  (RMSNorm)
        scale(x)  = 1 / sqrt(mean(centre(x)^2) + eps)                    one number per position

    With the scale frozen at one input's, the norm is a linear map (and a constant, the bias): what
    direct logit attribution (analysis/decompose.py) and a replacement model read a sum of parts through."""

    gain: torch.Tensor  # [E], detached, in float32 at least: gamma (an RMSNorm with plus_one: 1 + w)
    bias: torch.Tensor | None  # [E], like gain: a LayerNorm's beta; None for an RMSNorm
    centred: bool  # whether centre() subtracts the mean (a LayerNorm)
    eps: float
    scale: torch.Tensor | None  # [...]: scale(x) in float32 at least for the x [..., E] given, else None


def norm_parts(norm: nn.Module, x: torch.Tensor | None = None) -> NormParts:
    """The parts of a LayerNorm or RMSNorm (NormParts), and its scale frozen at x [..., E] when x is
    given. Raises ValueError for any other module."""
    if not isinstance(norm, (LayerNorm, RMSNorm)):
        raise ValueError(f"no frozen-scale form for the norm {type(norm).__name__}; allowed: LayerNorm, RMSNorm")
    weight = norm.weight.detach()
    weight = weight.to(torch.promote_types(weight.dtype, torch.float32))
    centred = isinstance(norm, LayerNorm)
    if centred:
        gain, bias = weight, norm.bias.detach().to(weight.dtype)
    else:
        gain, bias = (1.0 + weight if norm.plus_one else weight), None
    scale = None
    if x is not None:
        x = x.to(torch.promote_types(x.dtype, torch.float32))  # float64 stays float64
        spread = x.var(dim=-1, unbiased=False) if centred else x.pow(2).mean(dim=-1)  # (...,)
        scale = torch.rsqrt(spread + norm.eps)
    return NormParts(gain, bias, centred, norm.eps, scale)


class Projection(nn.Linear):
    """x W^T, without a bias, between two widths: OPT's project_in (token embeddings, d_embed ->
    d_model) and project_out (final hidden state, d_model -> d_embed). Trace point: out."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__(d_in, d_out, bias=False)
        self.out = TracePoint("batch pos d_out")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(super().forward(x))  # (B, T, d_out)


class Dropout(nn.Dropout):
    """nn.Dropout that is free where it is the identity: in evaluation, or with p = 0.

    A module call costs a few microseconds of Python (hooks, dispatch) even when it returns its
    input; a layer makes three such calls, a 1 x 16 MiniLM pass nineteen. Like TracePoint,
    `__call__` is overridden so that this path reads two attributes and nothing else.
    """

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        if not self.training or self.p == 0.0:
            return x
        return super().__call__(x)


def make_norm(config) -> nn.Module:
    if config.norm == "rmsnorm":
        return RMSNorm(config.d_model, eps=config.norm_eps, plus_one=config.norm_plus_one)
    return NORMS[config.norm](config.d_model, eps=config.norm_eps)


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


# activation name -> (function, gated?)
ACTIVATIONS = {
    "relu": (F.relu, False),  # the paper: max(0, x)
    "gelu": (F.gelu, False),  # BERT: x * Phi(x)
    "gelu_tanh": (_gelu_tanh, False),  # GPT-2: the tanh approximation of GELU
    "silu": (F.silu, False),  # x * sigmoid(x), a.k.a. swish
    "swiglu": (F.silu, True),  # Llama: (silu(x W_gate) * x W_in) W_out
    "geglu": (F.gelu, True),
    "geglu_tanh": (_gelu_tanh, True),  # Gemma: the tanh approximation of GELU, gated
}


class FeedForward(nn.Module):
    """The position-wise feed-forward network, applied to each position separately.

        FFN(x)    = act(x W_in + b_in) W_out + b_out                        (the paper: act = ReLU)
        GLU(x)    = (act(x W_gate) * (x W_in)) W_out                        (SwiGLU, GeGLU; Shazeer 2020)

    Trace points: pre [batch pos d_ff] (the input of the non-linearity), post [batch pos d_ff]
    (after it, and after the gate), out [batch pos d_model].
    """

    def __init__(self, config):
        super().__init__()
        self.act, self.gated = ACTIVATIONS[config.activation]
        self.fc_in = nn.Linear(config.d_model, config.d_ff, bias=config.mlp_bias)  # W_1
        if self.gated:
            self.fc_gate = nn.Linear(config.d_model, config.d_ff, bias=config.mlp_bias)
        self.fc_out = nn.Linear(config.d_ff, config.d_model, bias=config.mlp_bias)  # W_2
        self.dropout = Dropout(config.dropout)
        self.pre = TracePoint("batch pos d_ff")
        self.post = TracePoint("batch pos d_ff")
        self.out = TracePoint("batch pos d_model")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            hidden = self.post(self.act(self.pre(self.fc_gate(x))) * self.fc_in(x))  # (B, T, F)
        else:
            hidden = self.post(self.act(self.pre(self.fc_in(x))))  # (B, T, F)
        return self.out(self.fc_out(self.dropout(hidden)))  # (B, T, E)
