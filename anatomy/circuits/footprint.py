"""What a graph will take in memory, said before it is computed, and refused in one line when it cannot fit.

Shape letters: N the whole graph's nodes, n_kept a capped graph's, R the rows a capped graph computes.

    whole graph     adjacency [N, N]                                              4 N^2 bytes
                    + a sweep's working set: a bucket's gradients and their temporaries, its output rows
                      (sweep.py's constants)
                    + the sources kept between buckets, as far as the memory left goes
    capped graph    the larger of two phases:
                    making the rows: a sweep's working set + the sources kept + the ranking's influence [N]
                      + the rows held for the ranking, each over the nodes below it (at most [R, N])
                    assembling: adjacency [n_kept, n_kept], n_kept = cap + errors + tokens + logits
                      + the ranking's vectors + the rows held, after the frozen pass, the vectors and the
                      sources are let go (attribute.py)
                    the rows past what fits both go to a temporary file. Which features the ranking chooses
                    is known only as it goes, so the rows' size has two bounds: every row as wide as a
                    logit's (what the plan says the file may take), and the narrowest features chosen (the
                    least it will write: the bound a disk too small refuses)

max_bytes is a budget for the graph itself: what the process holds beyond what it held when the graph was asked
for (the model and the transcoders). The frozen pass and the vectors gathered are made first and counted against
it (the resident memory they added), and a capped graph's assembly gets it back (`freed`); the plan takes the rest.

On the CPU an adjacency is allocated zeroed by the system (`lazy_zeros`): the pages of the rows no edge is
written to (every error's and token's: three quarters of the nodes of a long prompt's capped graph) are never
touched and take no memory, so that an adjacency costs its targets' rows, 4 R N bytes.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass

import numpy as np
import torch

from .layout import Layout
from .sweep import GRADIENT_BYTES, KEEP_SOURCES_BYTES, OUT_BYTES


def working_bytes(where: Layout, d_model: int, rows: int) -> int:
    """A sweep's working set with at most `rows` rows in a bucket: their gradients [r, P, E] with the attention's
    temporaries (three times as large again: W_o's product, its heads regrouped, the keys' blocks and the values'
    gradients) and their output rows [r, W]; each within the bound sweep.py holds it to."""
    T, N = where.n_tokens, where.total
    gradients = min(GRADIENT_BYTES, 4 * rows * (T - 1) * d_model)
    return 4 * gradients + min(OUT_BYTES, 4 * rows * N)


def sources_bytes(where: Layout, d_model: int, left: int) -> int:
    """What the sources kept between buckets may take (sweep.Sources): every layer's (each active feature's and
    error's vector, with room for padding) as far as `left` and KEEP_SOURCES_BYTES go; they are gathered again
    for each bucket past it, so that memory left after the rest is spent on them before the rows (the rows past
    it go to a file, and are read once a ranking; the sources, for every bucket)."""
    return max(0, min(KEEP_SOURCES_BYTES, 4 * (where.logit_start - where.n_tokens) * d_model * 2, left))


@dataclass
class Plan:
    """Bytes: adjacency (the graph's matrix), ranking (the capped ranking's vectors), rows (the rows held, at most),
    working (a sweep's), sources (the sources kept between buckets, at most), rows_in_memory (what the rows may take
    in memory; the rest goes to a file), rows_least (the rows held, at least: the narrowest features chosen), freed
    (what a capped graph lets go of before its assembly: the frozen pass and the vectors, spent before the plan)."""

    nodes: int
    adjacency: int
    ranking: int
    rows: int
    working: int
    sources: int
    rows_in_memory: int
    rows_least: int = 0
    freed: int = 0

    @property
    def in_memory(self) -> int:
        """The most it holds at once (module docstring): a whole graph fills its matrix while it sweeps; a capped
        graph sweeps, then assembles its matrix beside the rows held, the sweeps' memory and `freed` let go."""
        held = min(self.rows, self.rows_in_memory)
        if not self.ranking:
            return self.adjacency + self.working + self.sources
        return max(self.ranking + self.working + self.sources + held, self.adjacency + self.ranking + held - self.freed)

    @property
    def on_file(self) -> int:
        """What the rows may write to a file, at most."""
        return max(0, self.rows - self.rows_in_memory)

    @property
    def on_file_least(self) -> int:
        """What the rows will write to a file, at least."""
        return max(0, self.rows_least - self.rows_in_memory)

    def describe(self) -> str:
        """One line: what it needs, where."""
        file = f", up to {size(self.on_file)} of rows in a temporary file" if self.on_file else ""
        return f"{size(self.in_memory)} in memory (the adjacency {size(self.adjacency)}){file}"


