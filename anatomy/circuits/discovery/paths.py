"""Runs with edges ablated: path patching of single edges, and circuits with every other edge ablated.

Shape letters: C copies of the batch in one pass, B pairs, U sources, V destinations, T positions,
E model width, H query heads, K key/value heads.

An edge u -> v is ablated when the input of v alone gets u's ablated output a_u (the corrupted run's,
or the mean over the task) in place of the value u has in this run, cur_u:

    in_v = resid_v + sum_{u -> v ablated} (a_u - cur_u)

Everything downstream of v sees v's changed output; every other reader of the same residual sees it
unchanged. A head's q, k or v with an input of its own is recomputed from it (attention.project), an
MLP's input goes through its own norm again, the logits read the final residual directly.

When most edges into v are ablated (a circuit), the sum runs over the kept ones instead:

    sum_{ablated} (a_u - cur_u) = sum_{all u before v} (a_u - cur_u) - sum_{kept} (a_u - cur_u)

where the first sum is a running total kept as the pass goes. Each of the C copies of the batch has
its own set of ablated edges: C patched runs in one forward pass.
"""

from __future__ import annotations

import torch
from torch import nn

from ...analysis.inputs import Batch
from ...trace import trace
from .residual import ResidualGraph


def run_ablated(
    model: nn.Module, graph: ResidualGraph, batch: Batch, ablation: torch.Tensor, ablated: torch.Tensor,
) -> torch.Tensor:
    """Last-position logits [C*B, vocab] of C copies of `batch` [B, T], copy c with the edges ablated[c]
    ablated. ablation [U, B, T, E] (or [U, 1, T, E]): each source's ablated output; ablated [C, U, V] bool
    (only allowed edges count). Row r of the output is copy r // B, pair r % B."""
    copies, batch_size = ablated.size(0), batch.size
    ablated = ablated & graph.allowed
    state: dict = {"sources": {}, "running": None, "inside": False}
    a = ablation.expand(-1, batch_size, -1, -1) if ablation.size(1) == 1 else ablation  # (U, B, T, E)
    a = a.repeat(1, copies, 1, 1)  # (U, C*B, T, E), copy-major like Batch.repeat
    interventions = {}
    for layer in range(graph.n_layers):
        interventions[f"blocks.{layer}.resid_pre"] = _keep(state, "resid_pre")
        if not graph.parallel:
            interventions[f"blocks.{layer}.resid_mid"] = _keep(state, "resid_mid")
        interventions[f"blocks.{layer}.attn.head_out"] = _sources(state, graph, layer, "head", a)
        interventions[f"blocks.{layer}.mlp.out"] = _sources(state, graph, layer, "mlp", a)
        for which in ("q", "k", "v"):
            interventions[f"blocks.{layer}.attn.{which}"] = _reader(state, graph, layer, which, a, ablated, batch_size)
        interventions[f"blocks.{layer}.mlp_norm.out"] = _reader(state, graph, layer, "mlp", a, ablated, batch_size)
    final = graph.reader_input_point(graph.n_layers, "logits")
    previous = interventions.get(final)
    interventions[final] = _final(state, graph, a, ablated, batch_size, previous)
    first = interventions["blocks.0.resid_pre"]

    def embed(x: torch.Tensor) -> None:
        first(x)
        state["sources"][0] = x
        state["running"] = a[0] - x  # sum over the sources so far of (a_u - cur_u)

    interventions["blocks.0.resid_pre"] = embed
    with torch.no_grad(), trace(model, [], interventions=interventions):
        return batch.repeat(copies).last_logits(model)[:, 0]  # (C*B, vocab)


def _keep(state: dict, key: str):
    def fn(x: torch.Tensor) -> None:
        state[key] = x

    return fn


def _sources(state: dict, graph: ResidualGraph, layer: int, kind: str, a: torch.Tensor):
    """Record this layer's heads (head_out [CB, T, H, E]) or MLP (mlp.out [CB, T, E]) as current sources."""
    first = next(i for i, node in enumerate(graph.sources) if node.layer == layer and node.kind == kind)

    def fn(x: torch.Tensor) -> None:
        outputs = x.unbind(2) if kind == "head" else (x,)
        for offset, value in enumerate(outputs):
            state["sources"][first + offset] = value
            state["running"] = state["running"] + (a[first + offset] - value)

    return fn


