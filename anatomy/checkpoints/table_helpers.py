"""What several architecture tables check the same way."""

from __future__ import annotations

from ..config import ModelConfig


def plain_heads(config: ModelConfig) -> dict:
    """The fields of plain multi-head attention, for `require`: one key/value head per query head,
    d_head = d_model / n_heads, and token embeddings as wide as the model."""
    return dict(n_kv_heads=config.n_heads, d_head=config.d_model // config.n_heads, d_embed=config.d_model)
