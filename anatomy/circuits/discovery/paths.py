"""Runs with edges ablated: path patching of single edges, and circuits with every other edge ablated.

Shape letters: C copies of the batch in one pass, B pairs, U sources, V destinations, T positions,
E model width, H query heads, K key/value heads.

An edge u -> v is ablated when the input of v alone gets u's ablated output a_u (the corrupted run's,
or the mean over the task) in place of the value u has in this run, cur_u:

    in_v = resid_v + sum_{u -> v ablated} (a_u - cur_u)

Everything downstream of v sees v's changed output; every other reader of the same residual sees it
unchanged. A head's q, k or v with an input of its own is recomputed from it (attention.project), an
MLP reads its own copy of the stream (blocks.L.mlp_in, before its norm), the logits read the final
residual directly. A source's output is what it adds to the stream (residual.head_writes: through a
frozen output norm in a sandwich block).

When most edges into v are ablated (a circuit), the sum runs over the kept ones instead:

    sum_{ablated} (a_u - cur_u) = sum_{all u before v} (a_u - cur_u) - sum_{kept} (a_u - cur_u)

where the first sum is a running total kept as the pass goes. Each of the C copies of the batch has
its own set of ablated edges: C patched runs in one forward pass.
"""

from __future__ import annotations

import torch
from torch import nn

from ...analysis.inputs import Batch
from ...analysis.runs import Run, run_patched
from ...trace import trace
from .residual import ResidualGraph, attention_norm, head_writes


