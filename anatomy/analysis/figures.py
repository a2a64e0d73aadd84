"""An analysis view's payload (views.panels) drawn with matplotlib, for a PNG or an SVG.

Shape letters: R rows, N columns, C components.

What a careful figure needs and matplotlib does not do by itself: at most MAX_FIGURE_ROWS labelled
rows (the largest by magnitude, and the title says which were kept), titles wrapped to the
figure's width, every colour bar labelled, values beyond a robust scale drawn in the end colour
with an arrow on the colour bar, the values printed in the cells when they fit, and a figure
sized by its rows and columns so that nothing is squashed or cut.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from ..viz.plots import MAX_LABEL_CHARS, wrap  # matplotlib on Agg: files only, no display
from ..viz.plots import tick_label as label

MAX_FIGURE_ROWS = 40
TOP_BARS = 20  # direct logit attribution: bars before "other N components"
VALUES_IN_CELLS = 900  # print each value in its cell up to this many cells


def as_array(values) -> np.ndarray:
    """Nested lists with None for a missing value -> a float array with NaN there."""
    return np.array([[np.nan if v is None else v for v in row] for row in values], dtype=np.float64)


def largest_rows(values: np.ndarray, n: int = MAX_FIGURE_ROWS) -> list[int]:
    """The indices of the n rows with the largest max |value|, in their original order."""
    if values.shape[0] <= n:
        return list(range(values.shape[0]))
    size = np.nan_to_num(np.abs(values), nan=0.0).max(axis=1)
    return sorted(np.argsort(-size, kind="stable")[:n].tolist())


def even_rows(count: int, n: int = MAX_FIGURE_ROWS) -> list[int]:
    """n row indices spread evenly over `count`, the first and the last included."""
    if count <= n:
        return list(range(count))
    return sorted({round(i * (count - 1) / (n - 1)) for i in range(n)})


def colour_map(scale: dict) -> dict:
    """imshow's cmap, vmin and vmax for a payload's scale."""
    if scale["kind"] == "diverging":
        return {"cmap": "RdBu", "vmin": -scale["limit"], "vmax": scale["limit"]}
    return {"cmap": "Blues", "vmin": scale["lo"], "vmax": scale["hi"]}


def extent_of(scale: dict) -> float:
    """The largest |value| a scale reaches."""
    return scale["limit"] if scale["kind"] == "diverging" else max(abs(scale["lo"]), abs(scale["hi"]))


def extend(values: np.ndarray, scale: dict) -> str:
    """The colour bar's arrows: which ends have values beyond them."""
    mapping = colour_map(scale)
    finite = values[np.isfinite(values)]
    below = finite.size and finite.min() < mapping["vmin"] - 1e-12 * abs(mapping["vmin"])
    above = finite.size and finite.max() > mapping["vmax"] + 1e-12 * abs(mapping["vmax"])
    return {(True, True): "both", (True, False): "min", (False, True): "max"}.get((bool(below), bool(above)), "neither")


def short(value: float, extent: float = 0.0) -> str:
    """A value in a cell, as the page prints it (grid.js: shortValue): at most five characters; below
    0.005 on a scale that reaches 0.5 or more, "0.00"."""
    if not np.isfinite(value):
        return "–"
    a = abs(value)
    sign = "-" if value < 0 else ""
    if a == 0:
        return "0"
    if a < 0.005 and extent >= 0.5:
        return "0.00"
    if a >= 9999.5:
        n, unit = (a / 1e6, "M") if a >= 999500 else (a / 1e3, "k")
        return sign + (f"{n:.0f}" if n >= 9.95 else f"{n:.1f}") + unit
    if a >= 99.95:
        return sign + f"{a:.0f}"
    if a >= 9.995:
        return sign + f"{a:.1f}"
    if a >= 0.005:
        return sign + f"{a:.2f}"
    return sign + f"{a:.0e}".replace("e-0", "e-")


