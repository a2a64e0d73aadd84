"""A traced pass that a longer text continues: the shared prefix kept, only the new positions computed.

Shape letters: B batch (1 here), T positions, K key/value heads, D head width, V vocabulary.

In a causal decoder no position reads a later one, so when a text grows, or its last tokens change,
every intermediate of the positions it shares with the previous text is unchanged. `extend(model,
ids, previous)` keeps the longest common prefix of previous.ids and ids (the ids, not the
characters: retokenisation may change the last tokens), reads that prefix's keys and values from
the previous trace into a KV cache, and runs the model on the new positions only, as a serving
engine's prefix cache does. The trace it returns answers every name run_with_cache's answers, in
the same order, equal to a full pass within float32 round-off (tests/analysis/test_prefix.py, for
every decoder layout and family):

    stored points (q, k, v, attn.out, mlp.pre, mlp.out, logits ...)   the kept positions, then the new
                                                                      ones; joined when first read
    derived points (derived.py: q_rot, scores, pattern, z, the        recipes over those, with the
    residual stream, the norms' outputs)                              attention inputs of a full pass
                                                                      (Stack.attention_inputs)

so a keystroke costs the new positions' pass, and a panel pays for what it reads. An encoder or an
encoder-decoder reads in both directions (a new token changes every position), T5's relative
position bias is a [query, key] point of its own, and a mixture of experts records inside each
expert only the tokens routed to it (a pass over the new positions alone records other points):
`extendable(model)` says which models this serves; the others run run_with_cache in full.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..attention import MultiHeadAttention
from ..trace import Trace, trace, trace_points
from .derived import Derivations

POSITION_AXES = ("pos", "query", "key")  # the axis along which a point grows with the text


def extendable(model: nn.Module) -> bool:
    """Whether extend() serves `model`: a causal decoder in evaluation mode, without T5's relative
    position bias (a point over queries and keys at once) and without a mixture of experts."""
    config = model.config
    return (config.arch == "decoder" and config.pos_encoding != "relative" and not config.n_experts
            and not model.training)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of two id sequences."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class Positions:
    """One stored point's value as pieces along its position axis, [B, ..., T_piece, ...] each: the
    kept prefix's pieces, then the new positions'. The trace joins them (torch.cat) when it first
    reads the point, and the joined tensor becomes the only piece, which the next text's pass keeps
    a view of."""

    def __init__(self, axis: int, parts: list[torch.Tensor]):
        self.axis = axis
        self.parts = parts

    def join(self, *parts: torch.Tensor) -> torch.Tensor:
        """The recipe the trace keeps: the pieces, concatenated along the position axis."""
        value = parts[0] if len(parts) == 1 else torch.cat(parts, dim=self.axis)
        self.parts = [value]
        return value

    def first(self, n: int) -> list[torch.Tensor]:
        """The pieces of positions 0..n-1 (views, nothing copied)."""
        kept, start = [], 0
        for part in self.parts:
            size = part.size(self.axis)
            if start >= n:
                break
            kept.append(part if start + size <= n else part.narrow(self.axis, 0, n - start))
            start += size
        return kept

    def at(self, t: int) -> torch.Tensor:
        """Position t's slice, the position axis dropped (nothing joined)."""
        start = 0
        for part in self.parts:
            size = part.size(self.axis)
            if t < start + size:
                return part.select(self.axis, t - start)
            start += size
        raise IndexError(f"position {t} is out of range: the point has {start} positions")


@dataclass
class PrefixPass:
    """A traced pass of `ids` [T] that extend() can continue: its trace (every point, as
    run_with_cache records it) and the pieces of its stored points."""

    ids: list[int]
    trace: Trace
    stored: dict[str, Positions]
    computed: int  # how many positions this pass ran (the others were kept from the previous one)

    def logits_at(self, t: int) -> torch.Tensor:
        """[V]: the logits at position t, read from their piece (the [T, V] logits never joined)."""
        return self.stored["logits"].at(t)[0]


def _position_axis(name: str, axes: tuple[str, ...]) -> int:
    found = [i for i, axis in enumerate(axes) if axis in POSITION_AXES]
    if len(found) != 1:
        raise ValueError(f"trace point {name!r} ({' '.join(axes)}) has no single position axis to extend along")
    return found[0]


class _Plan:
    """What extend() reads of a model's structure, found once per model and thread (walking SmolLM2's
    modules costs 25 ms): its recipes, each point's axes, its attention layers."""

    def __init__(self, model: nn.Module):
        self.derivations = Derivations(model)
        self.axes = {name: point.axes for name, point in trace_points(model).items()}
        self.attention = [(name, module) for name, module in model.named_modules()
                          if isinstance(module, MultiHeadAttention)]


