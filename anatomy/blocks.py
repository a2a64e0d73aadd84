"""The Transformer block: attention, (cross-attention,) feed-forward, each a residual sublayer.

Shape letters: B batch, T positions, S source positions, E model width.

Post-norm, the paper (section 3.1) and BERT:   x = Norm(x + Sublayer(x))
Pre-norm, GPT-2, Llama and seed 000:            x = x + Sublayer(Norm(x))

An encoder block has self-attention and a feed-forward network; a decoder block of an
encoder-decoder adds cross-attention between them, whose queries come from the decoder and
whose keys and values come from the encoder output ("memory"). Causality is in the mask, not
in the block: the same block serves every family.
"""

from __future__ import annotations

import torch
from torch import nn

from .attention import MultiHeadAttention
from .layers import Dropout, FeedForward, make_norm
from .positional import RotaryEmbedding
from .trace import TracePoint


class Block(nn.Module):
    """One layer. Trace points: resid_pre, resid_mid, (resid_cross,) resid_post [batch pos d_model]."""

    def __init__(self, config, layer_index: int, *, cross_attention: bool = False, rotary: RotaryEmbedding | None = None):
        super().__init__()
        self.pre_norm = config.norm_position == "pre"
        self.resid_pre = TracePoint("batch pos d_model")
        self.attn_norm = make_norm(config)
        self.attn = MultiHeadAttention(config, layer_index=layer_index, rotary=rotary)
        self.resid_mid = TracePoint("batch pos d_model")
        self.has_cross_attention = cross_attention
        if cross_attention:
            self.cross_attn_norm = make_norm(config)
            self.cross_attn = MultiHeadAttention(config, layer_index=layer_index, cross=True)
            self.resid_cross = TracePoint("batch pos d_model")
        self.mlp_norm = make_norm(config)
        self.mlp = FeedForward(config)
        self.resid_post = TracePoint("batch pos d_model")
        self.dropout = Dropout(config.dropout)

    def _residual(self, x: torch.Tensor, norm: nn.Module, sublayer, **kwargs) -> torch.Tensor:
        if self.pre_norm:
            return x + self.dropout(sublayer(norm(x), **kwargs))  # x + Sublayer(Norm(x))
        return norm(x + self.dropout(sublayer(x, **kwargs)))  # Norm(x + Sublayer(x))

    def forward(
        self,
        x: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        is_causal: bool = False,
        position_ids: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        memory: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        cache=None,
    ) -> torch.Tensor:
        """x [B, T, E] -> [B, T, E]; memory [B, S, E] and memory_mask for cross-attention."""
        x = self.resid_pre(x)
        x = self.resid_mid(self._residual(
            x, self.attn_norm, self.attn,
            mask=mask, is_causal=is_causal, position_ids=position_ids, bias=bias, cache=cache,
        ))
        if self.has_cross_attention:
            x = self.resid_cross(self._residual(
                x, self.cross_attn_norm, self.cross_attn, mask=memory_mask, memory=memory, cache=cache,
            ))
        return self.resid_post(self._residual(x, self.mlp_norm, self.mlp))
