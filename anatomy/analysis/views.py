"""Every analysis result as an offline HTML page and as a PNG: a grid (logit lens, patching, head
scores, direct logit attribution, rollout) or tokens shaded by their values (attributions).

Shape letters: L layers, B batch, T positions, H heads, C components.

The page is viz's one page shell (viz.html.page: a Content-Security-Policy that allows no request,
every label placed as text) with the viz views' common script and this floor's analysis.js.
"""

from __future__ import annotations

import html
from importlib import resources
from pathlib import Path
from string import Template
from typing import TYPE_CHECKING

import torch

from ..viz.html import View, asset, page, script_json

if TYPE_CHECKING:  # a Result knows its views (Result.view); the views only read a Result's fields
    from .result import Result

SCRIPT = (resources.files("anatomy.analysis") / "assets" / "analysis.js").read_text(encoding="utf-8")
STYLE = """
table.grid { border-collapse: collapse; font-size: 12px; }
table.grid th { font-weight: 500; color: var(--muted); padding: 2px 6px; white-space: pre; max-width: 120px;
                overflow: hidden; text-overflow: ellipsis; }
table.grid th.col { writing-mode: vertical-rl; transform: rotate(180deg); text-align: left; max-height: 110px; }
table.grid td.cell { min-width: 28px; height: 22px; padding: 0 4px; border: 1px solid #fff; white-space: pre;
                     overflow: hidden; max-width: 90px; text-overflow: ellipsis; }
.shaded-tokens { display: flex; flex-wrap: wrap; gap: 3px; font-size: 15px; }
.shaded-token { padding: 2px 5px; border-radius: 4px; white-space: pre; border: 1px solid var(--line); }
.check { color: #2b7a3d; }
"""
MAX_CELLS = 20000  # beyond this a grid is cut to its first rows and columns (the PNG shows it whole)


def _scale(values: torch.Tensor, diverging: bool | None = None) -> dict:
    finite = values[torch.isfinite(values)]
    lo, hi = (finite.min().item(), finite.max().item()) if finite.numel() else (0.0, 1.0)
    if diverging is None:
        diverging = lo < 0 < hi
    return {"diverging": diverging, "lo": lo, "hi": hi, "max": max(abs(lo), abs(hi))}


