"""`anatomy bench`: anatomy and Hugging Face transformers, side by side, on the same weights.

Every case loads the same weights into both libraries in this one process, then alternates
runs (anatomy, transformers, transformers, anatomy, ...) so that a burst of load from another
process hurts both alike, and reports medians and their ratio. The machine's own ceilings are
measured in the same run: the fp32 matmul peak (GFLOP/s) and the memory read bandwidth (GB/s),
so each result can also be read as a fraction of what the hardware allows.

    anatomy bench                 # the full suite (a few minutes on 2 cores)
    anatomy bench --quick         # a smoke test: tiny shapes, 2 repeats, no speed-ups (CI)
    anatomy bench --only encoder  # one or more groups (see GROUPS)

Cases (B batch, T tokens):
- encoder latency (1 x 16) and throughput (8 x 128), all-MiniLM-L6-v2 weights;
- greedy generation of 64 tokens at batch 1 with a KV cache, GPT-2 124M and a 6 x 384 shape;
- one training step (forward, backward, AdamW) of a 6 x 384 GPT-2-shaped decoder;
- the cost of the trace points when nothing is traced;
- per-pass overhead on models too narrow for arithmetic to matter, and matrix-vector bandwidth by
  weight layout;
- the graph page's first paint in Chromium and the graph JSON's size (page.py).

Each group is one file here with `bench_<group>(settings) -> list[Row]`; what they share is in
common.py. A new group is one more line in GROUPS.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import sys

from ..arguments import add_compute_arguments, non_negative_int, positive_float, within
from ..progress import Stages

# Each group's module (bench/<module>.py) and function, imported when the group runs: the arguments are
# checked, and a mistake refused, before torch and transformers load.
GROUPS = {
    "encoder": ["encoder:bench_encoder"],
    "generate": ["decoding:bench_generate"],
    "train": ["train:bench_train"],
    "trace": ["trace:bench_trace"],
    "overhead": ["overhead:bench_overhead"],
    "gemv": ["gemv:bench_gemv"],
    "load": ["load:bench_load"],
    "analysis": ["analysis:bench_analysis"],
    "sae": ["sae:bench_sae"],
    "explore": ["explore:bench_explore", "soak:bench_soak"],  # the page timed, then the soak
    "circuits": ["circuits:bench_circuits", "circuits_scale:bench_circuits_scale"],  # 16 tokens whole, then capped
    "refusals": ["refusals:bench_refusals"],
    "discovery": ["discovery:bench_discovery", "discovery_exact:bench_discovery_exact"],
    "page": ["page:bench_page"],
}


def group_rows(group: str, settings) -> list:
    """Every row of one group (GROUPS), its functions run in order."""
    rows = []
    for target in GROUPS[group]:
        module, _, function = target.partition(":")
        rows += getattr(importlib.import_module(f".{module}", __package__), function)(settings)
    return rows


SMOKE_TEST = ("smoke test (--quick): tiny shapes and 2 repeats check that every case runs and that both sides "
              "compute the same thing; the times are not measurements, so no speed-up is shown (run `anatomy bench` "
              "for those)")
MAX_REPEATS = 1000


def table(rows: list, quick: bool = False) -> str:
    """A Markdown table of bench Rows: readable in a terminal, pasteable into BENCHMARKS.md. quick: a smoke test,
    whose speed-ups would mean nothing ("n/a")."""
    from .common import fmt

    lines = ["| case | unit | anatomy | transformers | speed-up | notes |", "|---|---|---:|---:|---:|---|"]
    for row in rows:
        speedup = "n/a" if quick else f"{row.speedup:.2f}x" if row.speedup is not None else "-"
        lines.append(f"| {row.group}: {row.case} | {row.unit} | {fmt(row.ours)} | {fmt(row.theirs)} | {speedup} "
                     f"| {'; '.join(row.notes)} |")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="a smoke test: tiny shapes and 2 repeats check that it runs (CI); no speed-ups")
    parser.add_argument("--only", nargs="+", choices=sorted(GROUPS), metavar="GROUP",
                        help=f"run only these groups ({', '.join(GROUPS)})")
    parser.add_argument("--repeats", type=within(non_negative_int, 0, MAX_REPEATS, "repeats"), default=0,
                        help="timed runs per side (default: per case)")
    parser.add_argument("--soak-seconds", type=positive_float, default=0.0, metavar="S",
                        help="how long the explorer's soak types (explore group; default 600, 20 with --quick)")
    add_compute_arguments(parser, device=False)  # the CPU: both libraries against its measured ceilings


def run(args: argparse.Namespace) -> int:
    from ..checkpoints.parity import quiet_progress_bars
    from .common import Settings

    settings = Settings(quick=args.quick, repeats=2 if args.quick and not args.repeats else args.repeats,
                        soak_seconds=args.soak_seconds)
    try:
        import transformers
    except ImportError:
        print("anatomy bench compares with Hugging Face transformers: pip install transformers")
        return 2
    with quiet_progress_bars(), verbosity(transformers.logging, transformers.logging.ERROR):
        return run_groups(args, settings, transformers)


@contextlib.contextmanager
def verbosity(logging, level: int):
    """transformers' log level set to `level` for a block, then put back (tests run in one process)."""
    before = logging.get_verbosity()
    logging.set_verbosity(level)
    try:
        yield
    finally:
        logging.set_verbosity(before)


def run_groups(args: argparse.Namespace, settings: Settings, transformers) -> int:
    """The run itself: the machine's ceilings, every group asked for, the table."""
    import torch

    from .common import cpu_model, fmt, load_average, matmul_peak, read_bandwidth

    settings.peak_gflops = matmul_peak(512 if args.quick else 1536)
    settings.bandwidth_gbs = read_bandwidth(32 if args.quick else 256)
    print(f"# anatomy bench{' --quick' if args.quick else ''}, {datetime.date.today()}")
    if args.quick:
        print(SMOKE_TEST)
    print(f"machine: {cpu_model()}, {torch.get_num_threads()} threads; torch {torch.__version__}, "
          f"transformers {transformers.__version__}; load average at start {load_average()}")
    print(f"measured: fp32 matmul peak {settings.peak_gflops:.0f} GFLOP/s, "
          f"memory read bandwidth {settings.bandwidth_gbs:.1f} GB/s\n")
    rows = []
    with Stages.of(args, sys.stderr) as stages:  # stdout: the rows and the table
        for group in args.only or list(GROUPS):
            stages.start(f"the {group} group")
            done = group_rows(group, settings)
            rows += done
            for row in done:  # progress, while the rest runs
                print(f"  {row.group}: {row.case}: {fmt(row.ours)} vs {fmt(row.theirs)} {row.unit}", flush=True)
    print()
    print(table(rows, quick=args.quick))
    if args.quick:
        print(f"\n{SMOKE_TEST}")
    print(f"\nload average at end {load_average()}")
    return 0