def size(n: int) -> str:
    """Bytes in words: 3.2 GiB, 180 MiB, 12 KiB, 0 bytes (less than none counts as none)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{max(0, n)} bytes"


def lazy_zeros(rows: int, columns: int, device: torch.device) -> torch.Tensor:
    """[rows, columns] zeros; on the CPU from calloc (numpy.zeros), whose pages take memory only once written."""
    if device.type == "cpu":
        return torch.from_numpy(np.zeros((rows, columns), dtype=np.float32))
    return torch.zeros(rows, columns, device=device)


def plan(where: Layout, d_model: int, max_features: int | None, batch_size: int, room: int, lazy: bool = True,
         freed: int = 0) -> Plan:
    """The memory of the graph of this layout, whole (max_features None) or capped (rows computed batch_size at a
    time); the sources, then the rows, kept in memory as far as `room` bytes go after the rest (a capped graph's
    assembly, after it lets go of `freed` bytes and the sources, included). lazy: the adjacency costs its targets'
    rows alone (lazy_zeros, on the CPU)."""
    n_logits = where.total - where.logit_start
    n_features = where.logit_start - where.n_tokens * (len(where.feature_start) + 1)
    if max_features is None or max_features >= n_features:
        targets = n_features + n_logits
        adjacency = 4 * (targets if lazy else where.total) * where.total
        working = working_bytes(where, d_model, targets)
        return Plan(where.total, adjacency, 0, 0, working, sources_bytes(where, d_model, room - adjacency - working), 0)
    kept = where.total - n_features + max_features
    rows = max_features + n_logits
    working = working_bytes(where, d_model, max(batch_size, n_logits))
    adjacency = 4 * (rows if lazy else kept) * kept
    ranking = 4 * (where.total + 2 * rows)  # the influence [N], the rows' totals and norms
    sources = sources_bytes(where, d_model, room - ranking - working)
    rows_most = 4 * rows * where.logit_start  # every row as wide as a logit's
    rows_least = 4 * (n_logits * where.logit_start + narrowest(where, max_features))
    in_memory = min(room - ranking - working - sources, room + freed - adjacency - ranking)  # sweeping; assembling
    return Plan(kept, adjacency, ranking, rows_most, working, sources, max(0, in_memory), rows_least, freed)


def narrowest(where: Layout, count: int) -> int:
    """The fewest nodes `count` feature rows can reach together: the lowest layers' features, each row over the
    nodes below its layer (feature_start)."""
    reach = 0
    for start, errors in zip(where.feature_start, where.error_start):
        taken = min(count, errors - start)  # the layer's features
        reach, count = reach + taken * start, count - taken
    return reach


def resident_bytes() -> int:
    """The process's resident memory now (VmRSS; 0 where /proc says nothing)."""
    try:
        with open("/proc/self/status") as status:
            return next((int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS")), 0)
    except OSError:
        return 0


def room(max_bytes: int | None, spent: int = 0) -> int:
    """Bytes the graph may still take: the memory available, or max_bytes less what it has spent if less."""
    from ..checkpoints.memory import available_memory

    available = available_memory()
    return available if max_bytes is None else max(0, min(max_bytes - spent, available))


def check_room(where: Layout, d_model: int, max_features: int | None, batch_size: int, max_bytes: int | None,
               device: torch.device, spent: int = 0, folder: str | None = None) -> Plan:
    """The plan of this graph (`plan`), or ValueError in one line when it does not fit the memory available (or
    what is left of max_bytes after `spent`), or the least its rows will write past it does not fit the free space of
    the temporary folder (what they may write at most is said; a disk that fills before that stops the graph with
    an OSError naming the folder, RowStore.keep)."""
    budget = room(max_bytes, spent)
    needs = plan(where, d_model, max_features, batch_size, budget, lazy=device.type == "cpu", freed=spent)
    budgeted = max_bytes is not None and max_bytes - spent <= budget  # the budget binds, not the machine
    whose = (f"is the budget (--max-memory {size(max_bytes)}, less the {size(spent)} its forward pass took)" if budgeted
             else "are available")
    if needs.in_memory > budget:
        capped = needs.ranking > 0
        raise ValueError(
            f"this graph of {needs.nodes:,} nodes ({'capped at ' + format(max_features, ',') + ' features, ' if capped else ''}"
            f"{where.n_tokens} positions) needs {size(needs.in_memory)}, and {size(budget)} {whose}; "
            + ("a lower --max-feature-nodes or a shorter prompt needs less" if capped else
               "--max-feature-nodes bounds it (the nodes grow with the positions, the memory with their square)"))
    if needs.on_file_least:
        folder = folder or tempfile.gettempdir()
        free = shutil.disk_usage(folder).free
        if needs.on_file_least > free:
            raise ValueError(f"this graph's rows need at least {size(needs.on_file_least)} in a temporary file beyond "
                             f"the {size(budget)} of memory it may take, and {folder} has {size(free)} free")
    return needs
