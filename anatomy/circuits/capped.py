"""A capped graph: rows for max_feature_nodes features only, chosen batch by batch by their partial influence as
circuit-tracer 0.5 chooses them, so that the cap bounds the work and the memory.

Shape letters: R rows computed so far (the logits', then features' in the order chosen), n active features,
N the whole graph's nodes (what a row reaches), n_kept the capped graph's nodes.

circuit-tracer's `attribute(max_feature_nodes=...)` computes the logits' rows, then, every update_interval
batches, ranks the features not yet computed by their influence on the outputs through the rows computed so far,

    c = w + c Â[R, R]          w: the logits' probabilities (on the logit rows), Â: |A| row-normalised
    influence = c Â[R, :]      = sum_k w Â_R^k on every node (its power iteration, `compute_partial_influences`;
                                 here one pass over the rows in the order of their layers, partial_influence)

and computes the next update_interval batches of batch_size features in that order, up to max_feature_nodes.
Its graph keeps the chosen features and every error, token and logit: the edges from the features it did not
choose are dropped. Here the same choice is made from the same rows, held in a RowStore (rows.py), and the
batches between two rankings are swept together, in buckets of nearby positions (sweep.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .footprint import lazy_zeros
from .layout import Active, Layout, layout
from .replacement import Replacement
from .rows import RowStore
from .sweep import Rows, Sources, buckets, feature_rows, sweep, width

SLACK = 0.875  # a bucket of a batch's rows spans positions from 0.875 P to P: what it carries past a row's own is waste


@dataclass
class CappedRows:
    """What `capped_rows` computed: chosen [n] bool over Active, the features kept; row_nodes [R] the node (in
    the whole graph's order) of each row held in `store`; weights [R] each row's output weight."""

    chosen: torch.Tensor
    row_nodes: torch.Tensor
    weights: torch.Tensor
    store: RowStore


def feature_nodes(active: Active, where: Layout) -> torch.Tensor:
    """[n]: each active feature's node in the graph's order (layout.py)."""
    nodes = torch.empty(len(active.layer), dtype=torch.long, device=active.layer.device)
    for layer, start in enumerate(where.feature_start):
        lo, hi = active.span(layer)
        nodes[lo:hi] = torch.arange(start, start + hi - lo, device=nodes.device)
    return nodes


def compute(rep: Replacement, sources: Sources, where: Layout, rows: Rows, store: RowStore, progress=None) -> list[int]:
    """Sweep `rows` in buckets and append them to the store; returns the order they were stored in (indices)."""
    order = []
    row_bytes = 4 * where.logit_start
    for bucket in buckets(rows.position, rows.layer, rep.embed.size(1), SLACK, row_bytes):
        part = rows[bucket]
        out = lazy_zeros(len(part), width(where, part, rep.n_layers), rep.device)
        sweep(rep, sources, part, out)
        widths = [where.logit_start if layer >= rep.n_layers else where.feature_start[layer] for layer in part.layer.tolist()]
        store.add(out, widths)
        order += bucket.tolist()
        if progress is not None:
            progress(len(part))
    return order


def partial_influence(store: RowStore, row_nodes: torch.Tensor, weights: torch.Tensor, n_nodes: int) -> torch.Tensor:
    """[N]: every node's influence on the outputs through the rows held (module docstring), in one pass.

    A row reaches only the nodes below its own layer (its width), so the rows, taken widest first, are in an order
    where every row that reaches a row's node comes before it; when its turn comes, its influence is complete,

        c[t] = w[t] + influence[node of t]      influence += c[t] Â[t, :]

    which is circuit-tracer's series summed in that order, with no [R, R] matrix and no repeated product."""
    norms = store.absolute_total().clamp(min=1e-8)  # circuit-tracer's clamp
    influence = torch.zeros(n_nodes, device=weights.device)
    for start, block in store.blocks(widest_first=True):
        rows = slice(start, start + len(block))
        carried = weights[rows] + influence[row_nodes[rows]]
        influence[:block.size(1)] += (carried / norms[rows]) @ block.abs()
    return influence


def capped_rows(rep: Replacement, sources: Sources, active: Active, where: Layout, logit_rows: Rows,
                probabilities: torch.Tensor, max_features: int, batch_size: int, update_interval: int,
                store: RowStore, progress=None) -> CappedRows:
    """The logits' rows, then max_features features' rows, chosen as circuit-tracer chooses them (module docstring)."""
    device = rep.device
    nodes = feature_nodes(active, where)
    logit_nodes = torch.arange(where.logit_start, where.total, device=device)
    order = compute(rep, sources, where, logit_rows, store, progress)
    row_nodes = [logit_nodes[order]]
    weights = [probabilities.to(device)[order]]
    chosen = torch.zeros(len(active.layer), dtype=torch.bool, device=device)
    while int(chosen.sum()) < max_features:
        influence = partial_influence(store, torch.cat(row_nodes), torch.cat(weights), where.total)
        rank = torch.argsort(influence[nodes], descending=True, stable=True)
        queue = rank[~chosen[rank]][:min(update_interval * batch_size, max_features - int(chosen.sum()))]
        # the update_interval batches until the next ranking are swept as one: no ranking falls between them, and
        # each row is its own (the buckets are then fuller and fewer)
        order = compute(rep, sources, where, feature_rows(active, sources.vectors, queue), store, progress)
        row_nodes.append(nodes[queue[order]])
        weights.append(torch.zeros(len(queue), device=device))
        chosen[queue] = True
    return CappedRows(chosen, torch.cat(row_nodes), torch.cat(weights), store)


def kept_layout(active: Active, chosen: torch.Tensor, n_layers: int, T: int, n_logits: int) -> tuple[Active, Layout]:
    """The capped graph's active features (those chosen, in Active's order) and its node order."""
    kept = chosen.nonzero().flatten()
    subset = Active(active.layer[kept], active.position[kept], active.feature[kept], active.activation[kept],
                    active.pre_activation[kept])
    return subset, layout(subset, n_layers, T, n_logits)


def assemble(capped: CappedRows, active: Active, where: Layout, kept_where: Layout) -> tuple[torch.Tensor, torch.Tensor]:
    """(adjacency [n_kept, n_kept] of the capped graph, [R] the kept node of each row held): each row's edges from
    the kept nodes; the others' are dropped."""
    device = capped.row_nodes.device
    to_kept = torch.full((where.total,), -1, dtype=torch.long, device=device)  # a whole-graph node -> its kept node
    T = where.n_tokens
    to_kept[:T] = torch.arange(T, device=device)
    nodes = feature_nodes(active, where)
    for layer in range(len(where.feature_start)):
        lo, hi = active.span(layer)
        here = capped.chosen[lo:hi].nonzero().flatten()
        to_kept[nodes[lo:hi][here]] = torch.arange(kept_where.feature_start[layer], kept_where.feature_start[layer] + len(here),
                                                   device=device)
        to_kept[where.error_start[layer]:where.error_start[layer] + T] = torch.arange(
            kept_where.error_start[layer], kept_where.error_start[layer] + T, device=device)
    to_kept[where.logit_start:] = torch.arange(kept_where.logit_start, kept_where.total, device=device)
    sources = (to_kept[:where.logit_start] >= 0).nonzero().flatten()  # kept nodes that are sources, whole-graph order
    targets = to_kept[capped.row_nodes]
    adjacency = lazy_zeros(kept_where.total, kept_where.total, device)
    for start, block in capped.store.blocks():
        inside = sources[sources < block.size(1)]
        rows = torch.zeros(len(block), kept_where.total, device=device)
        rows[:, to_kept[inside]] = block[:, inside]
        adjacency[targets[start:start + len(block)]] = rows
    return adjacency, targets
