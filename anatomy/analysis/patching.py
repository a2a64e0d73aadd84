"""Activation patching: which activations carry the difference between a clean and a corrupted
input (Meng et al. 2022, "causal tracing"; Heimersheim & Nanda 2024, "How to use and interpret
activation patching").

Shape letters: N patched runs, B batch, T positions, H heads, L layers, V vocabulary.

For every cell (layer l, and a position or a head), run the corrupted input with the clean
run's activation put back at that one place, and score the output with `metric`:

    result[l, i] = metric(model(corrupt | point_l[i] := clean point_l[i]))

Batched: the N patched runs of a chunk are one forward pass of N copies of the corrupted batch,
each copy patched at its own cell, so a sweep costs a few large passes instead of L x T small
ones; the result equals the one-run-at-a-time result, and reports the measured difference on
the cell with the largest effect.

method="attribution" (Nanda 2023, "Attribution patching"): the first-order estimate from one
clean pass, one corrupted pass and one backward pass,

    result[l, i] ~= metric(corrupt) + sum (clean_l[i] - corrupt_l[i]) * d metric / d point_l[i].
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..trace import trace, trace_points
from .choices import BY
from .inputs import Batch, as_batch
from .lens import stack_of, stack_prefix
from .result import Result

METHODS = ("activation", "attribution")
# TransformerLens's short activation names -> anatomy's point inside a block
SHORT_NAMES = {"attn_out": "attn.out", "mlp_out": "mlp.out", "z": "attn.z", "pattern": "attn.pattern",
               "attn_scores": "attn.scores", "q": "attn.q", "k": "attn.k", "v": "attn.v", "result": "attn.head_out",
               "pre": "mlp.pre", "post": "mlp.post"}
POSITION_AXES = ("pos", "query", "key")
HEAD_AXES = ("head", "kv_head")

Metric = Callable[[torch.Tensor], torch.Tensor]
Progress = Callable[[int, int], None]  # (cells done, cells in all)


def _points(model: nn.Module, point: str) -> tuple[str, list[str], tuple[str, ...]]:
    """(stack prefix, the point's name in every layer, its axes)."""
    prefix = stack_prefix(model)
    for stack in ("encoder.", "decoder."):
        if point.startswith(stack):
            if model.config.arch != "encoder-decoder":
                raise ValueError(f"point {point!r} names a stack, but this model is arch={model.config.arch!r}")
            prefix, point = stack, point[len(stack):]
    point = SHORT_NAMES.get(point, point)
    points = trace_points(model)
    stack = model.encoder if prefix == "encoder." else stack_of(model)
    names = [f"{prefix}blocks.{layer}.{point}" for layer in range(len(stack.blocks))]
    if names[0] not in points:
        inside = sorted({name.split(".", 3 if prefix else 2)[-1] for name in points if ".blocks.0." in "." + name})
        raise ValueError(f"no point {point!r} in the blocks of this model; points of a block: {', '.join(inside)}")
    return prefix, names, points[names[0]].axes


def _axis(axes: tuple[str, ...], by: str, point: str) -> int | None:
    if by == "layer":
        return None
    wanted = POSITION_AXES if by == "position" else HEAD_AXES
    for axis, name in enumerate(axes):
        if name in wanted:
            return axis
    raise ValueError(f"by={by!r} needs a {' or '.join(wanted)} axis; {point} has axes {' '.join(axes)}")


def patch(
    model: nn.Module,
    clean,
    corrupt,
    *,
    point: str = "resid_pre",
    metric: Metric | None = None,
    by: str = "position",
    method: str = "activation",
    logits_at: str = "all",
    runs_per_pass: int | None = None,
    tokenizer=None,
    progress: Progress | None = None,
) -> Result:
    """[layer, position], [layer, head] or [layer]: metric of the corrupted run with the clean
    activation of `point` patched in at each cell (averaged over the batch).

    clean, corrupt: inputs of the same shape (strings, lists of strings, ids; (source, target)
    for an encoder-decoder). point: a point inside a block, resid_pre, resid_mid, resid_post,
    attn.out, mlp.out, attn.z, attn.pattern, attn.q/k/v, attn.head_out, cross_attn.z, ...;
    "encoder." or "decoder." in front picks an encoder-decoder's stack (default: the decoder).
    metric(logits [B, T, V]) -> [B]; default: the log-prob of the clean run's top token at the
    last real position. logits_at="last": the metric reads only the last position, so it is given
    logits [B, 1, V] of each row's last real token and the LM head skips every other position (the
    default metric does this). runs_per_pass: how many patched runs share one forward pass.
    progress(done, total): called before the first pass (done = 0) and after each, with the cells
    patched so far; an exception it raises stops the analysis (how a caller cancels it).
    """
    if by not in BY:
        raise ValueError(f"by={by!r} is not supported; allowed values: {', '.join(BY)}")
    if method not in METHODS:
        raise ValueError(f"method={method!r} is not supported; allowed values: {', '.join(METHODS)}")
    if logits_at not in ("all", "last"):
        raise ValueError(f"logits_at={logits_at!r} is not supported; allowed values: 'all', 'last'")
    if runs_per_pass is not None and (not isinstance(runs_per_pass, int) or runs_per_pass < 1):
        raise ValueError(f"runs_per_pass must be an integer >= 1, got {runs_per_pass!r}")
    if metric is not None and not callable(metric):
        raise ValueError(f"metric must be a function of logits [batch, pos, vocab] -> [batch], got {type(metric).__name__}")
    model.eval()
    clean_batch, corrupt_batch = as_batch(model, clean, tokenizer), as_batch(model, corrupt, tokenizer)
    for side in ("target", "source"):
        a, b = getattr(clean_batch, side), getattr(corrupt_batch, side)
        if a is not None and a.ids.shape != b.ids.shape:
            what = "texts" if side == "target" else "sources"
            raise ValueError(f"patching puts the clean run's activations back position by position, so both {what} "
                             f"need as many tokens: the clean one has {a.ids.size(1)}, the corrupted {b.ids.size(1)}"
                             + (f" (and {a.ids.size(0)} vs {b.ids.size(0)} sequences)" if a.ids.size(0) != b.ids.size(0) else ""))
    prefix, names, axes = _points(model, point)
    axis = _axis(axes, by, point)
    with torch.no_grad(), trace(model, names) as t:
        clean_logits = clean_batch.logits(model)
    clean_acts = [t[name] for name in names]
    if metric is None:
        metric, logits_at = _default_metric(clean_batch, clean_logits), "last"
    size = 1 if axis is None else clean_acts[0].size(axis)
    cells = [(layer, index) for layer in range(len(names)) for index in range(size)]
    run = _attribution if method == "attribution" else _activation
    logits_of = Batch.last_logits if logits_at == "last" else Batch.logits
    values, check, error = run(model, corrupt_batch, names, clean_acts, axis, cells, metric, logits_of, runs_per_pass,
                               progress or (lambda done, total: None))
    shape = (len(names),) if axis is None else (len(names), size)
    result_axes = ("layer",) if axis is None else ("layer", "head" if by == "head" else "pos")
    # The cells are the clean run's activations: its tokens name the positions (the corrupted
    # run's, which differ where the corruption is, are kept beside them)
    side = "source" if prefix == "encoder." else "target"
    tokens, corrupt_tokens = getattr(clean_batch, side).tokens, getattr(corrupt_batch, side).tokens
    return Result(
        f"{method} patching", values.view(shape), result_axes,
        labels={"layer": [str(layer) for layer in range(len(names))]},
        check=check, error=error, tokens=tokens,
        extra={"point": names[0].replace(".0.", ".L."), "by": by, "corrupt_tokens": corrupt_tokens},
    )


def _default_metric(clean: Batch, clean_logits: torch.Tensor) -> Metric:
    """The log-prob of the clean run's top token at the last real position; reads logits [N*B, 1, V]."""
    top = clean_logits[torch.arange(clean.size), clean.target.last].argmax(-1)  # (B,)

    def metric(logits: torch.Tensor) -> torch.Tensor:
        n = logits.size(0) // clean.size
        return torch.log_softmax(logits[:, -1].float(), dim=-1).gather(-1, top.repeat(n)[:, None])[:, 0]

    return metric


def _patcher(cells: list[tuple[int, int]], clean: torch.Tensor, axis: int | None, batch: int):
    """The intervention for one layer's point in a pass of len(cells)-ish copies: copy c (rows
    c*B..(c+1)*B) gets the clean value at its cell's index."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        for copy, index in cells:
            rows = slice(copy * batch, (copy + 1) * batch)
            if axis is None:
                x[rows] = clean
            else:
                where = (slice(None),) * axis + (index,)  # the cell's index along `axis`
                x[rows][where] = clean[where]
        return x

    return fn


def _run_cells(model, corrupt: Batch, names, clean_acts, axis, cells, metric, logits_of) -> torch.Tensor:
    """metric of one pass that patches each cell in its own copy of the corrupted batch -> [len(cells)]."""
    batch = corrupt.size
    by_layer: dict[int, list[tuple[int, int]]] = {}
    for copy, (layer, index) in enumerate(cells):
        by_layer.setdefault(layer, []).append((copy, index))
    interventions = {names[layer]: _patcher(layer_cells, clean_acts[layer], axis, batch)
                     for layer, layer_cells in by_layer.items()}
    with trace(model, [], interventions=interventions):
        scores = metric(logits_of(corrupt.repeat(len(cells)), model))  # (N*B,)
    if scores.shape != (len(cells) * batch,):
        raise ValueError(f"metric must return one value per sequence, shape ({len(cells) * batch},); "
                         f"got {tuple(scores.shape)}")
    return scores.view(len(cells), batch).mean(dim=1)  # (N,)


def _activation(model, corrupt, names, clean_acts, axis, cells, metric, logits_of, runs_per_pass, progress):
    tokens_per_run = corrupt.target.ids.numel() + (0 if corrupt.source is None else corrupt.source.ids.numel())
    # At most 4096 tokens and 256 MB of logits per pass.
    logits_per_run = (corrupt.target.ids.numel() if logits_of is Batch.logits else corrupt.size) * model.config.vocab_size
    chunk = runs_per_pass or max(1, min(4096 // tokens_per_run, 2**26 // logits_per_run))
    with torch.no_grad():
        parts = []
        progress(0, len(cells))  # a caller that cancels before the first pass is heard before it runs
        for start in range(0, len(cells), chunk):
            parts.append(_run_cells(model, corrupt, names, clean_acts, axis, cells[start:start + chunk], metric, logits_of))
            progress(min(start + chunk, len(cells)), len(cells))
        values = torch.cat(parts)
        # The identity: a batched cell equals the same cell patched alone.
        strongest = int((values - values.median()).abs().argmax())
        alone = _run_cells(model, corrupt, names, clean_acts, axis, [cells[strongest]], metric, logits_of)
    error = (alone - values[strongest]).abs().item()
    layer, index = cells[strongest]
    check = (f"batched = one run at a time: max |diff| {error:.1e} at layer {layer}"
             + ("" if axis is None else f", index {index}"))
    return values, check, error


def _attribution(model, corrupt, names, clean_acts, axis, cells, metric, logits_of, runs_per_pass, progress):
    with torch.enable_grad(), trace(model, names, grad=True) as t:
        score = metric(logits_of(corrupt, model))  # (B,)
        grads = torch.autograd.grad(score.mean(), [t[name] for name in names], allow_unused=True)
    base = score.mean().item()
    values = []
    for layer, index in cells:
        grad, corrupt_act = grads[layer], t[names[layer]].detach()
        delta = (clean_acts[layer] - corrupt_act) * (0 if grad is None else grad)
        if axis is not None:
            delta = delta.select(axis, index)
        values.append(base + delta.sum().item())
    # sum over the batch of the mean-metric gradient = the mean over the batch of each row's estimate
    check = "first-order estimate of activation patching (no identity holds exactly)"
    progress(len(cells), len(cells))
    return torch.tensor(values), check, float("nan")


Cell = tuple  # (point name, axis of its tensor or None for the whole point, index along that axis)


def patch_cells(
    model: nn.Module, clean, corrupt, cells: list[Cell], metric: Metric, *, logits_at: str = "last",
    runs_per_pass: int | None = None, saes=None, progress: Progress | None = None,
) -> torch.Tensor:
    """[len(cells)]: metric of the corrupted run (averaged over its batch) with the clean run's value put
    back at one cell at a time, the cells of any points (a head's z, a neuron, an SAE feature):

        result[i] = mean_batch metric(model(corrupt | point_i[..., index_i along axis_i] := clean's))

    Batched as patch() is: the runs of a chunk are copies of the corrupted batch in one pass.
    clean, corrupt: inputs or Batches of the same shape; saes: SAEs spliced in (trace's saes), whose
    points (`<point>.sae.features`) cells may name. Raises ValueError for an axis the point lacks.
    """
    model.eval()
    clean_batch, corrupt_batch = as_batch(model, clean), as_batch(model, corrupt)
    names = sorted({cell[0] for cell in cells})
    with torch.no_grad(), trace(model, names, saes=saes) as t:
        clean_batch.logits(model) if logits_at == "all" else clean_batch.last_logits(model)
    clean_acts = {name: t[name] for name in names}
    for name, axis, _ in cells:
        if axis is not None and not 0 < axis < clean_acts[name].dim():
            raise ValueError(f"{name} has axes {' '.join(t.axes(name))}; axis {axis} is not one of them (past the batch)")
    logits_of = Batch.last_logits if logits_at == "last" else Batch.logits
    tokens_per_run = corrupt_batch.target.ids.numel()
    chunk = runs_per_pass or max(1, 4096 // tokens_per_run)
    values = []
    with torch.no_grad():
        for start in range(0, len(cells), chunk):
            part = cells[start:start + chunk]
            by_point: dict[tuple, list[tuple[int, int]]] = {}
            for copy, (name, axis, index) in enumerate(part):
                by_point.setdefault((name, axis), []).append((copy, index))
            interventions = {}
            for (name, axis), point_cells in by_point.items():
                patcher = _patcher(point_cells, clean_acts[name], axis, corrupt_batch.size)
                previous = interventions.get(name)
                interventions[name] = patcher if previous is None else (lambda x, p=previous, q=patcher: q(p(x)))
            with trace(model, [], interventions=interventions, saes=saes):
                scores = metric(logits_of(corrupt_batch.repeat(len(part)), model))
            if scores.shape != (len(part) * corrupt_batch.size,):
                raise ValueError(f"metric must return one value per sequence, shape ({len(part) * corrupt_batch.size},); "
                                 f"got {tuple(scores.shape)}")
            values.append(scores.view(len(part), corrupt_batch.size).mean(dim=1))
            if progress is not None:
                progress(min(start + chunk, len(cells)), len(cells))
    return torch.cat(values)
