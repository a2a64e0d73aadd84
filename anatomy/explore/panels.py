"""Each panel's data, as JSON: what the floors below computed, serialised, never recomputed here.

Shape letters: L layers, H heads, T positions (the decoder's), S key positions, D head width,
V vocabulary, E model width.

Every function takes a ModelSlot (its lock held by the caller), a Pass (state.py) and the panel's
settings, and returns a dict the page draws. The numbers come from the pass's trace, or from the
floor that owns the computation: the walk's step builders (anatomy.walk), the attention maps of
anatomy.viz, the sampling filters of anatomy.generation; the analyses' panels are analyses.py's, the
lens's lens.py's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..analysis.lens import stack_of
from ..generation.sampling import sampling_distribution
from ..viz.adapters import from_trace
from ..walk import walkthrough
from ..walk.render_html import section
from .models import ModelSlot
from .state import MAX_TOKENS, Pass
from .values import ExploreError, float_setting, int_setting, rounded

TOP = 10  # tokens listed in a distribution


def layer_count(model: nn.Module) -> int:
    """The layers of the stack the panels show (an encoder-decoder's decoder)."""
    return len(stack_of(model).blocks)


def head_count(model: nn.Module) -> int:
    """The heads of each layer of that stack."""
    return stack_of(model).blocks[0].attn.n_heads


# ---- input, tokens, next ------------------------------------------------------------------------


def default_position(model: nn.Module, p: Pass) -> int | None:
    """Where the next-token panel reads: the last position of a decoder (or a decoder's target), an
    encoder's first mask token (None: no mask, or no head that predicts tokens)."""
    if not p.predicts:
        return None
    if model.config.arch != "encoder":
        return len(p.ids) - 1
    mask = model.tokenizer.mask_id
    return p.ids.index(mask) if mask is not None and mask in p.ids else None


def continuation(tokenizer, ids: list[int], new: int) -> str:
    """The text that appending token `new` adds after `ids`, as the tokenizer writes it (a word
    tokenizer's space between words, a byte-level token's own space): how `generate` prints."""
    before = tokenizer.decode(ids)
    after = tokenizer.decode(ids + [new])
    return after[len(before):] if after.startswith(before) else tokenizer.token_texts([new])[0]


def distribution(model: nn.Module, p: Pass, position: int, settings: dict) -> dict:
    """The top TOP tokens at `position`, with what sampling keeps under the settings' temperature,
    top-k and top-p (generation.sampling_distribution, the sampler's own filters)."""
    temperature = float_setting(settings, "temperature", 1.0, 1e-6, 100.0)
    top_k = settings.get("top_k")
    top_k = None if top_k in (None, 0) else int_setting(settings, "top_k", 0, 1, model.config.vocab_size)
    top_p = float_setting(settings, "top_p", None, 1e-9, 1.0)
    logits = p.logits_at(position)  # (V,)
    probs = torch.softmax(logits, dim=-1)
    sampled = sampling_distribution(logits[None], temperature, top_k, top_p)[0]  # (V,)
    top_probs, top_ids = probs.topk(min(TOP, probs.numel()))
    labels = model.tokenizer.labels(top_ids.tolist())
    texts = [continuation(model.tokenizer, p.ids[:position + 1], i) for i in top_ids.tolist()]
    kept = sampled > 0
    return {
        "position": position,
        "after": p.tokens[position],
        "next": [{"token": label, "text": text, "id": int(i), "prob": float(pr), "sample_prob": float(sampled[i]),
                  "kept": bool(kept[i])}
                 for label, text, i, pr in zip(labels, texts, top_ids.tolist(), top_probs.tolist())],
        "kept": int(kept.sum()), "kept_mass": float(probs[kept].sum()),
        "settings": {"temperature": temperature, "top_k": top_k, "top_p": top_p},
    }


def run(slot: ModelSlot, p: Pass, settings: dict) -> dict:
    """The page's first call for a text: its tokens and ids, and the next-token distribution
    (an encoder: its first mask's candidates; an encoder-decoder: the target's next token)."""
    model = slot.get()
    position = settings.get("position")
    if position is None:
        position = default_position(model, p)
    elif not isinstance(position, int) or isinstance(position, bool) or not 0 <= position < len(p.ids):
        raise ExploreError(f"'position' must be an integer in [0, {len(p.ids) - 1}]")
    out = {
        "model": slot.name, "arch": model.config.arch, "tokens": p.tokens, "ids": p.ids,
        "source": None if p.source_ids is None else {"tokens": p.source_tokens, "ids": p.source_ids},
        "target": model.tokenizer.decode(p.ids) if p.source_ids is not None else None,
        "translated": p.translated, "n_layers": layer_count(model), "n_heads": head_count(model),
        "mask_token": model.tokenizer.mask_token, "ms": round(1000 * p.seconds, 1), "computed": len(p.ids) - p.kept,
        "next": [], "distribution": None,
    }
    if position is not None:
        out["distribution"] = distribution(model, p, position, settings)
        out["next"] = [{k: row[k] for k in ("token", "id", "prob")} for row in out["distribution"]["next"]]
    elif model.config.arch == "encoder":
        out["note"] = (f"type {model.tokenizer.mask_token} where a word should be guessed"
                       if model.tokenizer.mask_id is not None and p.predicts
                       else "this encoder has no masked-language head: it writes vectors, not words")
    return out


# ---- the walk -------------------------------------------------------------------------------------


def vocabulary(slot: ModelSlot) -> list[str]:
    """Every token of the model's vocabulary as text (Tokenizer.labels), made once per model: the walk
    labels the one-hot columns and the logits with them."""
    if "vocabulary" not in slot.cache:
        slot.cache["vocabulary"] = slot.get().tokenizer.labels(list(range(slot.get().config.vocab_size)))
    return slot.cache["vocabulary"]


@dataclass
class BuiltWalk:
    """The walk built on a pass for one (layer, head, row), kept for the next step opened."""

    key: tuple
    walk: object  # a Walkthrough

    def tensors(self) -> list[torch.Tensor]:
        """The matrices of the steps built so far (the memory the pass's budget counts)."""
        return [m.values for step in self.walk.steps if step.built for m in step.matrices]


def walk(slot: ModelSlot, p: Pass, settings: dict) -> dict:
    """The walk's steps (anatomy.walk's builders) for a layer, a head and a row: each step's title and
    check, and, for the steps `open` names (numbers), the HTML the walk's page renders (MathML, shaded
    matrices, the worked row, the float64 checks). The steps that cost as much as a pass (the float64
    logits over the vocabulary) are built only when opened; the walk of a pass is kept for the next
    step opened."""
    model = slot.get()
    layer = int_setting(settings, "layer", 0, 0, layer_count(model) - 1)
    head = int_setting(settings, "head", 0, 0, head_count(model) - 1)
    read = default_position(model, p)  # an encoder's mask, else the last row
    focus = int_setting(settings, "row", len(p.ids) - 1 if read is None else read, 0, len(p.ids) - 1)
    opened = settings.get("open", [])
    if not isinstance(opened, list) or not all(isinstance(n, int) and not isinstance(n, bool) for n in opened):
        raise ExploreError("'open' must be a list of step numbers")
    key = (layer, head, focus)
    if "walk" not in p.memo or p.memo["walk"].key != key:
        options = dict(layer=layer, head=head, focus=focus, model_name=slot.name, vocab=vocabulary(slot), lazy=True)
        if p.source_ids is not None:
            result = walkthrough(model, p.source_ids, tokens=p.source_tokens, target_ids=p.ids,
                                 target_tokens=p.tokens, **options)
        else:
            mask = model.tokenizer.mask_token if model.config.arch == "encoder" else None
            result = walkthrough(model, p.ids, tokens=p.tokens, mask_token=mask, cache=p.trace, **options)
        p.memo["walk"] = BuiltWalk(key, result)
    result = p.memo["walk"].walk
    html = {s.number: section(s) for s in result.steps if s.number in opened}  # builds the opened ones
    checks = [c for s in result.steps if s.built for c in s.checks]
    return {"layer": layer, "head": head, "row": focus, "ok": all(c.ok for c in checks), "checks": len(checks),
            "worst": max((c.max_diff for c in checks), default=0.0),
            "later": sum(not s.built for s in result.steps),
            "steps": [{"number": s.number, "section": s.section, "title": s.title, "built": s.built,
                       "ok": s.ok if s.built else None, "html": html.get(s.number)} for s in result.steps]}


# ---- attention ------------------------------------------------------------------------------------


def attention_maps(model: nn.Module, p: Pass) -> list[dict]:
    """The attention maps of the pass: self-attention, or an encoder-decoder's three."""
    if p.source_ids is None:
        name = "causal self-attention" if model.config.arch == "decoder" else "self-attention"
        return [{"name": name, "stack": "", "attention": "attn", "queries": p.tokens, "keys": p.tokens}]
    return [
        {"name": "encoder self-attention", "stack": "encoder.", "attention": "attn", "queries": p.source_tokens,
         "keys": p.source_tokens},
        {"name": "decoder self-attention (causal)", "stack": "decoder.", "attention": "attn", "queries": p.tokens,
         "keys": p.tokens},
        {"name": "cross-attention", "stack": "decoder.", "attention": "cross_attn", "queries": p.tokens,
         "keys": p.source_tokens},
    ]


def attention(slot: ModelSlot, p: Pass, settings: dict) -> dict:
    """One layer of one map (anatomy.viz's AttentionMap of that layer of the pass's trace): weights
    [H, T, S]; with `heads` "one", only head `head`'s, [1, T, S] (a long text's head view); with
    `thumbnail` n, instead each head's weights averaged over at most n × n blocks, thumbnails
    [H, ≤n, ≤n] (the model view); with `head` and `query`, the neuron view's q, k, q ∘ k, scores
    and softmax for that query."""
    model = slot.get()
    maps = attention_maps(model, p)
    which = int_setting(settings, "map", 0, 0, len(maps) - 1)
    spec = maps[which]
    stack = getattr(model, spec["stack"][:-1]) if spec["stack"] else model
    n_layers = len(stack.blocks)
    layer = int_setting(settings, "layer", 0, 0, n_layers - 1)
    found = from_trace(p.trace, spec["queries"], spec["keys"], stack=spec["stack"], attention=spec["attention"],
                       name=spec["name"], layers=[layer])
    weights = torch.from_numpy(found.weights[0])  # (H, T, S)
    out = {"maps": [{k: m[k] for k in ("name", "queries", "keys")} for m in maps], "map": which, "layer": layer,
           "n_layers": n_layers, "n_heads": found.n_heads}
    shown = settings.get("heads", "all")
    if shown not in ("all", "one"):
        raise ExploreError(f"'heads' must be 'all' or 'one', got {str(shown)[:50]!r}")
    if settings.get("thumbnail") is not None:
        n = int_setting(settings, "thumbnail", 54, 1, MAX_TOKENS)
        size = (min(n, weights.size(1)), min(n, weights.size(2)))
        out["thumbnails"] = rounded(F.adaptive_avg_pool2d(weights, size), 3)  # (H, ≤n, ≤n): block means
    elif shown == "one":
        head = int_setting(settings, "head", 0, 0, found.n_heads - 1)
        out["weights"], out["heads_shown"] = rounded(weights[head:head + 1], 4), [head]
    else:
        out["weights"] = rounded(weights, 4)
    if settings.get("head") is not None and found.has_vectors:
        head = int_setting(settings, "head", 0, 0, found.n_heads - 1)
        query = int_setting(settings, "query", len(spec["queries"]) - 1, 0, len(spec["queries"]) - 1)
        q = torch.from_numpy(found.q[0, head, query])  # (D,)
        k = torch.from_numpy(found.k[0, head])  # (S, D)
        out["neuron"] = {"head": head, "query": query, "q": rounded(q, 4), "k": rounded(k, 4),
                         "q_times_k": rounded(q[None] * k, 4), "scores": rounded(k @ q / math.sqrt(q.numel()), 5),
                         "weights": rounded(weights[head, query], 5)}
    return out


def kl_divergence(p_logits: torch.Tensor, q_logits: torch.Tensor) -> float:
    """KL(p || q) = sum_i p_i (log p_i - log q_i) of the two softmax distributions, in float64."""
    p, q = torch.softmax(p_logits.double(), dim=-1), torch.softmax(q_logits.double(), dim=-1)
    return float((p * (p.clamp_min(1e-30).log() - q.clamp_min(1e-30).log())).sum())


def before_after(model: nn.Module, before_logits: torch.Tensor, after_logits: torch.Tensor) -> dict:
    """Two next-token distributions side by side: the tokens on top of either, and KL(before || after)."""
    before = torch.softmax(before_logits.double(), dim=-1)
    after = torch.softmax(after_logits.double(), dim=-1)
    k = min(TOP, before.numel())
    ids = torch.cat([before.topk(k).indices, after.topk(k).indices]).unique().tolist()
    ids.sort(key=lambda i: -float(before[i]))
    return {"kl": kl_divergence(before_logits, after_logits), "rows": [{"token": t, "id": i, "before": float(before[i]), "after": float(after[i])}
                               for t, i in zip(model.tokenizer.labels(ids), ids)]}


__all__ = ["attention", "run", "walk"]
