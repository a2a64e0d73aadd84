"""The key/value cache for incremental decoding.

Shape letters: B batch, K key/value heads, L capacity (positions), D head width.

When a decoder generates token t+1 it needs the keys and values of tokens 0..t, which do not
change once computed (causality: no earlier position ever sees a later one). The cache keeps
them, so each step computes the projections of the new token only. Storage is allocated once,
[B, K, L, D] per layer, and each step writes into it: no concatenation, no reallocation.

Cross-attention keys and values depend only on the encoder output, so they are computed at
the first step and reused.
"""

from __future__ import annotations

import torch


class CacheFullError(ValueError):
    """More positions were appended than the cache was made for."""


class KVCache:
    """Preallocated keys and values for every layer of one decoder stack.

    `length` counts the positions stored. A forward pass appends its new keys and values in each
    layer, then the model calls `advance()` once. Make one with `model.new_cache()`.
    """

    def __init__(self, n_layers: int, capacity: int):
        self.n_layers = n_layers
        self.capacity = capacity
        self.length = 0
        self._step = 0
        self._keys: list[torch.Tensor | None] = [None] * n_layers  # each (B, K, L, D)
        self._values: list[torch.Tensor | None] = [None] * n_layers
        self._cross: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * n_layers

    @classmethod
    def holding(cls, keys: list, values: list, capacity: int) -> "KVCache":
        """A cache whose first P positions are given: keys[l], values[l] [B, K, P, D] per layer (None for a
        layer that will not run); a pass on it reads them as the past and appends after them (a patched
        run that starts where it first differs from a cached one: analysis.runs)."""
        lengths = {k.size(2) for k in keys if k is not None}
        if len(lengths) != 1:
            raise ValueError(f"the layers' cached keys must all hold the same positions, got {sorted(lengths)}")
        cache = cls(len(keys), capacity)
        cache.length = lengths.pop()
        for layer, (k, v) in enumerate(zip(keys, values)):
            if k is not None:
                cache._keys[layer] = k.new_empty(*k.shape[:2], capacity, k.size(3))
                cache._values[layer] = v.new_empty(*v.shape[:2], capacity, v.size(3))
                cache._keys[layer][:, :, :cache.length] = k
                cache._values[layer][:, :, :cache.length] = v
        return cache

    def check_room(self, n_new: int) -> None:
        """Raise CacheFullError unless n_new more positions fit."""
        if self.length + n_new > self.capacity:
            raise CacheFullError(
                f"the cache holds {self.capacity} positions; {self.length} are used and {n_new} more were given"
            )

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v [B, K, T, D] after the cached positions; return all keys and values so far."""
        n_new = k.size(2)
        end = self.length + n_new
        self.check_room(n_new)
        if self._keys[layer] is None:
            batch, heads, _, d_head = k.shape
            self._keys[layer] = k.new_empty(batch, heads, self.capacity, d_head)
            self._values[layer] = v.new_empty(batch, heads, self.capacity, d_head)
        keys, values = self._keys[layer], self._values[layer]
        keys[:, :, self.length:end] = k
        values[:, :, self.length:end] = v
        self._step = n_new
        return keys[:, :, :end], values[:, :, :end]  # (B, K, length + T, D)

    def advance(self) -> None:
        """Called by the model after every layer has appended this pass's positions."""
        self.length += self._step
        self._step = 0

    def cross_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        return self._cross[layer]

    def store_cross(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self._cross[layer] = (k, v)
        return k, v

    def reorder(self, batch_indices: torch.Tensor) -> None:
        """Keep batch rows `batch_indices` (beam search: each surviving beam takes its parent's cache)."""
        for layer in range(self.n_layers):
            if self._keys[layer] is not None:
                self._keys[layer] = self._keys[layer].index_select(0, batch_indices)
                self._values[layer] = self._values[layer].index_select(0, batch_indices)
            if self._cross[layer] is not None:
                k, v = self._cross[layer]
                self._cross[layer] = (k.index_select(0, batch_indices), v.index_select(0, batch_indices))
