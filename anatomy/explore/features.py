"""The features panel: a sparse autoencoder read on the pass, one feature's logits, and steering with it.

Shape letters: T positions (the decoder's), E the width of the SAE's point, F features.

The SAEs are the ones `anatomy explore --sae MODEL=PATH` attached to a model (anatomy.sae.load_sae);
each function takes a ModelSlot (its lock held by the caller), a Pass and the panel's settings, as
panels.py's do, and reads the SAE's point from the pass's own trace.
"""

from __future__ import annotations

import torch

from ..trace import trace
from .models import ModelSlot
from .panels import before_after, default_position
from .state import Pass
from .values import ExploreError, float_setting, int_setting, rounded


def sae_of(slot: ModelSlot, settings: dict):
    """The SAE the settings name (default: the model's first), from the ones the explorer was given."""
    if not slot.saes:
        raise ExploreError(f"no sparse autoencoder is attached to {slot.name}: start the explorer with "
                           f"--sae {slot.name}=FOLDER (an `anatomy sae train` run, SAELens's or Gemma Scope's files)")
    name = settings.get("sae") or next(iter(slot.saes))
    if name not in slot.saes:
        raise ExploreError(f"'sae' must be one of {', '.join(slot.saes)}, got {str(name)[:100]!r}")
    return name, slot.saes[name]


def _read_by_sae(p: Pass, sae) -> torch.Tensor:
    """[T, E]: the vector of the SAE's point at every position of the pass (the decoder's side)."""
    if sae.point not in p.trace:
        raise ExploreError(f"the SAE reads {sae.point!r}, which this model's pass does not have")
    return p.trace[sae.point][0].float()


def features(slot: ModelSlot, p: Pass, settings: dict) -> dict:
    """The features most active on the text: f = sae.encode(x) of the pass's own x at the SAE's point,
    the `top` largest by their peak over positions, each with its activation at every token; and
    how well the SAE reads this text (x = x^ + e exactly; the share of variance x^ explains, L0)."""
    name, sae = sae_of(slot, settings)
    top = int_setting(settings, "top", 16, 1, 64)
    with torch.no_grad():
        x = _read_by_sae(p, sae)  # (T, E)
        f = sae.encode(x)  # (T, F); a head SAE reads [T, H, D] flattened
        recon = sae.decode(f).reshape(x.shape)  # (T, E)
    peak = f.max(dim=0).values  # (F,)
    order = peak.argsort(descending=True)[:top]
    order = order[peak[order] > 0]
    residual = ((x - recon) ** 2).sum().item()
    spread = ((x - x.mean(dim=0)) ** 2).sum().item()
    return {"sae": name, "point": sae.point, "d_sae": sae.d_sae, "kind": sae.kind, "tokens": p.tokens,
            "l0": float((f > 0).sum(-1).float().mean()), "fve": 1 - residual / spread if spread > 0 else None,
            "check": f"x = reconstruction + error exactly; on this text the reconstruction explains "
                     f"{100 * (1 - residual / spread):.1f}% of the variance" if spread > 0 else "",
            "features": [{"id": int(i), "peak": float(peak[i]), "acts": rounded(f[:, i], 4)} for i in order.tolist()]}


def feature(slot: ModelSlot, p: Pass, settings: dict) -> dict:
    """One feature: its activation at each token of the text, and the tokens its decoder direction
    promotes and suppresses through the unembedding (anatomy.sae's feature lens)."""
    model = slot.get()
    name, sae = sae_of(slot, settings)
    index = int_setting(settings, "feature", 0, 0, sae.d_sae - 1)
    with torch.no_grad():
        x = _read_by_sae(p, sae)
        acts = sae.encode(x)[:, index]  # (T,)
    out = {"sae": name, "feature": index, "tokens": p.tokens, "acts": rounded(acts, 4), "logits": None}
    try:
        from ..sae.analysis import feature_lens

        lens_ = feature_lens(model, sae, [index], top=10)
        out["logits"] = {key: lens_.extra[f"{key}_tokens"][0] for key in ("promoted", "suppressed")}
        out["logits"].update({f"{key}_values": rounded(lens_.extra[f"{key}_logits"][0], 4)
                              for key in ("promoted", "suppressed")})
    except ValueError as error:  # not a residual-stream SAE of a pre-norm decoder: no direct logits
        out["logits_note"] = str(error)
    return out


def steer(slot: ModelSlot, p: Pass, settings: dict) -> dict:
    """The next-token distribution before and after adding alpha times a feature's decoder direction
    to the SAE's point at every position (anatomy.sae.steer, through anatomy.trace)."""
    from ..sae import steer as steering

    model = slot.get()
    name, sae = sae_of(slot, settings)
    index = int_setting(settings, "feature", 0, 0, sae.d_sae - 1)
    alpha = float_setting(settings, "alpha", 0.0, -1000.0, 1000.0)
    position = default_position(model, p)
    if position is None:
        raise ExploreError("steering is read on the next-token distribution: this model predicts none here")
    inputs = (torch.tensor([p.ids]),) if p.source_ids is None else (torch.tensor([p.source_ids]), torch.tensor([p.ids]))
    with torch.no_grad(), trace(model, [], interventions={sae.point: steering(sae, index, alpha)}):
        after_logits = model(*inputs).logits[0, position].float()
    return {"sae": name, "feature": index, "alpha": alpha, "point": sae.point,
            **before_after(model, p.logits[position], after_logits)}


__all__ = ["feature", "features", "sae_of", "steer"]