def _grid(name: str, values: torch.Tensor, rows: list[str], cols: list[str], text=None, corner: str = "",
          caption: str = "", scale: dict | None = None) -> dict:
    values = values.float()
    n_rows = max(1, min(len(rows), MAX_CELLS // max(1, len(cols))))
    return {"name": name, "rows": rows[:n_rows], "cols": cols, "corner": corner, "caption": caption,
            "values": values[:n_rows].tolist(), "text": None if text is None else [row for row in text[:n_rows]],
            "scale": scale or _scale(values)}


def panels(result: Result) -> tuple[str, list[dict], str]:
    """(layout "grid" or "tokens", one panel per sequence, the colour legend) for a result."""
    kind, values, tokens = result.kind, result.values.detach().float(), result.tokens
    batch_tokens = lambda b: tokens[b] if b < len(tokens) else [str(i) for i in range(values.shape[-1])]  # noqa: E731
    if kind == "logit lens":
        probs, top = result.extra["top_probs"][..., 0], result.extra["top_tokens"]  # (L+1, B, T)
        return "grid", [
            _grid(f"sequence {b}", probs[:, b], result.labels["layer"], batch_tokens(b),
                  text=[[top[layer][b][t][0] for t in range(probs.size(2))] for layer in range(probs.size(0))],
                  corner="layer \\ input", caption="each cell: the top next token read from that layer, shaded by its probability",
                  scale={"diverging": False, "lo": 0.0, "hi": 1.0, "max": 1.0})
            for b in range(probs.size(1))
        ], "top-token probability"
    if kind.endswith("patching"):
        cols = batch_tokens(0) if result.axes[-1] == "pos" else [f"H{h}" for h in range(values.shape[-1])]
        grid = values if values.dim() == 2 else values[:, None]
        return "grid", [_grid(f"{result.extra['point']} by {result.extra['by']}", grid, result.labels["layer"],
                              cols if values.dim() == 2 else ["all"], corner="layer")], "metric of the patched run"
    if kind.endswith("heads"):
        extra = result.extra
        name = f"{extra['length']} random tokens, repeated, {extra['ids'].size(0)} sequences"
        return "grid", [_grid(name, values, [f"L{i}" for i in range(values.size(0))],
                              [f"H{h}" for h in range(values.size(1))], corner="layer \\ head",
                              scale={"diverging": False, "lo": 0.0, "hi": 1.0, "max": 1.0})], "score"
    if kind in ("integrated gradients", "gradient x input"):
        return "tokens", [{"name": f"sequence {b}", "tokens": batch_tokens(b), "values": values[b].tolist(),
                           "scale": _scale(values[b], diverging=True)} for b in range(values.size(0))], \
            "attribution (blue: for the target)"
    if kind == "direct logit attribution":
        return "grid", [_grid(f"sequence {b}", values[:, b], result.labels["component"], batch_tokens(b),
                              corner="component", scale=_scale(values[:, b], diverging=True))
                        for b in range(values.size(1))], "contribution to the logit"
    if kind == "decomposition":
        norms = values.norm(dim=-1)  # (C, B, T)
        return "grid", [_grid(f"sequence {b}", norms[:, b], result.labels["component"], batch_tokens(b),
                              corner="component", caption="the norm of each component's write")
                        for b in range(norms.size(1))], "norm of the write"
    if kind == "attention rollout":
        last = values[-1]  # (B, Q, K)
        return "grid", [_grid(f"sequence {b}", last[b], batch_tokens(b), batch_tokens(b), corner="query \\ key",
                              scale={"diverging": False, "lo": 0.0, "hi": last[b].max().item(), "max": 1.0})
                        for b in range(last.size(0))], "share of the flow"
    raise ValueError(f"no view for {kind!r}")


def html_view(result: Result, *, title: str | None = None) -> View:
    """The result as one self-contained, offline HTML page (a viz View)."""
    layout, parts, legend = panels(result)
    title = title or result.kind[:1].upper() + result.kind[1:]
    shape = " × ".join(f"{size} {axis}" for axis, size in zip(result.axes, result.values.shape))
    payload = {"view": "analysis", "initial": {"panel": 0}, "layout": layout, "panels": parts,
               "legend": legend, "check": result.check or "no identity to check"}
    body = Template(asset("view.html")).substitute(
        title=html.escape(title), subtitle=html.escape(shape), data=script_json(payload))
    document = page(title, body, style=asset("view.css") + STYLE, script=asset("common.js") + "\n" + SCRIPT,
                    body_class="view-analysis")
    return View("analysis", document, height=560)


def figure(result: Result, panel: int = 0):
    """The result as a matplotlib Figure: the grid as a heatmap, or the tokens as one shaded row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layout, parts, legend = panels(result)
    part = parts[panel]
    label = lambda text: text.replace("$", r"\$")[:24]  # noqa: E731  tokens are text, not mathtext
    if layout == "tokens":
        grid, rows, cols = torch.tensor([part["values"]]).numpy(), [""], part["tokens"]
    else:
        grid, rows, cols = torch.tensor(part["values"]).numpy(), part["rows"], part["cols"]
    scale = part["scale"]
    fig, ax = plt.subplots(figsize=(min(18, 2.5 + 0.45 * len(cols)), min(14, 1.6 + 0.38 * len(rows))),
                           layout="constrained")
    if scale["diverging"]:
        image = ax.imshow(grid, cmap="RdBu", vmin=-scale["max"], vmax=scale["max"], aspect="auto")
    else:
        image = ax.imshow(grid, cmap="Blues", vmin=scale["lo"], vmax=scale["hi"], aspect="auto")
    ax.set_xticks(range(len(cols)), [label(c) for c in cols], rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(len(rows)), [label(r) for r in rows], fontsize=8)
    if layout == "grid" and part["text"] is not None and grid.size <= 600:
        for i, row in enumerate(part["text"]):
            for j, text in enumerate(row):
                ax.text(j, i, label(text), ha="center", va="center", fontsize=6)
    ax.set_title(f"{result.kind} · {part['name']}\n{result.check}", fontsize=10, loc="left")
    fig.colorbar(image, ax=ax, shrink=0.8, label=legend)
    return fig


def save(result: Result, path: str | Path, **options) -> Path:
    """Write `result` as .html (interactive) or .png / .svg (a figure); ValueError for other suffixes."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in (".html", ".htm"):
        return html_view(result, **options).save(path)
    if suffix in (".png", ".svg"):
        from ..viz.plots import save_figure

        return save_figure(figure(result, **options), path)
    raise ValueError(f"cannot write {path.name!r}: the suffix must be .html, .png or .svg")


__all__ = ["figure", "html_view", "panels", "save"]
