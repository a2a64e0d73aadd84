"""Patched runs that start where they differ: every run of a patching sweep begins at the first layer it
changes, from the base run's residual stream cached there, instead of recomputing the layers before it.

Shape letters: R runs, C copies in one pass, B batch, T positions, E model width, L layers.

A patched run differs from its base run (the corrupted run in activation patching, the clean run in path
patching) only from the first block it edits on: everything before that block is the base run's, bit for
bit. So, with the base run's residual stream x_l at the input of every block cached once,

    run(edits at block l and later) = Stack.run_from(l, x_l) with the same edits

Runs are grouped by their first layer and batched as C copies of the batch in one pass (copy c edits
only its own rows), C chosen so that a pass reads at most max_tokens tokens. Activation patching
(patching.patch, patching.patch_cells: `anatomy analyze patch`, the explore page's patch panel, the
exact checks of node attribution) and path patching of single edges (circuits/discovery) are such runs.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..cache import KVCache
from ..trace import trace
from .inputs import Batch, device_of

Edit = Callable[[torch.Tensor], torch.Tensor]  # one copy's value of a point [B, ...] -> its patched value
Metric = Callable[[torch.Tensor], torch.Tensor]  # logits [C*B, 1 or T, V] -> [C*B]
Progress = Callable[[int, int], None]  # (runs done, runs in all)


@dataclass
class Run:
    """One patched run: `edits` {point name: Edit}; `layer`: the first block of the (decoder's) stack that
    any edit changes, None for the whole pass (an edit of the embeddings, or of an encoder-decoder's
    encoder, which the decoder's stream does not hold)."""

    edits: dict[str, Edit]
    layer: int | None = None


def first_layer(model: nn.Module, points: Sequence[str]) -> int | None:
    """The first block any of the points belongs to, where a run that edits them may start: blocks.12.attn.z
    -> 12, an encoder-decoder's decoder.blocks.3.mlp.out -> 3; None if any point is outside the blocks."""
    prefix = r"decoder\.blocks\." if model.config.arch == "encoder-decoder" else r"blocks\."
    layers = [re.match(prefix + r"(\d+)\.", point) for point in points]
    return None if not layers or None in layers else min(int(found.group(1)) for found in layers)


def residual_stream(model: nn.Module, batch: Batch, saes=None) -> list[torch.Tensor]:
    """[L + 1] x [B, T, E]: the residual stream at the input of every block of the (decoder's) stack, and
    after the last (what the final norm reads), from one pass without gradients (SAEs spliced in: trace's
    saes)."""
    stack = model.decoder if batch.source is not None else model
    prefix = "decoder." if batch.source is not None else ""
    n_layers = len(stack.blocks)
    names = [f"{prefix}blocks.{layer}.resid_pre" for layer in range(n_layers)]
    names.append(f"{prefix}blocks.{n_layers - 1}.resid_post")
    with torch.no_grad(), trace(model, names, saes=saes) as t:
        batch.hidden(model)
    return [t[name] for name in names]


def _combined(edits: list[tuple[int, Edit]], batch_size: int) -> Edit:
    """One intervention for a pass of copies: copy c (rows c*B .. (c+1)*B) gets its own edit."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        for copy, edit in edits:
            rows = slice(copy * batch_size, (copy + 1) * batch_size)
            x[rows] = edit(x[rows])
        return x

    return fn


def pass_start(layer: int, resid: torch.Tensor, prefix, copies: int, batch: Batch) -> tuple:
    """Where a pass of `copies` copies starts: (layer, the stream [C*B, T, E]), or with a prefix of P positions
    (layer, the stream after them [C*B, T - P, E], a cache holding them)."""
    if prefix is None:
        return layer, resid.repeat(copies, 1, 1)  # (C*B, T, E)
    held, keys, values = prefix
    repeat = [None if l < layer else k.repeat(copies, 1, 1, 1) for l, k in enumerate(keys)]  # (C*B, K, P, D)
    past = KVCache.holding(repeat, [None if l < layer else v.repeat(copies, 1, 1, 1) for l, v in enumerate(values)],
                           batch.target.ids.size(1))
    return layer, resid[:, held:].repeat(copies, 1, 1), past  # (C*B, T - P, E)


def run_patched(
    model: nn.Module, batch: Batch, runs: Sequence[Run], metric: Metric, *, stream: list[torch.Tensor] | None = None,
    logits_at: str = "last", max_tokens: int = 4096, runs_per_pass: int | None = None, saes=None,
    prefix: tuple[int, list, list] | None = None, progress: Progress | None = None,
) -> torch.Tensor:
    """[R, B]: metric of each patched run of `batch`, each row of the batch scored (in the metric's dtype).

    Each run starts at its `layer` from the base run's residual stream there (`stream`, residual_stream's;
    computed here when not given), runs of one layer sharing a pass as copies of the batch, at most
    max_tokens tokens (or runs_per_pass copies) a pass. logits_at: "last" (each row's last real token)
    or "all". saes: SAEs spliced in (trace's saes). prefix = (P, keys, values): no run changes the first P
    positions (a causal model, whose runs differ from the base run only from position P on), and keys[l],
    values[l] [B, K, P, D] are the base run's there: each run computes positions P.. alone, reading those
    as its past (KVCache.holding), and its edits see the points of those positions only.
    progress(runs done, runs) before the first run (0) and after each pass. Raises ValueError when the metric returns anything but one
    number per row."""
    model.eval()
    if not runs:
        return torch.empty(0, batch.size, device=device_of(model))
    if stream is None and any(run.layer is not None for run in runs):
        stream = residual_stream(model, batch, saes)
    if progress is not None:  # before the first run, after the base run when it made one: a caller that
        progress(0, len(runs))  # cancels before or during that pass is heard before any run
    copies = runs_per_pass or max(1, max_tokens // batch.target.ids.numel())
    by_layer: dict[int, list[int]] = {}
    for r, run in enumerate(runs):
        by_layer.setdefault(run.layer, []).append(r)
    passes = [same[start:start + copies] for layer, same in sorted(by_layer.items(), key=lambda item: item[0] or 0)
              for start in range(0, len(same), copies)]  # a pass starts at one layer
    values, done = None, 0
    logits_of = Batch.last_logits if logits_at == "last" else Batch.logits
    with torch.no_grad():
        for group in passes:
            layer = runs[group[0]].layer
            by_point: dict[str, list[tuple[int, Edit]]] = {}
            for copy, r in enumerate(group):
                for point, edit in runs[r].edits.items():
                    by_point.setdefault(point, []).append((copy, edit))
            interventions = {point: _combined(edits, batch.size) for point, edits in by_point.items()}
            start = None if layer is None else pass_start(layer, stream[layer], prefix, len(group), batch)
            with trace(model, [], interventions=interventions, saes=saes):
                scores = metric(logits_of(batch.repeat(len(group)), model, start))
            if scores.shape != (len(group) * batch.size,):
                raise ValueError(f"metric must return one value per sequence, shape ({len(group) * batch.size},); "
                                 f"got {tuple(scores.shape)}")
            if values is None:
                values = scores.new_empty(len(runs), batch.size)
            values[group] = scores.view(len(group), batch.size)
            done += len(group)
            if progress is not None:
                progress(done, len(runs))
    return values

