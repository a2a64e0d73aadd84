"""Static images with matplotlib (Agg, no display): attention heatmaps and the positional encoding.

Shape letters: T query positions, S key positions, P positions, E model width (d_model).

    fig = attention_heatmap(weights[layer, head], queries, keys)   # weights [T, S]
    save_figure(fig, "attention.png")                              # or .svg
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no window, no display needed

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from ..positional import sinusoidal_table  # noqa: E402
from .data import AttentionMap  # noqa: E402
from ..checkpoints.token_text import legend_for  # noqa: E402
from .html import write_atomically  # noqa: E402

IMAGE_FORMATS = (".png", ".svg")
MAX_TICK_LABELS = 64  # beyond this, label every n-th token so the labels stay legible
MAX_LABEL_CHARS = 24  # longer tokens are cut with "…"


def attention_heatmap(weights, queries: Sequence[str], keys: Sequence[str], title: str = "") -> Figure:
    """One head's weights [T, S] as a heatmap: queries down, keys across, tokens as tick labels."""
    weights = np.asarray(weights, dtype=np.float32)
    if weights.shape != (len(queries), len(keys)):
        raise ValueError(f"weights {weights.shape} do not match {len(queries)} queries x {len(keys)} keys")
    n_rows, n_cols = weights.shape
    cell = 0.32 if max(n_rows, n_cols) <= 40 else 12 / max(n_rows, n_cols)
    fig, ax = plt.subplots(figsize=(max(4.5, 2.2 + n_cols * cell), max(3.8, 1.8 + n_rows * cell)), layout="constrained")
    image = ax.imshow(weights, cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    _token_ticks(ax.set_yticks, ax.set_yticklabels, queries, rotation=0)
    _token_ticks(ax.set_xticks, ax.set_xticklabels, keys, rotation=60)
    ax.tick_params(axis="x", labeltop=True, labelbottom=False, top=True, bottom=False)
    plt.setp(ax.get_xticklabels(), ha="left", rotation_mode="anchor")
    ax.set_ylabel("query")
    ax.set_xlabel("key")
    ax.xaxis.set_label_position("top")
    legend = legend_for([*queries, *keys])
    heading = "\n".join(part for part in (title, legend and f"Tokens: {legend}.") if part)
    if heading:
        ax.set_title(wrap(heading, fig.get_size_inches()[0] * 0.9, 10), fontsize=10, loc="left")
    fig.colorbar(image, ax=ax, shrink=0.8, label="attention weight")
    return fig


def tick_label(text: str) -> str:
    """A token or a name as matplotlib text: cut to MAX_LABEL_CHARS with "…", and "$" escaped (it
    would start mathtext)."""
    text = text if len(text) <= MAX_LABEL_CHARS else text[: MAX_LABEL_CHARS - 1] + "…"
    return text.replace("$", r"\$")


def wrap(text: str, width_inches: float, fontsize: float = 10) -> str:
    """`text` wrapped to `width_inches` at `fontsize` points (matplotlib does not wrap a title or a
    label that is too long: it is cut at the figure's edge)."""
    columns = max(16, int(width_inches * 72 / (0.55 * fontsize)))
    return "\n".join(textwrap.fill(line, columns) for line in text.split("\n"))


def _token_ticks(set_ticks, set_labels, tokens: Sequence[str], rotation: int) -> None:
    step = max(1, -(-len(tokens) // MAX_TICK_LABELS))
    positions = list(range(0, len(tokens), step))
    set_ticks(positions)
    set_labels([tick_label(tokens[i]) for i in positions], rotation=rotation, fontsize=8)


def map_heatmap(attention: AttentionMap, layer: int, head: int) -> Figure:
    """The heatmap of one layer and head of an AttentionMap (raises IndexError naming the ranges)."""
    attention.check_layer_head(layer, head)
    return attention_heatmap(attention.weights[layer, head], attention.queries, attention.keys,
                             title=f"{attention.name} · layer {layer} · head {head}")


def positional_encoding_figure(table=None, n_positions: int = 100, d_model: int = 512) -> Figure:
    """The positional-encoding matrix [P, E] as an image: positions down, dimensions across (Armas, 2024).

    table defaults to the paper's sinusoids, anatomy.positional.sinusoidal_table(n_positions, d_model).
    """
    if table is None:
        table = sinusoidal_table(n_positions, d_model)
    table = np.asarray(table.detach() if hasattr(table, "detach") else table, dtype=np.float32)
    fig, ax = plt.subplots(figsize=(9, 4.2), layout="constrained")
    image = ax.pcolormesh(table, cmap="RdBu", vmin=-1.0, vmax=1.0)
    ax.invert_yaxis()
    ax.set_xlabel("embedding dimension")
    ax.set_ylabel("position")
    ax.set_title(f"Positional encoding: {table.shape[0]} positions × {table.shape[1]} dimensions", fontsize=11, loc="left")
    fig.colorbar(image, ax=ax, label="value")
    return fig


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Write fig as PNG or SVG (by the suffix) and close it; raises ValueError for other suffixes."""
    path = Path(path)
    if path.suffix.lower() not in IMAGE_FORMATS:
        raise ValueError(f"cannot write {path.name!r}: the image format must be one of {', '.join(IMAGE_FORMATS)}")
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=150, format=path.suffix.lower()[1:])
    plt.close(fig)
    return write_atomically(path, buffer.getvalue())
