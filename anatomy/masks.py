"""Attention masks, with one convention everywhere: a boolean tensor, True = may attend.

Shape letters: B batch, T query positions, S key positions (S = T for self-attention).

- A padding mask is [B, T], True for a real token, False for padding.
- A causal mask is [T, S], True where key position <= query position; a sliding window of width w
  keeps only the w most recent of those keys (Mistral, Gemma 2/3).
- Masks combine with logical AND and broadcast to the scores' shape [B, H, T, S].

The model builds its masks once per forward pass and every layer uses them; no layer
invents its own. The additive form (0 or the most negative float) exists only inside the
eager kernel, where a row with nothing to attend to is set to zeros rather than NaN.
"""

from __future__ import annotations

import torch


def causal_mask(n_queries: int, n_keys: int | None = None, *, offset: int = 0, window: int | None = None,
                device=None) -> torch.Tensor:
    """[T, S] lower-triangular mask: query t (at absolute position offset + t) sees keys 0..offset+t.

    `offset` is the number of keys already cached before these queries (incremental decoding).
    With a `window` w, query p sees only keys p - w < s <= p: itself and the w - 1 keys before it.
    """
    n_keys = n_queries + offset if n_keys is None else n_keys
    query_positions = torch.arange(offset, offset + n_queries, device=device)[:, None]  # (T, 1)
    key_positions = torch.arange(n_keys, device=device)[None, :]  # (1, S)
    allowed = key_positions <= query_positions  # (T, S)
    if window is not None:
        allowed &= key_positions > query_positions - window
    return allowed


def padding_to_key_mask(padding_mask: torch.Tensor) -> torch.Tensor:
    """[B, S] padding mask (True = real token) -> [B, 1, 1, S]: every query may attend to real keys."""
    return padding_mask[:, None, None, :]  # (B, 1, 1, S)


def combine(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """The logical AND of the given masks (None = no constraint), broadcast together."""
    present = [m for m in masks if m is not None]
    if not present:
        return None
    combined = present[0]
    for mask in present[1:]:
        combined = combined & mask
    return combined


def self_attention_mask(
    padding_mask: torch.Tensor | None, n_queries: int, *, causal: bool, past_length: int = 0,
    window: int | None = None, device=None,
) -> tuple[torch.Tensor | None, bool]:
    """The mask for self-attention, and whether a fused kernel's own causal flag can stand for it.

    Returns (mask, is_causal). mask is the whole constraint: None (every key) or bool,
    broadcastable to [B, H, T, S] where S = past_length + T. is_causal=True says that mask is
    exactly the causal triangle (no padding, no cache, no window that cuts): a fused kernel may
    apply causality itself without reading the mask. `window`: a sliding window (causal only).
    """
    n_keys = past_length + n_queries
    device = padding_mask.device if padding_mask is not None else device
    if window is not None and window >= n_keys:
        window = None  # the window reaches back to the first key: plain causal attention
    if causal and padding_mask is None and window is None and n_queries == 1:
        return None, False  # one new token sees every cached key
    key_mask = padding_to_key_mask(padding_mask) if padding_mask is not None else None
    future = causal_mask(n_queries, n_keys, offset=past_length, window=window, device=device) if causal else None
    is_causal = causal and padding_mask is None and window is None and past_length == 0
    return combine(key_mask, future), is_causal


def cross_attention_mask(source_padding_mask: torch.Tensor | None) -> torch.Tensor | None:
    """[B, 1, 1, S] for the rectangular decoder-to-encoder scores [B, H, T, S]: only real source tokens."""
    return None if source_padding_mask is None else padding_to_key_mask(source_padding_mask)
