"""Node attribution over a dataset: AtP, AtP* and IG-style attribution patching, for heads (their
outputs, or their queries, keys and values), MLPs, neurons and SAE features.

Shape letters: L layers, H heads, K key/value heads, B pairs, T query positions, S key positions,
F neurons or features.

The effect of a node n is what the metric loses when n takes its corrupted value in the clean run:

    c(n) = m(clean) - m(clean | n := n(corrupt))

AtP (Nanda 2023, "Attribution patching") is its first-order term, from one clean pass, one corrupted
pass and one backward pass for every node at once:

    AtP(n) = mean_pairs  sum (n(clean) - n(corrupt)) . d m / d n |clean

IG (integrated gradients on the path from the corrupted input embeddings to the clean ones, as
edges.py does for EAP-IG) averages the gradient over k/m, k = 1..m. AtP* (Kramár et al. 2024, "AtP*:
An efficient and scalable method for localizing LLM behaviour to components") fixes two of AtP's
failures:

- the QK fix: a query or key moves the attention pattern through a softmax, where a gradient is
  blind once the softmax saturates; AtP* recomputes the pattern exactly with that query (key)
  corrupted and keeps only the rest linear:  AtP*(n) = - sum (A(n corrupted) - A) . d m / d A
- GradDrop: paths that cancel hide a node; the gradient is taken L more times, each time with one
  layer's residual writes (its attention and MLP outputs) passing no gradient back, and
  AtP*(n) = 1/(L-1) sum_l |AtP_l(n)|  (unsigned).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ...analysis.attribution import on_path, riemann
from ...analysis.inputs import Batch
from ...analysis.patching import first_order
from ...analysis.result import Result
from ...attention import attention_scores, attention_weights, repeat_kv
from ... import masks
from ...trace import trace
from .choices import MAX_STEPS, NODE_METHODS as METHODS, node_refusal
from .tasks import Task

KINDS = {  # kind -> (point inside block L, the axis that indexes the node, the result's axis name)
    "heads": ("attn.z", 2, "head"), "q": ("attn.q", 1, "head"), "k": ("attn.k", 1, "kv_head"),
    "v": ("attn.v", 1, "kv_head"), "mlp": ("mlp.out", None, None), "neurons": ("mlp.post", 2, "neuron"),
}
Progress = Callable[[int, int], None]


class _Gate(torch.autograd.Function):
    """The identity, whose backward passes no gradient while `closed` names its layer (GradDrop)."""

    @staticmethod
    def forward(ctx, x, layer, closed):
        ctx.layer, ctx.closed = layer, closed
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return (torch.zeros_like(grad) if ctx.closed[0] == ctx.layer else grad), None, None


def node_points(model: nn.Module, kind: str, sae_point: str | None = None) -> list[tuple[str, int | None]]:
    """(point, node axis) for every layer's nodes of `kind`, or the one SAE point's features."""
    if kind == "features":
        return [(f"{sae_point}.sae.features", 2)]
    point, axis, _ = KINDS[kind]
    return [(f"blocks.{layer}.{point}", axis) for layer in range(model.config.n_layers)]


def attribute_nodes(
    model: nn.Module, task: Task, *, kind: str = "heads", method: str = "atp", steps: int = 5,
    sae=None, batch_size: int = 16, progress: Progress | None = None,
) -> Result:
    """[layer, head] (heads, q; k, v: [layer, kv_head]), [layer] (mlp), [layer, neuron] or [feature]:
    the attribution of every node of `kind` over the task's pairs (mean over pairs), for a decoder's next
    token or an encoder classifier's label logits (the task's metric reads them). A mixture of experts
    is one MLP node (the router's choice is part of it).

    method "atp", "atp*" (q and k get the QK fix; every kind GradDrop; unsigned) or "ig" (`steps`
    points). sae: an anatomy.SAE (kind="features"), spliced at its own point. Raises ValueError for an
    unknown kind or method, steps outside 1..MAX_STEPS, another kind of model, or the neurons of experts.
    """
    if kind not in (*KINDS, "features"):
        raise ValueError(f"kind={kind!r} is not supported; allowed values: {', '.join([*KINDS, 'features'])}")
    if method not in METHODS:
        raise ValueError(f"method={method!r} is not supported; allowed values: {', '.join(METHODS)}")
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"steps must be an integer from 1 to {MAX_STEPS}, got {steps!r}")
    if (kind == "features") != (sae is not None):
        raise ValueError("kind='features' needs sae=an anatomy.SAE, and sae is only for kind='features'")
    config = model.config
    why = node_refusal(config)
    if why:
        raise ValueError(why)
    if kind == "neurons" and config.n_experts:
        raise ValueError(f"kind='neurons' reads one MLP's hidden units; this model's MLPs are mixtures of {config.n_experts} "
                         f"experts, each token routed to {config.n_experts_per_token}: an expert layer is one node, "
                         f"kind='mlp'")
    model.eval()
    saes = {sae.point_out or sae.point: sae} if sae is not None else None
    points = node_points(model, kind, sae.point if sae is not None else None)
    chunks = task.batches(batch_size)
    n_steps = steps if method == "ig" else 1
    total_passes = len(chunks) * (n_steps + (model.config.n_layers if method == "atp*" else 0))
    done = [0]

    def tick() -> None:
        done[0] += 1
        if progress is not None:
            progress(done[0], total_passes)

    sums = None
    for rows in chunks:
        part = _chunk(model, task, rows, points, kind, method, n_steps, saes, tick)
        sums = part if sums is None else sums + part
    values = sums / len(task)
    if method == "atp*":
        gated = values[1:].abs()  # (L gates, layers, nodes)
        if kind != "features":  # a layer's own gate is left out: its nodes write through it
            gated = gated * (1 - torch.eye(gated.size(0), dtype=gated.dtype, device=gated.device))[:, :, None]
        values = gated.sum(0) / max(1, model.config.n_layers - 1)  # GradDrop: 1/(L-1) sum_l |AtP_l|
    else:
        values = values[0]
    return _result(model, task, kind, method, steps, values, sae)


def _chunk(model, task, rows, points, kind, method, steps, saes, tick) -> torch.Tensor:
    """Sum over this chunk's pairs of each node's estimate: [1 + gates, layers, nodes] (gates: atp*)."""
    clean, corrupt = task.inputs(rows)
    names = [name for name, _ in points]
    qk = method == "atp*" and kind in ("q", "k")
    extra = _qk_names(model) if qk else []
    with torch.no_grad(), trace(model, names + extra + ["blocks.0.resid_pre"], saes=saes) as t:
        corrupt.last_logits(model)
    corrupt_values = {name: t[name] for name in t}
    with torch.no_grad(), trace(model, names + extra + ["blocks.0.resid_pre"], saes=saes) as t:
        clean.last_logits(model)
    clean_values = {name: t[name] for name in t}
    layers = model.config.n_layers
    gates = list(range(layers)) if method == "atp*" else []
    totals = None
    for alpha, weight in zip(*riemann(steps)):  # the right Riemann sum, k/m for k = 1..m
        embed = on_path(corrupt_values["blocks.0.resid_pre"], clean_values["blocks.0.resid_pre"], float(alpha))
        grads = _gradients(model, task, rows, clean, names + [n for n in extra if n.endswith("pattern")],
                           embed, saes, gates, tick)
        estimates = []
        for grad in grads:  # no gate, then each closed layer
            if qk:
                estimates.append(_qk_fixed(model, clean, kind, clean_values, corrupt_values, grad))
            else:
                estimates.append(torch.stack([first_order(clean_values[n] - corrupt_values[n], grad[n], axis)
                                              for n, axis in points]))  # (layers, nodes)
        step = torch.stack(estimates) * float(weight)  # (1 + gates, layers, nodes)
        totals = step if totals is None else totals + step
    return totals


def _gradients(model, task, rows, batch: Batch, names, embed, saes, gates, tick) -> list[dict]:
    """d m / d point for every named point, summed over the pairs' metrics: without a gate, then once per
    closed layer (GradDrop: one forward pass, one backward pass per gate)."""
    closed = [None]
    interventions = {"blocks.0.resid_pre": lambda x: embed.detach().requires_grad_(True)}
    for layer in range(model.config.n_layers if gates else 0):
        for point in ("attn.out", "mlp.out"):
            interventions[f"blocks.{layer}.{point}"] = lambda x, l=layer: _Gate.apply(x, l, closed)
    results = []
    with torch.enable_grad(), trace(model, names, interventions, grad=True, saes=saes) as t:
        values = task.score(batch.last_logits(model)[:, 0], rows).sum()
        tensors = [t[name] for name in names]
        for gate in [None, *gates]:
            closed[0] = gate
            grads = torch.autograd.grad(values, tensors, allow_unused=True, retain_graph=gate != gates[-1] if gates else False)
            results.append(dict(zip(names, grads)))
            tick()
    return results


def _qk_names(model: nn.Module) -> list[str]:
    rotary = model.config.pos_encoding == "rotary"
    names = []
    for layer in range(model.config.n_layers):
        names += [f"blocks.{layer}.attn.{p}" for p in (("q_rot", "k_rot") if rotary else ("q", "k"))]
        names += [f"blocks.{layer}.attn.scores", f"blocks.{layer}.attn.pattern"]
    return names


def _qk_fixed(model, batch: Batch, kind: str, clean: dict, corrupt: dict, grad: dict) -> torch.Tensor:
    """[layers, heads]: - sum (A' - A) . d m / d A, with A' the pattern recomputed exactly with one head's
    query (kind "q") or one key/value head's keys (kind "k") corrupted (summed over the pairs)."""
    config = model.config
    suffix = "_rot" if config.pos_encoding == "rotary" else ""
    batch = batch.on(model)  # its padding mask meets the scores
    width = batch.target.ids.size(1)
    per_layer = []
    for layer, block in enumerate(model.blocks):
        attn, prefix = block.attn, f"blocks.{layer}.attn."
        q, k = clean[prefix + "q" + suffix], repeat_kv(clean[prefix + "k" + suffix], attn.n_heads)  # (B, H, T, D), (B, H, S, D)
        window = config.sliding_window if config.layer_types[layer] == "sliding" else None
        mask, _ = masks.self_attention_mask(batch.target.padding_mask, width, causal=config.arch == "decoder",
                                            window=window, device=q.device)
        bias = clean[prefix + "scores"] - attention_scores(q, k, scale=attn.scale, softcap=attn.softcap)  # ALiBi etc.
        if kind == "q":
            scores = attention_scores(corrupt[prefix + "q" + suffix], k, scale=attn.scale, softcap=attn.softcap)
        else:
            k_corrupt = repeat_kv(corrupt[prefix + "k" + suffix], attn.n_heads)
            scores = attention_scores(q, k_corrupt, scale=attn.scale, softcap=attn.softcap)
        changed = attention_weights(scores + bias, mask) - clean[prefix + "pattern"]  # (B, H, T, S)
        g = grad[prefix + "pattern"]
        per_head = -(changed * (torch.zeros_like(changed) if g is None else g)).double().sum(dim=(0, 2, 3))  # (H,)
        if kind == "k":
            per_head = per_head.view(attn.n_kv_heads, -1).sum(1)  # the query heads a key/value head serves
        per_layer.append(per_head)
    return torch.stack(per_layer)


def _result(model, task, kind, method, steps, values, sae) -> Result:
    n_layers = model.config.n_layers
    layers = [f"L{layer}" for layer in range(n_layers)]
    name = {"atp": "AtP", "atp*": "AtP* (QK fix, GradDrop; unsigned)" if kind in ("q", "k") else "AtP* (GradDrop; unsigned)",
            "ig": f"IG, {steps} steps"}[method]
    letter = {"head": "H", "kv_head": "KV", "neuron": "N"}
    if kind == "features":
        values, axes, labels = values[0], ("feature",), {"feature": [f"F{i}" for i in range(values.size(1))]}
    elif kind == "mlp":
        values, axes, labels = values[:, 0], ("layer",), {"layer": layers}
    else:
        axis = KINDS[kind][2]
        values, axes = values, ("layer", axis)
        labels = {"layer": layers, axis: [f"{letter[axis]}{i}" for i in range(values.size(1))]}
    return Result(
        f"node attribution ({name}, {kind})", values, axes, labels=labels,
        check="the metric each node's corruption costs, estimated (no identity holds exactly; verify_nodes "
              "patches the top ones exactly)",
        extra={"method": method, "kind": kind, "steps": steps, "task": task.name, "pairs": len(task),
               "sae_point": None if sae is None else sae.point, "view": "grid",
               "row_layers": list(range(n_layers)) if values.dim() == 2 else None,
               "legend": "the metric lost when the node is corrupted",
               "caption": "Each cell: the estimated drop of the metric, m(clean) − m(clean with the node corrupted), "
                          "averaged over the task's pairs."},
        about=f"{task.name}, {len(task)} pairs",
    )
