"""Attention: the source texts' scaled dot-product attention, its two kernels, and multi-head attention.

Shape letters: B batch, H query heads, K key/value heads, T query positions, S key positions,
D head width (d_head), E model width (d_model).

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V                     (the paper, eq. 1)
    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,
        head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)                      (section 3.2.2)

Masks are boolean, True = may attend, and every one is built in masks.py, never in a kernel.

Kernels share one signature, kernel(q, k, v, mask, *, is_causal, bias, scale, softcap, dropout_p,
on_scores, on_pattern) -> (output, weights or None), and ATTENTION_KERNELS names them: the module
calls the one config.attn_impl names, or eager_attention when only it can compute what is asked.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .layers import RMSNorm
from .positional import RotaryEmbedding
from .trace import TracePoint

TensorFn = Callable[[torch.Tensor], torch.Tensor]


def scaled_dot_product_attention(q, k, v, mask=None) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T / sqrt(d_k)) v, for any leading dimensions: the source texts' function, corrected.

    q [..., T, D], k [..., S, D], v [..., S, Dv]; mask bool broadcastable to [..., T, S],
    True = may attend. Returns (output [..., T, Dv], weights [..., T, S]). A query row with no key
    to attend to gets zero weights and a zero output, never NaN. Array-likes (numpy, lists) are
    accepted and computed in float64.
    """
    q, k, v = (x if torch.is_tensor(x) else torch.as_tensor(x, dtype=torch.float64) for x in (q, k, v))
    if mask is not None and not torch.is_tensor(mask):
        mask = torch.as_tensor(mask)
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError(f"mask must be boolean (True = may attend), got dtype {mask.dtype}")
    return eager_attention(q, k, v, mask)


def attention_weights(scores: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(scores) over the keys each query may attend to: scores [..., T, S] -> weights [..., T, S].

    mask bool broadcastable to the scores, True = may attend; a row with no allowed key gets zeros.
    """
    if mask is not None:
        # Adding finfo.min (not -inf) to forbidden scores: exp() sends them to exactly 0.
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)  # (..., T, S), rows sum to 1
    if mask is not None:
        # A row with no allowed key would be uniform over forbidden keys: make it zero instead.
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    return weights


def attention_scores(q: torch.Tensor, k: torch.Tensor, *, bias: torch.Tensor | None = None,
                     scale: float | None = None, softcap: float | None = None) -> torch.Tensor:
    """The scores before the softmax: q [B, H, T, D], k [B, H, S, D] -> [B, H, T, S].

        scores = c * tanh((q k^T * scale) / c) + bias      scale = 1/sqrt(D) unless given; softcap c

    The eager kernel's first step, and how a cache recomputes the scores it did not keep (same ops, same bits).
    """
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale  # (B, H, T, S)
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if bias is not None:
        scores = scores + bias
    return scores


def repeat_kv(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """[B, K, S, D] -> [B, H, S, D]: grouped-query attention, each key/value head serving H / K query heads."""
    if x.size(1) == n_heads:
        return x
    return x.repeat_interleave(n_heads // x.size(1), dim=1)  # head h reads key/value head h // (H / K)


def eager_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    is_causal: bool = False,
    bias: torch.Tensor | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    dropout_p: float = 0.0,
    on_scores: TensorFn | None = None,
    on_pattern: TensorFn | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The explicit computation, step by step; returns (output, weights).

    q [B, H, T, D], k and v [B, H, S, D]; mask bool broadcastable to [B, H, T, S], the whole
    constraint (is_causal only tells a fused kernel that mask is the causal triangle, so it is
    refused here without a mask). scale defaults to 1/sqrt(D). softcap c bounds the scores,
    c * tanh(scores / c) (Gemma 2); bias (ALiBi) is added to the scaled scores. `on_scores` and
    `on_pattern` see (and may replace) the scores and the softmax weights: the trace points.
    """
    if is_causal and mask is None:
        raise ValueError("is_causal=True says `mask` is the causal triangle; give the mask (masks.self_attention_mask)")
    scores = attention_scores(q, k, bias=bias, scale=scale, softcap=softcap)  # (B, H, T, S)
    if on_scores is not None:
        scores = on_scores(scores)
    weights = attention_weights(scores, mask)  # (B, H, T, S)
    if on_pattern is not None:
        weights = on_pattern(weights)
    if dropout_p > 0.0:
        weights_used = F.dropout(weights, p=dropout_p)
    else:
        weights_used = weights
    return torch.matmul(weights_used, v), weights  # (B, H, T, D), (B, H, T, S)


def sdpa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    is_causal: bool = False,
    bias: torch.Tensor | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    dropout_p: float = 0.0,
    on_scores: TensorFn | None = None,
    on_pattern: TensorFn | None = None,
) -> tuple[torch.Tensor, None]:
    """torch's fused kernel (flash / memory-efficient / math, chosen by torch): same result as
    eager_attention, without materialising the weights, which it therefore cannot return, see or
    soft-cap: asking for softcap, on_scores or on_pattern raises ValueError."""
    if softcap is not None or on_scores is not None or on_pattern is not None:
        raise ValueError("the fused kernel neither soft-caps nor exposes scores or weights; use eager_attention")
    attn_mask = None if (is_causal and bias is None) else mask  # the kernel's own flag stands for the triangle
    if bias is not None:
        attn_mask = bias if mask is None else bias.masked_fill(~mask, torch.finfo(bias.dtype).min)
        attn_mask = attn_mask.to(q.dtype)
    output = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=attn_mask is None and is_causal, scale=scale
    )
    if bias is not None and mask is not None:
        # With an additive mask the fused kernel cannot know a row was entirely forbidden.
        output = output.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    return output, None


