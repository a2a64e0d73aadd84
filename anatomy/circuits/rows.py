"""The rows a capped graph has computed, held for its ranking and its assembly: in memory as far as a budget
goes, then in a temporary file that is deleted when the store is.

Shape letters: R rows held, W a row's width (the nodes below it, in the whole graph's order), b rows read at once.

A row is held over the nodes below its own (tokens, then every layer under it: a prefix of the node order), in
float32, with two numbers made as it arrives: its signed total (what its dropped sources carry is that minus
what the graph keeps) and its absolute total (its normalisation, Â[t, s] = |A[t, s]| / sum_s |A[t, s]|).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator

import numpy as np
import torch

READ_BYTES = 256 * 2**20  # a block of rows read back at most


class RowStore:
    """Rows of different widths, appended in order and read back in blocks; memory_bytes: what may stay in memory
    (on the rows' device), the rest goes to a temporary file in `folder` (the system's temporary folder if None)."""

    def __init__(self, memory_bytes: int, folder: str | None = None):
        self.memory_bytes, self.folder = memory_bytes, folder
        self.widths: list[int] = []
        self.totals: list[torch.Tensor] = []
        self.absolute: list[torch.Tensor] = []
        self.in_memory: list[torch.Tensor] = []
        self.held_bytes = 0
        self.file = None
        self.offsets: list[int] = []  # per row on file: its byte offset
        self.device = None

    def __len__(self) -> int:
        return len(self.widths)

    @property
    def file_bytes(self) -> int:
        return 0 if self.file is None else self.file.tell()

    def add(self, block: torch.Tensor, widths: list[int]) -> None:
        """Append the rows of block [r, W], row i over its first widths[i] columns."""
        self.device = block.device
        for row, width in zip(block, widths):
            self.totals.append(row[:width].sum())
            self.absolute.append(row[:width].abs().sum())
            if self.file is None and self.held_bytes + 4 * width <= self.memory_bytes:
                self.in_memory.append(row[:width].clone())
                self.held_bytes += 4 * width
            else:
                if self.file is None:
                    self.file = tempfile.TemporaryFile(dir=self.folder)
                self.offsets.append(self.file.tell())
                self.file.write(row[:width].cpu().numpy().tobytes())
            self.widths.append(width)

    def total(self) -> torch.Tensor:
        """[R]: each row's sum."""
        return torch.stack(self.totals)

    def absolute_total(self) -> torch.Tensor:
        """[R]: each row's sum of |A|."""
        return torch.stack(self.absolute)

    def blocks(self) -> Iterator[tuple[int, torch.Tensor]]:
        """(first row, rows [b, W_max] padded with zeros): every row, in order, READ_BYTES at a time."""
        start = 0
        while start < len(self):
            stop, widest = start, 0
            while stop < len(self) and (stop == start or (stop - start + 1) * max(widest, self.widths[stop]) * 4 <= READ_BYTES):
                widest = max(widest, self.widths[stop])
                stop += 1
            yield start, self.read(start, stop, widest)
            start = stop

    def read(self, start: int, stop: int, widest: int) -> torch.Tensor:
        block = torch.zeros(stop - start, widest, device=self.device)
        held = len(self.in_memory)
        for i in range(start, min(stop, held)):
            block[i - start, :self.widths[i]] = self.in_memory[i]
        if stop > held:
            first = max(start, held)
            self.file.seek(self.offsets[first - held])
            values = np.fromfile(self.file, dtype=np.float32, count=sum(self.widths[first:stop]))
            at = 0
            for i in range(first, stop):
                block[i - start, :self.widths[i]] = torch.from_numpy(values[at:at + self.widths[i]]).to(self.device)
                at += self.widths[i]
            self.file.seek(0, 2)  # back to the end, where the next row is written
        return block

    def columns(self, columns: torch.Tensor) -> torch.Tensor:
        """[R, len(columns)]: every row's values at these node columns (0 past a row's width)."""
        result = torch.zeros(len(self), len(columns), device=self.device)
        for start, block in self.blocks():
            inside = columns < block.size(1)
            result[start:start + len(block), inside] = block[:, columns[inside]]
        return result

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
