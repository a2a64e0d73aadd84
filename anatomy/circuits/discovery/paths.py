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

where the first sum is a running total kept as the pass goes (deltas.py: every a_u - cur_u kept once,
a layer's q, k and v inputs summed in one product, the heads whose input changed recomputed in one
batched projection). Each of the C copies of the batch has its own set of ablated edges: C patched runs
in one forward pass. Where every a_u equals the clean run's output before a position P (IOI's corrupted
name, late in the prompt), a circuit's run is the clean run there: it computes positions P.. alone, the
clean run's keys and values before them read from a cache (shared_prefix).
"""

from __future__ import annotations

import torch
from torch import nn

from ...analysis.inputs import Batch
from ...analysis.runs import Run, pass_start, run_patched
from ...trace import trace
from .deltas import SOURCES_PER_PRODUCT, SourceDeltas
from .residual import ResidualGraph, attention_norm, head_writes


def run_ablated(
    model: nn.Module, graph: ResidualGraph, batch: Batch, ablation: torch.Tensor, ablated: torch.Tensor,
    start: tuple[int, torch.Tensor, torch.Tensor | None] | None = None, prefix: tuple[int, list, list] | None = None,
) -> torch.Tensor:
    """Last-position logits [C*B, vocab] of C copies of `batch` [B, T], copy c with the edges ablated[c]
    ablated. ablation [U, B, T, E] (or [U, 1, T, E]): each source's ablated output; ablated [C, U, V] bool
    (only allowed edges count). Row r of the output is copy r // B, pair r % B.

    start = (layer, resid [B, T, E], outputs [U, B, T, E], None at layer 0): no edge into a destination before
    `layer` is ablated, so the copies equal the unablated run before it: they start at `layer` from that run's
    residual stream (Stack.run_from), every source before it taken from that run's `outputs`.
    prefix = (P, keys, values), with start: every a_u equals that run's output before position P, so the
    copies equal it there too (a causal model): they compute positions P.. alone, its keys and values
    keys[l], values[l] [B, K, P, D] read as their past (analysis.runs.pass_start)."""
    if prefix is not None and start is None:
        raise ValueError("a run that skips the first positions (prefix) needs the run it starts from (start)")
    copies, batch_size = ablated.size(0), batch.size
    ablated = ablated & graph.allowed
    held = 0 if prefix is None else prefix[0]
    a = ablation.expand(-1, batch_size, -1, -1) if ablation.size(1) == 1 else ablation  # (U, B, T, E)
    deltas = SourceDeltas(a[:, :, held:], copies)  # (U, B, T - P, E)
    groups = _groups(graph)
    plans = {key: _plan(graph, columns, ablated) for key, columns in groups.items()}
    stream: dict[str, torch.Tensor] = {}
    interventions = {}
    for layer in range(graph.n_layers):
        interventions[f"blocks.{layer}.resid_pre"] = _keep(stream, "resid_pre")
        if not graph.parallel:
            interventions[f"blocks.{layer}.resid_mid"] = _keep(stream, "resid_mid")
        interventions[f"blocks.{layer}.attn.head_out"] = _sources(deltas, graph, layer, "head")
        interventions[graph.mlp_write_point(layer)] = _sources(deltas, graph, layer, "mlp")
        interventions.update(_readers(deltas, stream, graph, layer, groups, plans))
    final = graph.reader_input_point(graph.n_layers, "logits")
    previous = interventions.get(final)
    interventions[final] = _final(deltas, plans[(graph.n_layers, "logits")], previous)
    first = interventions["blocks.0.resid_pre"]

    def embed(x: torch.Tensor) -> None:
        first(x)
        deltas.record(0, x[None])

    interventions["blocks.0.resid_pre"] = embed
    resumed = None
    if start is not None:
        layer, resid, outputs = start
        _resume(deltas, graph, layer, None if outputs is None else outputs[:, :, held:], ablated)
        resumed = pass_start(layer, resid, prefix, copies, batch)  # (layer, stream [C*B, T - P, E], past)
    with torch.no_grad(), trace(model, [], interventions=interventions):
        return batch.repeat(copies).last_logits(model, resumed)[:, 0]  # (C*B, vocab)


def _resume(deltas: SourceDeltas, graph: ResidualGraph, layer: int, outputs: torch.Tensor, ablated: torch.Tensor) -> None:
    """The state of a run started at `layer`: the sources before it recorded as the base run wrote them (from
    layer 0 the run records the embeddings itself, at blocks.0.resid_pre)."""
    before = sum(1 for node in graph.sources if node.layer < layer) if layer > 0 else 0
    earlier = [v for v, node in enumerate(graph.destinations) if node.layer < layer]
    if bool(ablated[:, :, earlier].any()):
        raise ValueError(f"a run started at layer {layer} cannot ablate an edge into an earlier destination")
    if before:
        deltas.record(0, outputs[:before].repeat(1, deltas.copies, 1, 1))  # (before, C*B, T, E)


def plan_passes(graph: ResidualGraph, task, stored: int, max_tokens: int, max_bytes: int) -> tuple[int, int]:
    """(pairs per chunk, copies per pass) for runs that keep `stored` sources' outputs: half of max_bytes
    for a chunk's ablated outputs [U, B, T, E], half for a pass's kept outputs [stored + a product's
    block + 2, C*B, T, E], and at most max_tokens tokens a pass."""
    width = int(task.lengths.max())
    per_pair = len(graph.sources) * width * graph.model.config.d_model * 4
    tokens = pass_tokens(graph, stored, width, max_tokens, max_bytes)
    pairs = max(1, min(len(task), max_bytes // 2 // per_pair, tokens // width))
    return pairs, max(1, tokens // (pairs * width))


def pass_tokens(graph: ResidualGraph, stored: int, width: int, max_tokens: int, max_bytes: int) -> int:
    """The tokens of a pass (copies x pairs x positions computed) that keep `stored` sources' outputs
    [stored + a product's block + 2, C*B, T, E] in half of max_bytes, at most max_tokens and at least
    `width` (one sequence)."""
    per_token = (stored + SOURCES_PER_PRODUCT + 2) * graph.model.config.d_model * 4
    return max(width, min(max_tokens, max_bytes // 2 // per_token))


READERS = {"q": "attn", "k": "attn", "v": "attn", "mlp": "mlp", "logits": "logits"}  # destination kind -> its group


def _groups(graph: ResidualGraph) -> dict[tuple[int, str], list[int]]:
    """(layer, group) -> the destinations of that group, which read one residual when nothing is ablated: a
    layer's q, k and v inputs ("attn"), its MLP's, the logits'."""
    groups: dict[tuple[int, str], list[int]] = {}
    for v, node in enumerate(graph.destinations):
        groups.setdefault((node.layer, READERS[node.kind]), []).append(v)
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


def _keep(stream: dict, key: str):
    def fn(x: torch.Tensor) -> None:
        stream[key] = x

    return fn


def _sources(deltas: SourceDeltas, graph: ResidualGraph, layer: int, kind: str):
    """Record this layer's heads (what each adds to the stream, from head_out [CB, T, H, E]) or MLP (its write
    [CB, T, E]) as current sources."""
    first = next(i for i, node in enumerate(graph.sources) if node.layer == layer and node.kind == kind)
    block = graph.model.blocks[layer]

    def fn(x: torch.Tensor) -> None:
        deltas.record(first, head_writes(block, x).permute(2, 0, 1, 3) if kind == "head" else x[None])  # (n, CB, T, E)

    return fn


def _readers(deltas: SourceDeltas, stream: dict, graph: ResidualGraph, layer: int, groups: dict, plans: dict) -> dict:
    """The interventions on a layer's readers: q, k, v [CB, heads, T, D] recomputed for the heads whose input
    changes, each from its own input (project_heads); the MLP's own copy of the stream [CB, T, E] (mlp_in)
    changed. The q, k and v inputs of the layer's heads are one group: their inputs [v, CB, T, E] are
    computed once, where the first of them is read, and dropped after the last."""
    block = graph.model.blocks[layer]
    resid_of = {"attn": "resid_pre", "mlp": "resid_pre" if graph.parallel else "resid_mid"}
    interventions, computed = {}, {}
    for group in ("attn", "mlp"):
        plan, live = plans[(layer, group)], _live(plans[(layer, group)])  # live (v,)
        nodes = [graph.destinations[v] for v in groups[(layer, group)]]
        readers = list(dict.fromkeys(node.kind for node in nodes))  # in the order the pass reads them: q, k, v
        for kind in readers:
            rows = [i for i, node in enumerate(nodes) if node.kind == kind and live[i]]  # this kind's changed inputs
            point = f"blocks.{layer}.attn.{kind}" if kind != "mlp" else f"blocks.{layer}.mlp_in"
            shared = (group, resid_of[group], kind == readers[-1], computed)
            interventions[point] = _reader(deltas, stream, block, kind, plan, rows, [nodes[i].index for i in rows],
                                           shared)
    return interventions


def _reader(deltas: SourceDeltas, stream: dict, block: nn.Module, kind: str, plan: Plan, rows: list[int],
            slots: list[int], shared: tuple):
    group, resid, last, computed = shared  # the group's inputs, computed once, dropped by its last reader
    if rows and rows == list(range(rows[0], rows[0] + len(rows))):
        rows = slice(rows[0], rows[0] + len(rows))  # consecutive: the group's inputs read in place, no copy

    def fn(x: torch.Tensor) -> torch.Tensor | None:
        if group not in computed and rows:
            computed[group] = deltas.changes(plan).add_(stream[resid])  # (v, CB, T, E): in_v = resid + change_v
        inputs = computed.pop(group, None) if last else computed.get(group)
        if not rows:
            return None  # nothing to change here
        if kind == "mlp":
            return inputs[0]
        x = x.clone()
        x[:, slots] = project_heads(block, kind, inputs[rows], slots).transpose(0, 1)  # (h, CB, T, D) -> (CB, h, T, D)
        return x

    return fn


def project_heads(block: nn.Module, kind: str, x: torch.Tensor, slots: list[int]) -> torch.Tensor:
    """The q, k or v [h, B, T, D] (before rotary positions) of heads `slots` [h], each from an input x[i]
    [B, T, E] of its own. Without q/k norms, each head's rows of the projection alone, in one batched
    product: norm(x_h) W_h^T + b_h; with them, the module's whole projection, of which the head's part
    is taken."""
    attn, norm = block.attn, attention_norm(block)
    normed = norm(x)  # (h, B, T, E)
    heads, batch, length, width = normed.shape
    if attn.qk_norm != "none":
        every = attn.project(normed.reshape(heads * batch, length, width), kind)  # (h*B, heads, T, D)
        every = every.view(heads, batch, *every.shape[1:])  # (h, B, heads, T, D)
        return torch.stack([every[i, :, slot] for i, slot in enumerate(slots)])  # (h, B, T, D)
    proj = {"q": attn.q_proj, "k": attn.k_proj, "v": attn.v_proj}[kind]
    weight = proj.weight.view(-1, attn.d_head, width)[slots]  # (H*D, E) -> (heads, D, E) -> (h, D, E)
    out = torch.matmul(normed.view(heads, batch * length, width), weight.transpose(1, 2))  # (h, B*T, D)
    if proj.bias is not None:
        out = out + proj.bias.view(-1, 1, attn.d_head)[slots]  # (heads, 1, D) -> (h, 1, D)
    return out.view(heads, batch, length, attn.d_head)  # (h, B, T, D)


def _final(deltas: SourceDeltas, plan: Plan, previous):
    live = bool(_live(plan).any())

    def fn(x: torch.Tensor) -> torch.Tensor | None:
        if previous is not None:
            previous(x)
        return x + deltas.changes(plan)[0] if live else None

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
    clean, logits, t = graph.recorded_run(model, batch, names + [final] + kv_points(model))  # sources (U, B, T, E)
    stream = [t[f"blocks.{layer}.resid_pre"] for layer in range(graph.n_layers)] + [t[final]]
    prefix = shared_prefix(model, a, clean, t)
    held = 0 if prefix is None else prefix[0]

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
            x[:, slot] = project_heads(block, kind, changed_input(resid, u)[None], [slot])[0]
            return x

        runs.append(Run({f"blocks.{node.layer}.attn.{node.kind}": edit}, node.layer))
    patched = run_patched(model, batch, runs, metric, stream=stream, max_tokens=max_tokens, prefix=prefix,
                          progress=progress)
    return patched, metric(logits[:, None])


def kv_points(model: nn.Module) -> list[str]:
    """The points of every layer's keys (after rotary positions) and values: what a run that starts at a
    later position reads as its past (shared_prefix)."""
    keys = "k_rot" if model.config.pos_encoding == "rotary" else "k"
    return [f"blocks.{layer}.attn.{which}" for layer in range(model.config.n_layers) for which in (keys, "v")]


def shared_prefix(model: nn.Module, ablation: torch.Tensor, outputs: torch.Tensor, t: dict) -> tuple | None:
    """(P, keys, values): P the first position where some source's ablated output ablation [U, B or 1, T, E]
    differs from its output in a run, outputs [U, B, T, E], whose kv_points t holds; keys[l], values[l]
    [B, K, P, D] that run's before P. Before P no ablated edge changes anything: a causal model's ablated
    runs equal that run there, and compute positions P.. alone. None where they differ at position 0."""
    differs = (ablation != outputs).any(dim=(0, 1, 3))  # (T,): the positions where some edge would carry a change
    held = int(differs.nonzero().min()) if bool(differs.any()) else 0
    if held == 0:
        return None
    keys, values = kv_points(model)[0::2], kv_points(model)[1::2]
    return held, [t[name][:, :, :held] for name in keys], [t[name][:, :, :held] for name in values]
