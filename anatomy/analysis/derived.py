"""The trace points a full cache keeps as recipes: each is the same operation, on the same tensors,
as the forward pass computed it with, so the value read later is bitwise the one that pass made.

    blocks.L.attn.q_rot   = rotary(q, position_ids), k_rot likewise          the tables the pass read
    blocks.L.attn.scores  = attention_scores(q or q_rot, repeat_kv(k or k_rot), bias, scale, softcap)
    blocks.L.attn.pattern = attention_weights(scores, mask)                  the eager kernel's functions
    blocks.L.attn.z       = (pattern @ repeat_kv(v)) transposed to [batch query head d_head]
    blocks.L.mlp.post     = act(mlp.pre)                                      a feed-forward without a gate
    blocks.L.resid_mid    = resid_pre + attn.out (or + attn_out_norm.out)     sequential blocks, no dropout
    blocks.L.resid_cross  = resid_mid + cross_attn.out (or its out norm)      the same, cross-attention
    blocks.L.resid_post   = resid_mid (or resid_cross) + mlp.out (or + mlp_out_norm.out), or for a
                            parallel block resid_pre + attn.out + mlp.out     the same sums, same order
    blocks.L.resid_pre    = blocks.L-1.resid_post                             the very tensor, checked
    <norm>.out            = norm(its input point)                             a snapshot of the norm's weights

These chain: the pattern reads the derived scores, z the derived pattern, and the residual stream
of a whole stack is one chain from the first block's resid_pre (stored) through every attn.out
and mlp.out (stored). Reading a derived point computes what it reads, once, and keeps all of it.

Stored instead, because recomputing would not give the same bits or would be the pass again:
every matrix product of a weight (q, k, v, attn.out, mlp.pre, mlp.out, logits); a norm whose
input is not a trace point (post-norm blocks, q/k norms); scores, pattern and z of a pass with a
KV cache (the keys include past ones no point recorded); z while attention dropout is active;
every residual sum while the block's dropout is active, and post-norm residuals (a norm of a sum);
a resid_pre that is not the tensor the previous block's resid_post saw (a hook changed it);
anything recorded under autocast (the recipe would run in another precision).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial

import torch
from torch import nn
from torch.func import functional_call

from ..attention import MultiHeadAttention, attention_scores, attention_weights, repeat_kv
from ..blocks import Block
from ..layers import FeedForward
from ..stack import Stack

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


def _sum(*terms: torch.Tensor) -> torch.Tensor:
    """x + a (+ b), added left to right as the block adds them."""
    total = terms[0]
    for term in terms[1:]:
        total = total + term
    return total


def _residual(block: Block, source: str, *updates: str) -> Recipe:
    """x + Dropout(update) (+ Dropout(update')) = x + update (+ update') while the dropout is the identity."""
    def recipe():
        if block.dropout.training and block.dropout.p > 0.0:
            return None
        return _sum, (source, *updates)
    return recipe


def _same(x: torch.Tensor) -> torch.Tensor:
    return x


class Derivations:
    """`derive` for anatomy.trace: (name, tensor) -> recipe, for the points of `model` that have one.

    The attention's mask, bias and KV cache are arguments of the pass, not trace points:
    `capturing()` keeps each attention layer's of the pass that runs inside it."""

    def __init__(self, model: nn.Module):
        self.recipes: dict[str, Recipe] = {}
        self.calls: dict[nn.Module, dict] = {}  # attention layer -> the keyword arguments of its call
        self.seen: dict[str, weakref.ref] = {}  # resid_post -> the tensor the pass recorded there
        self.aliases: dict[str, str] = {}  # blocks.L.resid_pre -> blocks.L-1.resid_post
        self._attention = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
        for prefix, module in model.named_modules():
            if isinstance(module, MultiHeadAttention):
                self._attention_points(partial(_join, prefix), module)
            elif isinstance(module, FeedForward) and not module.gated:
                self.recipes[_join(prefix, "post")] = _activation(module.act, _join(prefix, "pre"))
            elif isinstance(module, Block):
                self._block(prefix, module)
            elif isinstance(module, Stack) and len(module.blocks):
                self._stack(prefix, module)

    def _attention_points(self, name: Callable[[str], str], attention: MultiHeadAttention) -> None:
        rotated = attention.rotary is not None and not attention.cross
        q, k = (name("q_rot"), name("k_rot")) if rotated else (name("q"), name("k"))

        def scores(q, k, bias, scale, softcap):  # q [B, H, T, D], k [B, K, S, D] -> [B, H, T, S]
            return attention_scores(q, repeat_kv(k, attention.n_heads), bias=bias, scale=scale, softcap=softcap)

        def z(pattern, v):  # [B, H, T, S] @ [B, K, S, D] -> [B, H, T, D] -> [B, T, H, D], the point's axes
            return torch.matmul(pattern, repeat_kv(v, attention.n_heads)).transpose(1, 2)

        def call(recipe):  # no recipe outside capturing(), nor for a pass with a KV cache (earlier keys)
            def ask():
                kwargs = self.calls.get(attention)
                return None if kwargs is None or kwargs.get("cache") is not None else recipe(kwargs)
            return ask

        def z_recipe(kwargs):  # the kernel's output is dropout(pattern) @ v
            return None if attention.training and attention.dropout_p > 0.0 else (z, (name("pattern"), name("v")))

        if rotated:  # q_rot = rotary(q, position_ids), with the cos/sin tables the pass read
            def rotate(x, position_ids, tables):
                return functional_call(attention.rotary, tables, (x, position_ids))

            for point, source in (("q_rot", "q"), ("k_rot", "k")):
                self.recipes[name(point)] = call(lambda kwargs, source=source: (
                    rotate, (name(source), kwargs.get("position_ids"), dict(attention.rotary.named_buffers()))))
        self.recipes[name("scores")] = call(
            lambda kwargs: (scores, (q, k, kwargs.get("bias"), attention.scale, attention.softcap)))
        self.recipes[name("pattern")] = call(lambda kwargs: (attention_weights, (name("scores"), kwargs.get("mask"))))
        self.recipes[name("z")] = call(z_recipe)

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
        if block.norm_position == "post":
            return

        def update(sublayer: str) -> str:  # what the residual adds: the sublayer's output, or its out norm
            return name(f"{sublayer}_out_norm.out" if hasattr(block, f"{sublayer}_out_norm") else f"{sublayer}.out")

        if block.parallel:  # x + Attn(Norm(x)) + MLP(Norm''(x))
            self.recipes[name("resid_post")] = _residual(block, name("resid_pre"), update("attn"), update("mlp"))
            return
        self.recipes[name("resid_mid")] = _residual(block, name("resid_pre"), update("attn"))
        last = "resid_mid"
        if block.has_cross_attention:
            self.recipes[name("resid_cross")] = _residual(block, name("resid_mid"), update("cross_attn"))
            last = "resid_cross"
        self.recipes[name("resid_post")] = _residual(block, name(last), update("mlp"))

    def _stack(self, prefix: str, stack: Stack) -> None:
        """Block L + 1 reads what block L returned; the final norm reads the last block's output."""
        for i in range(1, len(stack.blocks)):
            self.aliases[_join(prefix, f"blocks.{i}.resid_pre")] = _join(prefix, f"blocks.{i - 1}.resid_post")
        if hasattr(stack, "final_norm"):
            last = _join(prefix, f"blocks.{len(stack.blocks) - 1}.resid_post")
            self.recipes[_join(prefix, "final_norm.out")] = _norm_of(stack.final_norm, last)

    def __call__(self, name: str, x: torch.Tensor) -> tuple | None:
        if torch.is_autocast_enabled(x.device.type):
            return None  # a recipe runs later, perhaps outside autocast: another precision, other bits
        if name.endswith("resid_post"):
            self.seen[name] = weakref.ref(x)
        source = self.aliases.get(name)
        if source is not None:  # resid_pre of block L + 1: the resid_post of block L only if it is that very tensor
            seen = self.seen.get(source)
            return (_same, (source,)) if seen is not None and seen() is x else None
        recipe = self.recipes.get(name)
        return recipe() if recipe is not None else None

    @contextmanager
    def capturing(self) -> Iterator["Derivations"]:
        """Keep each attention layer's keyword arguments (mask, bias, cache) while the block runs, of
        this thread's pass only: like a trace, it belongs to the thread that opened it (a pass in
        another thread, on the same model at the same time, has a mask of its own)."""
        owner = threading.get_ident()

        def keep(module, args, kwargs):
            if threading.get_ident() == owner:
                self.calls[module] = kwargs

        handles = [m.register_forward_pre_hook(keep, with_kwargs=True) for m in self._attention]
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()
            self.calls.clear()
            self.seen.clear()
