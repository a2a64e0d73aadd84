"""Each kind of analysis result as the panels of its layout: the data an analysis page draws.

Shape letters: L layers, B batch, T positions, H heads, C components, G groups of components
(one layer's attention or MLP), E model width, K top tokens.

One JavaScript function per layout draws a layout's panel into an element (assets/analysis.js):

    heatmap   patching, head scores, rollout, decomposition: one grid, every cell under its header
    lens      the logit lens: fixed-width cells, the top-k tokens and their probabilities
    dla       direct logit attribution: the top components at a position as ranked bars (the rest
              summed into one), and the contributions per layer at every position
    tokens    integrated gradients, gradient x input: each token over its value

Every number is a plain list to six significant digits and every token is text. Colour scales are
robust (scales.py): the largest values of a heavy-tailed result (SmolLM2's first position writes 100x
more than any other) would wash every other cell out, so a scale ends at the 98th percentile of
|value| and the cells beyond it are marked.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import torch

from .scales import as_numbers, diverging, sequential, spanning

if TYPE_CHECKING:
    from .result import Result

MAX_VALUES = 250_000  # per heatmap panel (all frames): beyond it, rows (or rollout's earlier layers) are left out
MAX_TARGETS = 12  # the lens's candidate targets


# ---- labels --------------------------------------------------------------------------------------


def _tokens(result: Result, b: int, length: int) -> list[str]:
    """Sequence b's tokens as shown (Tokenizer.labels), or positions when the result has none."""
    if b < len(result.tokens) and len(result.tokens[b]) == length:
        return [str(token) for token in result.tokens[b]]
    return [str(i) for i in range(length)]


def _last_real(tokens: list[str]) -> int:
    """The last position of a right-padded row (padding is shown as "")."""
    real = [i for i, token in enumerate(tokens) if token != ""]
    return real[-1] if real else len(tokens) - 1


def _flat(nested) -> list[str]:
    """Every string in nested lists."""
    if isinstance(nested, str):
        return [nested]
    return [token for item in nested for token in _flat(item)]


def _layer_of(name: str) -> int | None:
    """The layer a row label names ("L3", "L3 MLP", "L3H5", "resid_pre 3", "3"), else None."""
    match = re.match(r"L(\d+)|resid_(?:pre|post) (\d+)$|(\d+)$", name)
    if match is None:
        return None
    return int(next(group for group in match.groups() if group is not None))


# Component names (decompose.components) -> (layer, part): one layer's attention heads and output
# bias are its "attn", its cross-attention heads and bias its "cross", and its MLP.
COMPONENT_GROUPS = [(re.compile(r"L(\d+)H\d+$"), "attn"), (re.compile(r"L(\d+) attn bias$"), "attn"),
                    (re.compile(r"L(\d+) cross H\d+$"), "cross"), (re.compile(r"L(\d+) cross bias$"), "cross"),
                    (re.compile(r"L(\d+) MLP$"), "MLP")]


def component_groups(names: list[str]) -> tuple[list[str], list[int | None], torch.Tensor]:
    """(group labels, their layers, membership [G, C]): one group per layer's attention, cross-
    attention and MLP, and one per component of no layer (the embeddings, the biases of the end)."""
    labels: list[str] = []
    layers: list[int | None] = []
    member: list[int] = []
    for name in names:
        for pattern, part in COMPONENT_GROUPS:
            match = pattern.match(name)
            if match:
                label, layer = f"L{match.group(1)} {part}", int(match.group(1))
                break
        else:
            label, layer = name, None
        if label not in labels:
            labels.append(label)
            layers.append(layer)
        member.append(labels.index(label))
    membership = torch.zeros(len(labels), len(names), dtype=torch.float64, device="cpu")  # beside a Result's values
    membership[member, torch.arange(len(names), device="cpu")] = 1.0
    return labels, layers, membership


# ---- the payload, by kind --------------------------------------------------------------------------


