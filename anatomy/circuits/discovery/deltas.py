"""What the ablated edges of a run add to each destination's input: every source's change (a_u - cur_u),
kept once as the run records it, and the sums of them that a group of destinations reads.

Shape letters: C copies of the batch in one pass, B pairs, U sources, S sources of one product,
v destinations of one group, T positions, E model width, N = B*T*E.

An edge u -> v ablated changes the input of v by d_u = a_u - cur_u (a_u: u's ablated output, cur_u: its
output in this run), so a destination's input is the clean stream plus

    sum_{u -> v ablated} d_u = sum_{all u before v} d_u - sum_{u -> v kept} d_u

the second form read from the running total of every d_u so far, whichever sums fewer sources
(paths._plan). Each d_u is written once into one buffer [C, U, N] when u's output is recorded; a group's
changes are then products W [v, S] @ d [S, N] over the buffer's rows, with no copy of them when the rows
read are nearly contiguous.
"""

from __future__ import annotations

import torch

SOURCES_PER_PRODUCT = 64  # the gathered sources of one product at most: bounds the memory of the copy


class SourceDeltas:
    """The d_u = a_u - cur_u of one pass of C copies: a [U, B, T, E], each source's ablated output."""

    def __init__(self, a: torch.Tensor, copies: int):
        self.a, self.copies = a, copies
        self.d: torch.Tensor | None = None  # (C, U, N), rows written as the sources are recorded
        self.running: torch.Tensor | None = None  # (C, N): sum of d_u over the sources recorded so far

    def record(self, first: int, values: torch.Tensor) -> None:
        """Sources first.. first + n: their outputs values [n, C*B, T, E] in this run.

            d_u = a_u - cur_u,    running += sum_u d_u"""
        n, copies = values.size(0), self.copies
        if self.d is None:
            self.d = values.new_empty(copies, self.a.size(0), self.a[0].numel())  # (C, U, N)
        rows = self.d[:, first:first + n]  # (C, n, N)
        current = values.reshape(n, copies, -1).transpose(0, 1)  # (n, C*B, T, E) -> (C, n, N)
        torch.sub(self.a[first:first + n].reshape(1, n, -1), current, out=rows)
        total = rows.sum(1)  # (C, N)
        self.running = total if self.running is None else self.running.add_(total)

    def changes(self, plan: list) -> torch.Tensor:
        """[v, C*B, T, E]: for each destination of a group, the sum over its ablated edges of d_u, copy by
        copy, as paths._plan says (sign, sources [S] ascending, weights [S, v]):

            sign 1:   sum_{u ablated} d_u                W^T d
            sign -1:  running - sum_{u kept} d_u         running - W^T d"""
        width, (copies, n) = plan[0][2].size(1), self.running.shape
        change = self.running.new_zeros(width, copies, n)  # (v, C, N)
        for c, (sign, sources, weights) in enumerate(plan):
            rows = change[:, c]  # (v, N)
            if sign < 0:
                rows.copy_(self.running[c].expand_as(rows))
            if len(sources):
                self._add_product(rows, sign, sources, weights.to(rows).T, self.d[c])  # weights (v, S), on the run's device
        batch_rows = self.a.size(1)
        return change.view(width, copies * batch_rows, *self.a.shape[2:])  # (v, C*B, T, E)

    @staticmethod
    def _add_product(rows: torch.Tensor, sign: float, sources: torch.Tensor, w: torch.Tensor, d: torch.Tensor) -> None:
        """rows [v, N] += sign * w [v, S] @ d[sources] [S, N]: over the rows first..last of d in place (the weights
        of the rows between the sources zero) when that reads at most twice the sources' rows, else over the
        sources gathered, SOURCES_PER_PRODUCT at a time."""
        first, last = int(sources[0]), int(sources[-1]) + 1
        if last - first <= 2 * len(sources):
            spread = w.new_zeros(w.size(0), last - first)  # (v, last - first)
            spread[:, sources - first] = w
            rows.addmm_(spread, d[first:last], alpha=sign)
            return
        for start in range(0, len(sources), SOURCES_PER_PRODUCT):
            block = sources[start:start + SOURCES_PER_PRODUCT].to(d.device)
            rows.addmm_(w[:, start:start + len(block)], d.index_select(0, block), alpha=sign)  # (v, S) @ (S, N)
