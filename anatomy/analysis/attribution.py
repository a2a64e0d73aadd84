"""Which input tokens a prediction depends on: integrated gradients, gradient x input, and
attention rollout.

Shape letters: B batch, T positions, S source positions, E model width, N interpolation steps,
L layers, H heads.

Integrated gradients (Sundararajan et al. 2017, "Axiomatic Attribution for Deep Networks"), on
the token embeddings x with a baseline x' (the embeddings of baseline ids):

    IG_i(x) = (x_i - x'_i) * integral_0^1 d f(x' + a (x - x')) / d x_i  da
            ~ (x_i - x'_i) * sum_k w_k  d f(x' + a_k (x - x')) / d x_i

with the Gauss-Legendre points a_k and weights w_k on [0, 1] (Captum's default method). It is
complete: sum_i IG_i = f(x) - f(x'), up to the quadrature error, which the result reports.

Attention rollout (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers"): average
each layer's heads, add the residual connection as the identity, renormalise the rows, and
multiply the layers: R = A'_L ... A'_1 with A'_l = rownorm(0.5 mean_h A_l + 0.5 I).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ..trace import trace
from .inputs import Batch, Text, as_batch
from .result import Result


def gauss_legendre(steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(alphas [N], weights [N]) on [0, 1]: the Legendre nodes on [-1, 1] mapped by a = (1 + x) / 2,
    weights halved; sum_k w_k g(a_k) ~ integral_0^1 g."""
    nodes, weights = np.polynomial.legendre.leggauss(steps)
    return torch.tensor(0.5 * (1.0 + nodes)), torch.tensor(0.5 * weights)


def _embed_point(model: nn.Module) -> tuple[str, str]:
    """(the embedding point attributions are computed on, which side of the batch it reads)."""
    return ("encoder.embed", "source") if model.config.arch == "encoder-decoder" else ("embed", "target")


def _target_logit(target, batch: Batch, position: int | None):
    """f(model, copies of batch) -> [n*B]: the logit of `target` at `position` (default: each row's
    last real token, where only that position goes through the LM head)."""
    size = batch.size
    ids = torch.as_tensor(target, dtype=torch.long)
    ids = ids.expand(size) if ids.dim() == 0 else ids
    if ids.shape != (size,):
        raise ValueError(f"target must be one id or one id per sequence ({size}); got shape {tuple(ids.shape)}")

    def f(model: nn.Module, copies: Batch) -> torch.Tensor:
        n = copies.size // size
        if position is None:
            logits = copies.last_logits(model)[:, 0]  # (n*B, V)
        else:
            logits = copies.logits(model)[:, position]  # (n*B, V)
        if int(ids.max()) >= logits.size(-1) or int(ids.min()) < 0:
            raise ValueError(f"target ids must be in [0, vocab_size={logits.size(-1)})")
        return logits.gather(-1, ids.repeat(n)[:, None])[:, 0]

    return f


def _with_ids(batch: Batch, side: str, ids: torch.Tensor) -> Batch:
    text = getattr(batch, side)
    replaced = Text(ids, text.padding_mask, text.tokens)
    return Batch(replaced, batch.source) if side == "target" else Batch(batch.target, replaced)


