"""The figures of an SAE run: its training curves, and variance explained against L0 across runs.

    training_figure(history)            FVE (train and held out), L0 and dead features by step
    plot_training(run_dir, history)     that figure, written as run_dir/sae.png
    frontier_figure(runs)               FVE against L0, one labelled point per run (Gao et al. 2024, figure 1's axes)
    plot_frontier(runs, path)           that figure, written as a PNG
"""

from __future__ import annotations

import os
from pathlib import Path


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def _save(fig, path: Path) -> Path:
    from ..checkpoints.writing import replacing

    fig.tight_layout()
    with replacing(path, suffix=path.suffix) as temporary:
        fig.savefig(temporary)
    return path


def training_figure(history: list[dict], title: str | None = None):
    """The figure of the records of metrics.jsonl: FVE (train and held out), L0 and dead features by step (a
    set's records: the means over its layers, said by `title`); None without matplotlib."""
    plt = _pyplot()
    if plt is None:
        return None
    series = {key: [(r["step"], r[key]) for r in history if key in r] for key in ("fve", "val_fve", "l0", "val_l0", "dead")}
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(12, 3.6), dpi=110)
    for key, label, axis in (("fve", "train batch", left), ("val_fve", "held out", left),
                             ("l0", "train batch", middle), ("val_l0", "held out", middle), ("dead", "dead", right)):
        if series[key]:
            axis.plot(*zip(*series[key]), "-" if key in ("fve", "l0", "dead") else "o-", label=label, lw=1, ms=3)
    left.set_ylabel("fraction of variance explained")
    middle.set_ylabel("L0 (active features per token)")
    right.set_ylabel("share of features dead")
    for axis in (left, middle, right):
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
    left.legend()
    middle.legend()
    right.set_ylim(bottom=0.0, top=max(0.05, max([v for _, v in series["dead"]] or [0.0]) * 1.1))
    shown = [v for _, v in series["fve"][len(series["fve"]) // 10:]] + [v for _, v in series["val_fve"]]
    left.set_ylim(max(0.0, min(shown or [0.0]) - 0.05), 1.0)  # every held-out point inside the axes
    if title:
        fig.suptitle(title)
    return fig


def plot_training(run_dir: str | os.PathLike, history: list[dict], name: str = "sae.png", title: str | None = None
                  ) -> Path | None:
    """run_dir/`name`: training_figure, written as a PNG; None (nothing written) without matplotlib."""
    fig = training_figure(history, title)
    if fig is None:
        return None
    result = _save(fig, Path(run_dir) / name)
    _pyplot().close(fig)
    return result


def frontier_figure(runs: list[dict], title: str = ""):
    """The figure of FVE against L0 (log scale), one labelled point per run: {"l0", "fve", "label"} each;
    None without matplotlib."""
    plt = _pyplot()
    if plt is None:
        return None
    fig, axis = plt.subplots(figsize=(6, 4), dpi=110)
    runs = sorted(runs, key=lambda r: r["l0"])
    axis.plot([r["l0"] for r in runs], [r["fve"] for r in runs], "o-", lw=1.5)
    for i, r in enumerate(runs):  # below and right of each point; the last one's above and left, off the line
        last = i == len(runs) - 1 and len(runs) > 1
        axis.annotate(r["label"], (r["l0"], r["fve"]), textcoords="offset points", xytext=(-6, 4) if last else (5, -12),
                      ha="right" if last else "left", fontsize=8)
    axis.set_xscale("log", base=2)
    axis.margins(x=0.12, y=0.12)  # room for the labels below the points
    axis.set_xlabel("L0 (active features per token, held out)")
    axis.set_ylabel("fraction of variance explained (held out)")
    axis.grid(alpha=0.3)
    if title:
        axis.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_frontier(runs: list[dict], path: str | os.PathLike, title: str = "") -> Path | None:
    """frontier_figure(runs, title) written to `path` (PNG); None (nothing written) without matplotlib."""
    fig = frontier_figure(runs, title)
    if fig is None:
        return None
    result = _save(fig, Path(path))
    _pyplot().close(fig)
    return result