_plans = threading.local()


def _plan(model: nn.Module) -> _Plan:
    known = getattr(_plans, "by_model", None)
    if known is None:
        known = _plans.by_model = weakref.WeakKeyDictionary()
    if model not in known:
        known[model] = _Plan(model)
    return known[model]


def _full_pass_inputs(model: nn.Module, derivations: Derivations, total: int, dtype: torch.dtype) -> None:
    """Give `derivations` the attention inputs a full pass of `total` positions reads (its masks, its
    position bias, positions 0..total-1), so that its recipes compute the full pass's values."""
    device = model.token_embedding.weight.device
    layer_masks, bias = model.attention_inputs(None, total, device=device, dtype=dtype)
    position_ids = torch.arange(total, device=device)
    for block, kind in zip(model.blocks, model.config.layer_types):
        derivations.calls[block.attn] = {"mask": layer_masks[kind][0], "bias": bias, "position_ids": position_ids}


def _kept_cache(model: nn.Module, plan: _Plan, previous: PrefixPass, keep: int, total: int):
    """A KV cache for `total` positions holding the first `keep` positions' keys (after rotary, as the
    cache stores them) and values, read from the previous pass's trace."""
    cache = model.new_cache(total)
    for name, attention in plan.attention:
        rotated = f"{name}.k_rot" if attention.rotary is not None else f"{name}.k"
        keys = previous.trace[rotated].narrow(2, 0, keep)  # (B, K, keep, D)
        values = previous.trace[f"{name}.v"].narrow(2, 0, keep)  # (B, K, keep, D)
        cache.append(attention.layer_index, keys, values)
    cache.advance()
    return cache


def extend(model: nn.Module, ids: Sequence[int], previous: PrefixPass | None = None,
           tokens: list[str] | None = None, check: Callable[[], None] | None = None) -> PrefixPass:
    """The traced pass of `ids` [T], continuing `previous` (None: a pass from scratch): the longest
    common prefix of the two id sequences is kept (at most T - 1 positions, so that at least the
    last one runs), the other positions are computed with a KV cache of the kept ones. `tokens`:
    the trace's string tokens (default: model.tokenizer's labels of the ids, if it has one).
    `check()`, called at every trace point, may raise to stop the pass (the explorer's, once a later
    keystroke superseded the text); nothing is kept of a stopped pass, and `previous` is intact.

    Raises ValueError for a model extendable() refuses, or for no ids.
    """
    if not extendable(model):
        raise ValueError("extend() continues the pass of a causal decoder in evaluation mode, without T5's relative "
                         "positions or a mixture of experts (extendable(model)); run run_with_cache in full")
    ids = [int(i) for i in ids]
    if not ids:
        raise ValueError("extend() needs at least one id")
    if previous is not None and previous.ids == ids:
        return previous
    total = len(ids)
    keep = 0 if previous is None else min(common_prefix(previous.ids, ids), total - 1)
    plan = _plan(model)
    cache = _kept_cache(model, plan, previous, keep, total) if keep else model.new_cache(total)
    derivations = plan.derivations
    _full_pass_inputs(model, derivations, total, model.token_embedding.weight.dtype)
    stored: dict[str, Positions] = {}

    def derive(name: str, x: torch.Tensor) -> tuple:
        """A full pass's recipe where it has one; else the kept positions' pieces, then x's."""
        if check is not None:
            check()
        recipe = derivations(name, x)
        if recipe is not None:
            return recipe
        kept = []
        if keep:
            if name not in previous.stored:
                raise RuntimeError(f"the previous pass derived {name!r}, which this one stores: it cannot be continued")
            kept = previous.stored[name].first(keep)
        pieces = stored[name] = Positions(_position_axis(name, plan.axes[name]), [*kept, x])
        return pieces.join, tuple(pieces.parts)

    device = model.token_embedding.weight.device
    try:
        with torch.no_grad(), trace(model, None, derive=derive) as recorded:
            model(torch.tensor([ids[keep:]], device=device), cache=cache)
    finally:
        derivations.seen.clear()  # this pass's tensors and inputs: the plan outlives them
        derivations.calls.clear()
    tokenizer = getattr(model, "tokenizer", None)
    recorded.tokens = [list(tokens) if tokens is not None else
                       tokenizer.labels(ids) if tokenizer is not None else [str(i) for i in ids]]
    return PrefixPass(ids, recorded, stored, total - keep)


__all__ = ["Positions", "PrefixPass", "common_prefix", "extend", "extendable"]