def integrated_gradients(
    model: nn.Module,
    inputs,
    target,
    *,
    baseline_ids: torch.Tensor | None = None,
    steps: int = 50,
    position: int | None = None,
    steps_per_pass: int | None = None,
    tokenizer=None,
) -> Result:
    """[batch, pos]: each input token's share of f = the logit of `target` (an id, or one per
    sequence) at `position` (default: each row's last real token), by integrated gradients on the
    token embeddings (an encoder-decoder's source embeddings). baseline_ids: default all
    pad_token_id (or 0). extra["per_dim"] holds the [batch, pos, d_model] attributions."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    model.eval()
    batch = as_batch(model, inputs, tokenizer)
    point, side = _embed_point(model)
    ids = getattr(batch, side).ids
    if baseline_ids is None:
        baseline_ids = torch.full_like(ids, model.config.pad_token_id or 0)
    if tuple(baseline_ids.shape) != tuple(ids.shape):
        raise ValueError(f"baseline_ids must have the inputs' shape {tuple(ids.shape)}, got {tuple(baseline_ids.shape)}")
    length = batch.target.ids.size(1)
    if position is not None and not (isinstance(position, int) and -length <= position < length):
        raise ValueError(f"position must be an integer in [-{length}, {length}), got {position!r}")
    f = _target_logit(target, batch, position)
    with torch.no_grad():
        with trace(model, point) as t:
            f_input = f(model, batch)
        x = t[point]  # (B, T, E)
        baseline = _with_ids(batch, side, baseline_ids)
        with trace(model, point) as t:
            f_baseline = f(model, baseline)
        x_base = t[point]
    alphas, weights = gauss_legendre(steps)
    chunk = steps_per_pass or max(1, 4096 // ids.numel())
    total = torch.zeros_like(x, dtype=torch.float64)  # sum_k w_k grad_k, (B, T, E)
    for start in range(0, steps, chunk):
        a = alphas[start:start + chunk].to(x.dtype)  # (n,)
        path = (x_base + a[:, None, None, None] * (x - x_base)[None]).flatten(0, 1)  # (n*B, T, E)
        path.requires_grad_(True)
        with torch.enable_grad(), trace(model, [], interventions={point: lambda _: path}):
            score = f(model, batch.repeat(len(a)))  # (n*B,)
            (grad,) = torch.autograd.grad(score.sum(), path)
        grad = grad.view(len(a), *x.shape).double()  # (n, B, T, E)
        total += (weights[start:start + chunk, None, None, None] * grad).sum(0)
    per_dim = (x - x_base).double() * total  # (B, T, E)
    values = per_dim.sum(-1)  # (B, T)
    delta = (f_input - f_baseline).double()
    error = ((values.sum(-1) - delta).abs() / delta.abs().clamp_min(1e-12)).max().item()
    hint = "" if error < 1e-2 else "; not converged: more steps, or another baseline"
    return Result(
        "integrated gradients", values.float(), ("batch", "pos"),
        check=f"completeness: sum of attributions = f(x) - f(baseline) within {error:.1e} (relative, {steps} "
              f"Gauss-Legendre steps){hint}",
        error=error, tokens=getattr(batch, side).tokens,
        extra={"per_dim": per_dim.float(), "f_input": f_input, "f_baseline": f_baseline},
    )


def gradient_x_input(model: nn.Module, inputs, target, *, position: int | None = None, tokenizer=None) -> Result:
    """[batch, pos]: sum_e x_e * d f / d x_e on the token embeddings (Shrikumar et al. 2016), f as in
    integrated_gradients. It equals integrated gradients with a zero baseline when f is linear."""
    model.eval()
    batch = as_batch(model, inputs, tokenizer)
    point, side = _embed_point(model)
    f = _target_logit(target, batch, position)
    with torch.enable_grad(), trace(model, point, grad=True) as t:
        score = f(model, batch)
        (grad,) = torch.autograd.grad(score.sum(), t[point])
    x = t[point].detach()
    values = (x * grad).sum(-1)  # (B, T)
    total = values.sum(-1)
    return Result(
        "gradient x input", values, ("batch", "pos"),
        check=f"no completeness identity: sum {total[0].item():.4g} vs f(x) {score[0].item():.4g} (row 0)",
        tokens=getattr(batch, side).tokens,
    )


def _rollout_step(pattern: torch.Tensor) -> torch.Tensor:
    """[B, H, Q, K] (Q = K) -> rownorm(0.5 mean_h A + 0.5 I), [B, Q, K]."""
    mixed = 0.5 * pattern.mean(dim=1) + 0.5 * torch.eye(pattern.size(-1), dtype=pattern.dtype)
    return mixed / mixed.sum(dim=-1, keepdim=True)


def attention_rollout(model: nn.Module, inputs, *, tokenizer=None) -> Result:
    """[layer, batch, query, key]: the rollout after each layer (the last is the answer); rows sum to 1.

    Encoder-decoder: one joint matrix over the source tokens then the target tokens. Encoder layers
    move the source rows; each decoder layer's self-attention moves the target rows among the
    target; its cross-attention moves half of each target row to the encoder's output (rollout
    of the source rows) and keeps half in place: A'_cross = [[I, 0], [0.5 C, 0.5 I]] on the joint
    tokens. The decoder's rows then say how much each source and target token flowed into it.
    """
    model.eval()
    batch = as_batch(model, inputs, tokenizer)
    with torch.no_grad(), trace(model, "*attn.pattern") as t:
        batch.run(model)
    if model.config.arch != "encoder-decoder":
        layers = [_rollout_step(t[f"blocks.{i}.attn.pattern"].double()) for i in range(len(model.blocks))]
        tokens = batch.target.tokens
    else:
        layers = _joint_steps(model, t, batch)
        tokens = [s + tg for s, tg in zip(batch.source.tokens, batch.target.tokens)]
    rollout, rolled = [], None
    for step in layers:
        rolled = step if rolled is None else step @ rolled  # (B, Q, K): this layer after the ones below
        rollout.append(rolled)
    values = torch.stack(rollout).float()  # (L, B, Q, K)
    error = (values.sum(-1) - 1).abs().max().item()
    return Result(
        "attention rollout", values, ("layer", "batch", "query", "key"),
        check=f"every row is a distribution: max |row sum - 1| {error:.1e}", error=error, tokens=tokens,
    )


def _joint_steps(model: nn.Module, t, batch: Batch) -> list[torch.Tensor]:
    """Row-stochastic [B, S+T, S+T] matrices, one per encoder layer and two per decoder layer."""
    n_source, n_target = batch.source.ids.size(1), batch.target.ids.size(1)
    size = n_source + n_target
    eye = torch.eye(size, dtype=torch.float64).expand(batch.size, size, size)
    steps = []
    for i in range(len(model.encoder.blocks)):
        step = eye.clone()
        step[:, :n_source, :n_source] = _rollout_step(t[f"encoder.blocks.{i}.attn.pattern"].double())
        steps.append(step)
    for i in range(len(model.decoder.blocks)):
        step = eye.clone()
        step[:, n_source:, n_source:] = _rollout_step(t[f"decoder.blocks.{i}.attn.pattern"].double())
        steps.append(step)
        cross = t[f"decoder.blocks.{i}.cross_attn.pattern"].double().mean(dim=1)  # (B, T, S)
        step = eye.clone()
        step[:, n_source:, :n_source] = 0.5 * cross
        step[:, n_source:, n_source:] = 0.5 * torch.eye(n_target, dtype=torch.float64)
        steps.append(step / step.sum(dim=-1, keepdim=True))
    return steps
