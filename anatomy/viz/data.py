"""The plain data every attention view draws: token lists and attention arrays.

Shape letters: L layers, H heads, T query positions, S key positions, D head width.

The views know nothing about models. They draw `AttentionMap`s, which hold numpy arrays and
token strings; `anatomy.viz.adapters` turns a traced forward pass into them, and tests build
them from synthetic arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class AttentionMap:
    """One family of attention weights through a stack of layers.

    weights: [L, H, T, S] softmax weights; each row sums to 1 (or to 0 when it may attend to nothing).
    queries: the T tokens that attend; keys: the S tokens attended to. Self-attention has
    queries == keys; cross-attention has decoder queries and encoder keys.
    q, k: optional [L, H, T, D] and [L, H, S, D] query and key vectors (the neuron view needs them),
    as they enter the dot product (after rotary, where the model uses it).
    sentence_b_start: for a sentence pair in one sequence, the position where sentence B begins.
    cross: True for cross-attention (decoder queries, encoder keys).
    """

    name: str
    weights: np.ndarray
    queries: list[str]
    keys: list[str]
    q: np.ndarray | None = None
    k: np.ndarray | None = None
    sentence_b_start: int | None = None
    cross: bool = False

    def __post_init__(self) -> None:
        weights = np.asarray(self.weights, dtype=np.float32)
        object.__setattr__(self, "weights", weights)
        object.__setattr__(self, "queries", [str(token) for token in self.queries])
        object.__setattr__(self, "keys", [str(token) for token in self.keys])
        if weights.ndim != 4:
            raise ValueError(f"{self.name}: weights must be [layers, heads, queries, keys], got shape {weights.shape}")
        n_layers, n_heads, n_queries, n_keys = weights.shape
        if (len(self.queries), len(self.keys)) != (n_queries, n_keys):
            raise ValueError(
                f"{self.name}: weights are {n_queries} queries x {n_keys} keys, "
                f"but {len(self.queries)} query tokens and {len(self.keys)} key tokens were given"
            )
        for label, vectors, n_positions in (("q", self.q, n_queries), ("k", self.k, n_keys)):
            if vectors is None:
                continue
            vectors = np.asarray(vectors, dtype=np.float32)
            object.__setattr__(self, label, vectors)
            if vectors.ndim != 4 or vectors.shape[:3] != (n_layers, n_heads, n_positions):
                raise ValueError(
                    f"{self.name}: {label} must be [{n_layers}, {n_heads}, {n_positions}, d_head], got {vectors.shape}"
                )
        if (self.q is None) != (self.k is None):
            raise ValueError(f"{self.name}: give both q and k, or neither")
        if self.sentence_b_start is not None and not 0 < self.sentence_b_start < n_queries:
            raise ValueError(f"{self.name}: sentence_b_start must be in 1..{n_queries - 1}, got {self.sentence_b_start}")

    @property
    def n_layers(self) -> int:
        return self.weights.shape[0]

    @property
    def n_heads(self) -> int:
        return self.weights.shape[1]

    @property
    def has_vectors(self) -> bool:
        return self.q is not None

    def check_layer_head(self, layer: int, head: int | None = None) -> None:
        """Raise IndexError naming the allowed range when layer (or head) is out of range."""
        if not 0 <= layer < self.n_layers:
            raise IndexError(f"layer {layer} is out of range: {self.name} has layers 0..{self.n_layers - 1}")
        if head is not None and not 0 <= head < self.n_heads:
            raise IndexError(f"head {head} is out of range: {self.name} has heads 0..{self.n_heads - 1}")


def as_maps(attention, tokens: Sequence[str] | None = None, sentence_b_start: int | None = None) -> list[AttentionMap]:
    """Normalise what a view accepts into a list of AttentionMaps.

    attention is an AttentionMap, a sequence of them, or (as in bertviz) weights with `tokens`:
    an array [L, H, T, T], or one [1, H, T, T] tensor per layer (Hugging Face `outputs.attentions`).
    """
    if isinstance(attention, AttentionMap):
        return [attention]
    if isinstance(attention, Sequence) and attention and all(isinstance(m, AttentionMap) for m in attention):
        return list(attention)
    if tokens is None:
        raise TypeError("attention given as weights needs its tokens: head_view(weights, tokens)")
    weights = stack_layers(attention)
    return [AttentionMap("self-attention", weights, list(tokens), list(tokens), sentence_b_start=sentence_b_start)]


def stack_layers(attention) -> np.ndarray:
    """[L, H, T, S] float32 from an array or from one [H, T, S] / [1, H, T, S] tensor per layer."""
    if isinstance(attention, (list, tuple)):
        layers = [to_numpy(layer) for layer in attention]
        if any(layer.ndim == 4 and layer.shape[0] != 1 for layer in layers):
            raise ValueError("a view shows one sequence: pass per-layer weights with a batch of 1, [1, H, T, S]")
        layers = [layer[0] if layer.ndim == 4 else layer for layer in layers]
        return np.stack(layers).astype(np.float32)
    return to_numpy(attention).astype(np.float32, copy=False)


def to_numpy(array) -> np.ndarray:
    """A numpy copy of a numpy array or a torch tensor (detached, on the CPU)."""
    if hasattr(array, "detach"):
        return array.detach().float().cpu().numpy()
    return np.asarray(array)
