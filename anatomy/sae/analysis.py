"""Features as the components of the analyses: the lens, direct logit attribution, patching, attribution.

Shape letters: F features, B batch, T positions, E model width, V vocabulary, N patched runs, S steps.

An SAE at a point P in the residual stream's basis (resid_pre/mid/post, attn.out, mlp.out; a transcoder
writes mlp.out) writes P's value as a sum of parts,

    x_P = sum_i f_i W_dec[i] + b_dec + e                    (features, decoder bias, error term)

so each analysis takes the features where it took heads and layers, with the error term always a row of
its own, so that every identity stays exact:

    feature_lens                  each feature's direct effect on the logits, W_U (gamma * W_dec[i])
                                  (what Neuronpedia lists as a feature's logits; gamma the final norm's gain)
    feature_logit_attribution     DLA: the final residual is x_P plus what the layers after P add, so
                                  logit = sum_i share_i + error's + b_dec's + the rest's + the constant
    patch_features                activation patching with each feature (and the error) as a cell
    feature_integrated_gradients  integrated gradients over the features and the error, from x_P = b_dec;
                                  complete: the attributions sum to f(x) - f(x_P := b_dec)

The frozen-norm form of DLA, the quadrature, the inputs and Result come from anatomy/analysis.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from ..analysis.attribution import gauss_legendre
from ..analysis.decompose import frozen_norm
from ..analysis.inputs import Batch, as_batch
from ..analysis.lens import stack_of
from ..analysis.result import Result, max_abs_diff
from ..trace import trace
from .modules import SAE

RESIDUAL_BASIS = ("resid_pre", "resid_mid", "resid_post", "attn.out", "mlp.out")


def _written_point(model: nn.Module, sae: SAE) -> str:
    """The point the SAE writes, checked to be a vector the final residual sums (a pre-norm decoder stack)."""
    point = sae.point_out or sae.point
    if point is None:
        raise ValueError("the SAE does not say which point it reads (sae.point)")
    if not hasattr(model, "lm_head"):
        raise ValueError(f"features' logits need an LM head; this model has head={model.config.head!r}")
    prefix = "decoder." if model.config.arch == "encoder-decoder" else ""
    if not (point.startswith(prefix + "blocks.") and point.endswith(RESIDUAL_BASIS)):
        raise ValueError(f"{point!r} is not in the residual stream's basis of the stack the LM head reads "
                         f"({prefix}blocks.L.{{{', '.join(RESIDUAL_BASIS)}}})")
    if model.config.norm_position != "pre" or sae.flatten_heads:
        raise ValueError("the final residual is x_P plus what follows only in pre-norm blocks (norm_position='pre')")
    return point


def feature_lens(model: nn.Module, sae: SAE, features: Sequence[int] | None = None, *, top: int = 10) -> Result:
    """[feature, vocab]: the logits W_U (gamma * W_dec[i]) per unit of each feature (the final norm's scale left
    out: it depends on the whole residual), centred over the vocabulary (features.direct_logits). `features` (default all: then [feature, rank], the top `top`
    logits only, not the [F, V] matrix). extra: promoted / suppressed ids, logits and tokens, `top` each."""
    from .features import direct_logits, output_directions

    _written_point(model, sae)
    directions = output_directions(model, sae)
    ids = list(range(sae.d_sae)) if features is None else [sae.check_feature(int(i)) for i in features]
    chosen = directions[ids]  # (F', E)
    promoted, promoted_logits, suppressed, suppressed_logits = direct_logits(model, chosen, top)
    tokenizer = getattr(model, "tokenizer", None)
    labels = (lambda row: tokenizer.labels(row.tolist())) if tokenizer else (lambda row: [str(int(i)) for i in row])
    extra = {"promoted": promoted, "promoted_logits": promoted_logits, "promoted_tokens": [labels(r) for r in promoted],
             "suppressed": suppressed, "suppressed_logits": suppressed_logits,
             "suppressed_tokens": [labels(r) for r in suppressed]}
    if features is None:
        values, axes = promoted_logits, ("feature", "rank")
    else:
        with torch.no_grad():
            values = chosen.float() @ model.lm_head.proj.weight.detach().float().T  # (F', V)
            values, axes = values - values.mean(dim=1, keepdim=True), ("feature", "vocab")
    return Result("feature lens", values, axes, labels={"feature": [f"F{i}" for i in ids]},
                  check="no identity: each feature's direct effect per unit of activation", extra=extra)


def _parts(model: nn.Module, sae: SAE, batch: Batch) -> tuple:
    """(point, x_P [B, T, E], features [B, T, F], error [B, T, E], final residual [B, T, E], logits [B, T, V])."""
    point = _written_point(model, sae)
    prefix = "decoder." if model.config.arch == "encoder-decoder" else ""
    last = f"{prefix}blocks.{len(stack_of(model).blocks) - 1}.resid_post"
    with torch.no_grad(), trace(model, [point, f"{point}.sae.features", f"{point}.sae.error", last],
                                saes={point: sae}) as t:
        logits = batch.logits(model)
    return point, t[point], t[f"{point}.sae.features"], t[f"{point}.sae.error"], t[last], logits


def _targets(target, logits: torch.Tensor) -> torch.Tensor:
    """[B, T] target ids: one id, [batch] ids, [batch, pos] ids, or None (each position's top token)."""
    batch, length, vocab = logits.shape
    if target is None:
        return logits.argmax(-1)
    ids = torch.as_tensor(target, dtype=torch.long)
    ids = ids.expand(batch, length) if ids.dim() == 0 else ids[:, None].expand(batch, length) if ids.dim() == 1 else ids
    if tuple(ids.shape) != (batch, length) or int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise ValueError(f"target must be an id in [0, {vocab}), [batch] or [batch, pos] = {(batch, length)} ids")
    return ids


def feature_logit_attribution(model: nn.Module, inputs, sae: SAE, target=None, *, tokenizer=None) -> Result:
    """[component, batch, pos]: each feature's direct contribution to the logit of `target` (an id, [batch],
    [batch, pos], or None: each position's top token), then "SAE error", "SAE b_dec", "after the SAE" (what
    the layers after its point add, and what runs beside it), "norm bias + unembed bias". Only the
    features active somewhere in the batch are rows (their numbers in labels["component"]). The rows sum
    to the logit: the final norm's scale is frozen at the whole residual's (anatomy.direct_logit_attribution)."""
    if model.config.lm_head_transform or model.config.final_logit_softcap is not None:
        raise ValueError("direct logit attribution needs a linear unembedding (no LM-head transform, no soft-cap)")
    model.eval()
    batch = as_batch(model, inputs, tokenizer)
    point, x, features, error, final, logits = _parts(model, sae, batch)
    with torch.no_grad():
        ids = _targets(target, logits)  # (B, T)
        active = torch.nonzero(features.flatten(0, 1).amax(0) > 0)[:, 0]  # the features that fire somewhere
        directions = model.lm_head.proj.weight[ids]  # (B, T, E)
        written = features[..., active].permute(2, 0, 1)[..., None] * sae.W_dec[active][:, None, None]  # (F', B, T, E)
        rest = final - x  # what the layers after P (and the parallel branches) add
        parts = torch.cat([written, error[None], sae.b_dec.expand_as(x)[None], rest[None]])  # (F'+3, B, T, E)
        normed, bias = frozen_norm(getattr(stack_of(model), "final_norm", None), final, parts)
        contributions = (normed * directions).sum(-1)  # (F'+3, B, T)
        constant = directions @ bias
        if model.lm_head.proj.bias is not None:
            constant = constant + model.lm_head.proj.bias[ids]
        values = torch.cat([contributions, constant[None]])  # (F'+4, B, T)
        expected = logits.gather(-1, ids[..., None])[..., 0]
    error_value = max_abs_diff(values.sum(0), expected)
    names = [f"F{int(i)}" for i in active] + ["SAE error", "SAE b_dec", "after the SAE", "norm bias + unembed bias"]
    return Result("feature logit attribution", values, ("component", "batch", "pos"), labels={"component": names},
                  check=f"features + error + b_dec + the rest sum to the logit: max |diff| {error_value:.1e}",
                  error=error_value, tokens=batch.target.tokens, extra={"target": ids, "features": active, "point": point})


Metric = Callable[[torch.Tensor], torch.Tensor]


def patch_features(model: nn.Module, sae: SAE, clean, corrupt, metric: Metric, *, features: Sequence[int] | None = None,
                   method: str = "activation", runs_per_pass: int = 64, tokenizer=None) -> Result:
    """[feature]: metric(logits [B, T, V]) -> [B], averaged over the batch, of the corrupted run with the SAE
    spliced in and one feature set to its clean activations at every position (the last cell: the error
    term set to the clean one). features: which (default: those active in either run). method "activation"
    (one patched run per cell, N cells to a pass) or "attribution" (the first-order estimate, Nanda 2023:
    metric(corrupt) + sum (clean - corrupt) dmetric/dfeature). The identity checked: with every feature and
    the error patched together the point is the clean one, and the metric equals patching the point whole."""
    if method not in ("activation", "attribution"):
        raise ValueError(f"method={method!r} is not supported; allowed values: 'activation', 'attribution'")
    if not callable(metric):
        raise ValueError(f"metric must be a function of logits [batch, pos, vocab] -> [batch], got {type(metric).__name__}")
    model.eval()
    clean_batch, corrupt_batch = as_batch(model, clean, tokenizer), as_batch(model, corrupt, tokenizer)
    if clean_batch.target.ids.shape != corrupt_batch.target.ids.shape:
        raise ValueError(f"clean and corrupt must have the same shape; got {tuple(clean_batch.target.ids.shape)} and "
                         f"{tuple(corrupt_batch.target.ids.shape)}")
    point = sae.point_out or sae.point
    names = [f"{point}.sae.features", f"{point}.sae.error"]
    runs = {}
    for name, batch in (("clean", clean_batch), ("corrupt", corrupt_batch)):
        with torch.no_grad(), trace(model, [point] + names, saes={point: sae}) as t:
            logits = batch.logits(model)
        runs[name] = {"point": t[point], "features": t[names[0]], "error": t[names[1]], "metric": metric(logits)}
    clean_f, corrupt_f = runs["clean"]["features"], runs["corrupt"]["features"]
    if features is None:
        features = torch.nonzero((clean_f.flatten(0, 1).amax(0) > 0) | (corrupt_f.flatten(0, 1).amax(0) > 0))[:, 0].tolist()
    features = [sae.check_feature(int(i)) for i in features]
    cells = [("feature", i) for i in features] + [("error", None)]
    size = corrupt_batch.size
    if method == "activation":
        values = torch.cat([_patched(model, sae, corrupt_batch, runs["clean"], cells[start:start + runs_per_pass], metric)
                            for start in range(0, len(cells), runs_per_pass)])
    else:
        values = _attribution(model, sae, corrupt_batch, runs, cells, metric)
    # the identity: everything patched at once = the point patched whole
    everything = _patched(model, sae, corrupt_batch, runs["clean"], [("all", None)], metric)[0]
    with torch.no_grad(), trace(model, [], interventions={point: lambda x: runs["clean"]["point"]}):
        whole = metric(corrupt_batch.logits(model)).mean()
    error = abs(everything.item() - whole.item())
    labels = [f"F{i}" for i in features] + ["SAE error"]
    return Result(f"{method} patching", values, ("component",), labels={"component": labels},
                  check=f"all features and the error patched = {point} patched whole: |diff| {error:.1e}", error=error,
                  tokens=corrupt_batch.target.tokens,
                  extra={"point": point, "by": "feature", "clean": runs["clean"]["metric"].mean().item(),
                         "corrupt": runs["corrupt"]["metric"].mean().item(), "batch": size})


def _patched(model, sae, corrupt: Batch, clean: dict, cells: list, metric: Metric) -> torch.Tensor:
    """[len(cells)]: metric of one pass of len(cells) copies of the corrupted batch, copy c patched at cells[c]."""
    point, size = sae.point_out or sae.point, corrupt.size

    def features(f: torch.Tensor) -> torch.Tensor:  # (N*B, T, F)
        f = f.clone()
        for c, (kind, i) in enumerate(cells):
            rows = slice(c * size, (c + 1) * size)
            if kind == "feature":
                f[rows, :, i] = clean["features"][:, :, i]
            elif kind == "all":
                f[rows] = clean["features"]
        return f

    def error(e: torch.Tensor) -> torch.Tensor:
        e = e.clone()
        for c, (kind, _) in enumerate(cells):
            if kind in ("error", "all"):
                e[c * size:(c + 1) * size] = clean["error"]
        return e

    with torch.no_grad(), trace(model, [], saes={point: sae}, interventions={
            f"{point}.sae.features": features, f"{point}.sae.error": error}):
        scores = metric(corrupt.repeat(len(cells)).logits(model))  # (N*B,)
    if scores.shape != (len(cells) * size,):
        raise ValueError(f"metric must return one value per sequence, shape ({len(cells) * size},); got {tuple(scores.shape)}")
    return scores.view(len(cells), size).mean(1)


def _attribution(model, sae, corrupt: Batch, runs: dict, cells: list, metric: Metric) -> torch.Tensor:
    point = sae.point_out or sae.point
    names = [f"{point}.sae.features", f"{point}.sae.error"]
    with torch.enable_grad(), trace(model, names, saes={point: sae}, grad=True) as t:
        score = metric(corrupt.logits(model)).mean()
        d_features, d_error = torch.autograd.grad(score, [t[n] for n in names])
    delta_f = runs["clean"]["features"] - runs["corrupt"]["features"]  # (B, T, F)
    delta_e = runs["clean"]["error"] - runs["corrupt"]["error"]
    base = score.item()
    values = [base + ((delta_f[..., i] * d_features[..., i]).sum() if kind == "feature" else
                      (delta_e * d_error).sum()).item() for kind, i in cells]
    return torch.tensor(values)


def feature_integrated_gradients(model: nn.Module, inputs, sae: SAE, target, *, steps: int = 32,
                                 position: int = -1, tokenizer=None) -> Result:
    """[component, batch]: integrated gradients (Sundararajan et al. 2017) of the logit of `target` (an id, or one
    per sequence) at `position`, over the SAE's features and error term at its point, along
    x_P(a) = b_dec + a (sum_i f_i W_dec[i] + e), a from 0 to 1 (every feature and the error scaled together).
    Rows: the features active in the batch (summed over positions), then "SAE error". Complete: the rows sum to
    f(x) - f(x_P := b_dec), up to the quadrature, which the check reports."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    model.eval()
    batch = as_batch(model, inputs, tokenizer)
    point = sae.point_out or sae.point
    names = [f"{point}.sae.features", f"{point}.sae.error"]
    with torch.no_grad(), trace(model, names, saes={point: sae}) as t:
        logits = batch.logits(model)
    f, e = t[names[0]], t[names[1]]  # (B, T, F), (B, T, E)
    ids = torch.as_tensor(target, dtype=torch.long).expand(batch.size)
    if int(ids.min()) < 0 or int(ids.max()) >= logits.size(-1):
        raise ValueError(f"target ids must be in [0, {logits.size(-1)})")

    def logit(copies: int, interventions: dict, grad: bool = False) -> torch.Tensor:
        with torch.set_grad_enabled(grad), trace(model, names, saes={point: sae}, interventions=interventions,
                                                 grad=grad) as traced:
            out = batch.repeat(copies).logits(model)[:, position]  # (n*B, V)
        return out.gather(-1, ids.repeat(copies)[:, None])[:, 0], traced

    alphas, weights = gauss_legendre(steps)
    path_f = (alphas[:, None, None, None].to(f.dtype) * f[None]).flatten(0, 1).requires_grad_(True)  # (S*B, T, F)
    path_e = (alphas[:, None, None, None].to(e.dtype) * e[None]).flatten(0, 1).requires_grad_(True)
    score, traced = logit(steps, {names[0]: lambda _: path_f, names[1]: lambda _: path_e}, grad=True)
    d_f, d_e = torch.autograd.grad(score.sum(), [traced[n] for n in names])
    w = weights.to(f.dtype)[:, None, None, None]
    total_f = (w * d_f.view(steps, *f.shape)).sum(0)  # (B, T, F)
    total_e = (w * d_e.view(steps, *e.shape)).sum(0)
    ig_f = (f * total_f).sum(1)  # (B, F): summed over positions
    ig_e = (e * total_e).sum((1, 2))  # (B,)
    active = torch.nonzero(f.flatten(0, 1).amax(0) > 0)[:, 0]
    values = torch.cat([ig_f[:, active].T, ig_e[None]]).detach()  # (F'+1, B)
    full = logits[:, position].gather(-1, ids[:, None])[:, 0]
    zero, _ = logit(1, {names[0]: torch.zeros_like, names[1]: torch.zeros_like})
    delta = (full - zero).double()
    error = ((values.sum(0).double() - delta).abs() / delta.abs().clamp_min(1e-12)).max().item()
    return Result("feature integrated gradients", values, ("component", "batch"),
                  labels={"component": [f"F{int(i)}" for i in active] + ["SAE error"]},
                  check=f"completeness: the rows sum to f(x) - f(x_P = b_dec) within {error:.1e} (relative, {steps} "
                        f"Gauss-Legendre steps)", error=error, tokens=batch.target.tokens,
                  extra={"features": active, "point": point, "f_input": full, "f_baseline": zero})