def heatmap_axes(fig: Figure, ax, values: np.ndarray, rows: list[str], cols: list[str], scale: dict, legend: str,
                 cell_text: list[list[str]] | None = None, colorbar: str = "vertical") -> None:
    """values [R, N] on `ax`: rows and columns labelled, the values (or cell_text) in the cells when
    they fit, a labelled colour bar with arrows where values lie beyond the scale."""
    mapping = colour_map(scale)
    image = ax.imshow(values, aspect="auto", interpolation="nearest", **mapping)
    upright = all(len(c) <= 4 for c in cols)  # "H3", "L12": across; tokens: at 60 degrees
    ax.set_xticks(range(len(cols)), [label(c) for c in cols], fontsize=8, rotation=0 if upright else 60,
                  ha="center" if upright else "right", rotation_mode="anchor")
    ax.set_yticks(range(len(rows)), [label(r) for r in rows], fontsize=8)
    ax.tick_params(length=0)
    if values.size <= VALUES_IN_CELLS:
        norm, cmap = image.norm, image.get_cmap()
        for i in range(values.shape[0]):
            for j in range(values.shape[1]):
                text = cell_text[i][j] if cell_text is not None else short(values[i, j], extent_of(scale))
                shade = cmap(norm(values[i, j])) if np.isfinite(values[i, j]) else (1, 1, 1, 1)
                dark = 0.2126 * shade[0] + 0.7152 * shade[1] + 0.0722 * shade[2] < 0.5
                ax.text(j, i, "\n".join(label(line) for line in text.split("\n")), ha="center", va="center",
                        fontsize=6.5 if cell_text else 7, color="white" if dark else "#1f2430")
    bar = fig.colorbar(image, ax=ax, orientation=colorbar, extend=extend(values, scale),
                       shrink=0.9 if colorbar == "vertical" else 0.6, pad=0.02 if colorbar == "vertical" else 0.15,
                       fraction=0.05 if colorbar == "vertical" else 0.08, aspect=30)
    width, height = fig.get_size_inches()
    bar.set_label(wrap(legend, 0.5 * height if colorbar == "vertical" else 0.55 * width, 9), fontsize=9)
    bar.ax.tick_params(labelsize=8)


def title(fig: Figure, kind: str, panel: dict, payload: dict, note: str = "") -> None:
    """kind · panel name, the identity line (✓ when it holds, ⚠ when not), a note and the tokens'
    legend (when a token shown has a space or a new line), wrapped to the figure's width."""
    check = payload["check"]
    status = {"holds": "✓ ", "fails": "⚠ ", "none": ""}[check["status"]]
    if payload["tokenLegend"]:
        note = (note + "  " if note else "") + f"Tokens: {payload['tokenLegend']}."
    about = f" · {payload['about']}" if payload.get("about") else ""
    text = f"{kind}{about} · {panel['name']}\n{status}{check['text']}" + (f"\n{note}" if note else "")
    width = fig.get_size_inches()[0]
    # placed by the layout (which then leaves room for it), its lines aligned on the left
    fig.suptitle(wrap(text, width * 0.96, 9.5), fontsize=9.5, multialignment="left")


def size(n_rows: int, n_cols: int, col_inches: float = 0.48, row_inches: float = 0.27, label_inches: float = 1.4,
         longest_col: int = 4) -> tuple[float, float]:
    """A figure's (width, height) in inches for a grid: cells of a readable size, room for labels."""
    width = label_inches + 1.6 + n_cols * col_inches
    height = 1.3 + n_rows * row_inches + (0.2 if longest_col <= 4 else 0.06 * min(longest_col, MAX_LABEL_CHARS) + 0.2)
    return min(24.0, max(6.0, width)), min(20.0, max(3.2, height))


def draw(payload: dict, panel: dict, kind: str) -> Figure:
    """The figure of one panel of a payload (views.panels)."""
    layout = payload["layout"]
    if layout == "lens":
        return lens_figure(payload, panel, kind)
    if layout == "dla":
        return dla_figure(payload, panel, kind)
    if layout == "tokens":
        return tokens_figure(payload, panel, kind)
    return heatmap_figure(payload, panel, kind)


def heatmap_figure(payload: dict, panel: dict, kind: str) -> Figure:
    frame = panel["frames"][panel["frame"]]
    values = as_array(frame["values"])
    kept = largest_rows(values)
    note = ""
    if len(kept) < values.shape[0]:
        note = f"{len(kept)} of {values.shape[0]} rows shown: the largest by |value|."
    if len(panel["frames"]) > 1:
        note = f"{frame['label']}. " + note
    rows = [panel["rows"][i] for i in kept]
    longest = max((len(c) for c in panel["cols"]), default=1)
    fig = plt.figure(figsize=size(len(kept), len(panel["cols"]), longest_col=longest), layout="constrained")
    ax = fig.add_subplot()
    heatmap_axes(fig, ax, values[kept], rows, panel["cols"], frame["scale"], frame["legend"])
    ax.set_ylabel(panel["corner"].split(" \\ ")[0], fontsize=9)
    if " \\ " in panel["corner"]:
        ax.set_xlabel(panel["corner"].split(" \\ ")[1], fontsize=9)
    title(fig, kind, panel, payload, note)
    return fig


