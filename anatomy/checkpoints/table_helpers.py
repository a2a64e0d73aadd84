"""What several architecture tables check or map the same way."""

from __future__ import annotations

from ..config import ModelConfig
from .engine import Rule


def plain_heads(config: ModelConfig) -> dict:
    """The fields of plain multi-head attention, for `require`: one key/value head per query head,
    d_head = d_model / n_heads, and token embeddings as wide as the model."""
    return dict(n_kv_heads=config.n_heads, d_head=config.d_model // config.n_heads, d_embed=config.d_model)


def weight_and_bias(hf: str, ours: str) -> list[Rule]:
    """The two rules of a layer with a bias (a linear map, a LayerNorm): hf.weight -> ours.weight
    and hf.bias -> ours.bias."""
    return [Rule(f"{hf}.{p}", f"{ours}.{p}") for p in ("weight", "bias")]