def _input_changes(state: dict, graph: ResidualGraph, columns: list[int], a: torch.Tensor, ablated: torch.Tensor,
                   batch_size: int) -> torch.Tensor:
    """[len(columns), C*B, T, E]: sum over the ablated edges into each destination of (a_u - cur_u)."""
    copies = ablated.size(0)
    upstream = graph.allowed[:, columns].any(dim=1)  # (U,) every source before these destinations
    cut = ablated[:, :, columns]  # (C, U, v)
    kept = graph.allowed[:, columns][None] & ~cut  # (C, U, v)
    direct = cut.any(dim=(0, 2)).nonzero()[:, 0].tolist()
    through_kept = (kept.any(dim=(0, 2)) & upstream).nonzero()[:, 0].tolist()
    running = state["running"]  # (CB, T, E)
    shape = (len(columns), copies, batch_size) + running.shape[1:]
    if len(direct) <= len(through_kept):
        total, sources, weights, sign = None, direct, cut, 1.0
    else:
        total, sources, weights, sign = running, through_kept, kept, -1.0
    change = torch.zeros(shape, dtype=running.dtype) if total is None else total.view(copies, batch_size, *running.shape[1:]).expand(shape).clone()
    for u in sources:
        delta = (a[u] - state["sources"][u]).view(copies, batch_size, *running.shape[1:])  # (C, B, T, E)
        weight = weights[:, u, :].T.to(delta.dtype)  # (v, C): 1 where this copy ablates (keeps) u -> v
        change += sign * weight[:, :, None, None, None] * delta[None]
    return change.view(len(columns), copies * batch_size, *running.shape[1:])  # (v, CB, T, E)


def _reader(state: dict, graph: ResidualGraph, layer: int, kind: str, a, ablated, batch_size: int):
    """The intervention on a reader's point: q, k, v [CB, heads, T, D] recomputed per head from inputs of
    their own; the MLP's normed input [CB, T, E] recomputed from its own input."""
    columns = [i for i in graph.layer_destinations(layer) if graph.destinations[i].kind == kind]
    live = ablated[:, :, columns].any(dim=(0, 1))  # (v,): destinations with an ablated edge in some copy
    block = graph.model.blocks[layer]

    def fn(x: torch.Tensor) -> torch.Tensor | None:
        if state["inside"] or not bool(live.any()):
            return None  # our own call of the norm below, or nothing to change here
        changes = _input_changes(state, graph, columns, a, ablated, batch_size)  # (v, CB, T, E)
        resid = state["resid_pre" if kind != "mlp" or graph.parallel else "resid_mid"]
        if kind == "mlp":
            state["inside"] = True
            try:
                return block.mlp_norm(resid + changes[0])
            finally:
                state["inside"] = False
        x = x.clone()
        for slot in live.nonzero()[:, 0].tolist():  # one head (or key/value head) at a time
            x[:, slot] = one_head(block, kind, resid + changes[slot], slot)
        return x

    return fn


def one_head(block: nn.Module, kind: str, x: torch.Tensor, slot: int) -> torch.Tensor:
    """Head `slot`'s q, k or v [B, T, D] (before rotary positions) from an input x [B, T, E] of its own.
    Without q/k norms, its rows of the projection alone: norm(x) W_h^T + b_h; with them, the module's
    whole projection, of which the head's part is taken."""
    attn = block.attn
    if attn.qk_norm != "none":
        return attn.project(block.attn_norm(x), kind)[:, slot]
    proj = {"q": attn.q_proj, "k": attn.k_proj, "v": attn.v_proj}[kind]
    rows = slice(slot * attn.d_head, (slot + 1) * attn.d_head)  # head h's rows of W: h*D .. (h+1)*D
    bias = None if proj.bias is None else proj.bias[rows]
    return torch.nn.functional.linear(block.attn_norm(x), proj.weight[rows], bias)  # (B, T, D)


def _final(state: dict, graph: ResidualGraph, a, ablated, batch_size: int, previous):
    columns = graph.layer_destinations(graph.n_layers)

    def fn(x: torch.Tensor) -> torch.Tensor | None:
        if previous is not None:
            previous(x)
        if not bool(ablated[:, :, columns].any()):
            return None
        return x + _input_changes(state, graph, columns, a, ablated, batch_size)[0]

    return fn
