"""Synthetic activations for the training tests (a module of its own name: conftest is taken)."""

from __future__ import annotations

import torch


class SparseData:
    """Rows that are sparse sums of 64 ground-truth directions (4 per row), plus an offset: a pure function of the step."""

    def __init__(self, d=24, n_true=64, per_row=4, batch=256):
        generator = torch.Generator().manual_seed(0)
        self.directions = torch.nn.functional.normalize(torch.randn(n_true, d, generator=generator), dim=-1)
        self.offset = torch.randn(d, generator=generator)
        self.d, self.n_true, self.per_row, self.rows = d, n_true, per_row, batch

    def batch_of(self, seed, rows):
        generator = torch.Generator().manual_seed(seed)
        which = torch.rand(rows, self.n_true, generator=generator).argsort(-1)[:, :self.per_row]
        codes = torch.zeros(rows, self.n_true).scatter_(-1, which, 1 + torch.rand(rows, self.per_row, generator=generator))
        return 5.0 * (codes @ self.directions + self.offset)

    def batch(self, step):
        return self.batch_of(step, self.rows)
