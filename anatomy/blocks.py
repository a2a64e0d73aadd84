"""The Transformer block: attention, (cross-attention,) feed-forward, each a residual sublayer.

Shape letters: B batch, T positions, S source positions, E model width.

Post-norm, the paper (section 3.1) and BERT:      x = Norm(x + Sublayer(x))
Pre-norm, GPT-2, Llama, "3 Transformer Anatomy":  x = x + Sublayer(Norm(x))
Sandwich, Gemma 2 and 3:                          x = x + Norm'(Sublayer(Norm(x)))
Post-sublayer, OLMo 2:                            x = x + Norm'(Sublayer(x))
Parallel, GPT-NeoX and GPT-J:                     x = x + Attn(Norm(x)) + MLP(Norm''(x))   (GPT-J: Norm'' = Norm)

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
from .moe import MixtureOfExperts
from .positional import RotaryEmbedding
from .trace import TracePoint


class Block(nn.Module):
    """One layer. Trace points: resid_pre, resid_mid, (resid_cross,) resid_post [batch pos d_model]
    (a parallel block has no resid_mid: both sublayers read resid_pre); mlp_in [batch pos d_model], on
    request: the MLP sublayer's own copy of the stream it reads, before its norm (TransformerLens's
    hook_mlp_in), so that the MLP's input can be changed without changing the residual stream.

    Norms, by config.norm_position: attn_norm, cross_attn_norm, mlp_norm before (pre, sandwich) or
    after the residual sum (post); attn_out_norm, cross_attn_out_norm, mlp_out_norm on the
    sublayer's output (sandwich, post_sublayer).
    """

    def __init__(self, config, layer_index: int, *, cross_attention: bool = False, rotary: RotaryEmbedding | None = None):
        super().__init__()
        self.norm_position = config.norm_position
        self.parallel = config.parallel_residual
        self.resid_pre = TracePoint("batch pos d_model")
        self._add_norms(config, "attn")
        self.attn = MultiHeadAttention(config, layer_index=layer_index, rotary=rotary)
        if not self.parallel:
            self.resid_mid = TracePoint("batch pos d_model")
        self.has_cross_attention = cross_attention
        if cross_attention:
            self._add_norms(config, "cross_attn")
            self.cross_attn = MultiHeadAttention(config, layer_index=layer_index, cross=True)
            self.resid_cross = TracePoint("batch pos d_model")
        self.mlp_in = TracePoint("batch pos d_model", on_request=True)
        if not config.parallel_shared_norm:
            self._add_norms(config, "mlp")
        self.mlp = MixtureOfExperts(config) if config.n_experts else FeedForward(config)
        self.resid_post = TracePoint("batch pos d_model")
        self.dropout = Dropout(config.dropout)

    def _add_norms(self, config, sublayer: str) -> None:
        if self.norm_position != "post_sublayer":
            setattr(self, f"{sublayer}_norm", make_norm(config))
        if self.norm_position in ("sandwich", "post_sublayer"):
            setattr(self, f"{sublayer}_out_norm", make_norm(config))

    def _residual(self, x: torch.Tensor, name: str, sublayer, reads=None, **kwargs) -> torch.Tensor:
        """x + Sublayer(...) as the block's norms say; reads: the sublayer's own copy of x (a trace point)."""
        norm, out_norm = getattr(self, f"{name}_norm", None), getattr(self, f"{name}_out_norm", None)
        own = x if reads is None else reads(x)
        if self.norm_position == "post":
            return norm(x + self.dropout(sublayer(own, **kwargs)))  # Norm(x + Sublayer(x))
        update = sublayer(norm(own) if norm is not None else own, **kwargs)  # Sublayer(Norm(x)) or Sublayer(x)
        if out_norm is not None:
            update = out_norm(update)  # Norm'(...): sandwich and post-sublayer
        return x + self.dropout(update)

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
        attention = dict(mask=mask, is_causal=is_causal, position_ids=position_ids, bias=bias, cache=cache)
        if self.parallel:
            # Both sublayers read x; GPT-J feeds the MLP the attention's own norm (no mlp_norm).
            normed = self.attn_norm(x)
            if hasattr(self, "mlp_norm"):
                mlp_in = self.mlp_norm(self.mlp_in(x))
            else:  # the shared norm again, only on a copy of x that a trace has changed
                own = self.mlp_in(x)
                mlp_in = normed if own is x else self.attn_norm(own)
            return self.resid_post(x + self.dropout(self.attn(normed, **attention)) + self.dropout(self.mlp(mlp_in)))
        x = self.resid_mid(self._residual(x, "attn", self.attn, **attention))
        if self.has_cross_attention:
            x = self.resid_cross(self._residual(
                x, "cross_attn", self.cross_attn, mask=memory_mask, memory=memory, cache=cache,
            ))
        return self.resid_post(self._residual(x, "mlp", self.mlp, reads=self.mlp_in))