def lens_figure(payload: dict, panel: dict, kind: str) -> Figure:
    probs = np.array([[cell[0] for cell in row] for row in panel["probs"]], dtype=np.float64)
    kept = even_rows(len(panel["rows"]))
    note = ""
    if len(kept) < len(panel["rows"]):
        note = f"{len(kept)} of {len(panel['rows'])} layers shown, evenly spaced."
    cut = lambda token: token if len(token) <= 12 else token[:11] + "…"  # noqa: E731  a cell is 0.95 inch wide
    text = [[f"{cut(panel['top'][i][j][0])}\n{short(probs[i, j], 1.0)}" for j in range(len(panel["cols"]))]
            for i in kept]
    longest = max((len(c) for c in panel["cols"]), default=1)
    fig = plt.figure(figsize=size(len(kept), len(panel["cols"]), col_inches=0.95, row_inches=0.34,
                                  longest_col=longest), layout="constrained")
    ax = fig.add_subplot()
    heatmap_axes(fig, ax, probs[kept], [panel["rows"][i] for i in kept], panel["cols"], panel["scale"],
                 "probability of the top token", cell_text=text)
    ax.set_xlabel("position", fontsize=9)
    title(fig, kind, panel, payload, note)
    return fig


def dla_figure(payload: dict, panel: dict, kind: str) -> Figure:
    """Ranked bars of the top components at the panel's position, and the contributions per layer."""
    t = panel["position"]
    column = np.array([row[t] for row in panel["values"]], dtype=np.float64)
    order = np.argsort(-np.abs(column), kind="stable")
    top = order[:TOP_BARS]
    names = [panel["components"][c] for c in top]
    bars = column[top].tolist()
    if len(order) > TOP_BARS:
        names.append(f"other {len(order) - TOP_BARS} components")
        bars.append(float(column[order[TOP_BARS:]].sum()))
    groups = panel["groups"]
    grouped = as_array(groups["values"])
    kept = largest_rows(grouped)
    longest = max((len(c) for c in panel["positions"]), default=1)
    width, height = size(max(len(kept), len(bars)), len(panel["positions"]), longest_col=longest)
    fig, (bar_ax, grid_ax) = plt.subplots(1, 2, figsize=(width + 5.5, height), layout="constrained",
                                          gridspec_kw={"width_ratios": [5.5, max(2.0, width - 1.4)]})
    colours = ["#b4b9c3" if name.startswith("other ") else "#2166ac" if v >= 0 else "#b2182b"
               for name, v in zip(names, bars)]
    bar_ax.barh(range(len(bars)), bars, color=colours)
    bar_ax.set_yticks(range(len(bars)), [label(n) for n in names], fontsize=8)
    bar_ax.invert_yaxis()
    bar_ax.axvline(0, color="#6b7280", linewidth=0.8)
    for i, v in enumerate(bars):
        bar_ax.text(v, i, f" {short(v)} ", va="center", ha="left" if v >= 0 else "right", fontsize=7)
    bar_ax.margins(x=0.18)
    target = panel["targets"][t] if panel["targets"] else "the target"
    bar_ax.set_xlabel(f"contribution to the logit of {label(target)} at position {t} ({label(panel['positions'][t])})",
                      fontsize=9)
    bar_ax.tick_params(axis="x", labelsize=8)
    heatmap_axes(fig, grid_ax, grouped[kept], [groups["rows"][i] for i in kept], panel["positions"], groups["scale"],
                 groups["legend"])
    grid_ax.set_xlabel("position", fontsize=9)
    note = (f"Left: the top {min(TOP_BARS, len(order))} of {len(order)} components at position {t}, the rest summed. "
            "Right: per layer")
    if len(kept) < grouped.shape[0]:
        note += f", {len(kept)} of {grouped.shape[0]} rows (the largest by |value|)"
    note += "."
    title(fig, kind, panel, payload, note)
    return fig


def tokens_figure(payload: dict, panel: dict, kind: str) -> Figure:
    """One row of tokens shaded by their attributions, each value printed in its cell."""
    values = np.array([[np.nan if v is None else v for v in panel["values"]]], dtype=np.float64)
    n = len(panel["tokens"])
    longest = max((len(c) for c in panel["tokens"]), default=1)
    width = min(24.0, max(7.0, 1.2 + 0.62 * n))
    height = 2.4 + 0.06 * min(longest, 24) + 0.9
    fig = plt.figure(figsize=(width, height), layout="constrained")
    ax = fig.add_subplot()
    heatmap_axes(fig, ax, values, [""], panel["tokens"], panel["scale"], panel["legend"], colorbar="horizontal")
    ax.set_yticks([])
    ax.tick_params(axis="x", labeltop=False)
    title(fig, kind, panel, payload, panel.get("summary", ""))
    return fig


__all__ = ["draw"]
