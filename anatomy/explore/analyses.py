"""The analysis panels' data, as JSON: attribution, interventions and head scores, computed by the floors
below (anatomy.analysis, anatomy.trace's interventions) and serialised, never recomputed here.

Shape letters: T positions (the decoder's), V vocabulary, C components.

Each function takes a ModelSlot (its lock held by the caller), a Pass (state.py) and the panel's
settings, as panels.py's do; integrated gradients and patching run as jobs (server.py), and use
result_json and target_id from here.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..analysis import attention_rollout, detect_heads, direct_logit_attribution, gradient_x_input
from ..analysis.heads import KINDS
from ..analysis.lens import stack_prefix
from ..analysis.views import panels as analysis_view
from ..trace import trace
from .models import ModelSlot
from .panels import before_after, default_position, head_count, layer_count
from .state import Pass
from .values import ExploreError, float_setting, int_setting, rounded

MAX_BARS = 12  # components drawn in the attribution bars; the rest are summed into one


# ---- the analyses -----------------------------------------------------------------------------


def result_json(result, **extra) -> dict:
    """An analysis's Result as JSON: its kind, its identity and the measured difference, `extra`, and
    `view`, the payload the analysis pages draw (views.panels), which the page draws the same way."""
    return {"kind": result.kind, "check": result.check, "error": None if math.isnan(result.error) else result.error,
            "converged": result.extra.get("converged"), "view": analysis_view(result), **extra}


def target_id(model: nn.Module, p: Pass, settings: dict, position: int) -> int:
    """The token whose logit is explained: an id, a token's text, or (default) the top prediction."""
    target = settings.get("target")
    if target is None or target == "":
        return int(p.logits_at(position).argmax())
    if isinstance(target, int) and not isinstance(target, bool):
        if not 0 <= target < model.config.vocab_size:
            raise ExploreError(f"'target' must be an id in [0, {model.config.vocab_size})")
        return target
    if isinstance(target, str):
        ids = model.tokenizer.encode(target, add_special_tokens=False)
        if len(ids) != 1:
            raise ExploreError(f"'target' {target[:50]!r} is {len(ids)} tokens; give one token (or its id)")
        return ids[0]
    raise ExploreError("'target' must be a token id or one token's text")


def attribution(slot: ModelSlot, p: Pass, settings: dict) -> dict:
    """For a target token at the last position: direct logit attribution as ranked bars (the rest
    summed into one), gradient x input per token, and attention rollout's row for that position."""
    model = slot.get()
    method = settings.get("method", "dla")
    position = default_position(model, p)
    if position is None:
        raise ExploreError("attribution explains a predicted token: this model predicts none here")
    target = target_id(model, p, settings, position)
    inputs = torch.tensor([p.ids]) if p.source_ids is None else (torch.tensor([p.source_ids]), torch.tensor([p.ids]))
    base = {"method": method, "target": model.tokenizer.labels([target])[0], "target_id": target, "position": position}
    if method == "dla":
        result = direct_logit_attribution(model, inputs, target)
        values = result.values[:, 0, position]  # (C,)
        order = values.abs().argsort(descending=True)
        shown = order[:MAX_BARS].tolist()
        rest = order[MAX_BARS:]
        bars = [{"label": result.labels["component"][i], "value": float(values[i])} for i in shown]
        if len(rest):
            bars.append({"label": f"{len(rest)} other components", "value": float(values[rest].sum()), "rest": True})
        return result_json(result, **base, bars=bars, total=float(values.sum()))
    if method == "gxi":
        result = gradient_x_input(model, inputs, target, position=position)
        return result_json(result, **base, tokens=result.tokens[0], values=rounded(result.values[0], 5))
    if method == "rollout":
        result = attention_rollout(model, inputs)
        row = result.values[-1, 0, -1]  # the last query position's row: where its information came from
        return result_json(result, **base, tokens=result.tokens[0], values=rounded(row, 5))
    raise ExploreError(f"'method' must be one of dla, gxi, rollout (integrated gradients runs as a job), got {method!r}")


# ---- interventions --------------------------------------------------------------------------------


def intervene(slot: ModelSlot, p: Pass, settings: dict) -> dict:
    """The next-token distribution before and after zeroing or scaling one head's output (its z)
    or one MLP neuron, through anatomy.trace's interventions."""
    model = slot.get()
    position = default_position(model, p)
    if position is None:
        raise ExploreError("an intervention is read on the next-token distribution: this model predicts none here")
    kind = settings.get("kind", "head")
    if kind not in ("head", "neuron"):
        raise ExploreError(f"'kind' must be 'head' or 'neuron', got {kind!r}")
    layer = int_setting(settings, "layer", 0, 0, layer_count(model) - 1)
    prefix = stack_prefix(model)
    if kind == "head":
        index = int_setting(settings, "index", 0, 0, head_count(model) - 1)
        point = f"{prefix}blocks.{layer}.attn.z"  # [B, T, H, D]
    else:
        index = int_setting(settings, "index", 0, 0, model.config.d_ff - 1)
        point = f"{prefix}blocks.{layer}.mlp.post"  # [B, T, F]
    scale = float_setting(settings, "scale", 0.0, -100.0, 100.0)

    def edit(x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        x[:, :, index] = x[:, :, index] * scale
        return x

    inputs = (torch.tensor([p.ids]),) if p.source_ids is None else (torch.tensor([p.source_ids]), torch.tensor([p.ids]))
    with torch.no_grad(), trace(model, [], interventions={point: edit}):
        after_logits = model(*inputs).logits[0, position].float()
    return {"kind": kind, "layer": layer, "index": index, "scale": scale, "point": point, "position": position,
            **before_after(model, p.logits_at(position), after_logits)}


# ---- heads, computed once per model ---------------------------------------------------------------


def head_scores(slot: ModelSlot, kind: str, **options):
    """The Result of anatomy.detect_heads(model, kind, **options), computed once per model and kept."""
    scores = slot.cache.setdefault("heads", {})
    if kind not in scores:
        scores[kind] = detect_heads(slot.get(), kind, **options)
    return scores[kind]


def heads(slot: ModelSlot, settings: dict, progress=None, runs_per_pass: int | None = None) -> dict:
    """Previous-token, induction and duplicate-token scores of every head (anatomy.detect_heads on
    repeated random tokens), computed once per model and kept; `view`: the scores of `kind` (default
    induction) as the analysis pages draw them. progress(done, total): the kinds scored, called
    after every forward pass (runs_per_pass sequences each), so that a caller may stop it between
    any two."""
    model = slot.get()
    shown = settings.get("kind", "induction")
    if shown not in KINDS:
        raise ExploreError(f"'kind' must be one of {', '.join(KINDS)}, got {str(shown)[:50]!r}")
    out = {"kinds": list(KINDS), "n_layers": layer_count(model), "n_heads": head_count(model), "scores": {}}
    for index, kind in enumerate(KINDS):
        def kind_progress(done, total, index=index):
            if progress is not None:
                progress(index + (done == total), len(KINDS))
        result = head_scores(slot, kind, runs_per_pass=runs_per_pass, progress=kind_progress)
        out["scores"][kind] = {"values": rounded(result.values, 4), "check": result.check}
        if kind == shown:
            out["view"] = analysis_view(result)  # the `kind` asked for, as the analysis pages draw it
    return out


__all__ = ["attribution", "heads", "intervene"]
