"""Synthetic attention and hostile tokens for the view tests (no model needed).

Shape letters: L layers, H heads, T query positions, S key positions, D head width.
"""

from __future__ import annotations

import numpy as np

# Tokens that would run script if they were ever put into the page as HTML.
HOSTILE = [
    "<img src=x onerror=window.__pwned=1>",
    "<script>window.__pwned=1</script>",
    "</script><script>window.__pwned=1</script>",
    '" onmouseover="window.__pwned=1',
    "<!--",
]
SENTENCE_A = ["[CLS]", "time", "flies", "like", "an", "arrow", "[SEP]"]
SENTENCE_B = ["fruit", "flies", *HOSTILE, "banana", "[SEP]"]


def synthetic_attention(n_layers: int, n_heads: int, n_queries: int, n_keys: int | None = None, d_head: int = 8,
                        seed: int = 0, causal: bool = False):
    """(weights [L, H, T, S], q [L, H, T, D], k [L, H, S, D]) with weights = softmax(q k^T / sqrt(D))."""
    n_keys = n_queries if n_keys is None else n_keys
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(n_layers, n_heads, n_queries, d_head)).astype(np.float32) * 2
    k = rng.normal(size=(n_layers, n_heads, n_keys, d_head)).astype(np.float32)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d_head)
    if causal:
        scores = np.where(np.tril(np.ones((n_queries, n_keys), bool)), scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return (weights / weights.sum(-1, keepdims=True)).astype(np.float32), q, k


def bert_sized_attention(n_layers=12, n_heads=12, n_tokens=512, seed=0) -> np.ndarray:
    """[L, H, T, T] like a trained model's: even heads look at a fixed offset, odd heads spread out."""
    rng = np.random.default_rng(seed)
    weights = np.empty((n_layers, n_heads, n_tokens, n_tokens), np.float32)
    rows = np.arange(n_tokens)
    for layer in range(n_layers):
        for head in range(n_heads):
            if head % 2 == 0:
                weights[layer, head] = 0.1 / n_tokens
                weights[layer, head, rows, (rows - head // 2) % n_tokens] += 0.9
            else:
                spread = rng.random((n_tokens, n_tokens), dtype=np.float32) ** 4
                weights[layer, head] = spread / spread.sum(-1, keepdims=True)
    return weights