ATTENTION_KERNELS = {"eager": eager_attention, "sdpa": sdpa_attention}


class MultiHeadAttention(nn.Module):
    """Multi-head attention, for self-attention and for cross-attention.

    Separate projections q_proj, k_proj, v_proj (E -> H*D, K*D, K*D) and o_proj (H*D -> E).
    With n_kv_heads < n_heads (grouped-query attention) each key/value head serves
    n_heads / n_kv_heads query heads.

    Options (ModelConfig): qk_norm, an RMSNorm on queries and keys before the rotation, over each
    head (q_norm, k_norm of width D) or over all heads at once (width H*D, K*D); scores scaled by
    1/sqrt(query_pre_attn_scalar) instead of 1/sqrt(D); attn_softcap.

    Trace points: q, k, v [batch head pos d_head] (k, v with the key/value heads), q_rot, k_rot
    after rotary positions, scores and pattern [batch head query key], z [batch query head d_head]
    (each head's output before W^O), out [batch query d_model].
    """

    def __init__(self, config, *, layer_index: int, cross: bool = False, rotary: RotaryEmbedding | None = None):
        super().__init__()
        self.n_heads = config.n_heads
        self.n_kv_heads = config.n_kv_heads
        self.d_head = config.d_head
        self.layer_index = layer_index
        self.cross = cross
        self.attn_impl = config.attn_impl
        self.dropout_p = config.effective_attn_dropout
        self.q_proj = nn.Linear(config.d_model, self.n_heads * self.d_head, bias=config.attn_bias)
        self.k_proj = nn.Linear(config.d_model, self.n_kv_heads * self.d_head, bias=config.attn_bias)
        self.v_proj = nn.Linear(config.d_model, self.n_kv_heads * self.d_head, bias=config.attn_bias)
        self.o_proj = nn.Linear(self.n_heads * self.d_head, config.d_model, bias=config.attn_out_bias)
        self.qk_norm = config.qk_norm
        if config.qk_norm != "none":
            per_head = config.qk_norm == "per_head"
            q_width, k_width = (self.d_head, self.d_head) if per_head else (
                self.n_heads * self.d_head, self.n_kv_heads * self.d_head)
            axes = ("batch head pos d_head", "batch kv_head pos d_head") if per_head else ("batch pos q_dim", "batch pos kv_dim")
            self.q_norm = RMSNorm(q_width, config.norm_eps, plus_one=config.norm_plus_one, axes=axes[0])
            self.k_norm = RMSNorm(k_width, config.norm_eps, plus_one=config.norm_plus_one, axes=axes[1])
        self.scale = None if config.query_pre_attn_scalar is None else config.query_pre_attn_scalar ** -0.5
        self.softcap = config.attn_softcap
        # Why a pass may not take the fused kernel config.attn_impl names (None: nothing stops it).
        self.why_not_fused = "attn_softcap: the fused kernel cannot soft-cap its scores" if self.softcap else None
        self.rotary = rotary  # shared by every layer of the stack; None unless pos_encoding="rotary"
        self.q = TracePoint("batch head query d_head")
        self.k = TracePoint("batch kv_head key d_head")
        self.v = TracePoint("batch kv_head key d_head")
        if rotary is not None:
            self.q_rot = TracePoint("batch head query d_head")
            self.k_rot = TracePoint("batch kv_head key d_head")
        self.scores = TracePoint("batch head query key")
        self.pattern = TracePoint("batch head query key")
        self.z = TracePoint("batch query head d_head")
        self.head_out = TracePoint("batch query head d_model", on_request=True)
        self.out = TracePoint("batch query d_model")

    def _split_heads(self, x: torch.Tensor, n_heads: int) -> torch.Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, n_heads, self.d_head).transpose(1, 2)  # (B, heads, length, D)

    def _heads(self, x: torch.Tensor, proj: nn.Linear, n_heads: int, norm: nn.Module | None = None) -> torch.Tensor:
        """x [B, L, E] -> x W split into heads [B, heads, L, D], through the q/k norm if there is one."""
        y = proj(x)  # (B, L, heads*D)
        if norm is not None and self.qk_norm == "across_heads":
            y = norm(y)
        y = self._split_heads(y, n_heads)  # (B, heads, L, D)
        if norm is not None and self.qk_norm == "per_head":
            y = norm(y)
        return y

    def project(self, x: torch.Tensor, which: str) -> torch.Tensor:
        """x [B, L, E] (the sublayer's input, after its norm) -> the queries, keys or values of every head,
        [B, H, L, D] for "q", [B, K, L, D] for "k" and "v": what the trace points q, k, v record (before
        rotary positions). Circuit discovery computes one head's q, k or v from an input of its own."""
        if which == "q":
            return self._heads(x, self.q_proj, self.n_heads, getattr(self, "q_norm", None))
        if which == "k":
            return self._heads(x, self.k_proj, self.n_kv_heads, getattr(self, "k_norm", None))
        if which == "v":
            return self._heads(x, self.v_proj, self.n_kv_heads)
        raise ValueError(f"which={which!r} is not supported; allowed values: 'q', 'k', 'v'")

    def _kernel(self):
        """The kernel for this pass: config.attn_impl's, unless only the explicit one computes what is asked."""
        if self.scores.active or self.pattern.active:
            return eager_attention  # scores and weights exist only in the explicit computation
        if self.why_not_fused is not None:
            return eager_attention
        return ATTENTION_KERNELS[self.attn_impl]

    def forward(
        self,
        x: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        is_causal: bool = False,
        position_ids: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        memory: torch.Tensor | None = None,
        cache=None,
    ) -> torch.Tensor:
        """x [B, T, E] -> [B, T, E].

        memory [B, S, E]: the encoder output that keys and values come from (cross-attention).
        cache: a KVCache; self-attention appends this step's keys and values and attends over all
        of them; cross-attention computes the encoder's keys and values once and reuses them.
        """
        batch, n_queries, _ = x.shape
        q = self.q(self._heads(x, self.q_proj, self.n_heads, getattr(self, "q_norm", None)))  # (B, H, T, D)

        cached = cache.cross_kv(self.layer_index) if (cache is not None and self.cross) else None
        if cached is not None:
            k, v = cached
        else:
            source = memory if self.cross else x
            k = self.k(self._heads(source, self.k_proj, self.n_kv_heads, getattr(self, "k_norm", None)))  # (B, K, S, D)
            v = self.v(self._heads(source, self.v_proj, self.n_kv_heads))  # (B, K, S, D)
            if self.rotary is not None and not self.cross:
                q = self.q_rot(self.rotary(q, position_ids))
                k = self.k_rot(self.rotary(k, position_ids))
            if cache is not None:
                k, v = cache.store_cross(self.layer_index, k, v) if self.cross else cache.append(self.layer_index, k, v)

        k, v = repeat_kv(k, self.n_heads), repeat_kv(v, self.n_heads)  # (B, K, S, D) -> (B, H, S, D)

        z, _ = self._kernel()(
            q, k, v, mask, is_causal=is_causal, bias=bias, scale=self.scale, softcap=self.softcap,
            dropout_p=self.dropout_p if self.training else 0.0,
            on_scores=self.scores if self.scores.active else None,
            on_pattern=self.pattern if self.pattern.active else None,
        )  # (B, H, T, D)
        z = self.z(z.transpose(1, 2))  # (B, H, T, D) -> (B, T, H, D)
        concat = z.reshape(batch, n_queries, self.n_heads * self.d_head)  # (B, T, H*D): Concat(head_1..head_h)
        if self.head_out.active:
            # Concat(head_1..head_h) W^O = sum_i head_i W_i^O: each head's own write to the residual.
            w_o = self.o_proj.weight.view(-1, self.n_heads, self.d_head)  # (E, H, D)
            heads = torch.einsum("bthd,ehd->bthe", z, w_o)  # (B, T, H, E)
            traced = self.head_out(heads)
            if traced is not heads:  # an intervention replaced some head: the output is their sum
                bias = self.o_proj.bias if self.o_proj.bias is not None else 0.0
                return self.out(traced.sum(dim=2) + bias)
        return self.out(self.o_proj(concat))  # (B, T, E)
