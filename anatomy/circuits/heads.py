"""An edge split by the attention heads it crosses: parts that add up to the edge exactly.

Shape letters: T positions, E d_model, H query heads, K key/value heads, D d_head.

Between a source that writes w at (layer l, position q) and a target that reads r (a feature's encoder at
layer L, or a logit), the replacement applies, layer after layer, attention (the sum of its heads, A_k = sum_h
A_{k,h}) and a skip transcoder's path S_k, each as x -> x + op(x). Expanding the product by each path's first
step that is not the identity,

    (I + op_n) ... (I + op_1) = I + sum_j (I + op_n) ... (I + op_{j+1}) op_j

splits the edge A[t, s] = r . M w into

    residual       r . w                                  (the source's own position only, untouched)
    (k, head h)    G_k . A_{k,h}(w)                       w moved by head h of layer k first, then carried the
                                                          rest of the way (G_k: the target's gradient there)
    (k, skip)      G_k . S_k(w)

with A_{k,h}(w)[p] = A_h[p, q] (norm(w)[q] W_V^h) W_O^h. Every part is one head's (or the skip's) first move
of the source's vector; the parts sum to the edge (`HeadSplit.check`). A cross-layer feature writes at several
layers: its parts are summed over them. This is what circuit-tracer's open pull request #114 attempts.

A head's part is itself a sum over the query positions p it moves the vector to, from the source's own
position q (the key): pairs[(k, h)][(p, q)] = G_k[p] . A_h[p, q] (norm(w)[q] W_V^h) W_O^h, the (query, key)
position pairs that carry it, whose attention score qk.py explains.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .graph import Graph, Node
from .replacement import Replacement
from .stream import NodeStream


@dataclass
class HeadSplit:
    """The parts of one edge: {"residual" | (layer, head) | (layer, "skip"): value}, the edge they add up to
    and the identity with its measured difference; pairs: {(layer, head): {(query, key): value}}, each head's
    part by the position pairs that carry it (they add up to the part)."""

    target: Node
    source: Node
    parts: dict
    edge: float
    check: str
    error: float
    pairs: dict

    def heads(self, n: int | None = None) -> list[tuple[tuple[int, int], float]]:
        """((layer, head), part) of the heads, largest |part| first (the n largest)."""
        heads = [(part, value) for part, value in self.parts.items() if isinstance(part, tuple) and part[1] != "skip"]
        return sorted(heads, key=lambda item: -abs(item[1]))[:n]

    def positions(self, layer: int, head: int) -> list[tuple[tuple[int, int], float]]:
        """((query, key), value) of the position pairs that carry one head's part, largest |value| first."""
        return sorted(self.pairs.get((layer, head), {}).items(), key=lambda item: -abs(item[1]))

    def largest(self, n: int = 10) -> list[tuple[str, float]]:
        """The n largest parts by size, named ("L3 H5", "L4 skip", "residual")."""
        named = [(part if part == "residual" else f"L{part[0]} " + (part[1] if part[1] == "skip" else f"H{part[1]}"), value)
                 for part, value in self.parts.items()]
        return sorted(named, key=lambda item: -abs(item[1]))[:n]


@torch.no_grad()
def split_by_head(model: nn.Module, transcoders, graph: Graph, target: Node | str, source: Node | str) -> HeadSplit:
    """The edge graph[target, source] split by the heads (and skips) its paths first cross (module docstring),
    recomputed from the model and the transcoders on the graph's prompt. Raises KeyError for a node not in the
    graph, ValueError for a target that is not a feature or a logit, or a post-norm model (its residual stream
    passes through a norm after every sublayer: no path is the identity, so an edge has no first moves)."""
    target, source = graph.nodes[graph.index(target)], graph.nodes[graph.index(source)]
    if target.kind not in ("feature", "logit"):
        raise ValueError(f"an edge's target is a feature or a logit, not a {target.kind}")
    refuse_post_norm(model)
    stream = NodeStream(model, transcoders, graph.meta["prompt_ids"])
    return split_edge(stream, target, source, float(graph.adjacency[graph.index(target), graph.index(source)]))


def refuse_post_norm(model: nn.Module) -> None:
    """ValueError for a post-norm model (module docstring: its edges have no first moves)."""
    if model.config.norm_position == "post":
        raise ValueError("an edge of a post-norm model does not split by heads: its residual stream passes through a "
                         "norm after every sublayer, so no path is the identity and an edge has no first moves")


def split_edge(stream: NodeStream, target: Node, source: Node, edge: float) -> HeadSplit:
    """split_by_head on a prompt's NodeStream, for an edge of value `edge` (the graph's) from source to target."""
    rep = stream.rep
    L = rep.n_layers
    if target.id not in stream.gradients:  # every edge into one target shares its gradients
        stream.gradients[target.id] = target_gradients(rep, target)
    read_layer, top, start, at_mid, at_post = stream.gradients[target.id]
    parts: dict = {}
    pairs: dict = {}
    for layer, w, q in source_writes(stream, source):  # w [E] added at resid_post(layer) (-1: the embeddings), at q
        if layer >= read_layer:
            continue  # written after the target reads: no path
        if q == target.column:
            parts["residual"] = parts.get("residual", 0.0) + float(start[q] @ w)
        for k in range(layer + 1, top + 1):
            moves = head_moves(rep, k, at_mid[k], w, q)  # (H, T): by the query position each head moves w to
            for head, value in enumerate(moves.sum(1).tolist()):
                parts[(k, head)] = parts.get((k, head), 0.0) + value
            for head, p in moves.nonzero().tolist():
                carried = pairs.setdefault((k, head), {})
                carried[(p, q)] = carried.get((p, q), 0.0) + float(moves[head, p])
        for k in range(layer + 1, min(read_layer, L)):
            if rep.skips[k] is not None:
                where = torch.tensor([q], device=rep.device)
                moved = rep.output_images(k, rep.input_images(k, w[None], where) @ rep.skips[k], where)[0]
                parts[(k, "skip")] = parts.get((k, "skip"), 0.0) + float(at_post[k][q] @ moved)
    total = sum(parts.values())
    error = abs(total - edge) / max(1.0, sum(abs(v) for v in parts.values()))
    check = f"the parts add up to the edge ({edge:.6g}): difference {abs(total - edge):.2g}, {error:.2g} of their sizes"
    return HeadSplit(target, source, parts, edge, check, error, pairs)


