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

The integrand g(a) = d f / d a along the path is far from smooth on real models: on SmolLM2, "The
capital of France is" -> " Paris" from a padding baseline, it swings between -1800 and +4300 for
an integral of 10.3, in spikes a few hundredths of [0, 1] wide, so 50 evenly spread Gauss-Legendre
points miss completeness by 130% and 300 still by 8%. By default the points therefore go where
the spikes are: [0, 1] is cut into panels of NODES_PER_PANEL Gauss-Legendre points, and the
panels where the path's gradient is largest (width x max |g|) are halved, round after round, until
sum_i IG_i is within `tolerance` of f(x) - f(x') or `max_steps` gradients were computed. A fixed
`steps` gives Captum's rule exactly.

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
    return torch.tensor(0.5 * (1.0 + nodes), device="cpu"), torch.tensor(0.5 * weights, device="cpu")


def riemann(steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(alphas [N], weights [N]) on [0, 1]: the right Riemann sum, a_k = k/N and w_k = 1/N for k = 1..N, whose
    last point is the input itself: Hanna et al.'s rule for EAP-IG (2024), the integrated gradients of
    circuit discovery (circuits/discovery). Gauss-Legendre (gauss_legendre) is Captum's, for `ig` here."""
    return (torch.arange(1, steps + 1, dtype=torch.float64, device="cpu") / steps,
            torch.full((steps,), 1.0 / steps, dtype=torch.float64, device="cpu"))


def on_path(baseline: torch.Tensor, x: torch.Tensor, alpha: float) -> torch.Tensor:
    """baseline + alpha (x - baseline): a point of the straight path; exactly x at alpha = 1 (the input
    itself, not a rounding of it)."""
    return x if alpha == 1 else baseline + alpha * (x - baseline)


def _embed_point(model: nn.Module) -> tuple[str, str]:
    """(the embedding point attributions are computed on, which side of the batch it reads)."""
    return ("encoder.embed", "source") if model.config.arch == "encoder-decoder" else ("embed", "target")


def _target_logit(target, batch: Batch, position: int | None):
    """f(model, copies of batch) -> [n*B]: the logit of `target` at `position` (default: each row's
    last real token, where only that position goes through the LM head)."""
    size = batch.size
    ids = torch.as_tensor(target, dtype=torch.long, device=batch.target.ids.device)
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


NODES_PER_PANEL = 8  # Gauss-Legendre points per panel of the adaptive rule
FIRST_PANELS = 8  # the adaptive rule starts from 64 points, about Captum's default 50
TOLERANCE = 0.05  # completeness, relative, that the adaptive rule stops at
MAX_STEPS = 2048  # gradients the adaptive rule may compute
PANEL_MEMORY = 512 * 2**20  # bytes the adaptive rule's panels may hold


def integrated_gradients(
    model: nn.Module,
    inputs,
    target,
    *,
    baseline_ids: torch.Tensor | None = None,
    steps: int | None = None,
    tolerance: float = TOLERANCE,
    max_steps: int = MAX_STEPS,
    position: int | None = None,
    steps_per_pass: int | None = None,
    tokenizer=None,
    progress=None,
) -> Result:
    """[batch, pos]: each input token's share of f = the logit of `target` (an id, or one per
    sequence) at `position` (default: each row's last real token), by integrated gradients on the
    token embeddings (an encoder-decoder's source embeddings). baseline_ids: default all
    pad_token_id (or 0).

    steps: None (default) places the points adaptively until completeness is within `tolerance`
    (relative) or `max_steps` gradients were computed (see the module docstring); an integer uses
    that many Gauss-Legendre points, as Captum's LayerIntegratedGradients does. extra["steps"] is
    the number of gradients computed, extra["per_dim"] the [batch, pos, d_model] attributions.
    progress(done, total): called before the first pass of the path (done = 0) and after each, with
    the gradients computed so far and the most that may be computed; an exception it raises stops
    the analysis (how a caller cancels it).
    Raises ValueError for a bad argument."""
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise ValueError(f"steps must be None (adaptive) or an integer >= 1, got {steps!r}")
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0 < tolerance < 1:
        raise ValueError(f"tolerance must be a number in (0, 1), got {tolerance!r}")
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < FIRST_PANELS * NODES_PER_PANEL:
        raise ValueError(f"max_steps must be an integer >= {FIRST_PANELS * NODES_PER_PANEL}, got {max_steps!r}")
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
    delta = (f_input - f_baseline).double()  # (B,)
    chunk = steps_per_pass or max(1, 4096 // ids.numel())
    budget = steps if steps is not None else max_steps
    done = [0]

    def weighted_gradients(alphas: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(sum_k w_k grad f(path(a_k)) [B, T, E], g(a_k) = grad . (x - x') [N, B]) in float64."""
        total = torch.zeros_like(x, dtype=torch.float64)
        g = []
        for start in range(0, len(alphas), chunk):
            a = alphas[start:start + chunk].to(x)  # (n,), on x's device
            path = (x_base + a[:, None, None, None] * (x - x_base)[None]).flatten(0, 1)  # (n*B, T, E)
            path.requires_grad_(True)
            with torch.enable_grad(), trace(model, [], interventions={point: lambda _: path}):
                score = f(model, batch.repeat(len(a)))  # (n*B,)
                (grad,) = torch.autograd.grad(score.sum(), path)
            grad = grad.view(len(a), *x.shape).double()  # (n, B, T, E)
            total += (weights[start:start + chunk, None, None, None].to(grad) * grad).sum(0)
            g.append((grad * (x - x_base).double()[None]).sum((-1, -2)))  # (n, B)
            done[0] += len(a)
            if progress is not None:
                progress(done[0], budget)
        return total, torch.cat(g)

    def completeness(total: torch.Tensor) -> float:
        attributed = ((x - x_base).double() * total).sum((-1, -2))  # (B,)
        return ((attributed - delta).abs() / delta.abs().clamp_min(1e-12)).max().item()

    if progress is not None:
        progress(0, budget)  # a caller that cancels before the first pass is heard before it runs
    if steps is not None:
        total, _ = weighted_gradients(*gauss_legendre(steps))
        error, computed, rule = completeness(total), steps, f"{steps} Gauss-Legendre steps"
    else:
        total, error, computed, n_panels = _adaptive(weighted_gradients, completeness, tolerance, max_steps)
        rule = f"adaptive Gauss-Legendre: {computed} gradients on {n_panels} panels"
    per_dim = (x - x_base).double() * total  # (B, T, E)
    values = per_dim.sum(-1)  # (B, T)
    converged = error <= (tolerance if steps is None else 1e-2)
    hint = "" if converged else "; not converged: more steps, or another baseline"
    return Result(
        "integrated gradients", values.float(), ("batch", "pos"),
        check=f"completeness: sum of attributions = f(x) - f(baseline) within {error:.1e} (relative, {rule}){hint}",
        error=error, tokens=getattr(batch, side).tokens,
        extra={"per_dim": per_dim.float(), "f_input": f_input, "f_baseline": f_baseline, "steps": computed,
               "baseline_ids": baseline_ids,
               "converged": converged},
    )


def _adaptive(weighted_gradients, completeness, tolerance: float, max_steps: int):
    """Composite Gauss-Legendre on panels of [0, 1], halving the panels where the path's gradient is
    largest until completeness <= tolerance or max_steps gradients. Returns (sum_k w_k grad_k
    [B, T, E], completeness, gradients computed, panels)."""
    nodes, weights = gauss_legendre(NODES_PER_PANEL)

    def evaluate(lo: float, hi: float) -> dict:
        total, g = weighted_gradients(lo + (hi - lo) * nodes, (hi - lo) * weights)
        return {"lo": lo, "hi": hi, "total": total, "size": (hi - lo) * g.abs().max().item()}

    panels = [evaluate(i / FIRST_PANELS, (i + 1) / FIRST_PANELS) for i in range(FIRST_PANELS)]
    computed = FIRST_PANELS * NODES_PER_PANEL
    # Each panel keeps its share of the integral ([B, T, E] float64) to be replaced when it is halved:
    # no more panels than PANEL_MEMORY holds.
    panel_bytes = panels[0]["total"].numel() * 8
    max_steps = min(max_steps, max(computed, PANEL_MEMORY // panel_bytes * NODES_PER_PANEL))
    total = sum(p["total"] for p in panels)
    error = completeness(total)
    while error > tolerance and computed + 2 * NODES_PER_PANEL <= max_steps:
        # Halve the largest panels that together hold half of the gradient's size (Dörfler's marking),
        # as many as the budget allows.
        ranked = sorted(panels, key=lambda p: p["size"], reverse=True)
        budget = (max_steps - computed) // (2 * NODES_PER_PANEL)
        marked, held, whole = [], 0.0, sum(p["size"] for p in panels)
        for panel in ranked[:budget]:
            marked.append(panel)
            held += panel["size"]
            if held >= 0.5 * whole:
                break
        for panel in marked:
            middle = 0.5 * (panel["lo"] + panel["hi"])
            halves = [evaluate(panel["lo"], middle), evaluate(middle, panel["hi"])]
            total = total - panel["total"] + halves[0]["total"] + halves[1]["total"]
            panels.remove(panel)
            panels.extend(halves)
            computed += 2 * NODES_PER_PANEL
        error = completeness(total)
    return total, error, computed, len(panels)


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
    mixed = 0.5 * pattern.mean(dim=1) + 0.5 * torch.eye(pattern.size(-1), dtype=pattern.dtype, device=pattern.device)
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
    device = batch.target.ids.device  # the model's: as_batch put the batch there
    eye = torch.eye(size, dtype=torch.float64, device=device).expand(batch.size, size, size)
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
        step[:, n_source:, n_source:] = 0.5 * torch.eye(n_target, dtype=torch.float64, device=device)
        steps.append(step / step.sum(dim=-1, keepdim=True))
    return steps
