"""The rows a capped graph has computed, held for its ranking and its assembly: in memory as far as a budget
goes, then in a temporary file that is deleted when the store is.

Shape letters: R rows held, W a row's width (the nodes below it, in the whole graph's order), n rows in a chunk.

A row is held over the nodes below its own (tokens, then every layer under it: a prefix of the node order), in
float32, with two numbers made as it arrives: its signed total (what its dropped sources carry is that minus
what the graph keeps) and its absolute total (its normalisation, Â[t, s] = |A[t, s]| / sum_s |A[t, s]|).
Rows arrive sorted by layer within a sweep, so they are kept as chunks of consecutive rows of one width, each
one tensor [n, W] (or one contiguous run of the file): reading them back copies nothing in memory and pads
nothing, which matters because the ranking reads every row once per update (capped.py).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Chunk:
    """Rows start .. start + n, each W wide: in memory (values [n, W]) or on file at byte `offset`."""

    start: int
    n: int
    width: int
    values: torch.Tensor | None = None
    offset: int = 0


class RowStore:
    """Rows of different widths, appended in order and read back chunk by chunk; memory_bytes: what may stay in
    memory (on the rows' device), the rest goes to a temporary file in `folder` (the system's temporary folder
    if None)."""

    def __init__(self, memory_bytes: int, folder: str | None = None):
        self.memory_bytes, self.folder = memory_bytes, folder
        self.chunks: list[Chunk] = []
        self.totals: list[torch.Tensor] = []
        self.absolute: list[torch.Tensor] = []
        self.rows = 0
        self.held_bytes = 0
        self.file = None
        self.device = None

    def __len__(self) -> int:
        return self.rows

    @property
    def file_bytes(self) -> int:
        return 0 if self.file is None else self.file.tell()

    def add(self, block: torch.Tensor, widths: list[int]) -> None:
        """Append the rows of block [r, W], row i over its first widths[i] columns."""
        self.device = block.device
        first = 0
        for i in range(1, len(widths) + 1):  # runs of one width: a chunk each
            if i < len(widths) and widths[i] == widths[first]:
                continue
            values = block[first:i, :widths[first]]  # (n, W)
            self.totals.append(values.sum(1))
            self.absolute.append(values.abs().sum(1))
            self.keep(values)
            first = i

    def keep(self, values: torch.Tensor) -> None:
        n, width = values.shape
        chunk = Chunk(self.rows, n, width)
        if self.file is None and self.held_bytes + values.numel() * 4 <= self.memory_bytes:
            chunk.values = values.clone()
            self.held_bytes += values.numel() * 4
        else:
            if self.file is None:
                self.file = tempfile.TemporaryFile(dir=self.folder)
            chunk.offset = self.file.tell()
            try:
                self.file.write(values.cpu().numpy().tobytes())
            except OSError as error:  # the disk filled: the plan knows only bounds of what the rows write
                folder = self.folder or tempfile.gettempdir()
                raise OSError(error.errno, f"the capped graph's rows filled {folder} after {chunk.offset / 2**30:.1f} GiB "
                                           f"written ({error.strerror}); free space there, or give the graph more memory "
                                           f"(--max-memory)") from error
        self.chunks.append(chunk)
        self.rows += n

    def total(self) -> torch.Tensor:
        """[R]: each row's sum."""
        return torch.cat(self.totals)

    def absolute_total(self) -> torch.Tensor:
        """[R]: each row's sum of |A|."""
        return torch.cat(self.absolute)

    def blocks(self, widest_first: bool = False) -> Iterator[tuple[int, torch.Tensor]]:
        """(first row, rows [n, W]): every row, a chunk at a time, in order (or the widest chunks first, in order
        among chunks of one width); a chunk read from the file is read when its turn comes, and is the caller's;
        one held in memory is the store's: read it, do not write it."""
        chunks = sorted(self.chunks, key=lambda chunk: -chunk.width) if widest_first else self.chunks
        for chunk in chunks:
            if chunk.values is not None:
                yield chunk.start, chunk.values
                continue
            self.file.seek(chunk.offset)
            values = np.fromfile(self.file, dtype=np.float32, count=chunk.n * chunk.width)
            self.file.seek(0, 2)  # back to the end, where the next row is written
            yield chunk.start, torch.from_numpy(values).view(chunk.n, chunk.width).to(self.device)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