def target_gradients(rep: Replacement, target: Node) -> tuple[int, int, torch.Tensor, list, list]:
    """(the layer it reads at (n_layers for a logit), the last attention its paths cross, its reading vector's
    gradient where it reads [T, E], its gradient at each attention's heads' outputs (times W_O^h, [T, H, D]) and
    where each MLP's output is added ([T, E]): per layer, None above the target). A feature of a parallel block
    reads the stream its own layer's attention reads: its paths cross the attentions below it only."""
    T, L, E = len(rep.ids), rep.n_layers, rep.embed.size(1)
    g = torch.zeros(T, E, device=rep.device)
    if target.kind == "logit":
        g[T - 1] = rep.logit_transpose(rep.logit_vectors(torch.tensor([target.index], device=rep.device)))[0]
        read_layer, top = L, L - 1
    else:
        encoder = rep.transcoders.layers[target.layer].W_enc.detach()[:, target.index].float().to(rep.device)
        g[target.column] = rep.input_transpose_at(target.layer, encoder[None], target.column)[0]
        read_layer, top = target.layer, target.layer - 1 if rep.parallel else target.layer
    start = g.clone()
    at_mid, at_post = [None] * L, [None] * L
    for k in reversed(range(top + 1)):
        through = None
        if k < read_layer:  # the MLP of layer k is below the target: back through its skip
            at_post[k] = g.clone()
            through = rep.skip_transpose(k, g[None], first=0)
            if through is not None and not rep.parallel:  # a sequential MLP reads after the attention
                g, through = g + through[0], None
        at_mid[k], back = one_row_transpose(rep, k, g)
        g = g + back + (0 if through is None else through[0])
    return read_layer, top, start, at_mid, at_post


def one_row_transpose(rep: Replacement, layer: int, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[T, E] one row's gradient where the attention sublayer's output is added -> (its share at each head's output
    [T, H, D]; what it adds at the sublayer's input (resid_pre) [T, E], every position): the sublayer's transpose
    (frozen.FrozenSublayer), written out for a single row."""
    sublayer = rep.sublayers[layer]
    a = sublayer.attention
    T = g.size(0)
    u = (g @ sublayer.w_out_back).view(T, a.n_heads, a.d_head)  # (T, H, D)
    dv = torch.einsum("hpq,phd->qhd", sublayer.pattern_back[:, :T, :T], u)  # (T, H, D): to each key q
    dv = dv.view(T, a.n_kv, a.group, a.d_head).sum(2) * sublayer.norm.scale[:T, None, None]  # (T, K, D)
    return u, dv.reshape(T, -1) @ sublayer.w_back


def head_moves(rep: Replacement, layer: int, u: torch.Tensor, w: torch.Tensor, q: int) -> torch.Tensor:
    """[H, T]: gradient[p] . A_{layer,h}(w at position q)[p] for every head h and query position p: w normed and
    moved by each head alone, from q to p (and through the norm on the attention's output, if the block has one);
    u [T, H, D]: the gradient at each head's output (one_row_transpose)."""
    sublayer = rep.sublayers[layer]
    a = sublayer.attention
    K, D = a.n_kv, a.d_head
    normed = sublayer.norm.at(w[None], torch.tensor([q], device=w.device))[0]
    v = (normed @ a.w_v.T).view(K, D).repeat_interleave(a.group, dim=0)  # (H, D): its values
    T = u.size(0)
    return sublayer.pattern_back[:, :T, q] * torch.einsum("phd,hd->hp", u, v)  # (H, T): s'[p] A_h[p, q] u_h[p] . v_h


def source_writes(stream: NodeStream, source: Node) -> list[tuple[int, torch.Tensor, int]]:
    """[(layer it writes after (-1: the embeddings), what it adds to the stream [E], its position)] for a token,
    feature or error."""
    rep = stream.rep
    where = torch.tensor([source.column], device=rep.device)
    if source.kind == "token":
        return [(-1, rep.embed[source.column], source.column)]
    if source.kind == "error":
        error = stream.errors[source.layer, source.column]
        return [(source.layer, rep.output_images(source.layer, error[None], where)[0], source.column)]
    if source.kind == "feature":
        rows = rep.transcoders.decoder_vectors(source.layer)[source.index].detach().float().to(rep.device) * source.value  # (O, E)
        return [(source.layer + j, rep.output_images(source.layer + j, rows[j][None], where)[0], source.column)
                for j in range(rows.size(0))]
    raise ValueError(f"an edge's source is a token, a feature or an error, not a {source.kind}")