def _heatmap(name: str, rows: list[str], cols: list[str], frames: list[tuple[str, torch.Tensor, dict, str]], *,
             corner: str, caption: str = "", row_layers: list[int | None] | None = None, frame: int = 0,
             frame_control: str = "Show") -> dict:
    """One heatmap panel: rows x cols, one or more frames (label, values [rows, cols], scale, legend)."""
    per_frame = max(1, len(rows) * len(cols))
    if per_frame * len(frames) > MAX_VALUES:  # keep the frame shown first, then as many as fit
        if per_frame > MAX_VALUES:
            keep = max(1, MAX_VALUES // max(1, len(cols)))
            caption += f" The first {keep} of {len(rows)} rows are shown."
            rows = rows[:keep]
            row_layers = None if row_layers is None else row_layers[:keep]
            frames = [(label, values[:keep], scale, legend) for label, values, scale, legend in frames]
        fit = max(1, MAX_VALUES // max(1, len(rows) * len(cols)))
        if len(frames) > fit:
            caption += f" {len(frames) - fit} of {len(frames)} {frame_control.lower()} choices are left out."
            start = max(0, min(frame - fit + 1, len(frames) - fit))
            frames, frame = frames[start:start + fit], frame - start
    return {"name": name, "rows": rows, "cols": cols, "corner": corner, "caption": caption.strip(),
            "rowLayers": row_layers, "frame": frame, "frameControl": frame_control,
            "frames": [{"label": label, "values": as_numbers(values), "scale": scale, "legend": legend}
                       for label, values, scale, legend in frames]}


LENS_CAPTION = ("Each cell: the tokens the residual stream after that layer predicts next, read through the final "
                "norm and the unembedding, with their probabilities.")


def lens_candidates(final_ids: torch.Tensor, final_tokens: list[list[str]], last: int) -> dict[int, str]:
    """{id: token} of the lens's candidate targets (at most MAX_TARGETS): the model's own top token at
    every position, then its top-k at position `last` (the last real one). final_ids [T, K] and
    final_tokens [T][K]: the last layer's top tokens."""
    candidates: dict[int, str] = {}
    for t in [*range(final_ids.size(0)), *([last] * final_ids.size(1))]:
        for k in range(final_ids.size(1) if t == last else 1):
            candidates.setdefault(int(final_ids[t, k]), final_tokens[t][k])
    return dict(list(candidates.items())[:MAX_TARGETS])


def lens_panel(name: str, rows: list[str], cols: list[str], top: list, probs: torch.Tensor,
               targets: list[tuple[str, torch.Tensor]], col_keys: list[int] | None = None) -> dict:
    """One panel of the lens layout: rows (layers) × cols (tokens); top [L+1][T][K] the top tokens as
    text, probs [L+1, T, K] theirs; targets (token, probs [L+1, T]) the tokens a reader may shade by;
    col_keys: the positions the columns are (default 0 … T − 1; a window of a long text)."""
    panel = {"name": name, "rows": rows, "cols": cols, "rowLayers": list(range(len(rows))),
             "corner": "layer \\ position", "top": top, "probs": as_numbers(probs), "k": probs.size(-1),
             "targets": [{"token": token, "probs": as_numbers(values)} for token, values in targets],
             "scale": {"kind": "sequential", "lo": 0.0, "hi": 1.0}, "caption": LENS_CAPTION}
    if col_keys is not None:
        panel["colKeys"] = col_keys
    return panel


def _lens(result: Result) -> tuple[str, list[dict], list[str]]:
    probs, top = result.extra["top_probs"], result.extra["top_tokens"]  # (L+1, B, T, K); [L+1][B][T][K]
    ids = result.extra["top_ids"]
    rows = result.labels["layer"]
    parts, shown = [], []
    for b in range(probs.size(1)):
        cols = _tokens(result, b, probs.size(2))
        last = _last_real(cols)
        candidates = lens_candidates(ids[-1, b], top[-1][b], last)
        targets = [(token, result.values[:, b, :, i].exp()) for i, token in candidates.items()]
        tokens = [[top[layer][b][t] for t in range(probs.size(2))] for layer in range(probs.size(0))]
        shown += cols + _flat(tokens)
        parts.append(lens_panel(f"sequence {b}", rows, cols, tokens, probs[:, b], targets))
    return "lens", parts, shown


def _patching(result: Result) -> tuple[str, list[dict], list[str]]:
    values = result.values.detach().float()
    grid = values if values.dim() == 2 else values[:, None]  # (L, T), (L, H) or (L, 1)
    rows = [f"L{layer}" for layer in range(grid.size(0))]
    by = result.extra.get("by", "position")
    if result.axes[-1] == "pos":
        cols, corner = _tokens(result, 0, grid.size(1)), "layer \\ clean token"
    elif result.axes[-1] == "head":
        cols, corner = [f"H{h}" for h in range(grid.size(1))], "layer \\ head"
    else:
        cols, corner = ["all"], "layer"
    caption = (f"{result.extra.get('point', '')}: the corrupted run with the clean run's activation put back at one "
               f"{by} of one layer; each cell is the metric of that run.")
    corrupt = result.extra.get("corrupt_tokens")
    shown = list(cols)
    if corrupt and result.axes[-1] == "pos":
        differ = [f"{corrupt[0][t]} at position {t}" for t in range(min(len(cols), len(corrupt[0])))
                  if corrupt[0][t] != cols[t]]
        if differ:
            caption += " Columns are the clean prompt's tokens; the corrupted prompt has " + ", ".join(differ) + "."
            shown += corrupt[0]
    legend = "metric of the patched run"
    if result.kind == "activation patching":
        legend += " (log-prob of the clean run's top token)"
    name = f"{result.extra.get('point', 'the point')} by {by}"
    return "heatmap", [_heatmap(name, rows, cols, [("metric", grid, spanning(grid), legend)],
                                corner=corner, caption=caption, row_layers=list(range(len(rows))))], shown


def _heads(result: Result) -> tuple[str, list[dict], list[str]]:
    values = result.values.detach().float()
    extra = result.extra
    caption = (f"Each cell: the head's mean attention on the key its kind attends to, on {extra['ids'].size(0)} "
               f"sequences of {extra['length']} random tokens, repeated (1 is a perfect detector).")
    rows = [f"L{layer}" for layer in range(values.size(0))]
    cols = [f"H{h}" for h in range(values.size(1))]
    frame = ("score", values, {"kind": "sequential", "lo": 0.0, "hi": 1.0}, f"{result.kind[:-1]} score")
    name = f"{extra['ids'].size(0)} sequences of {extra['length']} random tokens, repeated"
    return "heatmap", [_heatmap(name, rows, cols, [frame], corner="layer \\ head", caption=caption,
                                row_layers=list(range(len(rows))))], []


def _rollout(result: Result) -> tuple[str, list[dict], list[str]]:
    values = result.values.detach().float()  # (L, B, Q, K)
    parts, shown = [], []
    for b in range(values.size(1)):
        tokens = _tokens(result, b, values.size(2))
        shown += tokens
        scale = sequential(values[:, b], lo=0.0)
        frames = [(f"after layer {layer}", values[layer, b], scale, "share of the flow from each key")
                  for layer in range(values.size(0))]
        parts.append(_heatmap(f"sequence {b}", tokens, tokens, frames, corner="query \\ key",
                              caption="Each row: how much of the query's final state flowed from each key token, "
                                      "through the attention of every layer up to the chosen one (each row sums to 1).",
                              frame=len(frames) - 1, frame_control="After layer"))
    return "heatmap", parts, shown


def _decomposition(result: Result) -> tuple[str, list[dict], list[str]]:
    parts_ = result.values.detach().double()  # (C, B, T, E)
    labels, layers, membership = component_groups(result.labels["component"])
    grouped = torch.einsum("gc,cbte->gbte", membership, parts_)  # (G, B, T, E): each layer's attention, MLP
    final = parts_.sum(0)  # (B, T, E)
    direction = final / final.norm(dim=-1, keepdim=True).clamp_min(1e-30)
    norms = grouped.norm(dim=-1)  # (G, B, T)
    along = (grouped * direction).sum(-1)  # (G, B, T): these sum to |x_L|
    parts, shown = [], []
    for b in range(parts_.size(1)):
        tokens = _tokens(result, b, parts_.size(2))
        shown += tokens
        frames = [("norm of each write", norms[:, b], sequential(norms[:, b], lo=0.0), "‖write‖"),
                  ("along the final residual", along[:, b], diverging(along[:, b]),
                   "write · x̂_L (each column sums to ‖x_L‖)")]
        parts.append(_heatmap(f"sequence {b}", labels, tokens, frames, corner="component \\ position",
                              caption="What each layer's attention (its heads and output bias) and MLP wrote into the "
                                      "residual stream at each position; the writes sum to the final residual x_L.",
                              row_layers=layers))
    return "heatmap", parts, shown


def _dla(result: Result) -> tuple[str, list[dict], list[str]]:
    values = result.values.detach().double()  # (C, B, T)
    names = result.labels["component"]
    labels, layers, membership = component_groups(names)
    grouped = torch.einsum("gc,cbt->gbt", membership, values)  # (G, B, T)
    target_tokens = result.extra.get("target_tokens")
    parts, shown = [], []
    for b in range(values.size(1)):
        tokens = _tokens(result, b, values.size(2))
        targets = target_tokens[b] if target_tokens else None
        shown += tokens + (targets or [])
        parts.append({
            "name": f"sequence {b}", "positions": tokens, "targets": targets, "position": _last_real(tokens),
            "components": names, "componentLayers": [_layer_of(name) for name in names],
            "values": as_numbers(values[:, b]), "logits": as_numbers(values[:, b].sum(0)),
            "groups": {"rows": labels, "rowLayers": layers, "values": as_numbers(grouped[:, b]),
                       "scale": diverging(grouped[:, b]), "legend": "contribution to the logit"},
            "caption": "Each component's direct contribution to the target's logit, through the final norm (its scale "
                       "frozen) and the unembedding; the contributions sum to the logit.",
        })
    return "dla", parts, shown


def _attributions(result: Result) -> tuple[str, list[dict], list[str]]:
    values = result.values.detach().float()  # (B, T)
    parts, shown = [], []
    for b in range(values.size(0)):
        tokens = _tokens(result, b, values.size(1))
        shown += tokens
        total = values[b].double().sum().item()
        if "f_input" in result.extra:
            delta = (result.extra["f_input"][b] - result.extra["f_baseline"][b]).item()
            summary = f"Sum of the attributions {total:.4g}; f(x) − f(baseline) = {delta:.4g}."
        else:
            summary = f"Sum of the attributions {total:.4g} (gradient × input has no completeness identity)."
        parts.append({"name": f"sequence {b}", "tokens": tokens, "values": as_numbers(values[b]),
                      "scale": diverging(values[b]), "summary": summary,
                      "legend": "attribution to the target's logit (blue: for, red: against)"})
    return "tokens", parts, shown


def _grid(result: Result) -> tuple[str, list[dict], list[str]]:
    """Any result of one or two axes with labels (extra["view"] = "grid"; circuit discovery's): one heatmap,
    rows = the first axis (one row for a single axis), a scale centred on zero."""
    values = result.values.detach().float()
    if values.dim() == 1:
        values = values[None]  # (1, N)
        rows, cols = [result.kind], result.labels.get(result.axes[0], [str(i) for i in range(values.size(1))])
    else:
        rows = result.labels.get(result.axes[0], [str(i) for i in range(values.size(0))])
        cols = result.labels.get(result.axes[1], [str(i) for i in range(values.size(1))])
    legend = result.extra.get("legend", "value")
    frame = ("value", values, diverging(values), legend)
    corner = " \\ ".join(result.axes) if values.dim() == 2 and len(result.axes) == 2 else result.axes[0]
    return "heatmap", [_heatmap(result.about or result.kind, rows, cols, [frame], corner=corner,
                                caption=result.extra.get("caption", ""), row_layers=result.extra.get("row_layers"))], []


BUILDERS = {"logit lens": _lens, "attention rollout": _rollout, "decomposition": _decomposition,
            "direct logit attribution": _dla, "integrated gradients": _attributions, "gradient x input": _attributions}


def layout_of(result: Result) -> tuple[str, list[dict], list[str]]:
    """(the layout, its panels, every token the panels show) of `result`, by its kind; ValueError for a
    result of no known kind."""
    kind = result.kind
    if kind.endswith("patching"):
        builder = _patching
    elif kind.endswith("heads"):
        builder = _heads
    elif kind in BUILDERS:
        builder = BUILDERS[kind]
    elif result.extra.get("view") == "grid":
        builder = _grid
    else:
        raise ValueError(f"no view for {kind!r}")
    return builder(result)
