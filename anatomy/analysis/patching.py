"""Activation patching: which activations carry the difference between a clean and a corrupted
input (Meng et al. 2022, "causal tracing"; Heimersheim & Nanda 2024, "How to use and interpret
activation patching").

Shape letters: N patched runs, B batch, T positions, H heads, L layers, V vocabulary.

For every cell (layer l, and a position or a head), run the corrupted input with the clean
run's activation put back at that one place, and score the output with `metric`:

    result[l, i] = metric(model(corrupt | point_l[i] := clean point_l[i]))

Batched, and from the cell's layer: a patched run equals the corrupted run before the cell's layer, so
it starts there from the corrupted run's residual stream (runs.run_patched), and the runs of one layer
are one forward pass of N copies of the corrupted batch, each copy patched at its own cell: a sweep
costs a few large passes over half the layers on average instead of L x T small whole ones. The result
equals the one-whole-run-at-a-time result, and reports the measured difference on the cell with the
largest effect.

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
from .runs import Edit, Run, first_layer, run_patched

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
    values, check, error = run(model, corrupt_batch, names, clean_acts, axis, cells, metric, logits_at, runs_per_pass,
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
    rows = torch.arange(clean.size, device=clean_logits.device)
    top = clean_logits[rows, clean.target.last.to(clean_logits.device)].argmax(-1)  # (B,)

    def metric(logits: torch.Tensor) -> torch.Tensor:
        n = logits.size(0) // clean.size
        return torch.log_softmax(logits[:, -1].float(), dim=-1).gather(-1, top.repeat(n)[:, None])[:, 0]

    return metric


def _cell_edit(clean: torch.Tensor, axis: int | None, index: int) -> Edit:
    """A copy's edit that puts the clean value back at one cell: the whole point (axis None), or index
    `index` along `axis`."""

    def edit(x: torch.Tensor) -> torch.Tensor:
        if axis is None:
            return clean
        where = (slice(None),) * axis + (index,)  # the cell's index along `axis`
        x[where] = clean[where]
        return x

    return edit


def _runs_per_pass(model: nn.Module, batch: Batch, logits_at: str, runs_per_pass: int | None) -> int:
    """At most 4096 tokens and 256 MB of logits per pass."""
    tokens = batch.target.ids.numel() + (0 if batch.source is None else batch.source.ids.numel())
    logits = (batch.target.ids.numel() if logits_at == "all" else batch.size) * model.config.vocab_size
    return runs_per_pass or max(1, min(4096 // tokens, 2**26 // logits))


def _activation(model, corrupt, names, clean_acts, axis, cells, metric, logits_at, runs_per_pass, progress):
    """Each cell's run starts at its layer from the corrupted run's residual stream (runs.run_patched)."""
    runs = [Run({names[layer]: _cell_edit(clean_acts[layer], axis, index)}, first_layer(model, [names[layer]]))
            for layer, index in cells]
    chunk = _runs_per_pass(model, corrupt, logits_at, runs_per_pass)
    values = run_patched(model, corrupt, runs, metric, logits_at=logits_at, runs_per_pass=chunk,
                         progress=progress).mean(dim=1)
    # The identity: a cell patched in a batch of copies, from its layer, equals the same cell patched alone
    # in a whole pass.
    strongest = int((values - values.median()).abs().argmax())
    alone = run_patched(model, corrupt, [Run(runs[strongest].edits)], metric, logits_at=logits_at).mean()
    error = (alone - values[strongest]).abs().item()
    layer, index = cells[strongest]
    check = (f"batched, from the cell's layer = one run at a time through every layer: max |diff| {error:.1e} "
             f"at layer {layer}"
             + ("" if axis is None else f", index {index}"))
    return values, check, error


def first_order(delta: torch.Tensor, grad: torch.Tensor | None, axis: int | None) -> torch.Tensor:
    """[cells] in float64: sum over the batch and every axis but `axis` of delta * grad, the first-order change
    of the metric when a point moves by delta ([1] for a whole point, axis None; a gradient None is 0).
    Attribution patching here (the corrupted run's metric plus the change of putting the clean value back)
    and node attribution in circuit discovery (the drop when the clean run's node takes the corrupted value,
    delta = clean - corrupt there too, the gradient at the clean run) are this one sum."""
    product = (delta * (0 if grad is None else grad)).double()
    if axis is None:
        return product.sum()[None]
    return product.transpose(0, axis).reshape(product.size(axis), -1).sum(1)


def _attribution(model, corrupt, names, clean_acts, axis, cells, metric, logits_at, runs_per_pass, progress):
    logits_of = Batch.last_logits if logits_at == "last" else Batch.logits
    with torch.enable_grad(), trace(model, names, grad=True) as t:
        score = metric(logits_of(corrupt, model))  # (B,)
        grads = torch.autograd.grad(score.mean(), [t[name] for name in names], allow_unused=True)
    base = score.mean().item()
    per_layer = [first_order(clean_acts[layer] - t[names[layer]].detach(), grads[layer], axis)
                 for layer in range(len(names))]
    values = [base + per_layer[layer][0 if axis is None else index].item() for layer, index in cells]
    # sum over the batch of the mean-metric gradient = the mean over the batch of each row's estimate
    check = "first-order estimate of activation patching (no identity holds exactly)"
    progress(len(cells), len(cells))
    return torch.tensor(values, device="cpu"), check, float("nan")


Cell = tuple  # (point name, axis of its tensor or None for the whole point, index along that axis)


def patch_cells(
    model: nn.Module, clean, corrupt, cells: list[Cell], metric: Metric, *, logits_at: str = "last",
    runs_per_pass: int | None = None, saes=None, progress: Progress | None = None,
) -> torch.Tensor:
    """[len(cells)]: metric of the corrupted run (averaged over its batch) with the clean run's value put
    back at one cell at a time, the cells of any points (a head's z, a neuron, an SAE feature):

        result[i] = mean_batch metric(model(corrupt | point_i[..., index_i along axis_i] := clean's))

    Batched as patch() is: each run starts at its point's layer from the corrupted run's residual stream,
    the runs of one layer copies of the corrupted batch in one pass (runs.run_patched).
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
    runs = [Run({name: _cell_edit(clean_acts[name], axis, index)}, first_layer(model, [name]))
             for name, axis, index in cells]
    chunk = _runs_per_pass(model, corrupt_batch, logits_at, runs_per_pass)
    values = run_patched(model, corrupt_batch, runs, metric, logits_at=logits_at, runs_per_pass=chunk,
                         saes=saes, progress=progress)
    return values.mean(dim=1)
