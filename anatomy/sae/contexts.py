"""Where features fire hardest: each feature's top contexts, kept while a corpus streams by.

Shape letters: F features, N top contexts kept per feature, n contexts in a batch, T tokens per context,
W tokens shown per context (BEFORE + 1 + AFTER).

A context is T consecutive tokens of the corpus (context_batches). For each feature, each context counts
once, by its highest activation a = max_t f(t); a feature keeps the N contexts of largest a seen so far,
each as the window of W tokens around that token (token ids, -1 past the context's edge) with the
feature's activation on every token of it. The SAE pages (sae/features.py) keep these for every feature
of one SAE, the graph page (circuits/features.py) for the features a graph shows, from every layer.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

BEFORE, AFTER = 14, 5  # tokens shown before and after a context's highest token (W = 20)


def context_batches(tokens: np.ndarray, context: int, batch: int) -> Iterator[tuple[int, int, torch.Tensor]]:
    """(contexts done, contexts in all, ids [n, T]) for consecutive contexts of `context` tokens, `batch` at
    a time (the tokens past the last whole context are left out). Raises ValueError when there is none."""
    total = len(tokens) // context
    if total == 0:
        raise ValueError(f"{len(tokens)} tokens make no context of {context}: give more text")
    for start in range(0, total, batch):
        stop = min(total, start + batch)
        ids = torch.from_numpy(np.asarray(tokens[start * context:stop * context], dtype=np.int64).reshape(-1, context))
        yield stop, total, ids  # ids: (n, T)


class TopContexts:
    """The `top` strongest contexts of each of `features` features so far (module docstring): values [F, N]
    (0 where fewer contexts fired), windows [F, N, W] token ids, window_acts [F, N, W] activations."""

    def __init__(self, features: int, top: int):
        self.top = top  # the tables are the CPU's, wherever the model ran: add() takes ids and acts there
        self.values = torch.zeros(features, 0, device="cpu")
        self.windows = torch.zeros(features, 0, BEFORE + 1 + AFTER, dtype=torch.long, device="cpu")
        self.window_acts = torch.zeros(features, 0, BEFORE + 1 + AFTER, device="cpu")

    @torch.no_grad()
    def add(self, ids: torch.Tensor, acts: torch.Tensor) -> None:
        """Take in a batch: ids [n, T] and the features' activations on them, acts [n, T, F] (positions a
        caller leaves out already set to 0)."""
        n, T = ids.shape
        offsets = torch.arange(-BEFORE, AFTER + 1, device=ids.device)  # (W,)
        best, where = acts.max(dim=1)  # (n, F): each context's highest activation per feature, and its position
        k = min(self.top, n)
        values, context = best.T.topk(k, dim=1)  # (F, k): this batch's best contexts per feature
        positions = where.T.gather(1, context)[..., None] + offsets  # (F, k, W)
        inside = (positions >= 0) & (positions < T)
        positions = positions.clamp(0, T - 1)
        contexts = context[..., None].expand_as(positions)
        feature = torch.arange(acts.size(2), device=ids.device)[:, None, None].expand_as(positions)
        values = torch.cat([self.values, values], dim=1)
        windows = torch.cat([self.windows, torch.where(inside, ids[contexts, positions], -1)], dim=1)
        window_acts = torch.cat([self.window_acts, torch.where(inside, acts[contexts, positions, feature], 0.0)], dim=1)
        keep = values.topk(min(self.top, values.size(1)), dim=1).indices  # (F, N)
        self.values = values.gather(1, keep)
        self.windows = windows.gather(1, keep[..., None].expand(-1, -1, windows.size(2)))
        self.window_acts = window_acts.gather(1, keep[..., None].expand(-1, -1, windows.size(2)))
