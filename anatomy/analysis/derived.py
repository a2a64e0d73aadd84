"""The trace points a full cache keeps as recipes: each is the same operation, on the same tensors,
as the forward pass computed it with, so the value read later is bitwise the one that pass made.

    blocks.L.attn.pattern = attention_weights(blocks.L.attn.scores, mask)    the kernel's own function
    blocks.L.mlp.post     = act(blocks.L.mlp.pre)                            a feed-forward without a gate
    blocks.L.resid_mid    = resid_pre + attn.out (or + attn_out_norm.out)    sequential blocks, no dropout
    <norm>.out            = norm(its input point)                            a snapshot of the norm's weights

A norm whose input is not a trace point (post-norm blocks, q/k norms) is stored, as is every point
whose operation is a matrix product: recomputing those would be the forward pass again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial

import torch
from torch import nn
from torch.func import functional_call

from ..attention import MultiHeadAttention, attention_weights
from ..blocks import Block
from ..layers import FeedForward
from ..models import Stack

Recipe = Callable[[], "tuple | None"]  # asked when the point is reached: (fn, args) or None


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _norm_of(norm: nn.Module, source: str) -> Recipe:
    """norm.out = norm(source), with the weights the pass used (copied: they may change later)."""
    def apply(x: torch.Tensor, weights: dict[str, torch.Tensor]) -> torch.Tensor:
        return functional_call(norm, weights, (x,))

    def recipe():
        return apply, (source, {name: p.detach().clone() for name, p in norm.named_parameters()})
    return recipe


def _activation(act: Callable, pre: str) -> Recipe:
    """mlp.post = act(mlp.pre)."""
    return lambda: (act, (pre,))


def _residual(block: Block, update: str, source: str) -> Recipe:
    """x + Dropout(update) = x + update while the dropout is the identity."""
    def recipe():
        if block.dropout.training and block.dropout.p > 0.0:
            return None
        return torch.add, (source, update)
    return recipe


class Derivations:
    """`derive` for anatomy.trace: name -> recipe, for the points of `model` that have one.

    The attention masks are arguments of the pass, not trace points: `capturing()` keeps each
    attention layer's mask of the pass that runs inside it."""

    def __init__(self, model: nn.Module):
        self.recipes: dict[str, Recipe] = {}
        self.masks: dict[nn.Module, torch.Tensor | None] = {}
        self._attention = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
        for prefix, module in model.named_modules():
            if isinstance(module, MultiHeadAttention):
                self.recipes[_join(prefix, "pattern")] = self._pattern(module, _join(prefix, "scores"))
            elif isinstance(module, FeedForward) and not module.gated:
                self.recipes[_join(prefix, "post")] = _activation(module.act, _join(prefix, "pre"))
            elif isinstance(module, Block):
                self._block(prefix, module)
            elif isinstance(module, Stack) and len(module.blocks) and hasattr(module, "final_norm"):
                source = _join(prefix, f"blocks.{len(module.blocks) - 1}.resid_post")
                self.recipes[_join(prefix, "final_norm.out")] = _norm_of(module.final_norm, source)

    def _pattern(self, attention: MultiHeadAttention, scores: str) -> Recipe:
        return lambda: (attention_weights, (scores, self.masks.get(attention)))

    def _block(self, prefix: str, block: Block) -> None:
        name = partial(_join, prefix)
        if block.parallel:  # both sublayers read resid_pre
            inputs = {"attn_norm": "resid_pre", "mlp_norm": "resid_pre"}
        elif block.norm_position in ("pre", "sandwich"):
            after_cross = "resid_cross" if block.has_cross_attention else "resid_mid"
            inputs = {"attn_norm": "resid_pre", "cross_attn_norm": "resid_mid", "mlp_norm": after_cross}
        else:  # post: the norm reads x + Sublayer(x), which is no point; post_sublayer: no input norms
            inputs = {}
        for norm, source in inputs.items():
            if hasattr(block, norm):
                self.recipes[name(f"{norm}.out")] = _norm_of(getattr(block, norm), name(source))
        if not block.parallel and block.norm_position != "post":
            update = "attn_out_norm.out" if hasattr(block, "attn_out_norm") else "attn.out"
            self.recipes[name("resid_mid")] = _residual(block, name(update), name("resid_pre"))

    def __call__(self, name: str) -> tuple | None:
        recipe = self.recipes.get(name)
        return recipe() if recipe is not None else None

    @contextmanager
    def capturing(self) -> Iterator["Derivations"]:
        """Keep each attention layer's `mask` argument while the block runs."""
        def keep(module, args, kwargs):
            self.masks[module] = kwargs.get("mask")

        handles = [m.register_forward_pre_hook(keep, with_kwargs=True) for m in self._attention]
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()
