"""Feature pages: every feature of an SAE, as a reader of Neuronpedia expects to see it, in one offline file.

Shape letters: F features, N top contexts kept per feature, W tokens shown per context, C contexts
scanned, T tokens per context, V vocabulary, H histogram bins.

For every feature, from one streaming pass over a corpus (passes that stop at the SAE's point):

    top contexts    the N contexts where it fires hardest (one per context: its highest token), each a window
                    of W tokens around that token with the feature's activation on every token
    density         the share of tokens on which it fires (> 0)
    histogram       how its non-zero activations are distributed (log-spaced bins)
    logits          the tokens its decoder direction promotes and suppresses through the unembedding:
                    W_U (gamma * W_dec[i]), gamma the final norm's gain (the norm's scale left out), centred
                    over the vocabulary (direct_logits)

and for the whole SAE the histogram of log10 feature density (Bricken et al. 2023's density plot).
The page (viz's page shell: inline script and style, a Content-Security-Policy that allows no request)
only draws these numbers: search by token, sort by density, a card per feature with its contexts shaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources

import numpy as np
import torch
from torch import nn

from ..layers import norm_parts
from ..viz.html import View, asset, pack, view_document
from .contexts import BEFORE, TopContexts, context_batches
from .modules import SAE
from .store import harvest

HISTOGRAM_EDGES = np.logspace(-3, 4, 57)  # activation bins, 8 per decade from 0.001 to 10,000 (H = 56)
ASSETS = resources.files("anatomy.sae") / "assets"


@dataclass
class FeatureData:
    """What a feature page shows; every array is per feature (axis 0 = F)."""

    values: torch.Tensor  # [F, N] the top contexts' highest activations (0: fewer contexts fired)
    windows: torch.Tensor  # [F, N, W] token ids around each (-1 past a context's edge)
    window_acts: torch.Tensor  # [F, N, W] the feature's activation on each of those tokens
    density: torch.Tensor  # [F] share of tokens it fires on
    histogram: torch.Tensor  # [F, H] counts of its non-zero activations per bin
    tokens_scanned: int = 0
    promoted: torch.Tensor | None = None  # [F, k] token ids, most promoted first
    promoted_logits: torch.Tensor | None = None
    suppressed: torch.Tensor | None = None  # [F, k] most suppressed first
    suppressed_logits: torch.Tensor | None = None
    meta: dict = field(default_factory=dict)


@torch.no_grad()
def feature_data(model: nn.Module, sae: SAE, tokens: np.ndarray, *, context: int = 128, skip: int = 1, top: int = 12,
                 batch: int = 16, logit_tokens: int = 8, progress=None) -> FeatureData:
    """Stream `tokens` (consecutive contexts of `context`, positions >= skip) through the model up to the SAE's
    point and keep, per feature, its `top` strongest contexts, its density and its histogram; then its
    promoted and suppressed tokens; progress(done, total) after each batch, in contexts. Raises ValueError
    when the text makes no context."""
    found = TopContexts(sae.d_sae, top)
    fired = torch.zeros(sae.d_sae, dtype=torch.float64)
    histogram = torch.zeros(sae.d_sae, len(HISTOGRAM_EDGES) - 1, dtype=torch.long)
    edges = torch.from_numpy(HISTOGRAM_EDGES).float()
    scanned = 0
    for done, total, ids in context_batches(tokens, context, batch):
        acts = sae.encode(harvest(model, ids, [sae.point])[0])  # (n, T, F)
        acts[:, :skip] = 0  # the first positions are no text's features (see store.py)
        on = acts > 0
        fired += on.sum((0, 1)).double()
        scanned += ids.size(0) * (context - skip)
        nonzero = acts[on]  # the activations, and their features below
        bins = torch.bucketize(nonzero.clamp(edges[0], edges[-1] * 0.999), edges, right=True) - 1
        features_on = on.nonzero()[:, 2]
        histogram.view(-1).index_add_(0, features_on * histogram.size(1) + bins, torch.ones_like(bins))
        found.add(ids, acts)
        if progress is not None:
            progress(done, total)
    data = FeatureData(found.values, found.windows, found.window_acts, (fired / scanned).float(), histogram, scanned)
    directions = output_directions(model, sae)
    if directions is not None:
        data.promoted, data.promoted_logits, data.suppressed, data.suppressed_logits = \
            direct_logits(model, directions, logit_tokens)
    return data


def final_norm_gain(model: nn.Module) -> torch.Tensor | float:
    """gamma [d_model]: the final norm's gain (layers.norm_parts: 1 + w for a plus-one RMSNorm), what a
    residual-stream direction is multiplied by on its way to the logits, the norm's scale left out; 1.0 for
    a model without one."""
    norm = getattr(model.decoder if model.config.arch == "encoder-decoder" else model, "final_norm", None)
    return 1.0 if norm is None else norm_parts(norm).gain.float()


def output_directions(model: nn.Module, sae: SAE) -> torch.Tensor | None:
    """[F, d_model]: each decoder row as the final norm's gain scales it, or None when the SAE writes
    no residual-stream vector (an SAE on attention heads) or the model has no unembedding."""
    if not hasattr(model, "lm_head") or sae.flatten_heads or sae.d_out != model.config.d_model:
        return None
    return sae.W_dec.detach().float() * final_norm_gain(model)


@torch.no_grad()
def direct_logits(model: nn.Module, directions: torch.Tensor, k: int = 8, chunk: int = 256):
    """(promoted ids [F, k], their logits, suppressed ids [F, k], their logits) of directions [F, d_model]
    through the LM head's matrix: the feature's direct effect on each token's logit per unit of activation,
    centred over the vocabulary,

        l = W_U d - mean_v (W_U d)_v

    Softmax ignores a shift every logit shares, so only the centred logits say what a direction promotes
    (>= 0) and suppresses (<= 0): a direction along the mean unembedding raises every raw logit, and its
    "most suppressed" tokens would otherwise show positive numbers."""
    weight = model.lm_head.proj.weight.detach().float()  # (V, d_model)
    k = min(k, weight.size(0))  # a vocabulary smaller than k (the toys'): all of it
    top, top_values, bottom, bottom_values = [], [], [], []
    for start in range(0, directions.size(0), chunk):
        logits = directions[start:start + chunk].float() @ weight.T  # (chunk, V)
        logits -= logits.mean(dim=1, keepdim=True)
        high, low = logits.topk(k, dim=1), logits.topk(k, dim=1, largest=False)
        top.append(high.indices), top_values.append(high.values)
        bottom.append(low.indices), bottom_values.append(low.values)
    return torch.cat(top), torch.cat(top_values), torch.cat(bottom), torch.cat(bottom_values)


def density_histogram(density: torch.Tensor, bins: int = 40) -> dict:
    """Counts of log10(density) over the features that fired, and how many never did."""
    alive = density[density > 0].double().log10()
    lo = float(alive.min()) if alive.numel() else -6.0
    counts = torch.histc(alive, bins=bins, min=lo, max=0.0) if alive.numel() else torch.zeros(bins)
    return {"lo": lo, "hi": 0.0, "counts": counts.long().tolist(), "dead": int((density == 0).sum())}


def render(data: FeatureData, tokenizer, *, title: str, subtitle: str) -> str:
    """The whole HTML document. Token ids reach the page as an index into the texts of the tokens the page
    uses (tokenizer.token_texts for contexts, tokenizer.labels for token lists); the arrays are packed."""
    used = torch.cat([data.windows.flatten()] + [t.flatten() for t in (data.promoted, data.suppressed) if t is not None])
    used = torch.unique(used[used >= 0])
    local = torch.full((int(used.max()) + 2 if used.numel() else 1,), -1, dtype=torch.int32)
    local[used] = torch.arange(used.numel(), dtype=torch.int32)
    remap = lambda ids: torch.where(ids >= 0, local[ids.clamp_min(0)], -1).to(torch.int32)  # noqa: E731
    peak = data.values[:, :1].clamp_min(1e-12)  # (F, 1): each feature's highest activation
    shade = (data.window_acts / peak[..., None]).clamp(0, 1)  # (F, N, W): 1 at the feature's maximum
    payload = {
        "view": "features",
        "meta": data.meta,
        "nFeatures": data.values.size(0), "top": data.values.size(1), "window": data.windows.size(2), "before": BEFORE,
        "tokensScanned": data.tokens_scanned,
        "texts": tokenizer.token_texts(used.tolist()), "labels": tokenizer.labels(used.tolist()),
        "density": [round(float(d), 8) for d in data.density],
        "peak": [round(float(v), 4) for v in data.values[:, 0]],
        "values": pack(data.values.numpy().astype("<f4")),
        "windows": pack(remap(data.windows).numpy().astype("<i4")),
        "shades": pack((shade * 255 + 0.5).to(torch.uint8).numpy()),
        "acts": pack(data.window_acts.numpy().astype("<f4")),
        "histogram": pack(data.histogram.numpy().astype("<i4")), "histogramEdges": HISTOGRAM_EDGES.tolist(),
        "densityHistogram": density_histogram(data.density),
    }
    if data.promoted is not None:
        k = data.promoted.size(1)
        payload.update(logitK=k, promoted=pack(remap(data.promoted).numpy().astype("<i4")),
                       promotedLogits=pack(data.promoted_logits.float().numpy().astype("<f4")),
                       suppressed=pack(remap(data.suppressed).numpy().astype("<i4")),
                       suppressedLogits=pack(data.suppressed_logits.float().numpy().astype("<f4")))
    return view_document("features", title, subtitle, payload,
                         scripts=[asset("common.js"), (ASSETS / "features.js").read_text(encoding="utf-8")],
                         style=asset("view.css") + "\n" + (ASSETS / "features.css").read_text(encoding="utf-8"))


def feature_page(model: nn.Module, sae: SAE, tokens: np.ndarray, *, context: int = 128, skip: int = 1, top: int = 12,
                 title: str | None = None, stats: dict | None = None, progress=None) -> View:
    """The feature page of `sae` over `tokens` as a viz View (`.save("features.html")`, shown in Jupyter);
    progress as feature_data's."""
    data = feature_data(model, sae, tokens, context=context, skip=skip, top=top, progress=progress)
    data.meta = {"point": sae.point_out or sae.point, "kind": sae.kind, "k": sae.k, "features": sae.d_sae,
                 "transcoder": sae.is_transcoder, "model": sae.metadata.get("model_name"), "stats": stats or {}}
    where = f"{sae.point} -> {sae.point_out}" if sae.is_transcoder else sae.point
    what = f"{sae.kind}{f' k={sae.k:g}' if sae.k else ''} {'transcoder' if sae.is_transcoder else 'SAE'}"
    subtitle = f"{what}, {sae.d_sae:,} features at {where}; top contexts from {data.tokens_scanned:,} tokens"
    document = render(data, model.tokenizer, title=title or f"Features of {sae.metadata.get('model_name') or 'the model'}",
                      subtitle=subtitle)
    return View("features", document, height=800)


def stats_of(folder) -> dict:
    """eval.json of a run folder, if there is one (shown at the top of the page)."""
    from pathlib import Path

    path = Path(folder) / "eval.json"
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except ValueError:
        return {}
