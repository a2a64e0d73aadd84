"""The discovery figure: a faithfulness curve beside the circuit's heads, named by role (matplotlib).

Shape letters: U sources, V destinations.

A head's weight in a circuit is the sum of |score| over the circuit's edges that leave its output or
enter its q, k or v input.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .residual import ResidualGraph


def head_weights(graph: ResidualGraph, scores: torch.Tensor, kept: torch.Tensor) -> dict[tuple[int, int], float]:
    """{(layer, head): sum of |score| over the kept edges [U, V] at that head (its output, its inputs)}."""
    weights: dict[tuple[int, int], float] = {}
    magnitude = scores.abs() * kept
    for u, node in enumerate(graph.sources):
        if node.kind == "head":
            weights[(node.layer, node.index)] = weights.get((node.layer, node.index), 0.0) + float(magnitude[u].sum())
    group = graph.n_heads // graph.n_kv
    for v, node in enumerate(graph.destinations):
        if node.kind in ("q", "k", "v"):
            heads = [node.index] if node.kind == "q" else range(node.index * group, (node.index + 1) * group)
            for head in heads:  # a key/value input serves its group of query heads: shared among them
                share = float(magnitude[:, v].sum()) / len(heads)
                weights[(node.layer, head)] = weights.get((node.layer, head), 0.0) + share
    return {key: value for key, value in weights.items() if value > 0}


def discovery_figure(curve, heads: list[tuple[str, float, str]], title: str):
    """The matplotlib figure: curve = faithfulness's Result; heads = [(name, weight, roles)], largest first."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [1.1, 1]})
    sizes, values = curve.extra["sizes"], curve.values.tolist()
    left.plot(sizes, values, marker="o", color="#3b5bdb")
    left.axhline(curve.extra["target"], color="#e67700", linestyle="--", linewidth=1)
    smallest = curve.extra["smallest"]
    if smallest is not None:
        value = values[sizes.index(smallest)]
        left.plot([smallest], [value], marker="o", markersize=10, color="#e67700")
        right_half = sizes.index(smallest) > len(sizes) / 2  # the label goes where the axes have room
        left.annotate(f"{smallest} edges: {value:.2f}", (smallest, value), textcoords="offset points",
                      xytext=(-10, -4) if right_half else (8, -14), ha="right" if right_half else "left")
    left.set_xscale("log")
    left.set_xlabel("edges kept (the top n by |score|)")
    left.set_ylabel("faithfulness (share of the gap recovered)")
    left.set_title("faithfulness of the top-n circuits")
    left.grid(alpha=0.3)
    names = [f"{name}  {roles}" if roles else name for name, _, roles in heads][::-1]
    right.barh(range(len(heads)), [weight for _, weight, _ in heads][::-1], color="#5c7cfa")
    right.set_yticks(range(len(heads)))
    right.set_yticklabels(names, fontsize=8)
    right.set_xlabel("sum of |edge score| in the circuit")
    right.set_title("the circuit's heads, by role")
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    return figure


def plot_discovery(curve, heads: list[tuple[str, float, str]], title: str, path: str | Path) -> Path:
    """Write discovery_figure to `path` (.png or .svg)."""
    figure = discovery_figure(curve, heads, title)
    figure.savefig(path, dpi=130)
    __import__("matplotlib.pyplot").pyplot.close(figure)
    return Path(path)
