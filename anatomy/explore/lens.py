"""The lens panel: the logit lens of a pass, kept position by position as the text grows.

Shape letters: L layers (L+1 rows: every block's input, then the last block's output), T positions,
K top tokens, E model width, V vocabulary.

A cell's lens reads the residual stream at its own position only, and in a causal decoder that is the
same for every position a continued pass kept (analysis/prefix.py). So the rows of those positions
travel with the pass (Pass.memo["lens"]) and a keystroke unembeds its new positions only: 31 × 49,152
logits a position on SmolLM2, not every position's. The numbers are anatomy.analysis's lens_top and
lens_probabilities on the pass's own residual stream; the page draws them with the analysis pages'
own lens view (analysis.js), a window of positions at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..analysis.lens import lens_probabilities, lens_top, stack_of, stack_prefix, unembed
from ..analysis.identity import identity_line
from ..analysis.layouts import lens_candidates, lens_panel
from ..checkpoints.token_text import legend_for
from .models import ModelSlot
from .panels import vocabulary
from .state import MAX_TOKENS, Pass
from .values import int_setting, rounded

TOP = 10  # tokens kept per cell; a request shows up to `top` of them


@dataclass
class LensRows:
    """The lens of positions 0 … T−1: probs and ids [L+1, T, TOP] of the top tokens, log_norm [L+1, T]
    (each cell's logsumexp), and per position the last row's largest difference from the model's own
    log-probabilities, error [T], and their largest magnitude, size [T] (the identity's scale)."""

    probs: torch.Tensor
    ids: torch.Tensor
    log_norm: torch.Tensor
    error: torch.Tensor
    size: torch.Tensor

    @property
    def length(self) -> int:
        return self.probs.size(1)

    def tensors(self) -> list[torch.Tensor]:
        return [self.probs, self.ids, self.log_norm, self.error, self.size]

    def first(self, n: int) -> "LensRows":
        """The rows of positions 0 … n−1 (what a continued pass keeps)."""
        return LensRows(self.probs[:, :n], self.ids[:, :n], self.log_norm[:, :n], self.error[:n], self.size[:n])

    def extended(self, more: "LensRows") -> "LensRows":
        return LensRows(*(torch.cat([a, b], dim=-1 if a.dim() == 1 else 1) for a, b in
                          zip((self.probs, self.ids, self.log_norm, self.error, self.size),
                              (more.probs, more.ids, more.log_norm, more.error, more.size))))


def residual_names(model) -> list[str]:
    """The residual stream the lens reads: resid_pre of every block, then the last block's resid_post."""
    prefix, n_layers = stack_prefix(model), len(stack_of(model).blocks)
    return [f"{prefix}blocks.{i}.resid_pre" for i in range(n_layers)] + [f"{prefix}blocks.{n_layers - 1}.resid_post"]


def residuals(model, p: Pass, start: int, stop: int) -> torch.Tensor:
    """[L+1, stop − start, E]: the pass's residual stream at those positions, every lens row."""
    return torch.stack([p.trace[name][0, start:stop] for name in residual_names(model)])


def lens_rows(slot: ModelSlot, p: Pass) -> LensRows:
    """The lens of every position of the pass: the rows it carried over, and those of its new positions."""
    model = slot.get()
    have = p.memo.get("lens")
    start = have.length if have is not None else 0
    if start == len(p.ids):
        return have
    x = residuals(model, p, start, len(p.ids))  # (L+1, new, E)
    probs, ids, log_norm = lens_top(model, x, min(TOP, model.config.vocab_size))
    with torch.no_grad():
        mine = torch.log_softmax(unembed(model, x[-1]).float(), dim=-1)  # (new, V): the last row
        own = torch.log_softmax(torch.stack([p.logits_at(t) for t in range(start, len(p.ids))]).float(), dim=-1)
    finite = torch.where(torch.isfinite(own), own.abs(), torch.zeros(()))
    new = LensRows(probs, ids, log_norm, (mine.double() - own.double()).abs().amax(dim=-1), finite.amax(dim=-1))
    p.memo["lens"] = new if have is None else have.extended(new)
    return p.memo["lens"]


def lens(slot: ModelSlot, p: Pass, settings: dict) -> dict:
    """The logit lens of positions start … start+count−1 (default: all): the top `top` tokens of each
    layer there and their probabilities, the payload the page's lens view draws (with the tokens a
    reader may shade by), and the identity the lens checks (its last row is the model's own)."""
    model = slot.get()
    total = len(p.ids)
    top = int_setting(settings, "top", 3, 1, TOP)
    count = int_setting(settings, "count", total, 1, MAX_TOKENS)
    # a page a reader chose stays put as the text grows; past a shortened text's end, its last page
    start = min(int_setting(settings, "start", max(0, total - count), 0, MAX_TOKENS - 1), max(0, total - count))
    stop = min(total, start + count)
    rows = lens_rows(slot, p)
    vocab = vocabulary(slot)
    window = rows.ids[:, start:stop, :top]  # (L+1, W, top)
    tokens = [[[vocab[i] for i in cell] for cell in layer] for layer in window.tolist()]
    candidates = lens_candidates(window[-1], tokens[-1], stop - start - 1)
    shaded = lens_probabilities(model, residuals(model, p, start, stop), rows.log_norm[:, start:stop],
                                torch.tensor(list(candidates)))  # (L+1, W, n)
    targets = [(token, shaded[..., i]) for i, token in enumerate(candidates.values())]
    layers = [f"resid_pre {i}" for i in range(rows.probs.size(0) - 1)] + [f"resid_post {rows.probs.size(0) - 2}"]
    cols = p.tokens[start:stop]
    probs = rows.probs[:, start:stop, :top]
    error = float(rows.error.max())
    check = f"last layer = the model's own log-probs: max |diff| {error:.1e}"
    view = {"kind": "logit lens", "layout": "lens", "about": "",
            "check": identity_line(check, error, float(rows.size.max())),
            "panels": [lens_panel(f"positions {start}–{stop - 1}", layers, cols, tokens, probs, targets,
                                  list(range(start, stop)))],
            "tokenLegend": legend_for([*cols, *(t for layer in tokens for cell in layer for t in cell)])}
    return {"kind": "logit lens", "check": check, "error": error, "rows": layers, "cols": cols,
            "start": start, "stop": stop, "total": total, "tokens": tokens, "probs": rounded(probs, 4),
            "view": view}


__all__ = ["LensRows", "lens", "lens_rows"]