def run_ablated(
    model: nn.Module, graph: ResidualGraph, batch: Batch, ablation: torch.Tensor, ablated: torch.Tensor,
    start: tuple[int, torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Last-position logits [C*B, vocab] of C copies of `batch` [B, T], copy c with the edges ablated[c]
    ablated. ablation [U, B, T, E] (or [U, 1, T, E]): each source's ablated output; ablated [C, U, V] bool
    (only allowed edges count). Row r of the output is copy r // B, pair r % B.

    start = (layer, resid [B, T, E], outputs [U, B, T, E]): no edge into a destination before `layer` is
    ablated, so the copies equal the unablated run before it: they start at `layer` from that run's
    residual stream (Stack.run_from), every source before it taken from that run's `outputs`."""
    copies, batch_size = ablated.size(0), batch.size
    ablated = ablated & graph.allowed
    a = ablation.expand(-1, batch_size, -1, -1) if ablation.size(1) == 1 else ablation  # (U, B, T, E)
    plans = {key: _plan(graph, columns, ablated) for key, columns in _groups(graph).items()}
    needed = {u for plan in plans.values() for _, sources, _ in plan for u in sources.tolist()}  # the outputs kept
    state: dict = {"sources": {}, "running": None, "a": a, "copies": copies, "needed": needed}
    interventions = {}
    for layer in range(graph.n_layers):
        interventions[f"blocks.{layer}.resid_pre"] = _keep(state, "resid_pre")
        if not graph.parallel:
            interventions[f"blocks.{layer}.resid_mid"] = _keep(state, "resid_mid")
        interventions[f"blocks.{layer}.attn.head_out"] = _sources(state, graph, layer, "head")
        interventions[graph.mlp_write_point(layer)] = _sources(state, graph, layer, "mlp")
        for which in ("q", "k", "v", "mlp"):
            point = f"blocks.{layer}.attn.{which}" if which != "mlp" else f"blocks.{layer}.mlp_in"
            interventions[point] = _reader(state, graph, layer, which, plans[(layer, which)])
    final = graph.reader_input_point(graph.n_layers, "logits")
    previous = interventions.get(final)
    interventions[final] = _final(state, plans[(graph.n_layers, "logits")], previous)
    first = interventions["blocks.0.resid_pre"]

    def embed(x: torch.Tensor) -> None:
        first(x)
        _record(state, 0, x)

    interventions["blocks.0.resid_pre"] = embed
    resumed = None
    if start is not None:
        layer, resid, outputs = start
        _resume(state, graph, layer, outputs, ablated)
        resumed = (layer, resid.repeat(copies, 1, 1))  # (C*B, T, E)
    with torch.no_grad(), trace(model, [], interventions=interventions):
        return batch.repeat(copies).last_logits(model, resumed)[:, 0]  # (C*B, vocab)


def _resume(state: dict, graph: ResidualGraph, layer: int, outputs: torch.Tensor, ablated: torch.Tensor) -> None:
    """The state of a run started at `layer`: the sources before it recorded as the base run wrote them (from
    layer 0 the run records the embeddings itself, at blocks.0.resid_pre)."""
    before = [u for u, node in enumerate(graph.sources) if node.layer < layer and layer > 0]
    earlier = [v for v, node in enumerate(graph.destinations) if node.layer < layer]
    if bool(ablated[:, :, earlier].any()):
        raise ValueError(f"a run started at layer {layer} cannot ablate an edge into an earlier destination")
    for u in before:
        _record(state, u, outputs[u].repeat(state["copies"], 1, 1))  # (C*B, T, E)


def plan_passes(graph: ResidualGraph, task, stored: int, max_tokens: int, max_bytes: int) -> tuple[int, int]:
    """(pairs per chunk, copies per pass) for runs that keep `stored` sources' outputs: half of max_bytes
    for a chunk's ablated outputs [U, B, T, E], half for a pass's kept outputs [stored + a product's
    block + 2, C*B, T, E], and at most max_tokens tokens a pass."""
    width, d_model = int(task.lengths.max()), graph.model.config.d_model
    per_pair = len(graph.sources) * width * d_model * 4
    per_token = (stored + SOURCES_PER_PRODUCT + 2) * d_model * 4
    tokens = max(width, min(max_tokens, max_bytes // 2 // per_token))
    pairs = max(1, min(len(task), max_bytes // 2 // per_pair, tokens // width))
    return pairs, max(1, tokens // (pairs * width))


def _groups(graph: ResidualGraph) -> dict[tuple[int, str], list[int]]:
    """(layer, reader kind) -> the destinations of that group, which read one residual: a layer's q, k and v
    inputs, its MLP's, the logits'."""
    groups: dict[tuple[int, str], list[int]] = {}
    for v, node in enumerate(graph.destinations):
        groups.setdefault((node.layer, node.kind), []).append(v)
    return groups


Plan = list  # per copy: (sign, sources [S], weights [S, v]): how a group's input changes are summed


def _plan(graph: ResidualGraph, columns: list[int], ablated: torch.Tensor) -> Plan:
    """For each copy, how a group's input changes are summed: over the ablated edges (sign 1), or as the
    running total minus the kept edges (sign -1), whichever reads fewer sources' outputs."""
    cut = ablated[:, :, columns]  # (C, U, v)
    kept = graph.allowed[:, columns][None] & ~cut  # (C, U, v)
    plan = []
    for c in range(cut.size(0)):
        direct = cut[c].any(dim=1).nonzero()[:, 0]
        through_kept = kept[c].any(dim=1).nonzero()[:, 0]
        if len(direct) <= len(through_kept):
            plan.append((1.0, direct, cut[c, direct].float()))
        else:
            plan.append((-1.0, through_kept, kept[c, through_kept].float()))
    return plan


def _live(plan: Plan) -> torch.Tensor:
    """[v] bool: the destinations whose input changes in some copy."""
    width = plan[0][2].size(1)
    live = torch.zeros(width, dtype=torch.bool, device="cpu")
    for sign, sources, weights in plan:
        live |= torch.ones(width, dtype=torch.bool, device="cpu") if sign < 0 else weights.sum(0) > 0
    return live


def _keep(state: dict, key: str):
    def fn(x: torch.Tensor) -> None:
        state[key] = x

    return fn


def _record(state: dict, u: int, value: torch.Tensor) -> None:
    """Source u's output in this run: into the running total of (a_u - cur_u), and kept if a sum needs it."""
    delta = (state["a"][u][None] - value.view(state["copies"], -1, *value.shape[1:])).view_as(value)  # (C*B, T, E)
    state["running"] = delta if state["running"] is None else state["running"] + delta
    if u in state["needed"]:
        state["sources"][u] = value


def _sources(state: dict, graph: ResidualGraph, layer: int, kind: str):
    """Record this layer's heads (what each adds to the stream, from head_out [CB, T, H, E]) or MLP (its write
    [CB, T, E]) as current sources."""
    first = next(i for i, node in enumerate(graph.sources) if node.layer == layer and node.kind == kind)
    block = graph.model.blocks[layer]

    def fn(x: torch.Tensor) -> None:
        for offset, value in enumerate(head_writes(block, x).unbind(2) if kind == "head" else (x,)):
            _record(state, first + offset, value)

    return fn


SOURCES_PER_PRODUCT = 64  # sources stacked for one product: bounds the memory of the stacked differences


def _input_changes(state: dict, plan: Plan) -> torch.Tensor:
    """[v, C*B, T, E]: for each destination of a group, sum over its ablated edges of (a_u - cur_u), copy by
    copy:

        sign 1:   sum_{u ablated} (a_u - cur_u)
        sign -1:  running - sum_{u kept} (a_u - cur_u)

    as products [v, S] @ [S, B*T*E] over blocks of the copy's sources."""
    running, copies, a = state["running"], state["copies"], state["a"]
    rows, shape = running.size(0), running.shape[1:]
    batch = rows // copies
    change = running.new_zeros(plan[0][2].size(1), copies, batch, shape.numel())  # (v, C, B, T*E)
    for c, (sign, sources, weights) in enumerate(plan):
        copy = slice(c * batch, (c + 1) * batch)  # this copy's rows
        if sign < 0:
            change[:, c] += running[copy].reshape(1, batch, -1)
        for start in range(0, len(sources), SOURCES_PER_PRODUCT):
            block = sources[start:start + SOURCES_PER_PRODUCT].tolist()
            current = torch.stack([state["sources"][u][copy] for u in block])  # (S, B, T, E)
            deltas = (a[block] - current).reshape(len(block), -1)  # (S, B*T*E)
            w = weights[start:start + len(block)].to(running).T  # (v, S), on the run's device
            change[:, c] += sign * (w @ deltas).view(w.size(0), batch, -1)
    return change.reshape(change.size(0), rows, *shape)  # (v, CB, T, E)


def _reader(state: dict, graph: ResidualGraph, layer: int, kind: str, plan):
    """The intervention on a reader's point: q, k, v [CB, heads, T, D] recomputed per head from inputs of
    their own; the MLP's own copy of the stream [CB, T, E] (mlp_in) changed."""
    live = _live(plan)  # (v,)
    block = graph.model.blocks[layer]

    def fn(x: torch.Tensor) -> torch.Tensor | None:
        if not bool(live.any()):
            return None  # nothing to change here
        changes = _input_changes(state, plan)  # (v, CB, T, E)
        resid = state["resid_pre" if kind != "mlp" or graph.parallel else "resid_mid"]
        if kind == "mlp":
            return resid + changes[0]
        x = x.clone()
        for slot in live.nonzero()[:, 0].tolist():  # one head (or key/value head) at a time
            x[:, slot] = one_head(block, kind, resid + changes[slot], slot)
        return x

    return fn


def one_head(block: nn.Module, kind: str, x: torch.Tensor, slot: int) -> torch.Tensor:
    """Head `slot`'s q, k or v [B, T, D] (before rotary positions) from an input x [B, T, E] of its own.
    Without q/k norms, its rows of the projection alone: norm(x) W_h^T + b_h; with them, the module's
    whole projection, of which the head's part is taken."""
    attn, norm = block.attn, attention_norm(block)
    if attn.qk_norm != "none":
        return attn.project(norm(x), kind)[:, slot]
    proj = {"q": attn.q_proj, "k": attn.k_proj, "v": attn.v_proj}[kind]
    rows = slice(slot * attn.d_head, (slot + 1) * attn.d_head)  # head h's rows of W: h*D .. (h+1)*D
    bias = None if proj.bias is None else proj.bias[rows]
    return torch.nn.functional.linear(norm(x), proj.weight[rows], bias)  # (B, T, D)


def _final(state: dict, plan: Plan, previous):
    live = bool(_live(plan).any())

    def fn(x: torch.Tensor) -> torch.Tensor | None:
        if previous is not None:
            previous(x)
        return x + _input_changes(state, plan)[0] if live else None

    return fn


# ---- single edges, from the destination's layer -----------------------------------------------------


def edge_effects(
    model: nn.Module, graph: ResidualGraph, batch: Batch, ablation: torch.Tensor, edges: list[tuple[int, int]],
    metric, *, max_tokens: int = 4096, progress=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(patched [k, B], clean [B]): the metric of the clean run with one edge u -> v ablated, for each of
    `edges`, and of the clean run itself, every row scored: path patching of single edges. ablation
    [U, B, T, E] (or [U, 1, T, E]): each source's ablated output; metric(last logits [C*B, vocab]) -> [C*B].

    With one edge ablated, the run is the clean run up to v's layer, and there v's input alone changes by
    a constant, in_v = resid_v + (a_u - clean_u): the run starts at v's layer from the clean residual
    stream (analysis.runs.run_patched, Stack.run_from), v's q, k or v recomputed from its changed input (or
    the MLP's own copy of the stream changed), the runs of one layer sharing a pass as copies of the batch.
    And it is the clean run before the first position P where any a_u differs from clean_u (IOI's corrupted
    name, late in the prompt): the model being causal, only positions P.. are computed, the clean run's
    keys and values before them read from a cache."""
    a = ablation.expand(-1, batch.size, -1, -1) if ablation.size(1) == 1 else ablation  # (U, B, T, E)
    final = graph.reader_input_point(graph.n_layers, "logits")
    names = [f"blocks.{layer}.{point}" for layer in range(graph.n_layers)
             for point in ("resid_pre",) + (() if graph.parallel else ("resid_mid",))]
    rotary = "k_rot" if model.config.pos_encoding == "rotary" else "k"
    kv = [f"blocks.{layer}.attn.{which}" for layer in range(graph.n_layers) for which in (rotary, "v")]
    clean, logits, t = graph.recorded_run(model, batch, names + [final] + kv)  # sources (U, B, T, E), the stream
    stream = [t[f"blocks.{layer}.resid_pre"] for layer in range(graph.n_layers)] + [t[final]]
    differs = (a != clean).any(dim=(0, 1, 3))  # (T,): the positions where some edge would carry a change
    held = int(differs.nonzero().min()) if bool(differs.any()) else 0
    prefix = None if held == 0 else (
        held, [t[f"blocks.{layer}.attn.{rotary}"][:, :, :held] for layer in range(graph.n_layers)],
        [t[f"blocks.{layer}.attn.v"][:, :, :held] for layer in range(graph.n_layers)])

    def changed_input(resid: torch.Tensor, u: int) -> torch.Tensor:  # (B, T - P, E)
        return (resid + (a[u] - clean[u]))[:, held:]

    runs = []
    for u, v in edges:  # each edit computes its input when its pass runs: no k copies of the stream held
        node = graph.destinations[v]
        if node.kind == "logits":  # the final residual, read at the last block's output
            runs.append(Run({final: lambda x, u=u: changed_input(t[final], u)}, graph.n_layers - 1))
            continue
        block, resid = graph.model.blocks[node.layer], t[graph.reader_input_point(node.layer, node.kind)]
        if node.kind == "mlp":  # the MLP's own copy of the stream, before its norm
            runs.append(Run({f"blocks.{node.layer}.mlp_in": lambda x, resid=resid, u=u: changed_input(resid, u)},
                            node.layer))
            continue

        def edit(x, block=block, kind=node.kind, slot=node.index, resid=resid, u=u):
            x[:, slot] = one_head(block, kind, changed_input(resid, u), slot)
            return x

        runs.append(Run({f"blocks.{node.layer}.attn.{node.kind}": edit}, node.layer))
    patched = run_patched(model, batch, runs, metric, stream=stream, max_tokens=max_tokens, prefix=prefix,
                          progress=progress)
    return patched, metric(logits[:, None])
