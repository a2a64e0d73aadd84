"""What a run reports: metrics.jsonl, loss.png, and the progress bar or log lines on the terminal.

    metrics.jsonl   one JSON object per logged step and per evaluation, appended as they come
    loss.png        train and validation loss against step (needs matplotlib)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from .checkpoint import make_readable, write_text_atomically

METRICS = "metrics.jsonl"


def read_metrics(run_dir: str | os.PathLike) -> list[dict]:
    """The records of `run_dir/metrics.jsonl` (a torn last line, from a kill, is dropped)."""
    path = Path(run_dir) / METRICS
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            break
    return records


def append_metrics(run_dir: Path, record: dict) -> None:
    with open(run_dir / METRICS, "a") as handle:
        handle.write(json.dumps(record) + "\n")


def rewrite_metrics(run_dir: Path, records: list[dict]) -> None:
    """Replace metrics.jsonl by `records` (on resume: the steps after the checkpoint will run again)."""
    write_text_atomically(run_dir / METRICS, "".join(json.dumps(r) + "\n" for r in records))


def plot_metrics(run_dir: str | os.PathLike, history: list[dict]) -> Path | None:
    """Write `run_dir/loss.png`: train loss and validation loss per step.
    Returns None (and writes nothing) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    train = [(r["step"], r["loss"]) for r in history if "loss" in r]
    val = [(r["step"], r["val_loss"]) for r in history if "val_loss" in r]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    if train:
        ax.plot(*zip(*train), label="train loss", lw=1)
    if val:
        ax.plot(*zip(*val), "o-", label="val loss", lw=1.5, ms=3)
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats per prediction)")
    ax.grid(alpha=0.3)
    ax.legend()
    out = Path(run_dir) / "loss.png"
    tmp = out.with_name(f".loss.png.tmp{os.getpid()}.png")
    fig.tight_layout()
    fig.savefig(tmp)
    plt.close(fig)
    make_readable(tmp)
    os.replace(tmp, out)
    return out


class ProgressBar:
    """A rich progress bar showing loss, tokens/s and ETA; does nothing when disabled."""

    def __init__(self, total: int, start: int, enabled: bool):
        # not a terminal (a log file, nohup): plain log lines are more useful than a frozen bar
        self.enabled = enabled and Console().is_terminal
        if not self.enabled:
            return
        self.bar = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[tps]} tok/s"),
                            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
        self.task = self.bar.add_task("train", total=total, completed=start, loss="-", tps="-")

    def __enter__(self):
        if self.enabled:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        if self.enabled:
            self.bar.__exit__(*exc)

    def update(self, step: int, loss: float, tokens_per_s: float) -> None:
        if self.enabled:
            self.bar.update(self.task, completed=step, loss=f"{loss:.4f}", tps=f"{tokens_per_s:,.0f}")

    def print(self, text: str, step: int) -> None:
        if self.enabled:
            self.bar.console.print(f"step {step}: {text}", markup=False, highlight=False)
