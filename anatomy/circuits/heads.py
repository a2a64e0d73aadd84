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
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .attribute import check_fits, prompt_ids
from .graph import Graph, Node
from .replacement import Replacement
from .vectors import errors_of, read_features


@dataclass
class HeadSplit:
    """The parts of one edge: {"residual" | (layer, head) | (layer, "skip"): value}, the edge they add up to
    and the identity with its measured difference."""

    target: Node
    source: Node
    parts: dict
    edge: float
    check: str
    error: float

    def largest(self, n: int = 10) -> list[tuple[str, float]]:
        """The n largest parts by size, named ("L3 H5", "L4 skip", "residual")."""
        named = [(part if part == "residual" else f"L{part[0]} " + (part[1] if part[1] == "skip" else f"H{part[1]}"), value)
                 for part, value in self.parts.items()]
        return sorted(named, key=lambda item: -abs(item[1]))[:n]


@torch.no_grad()
def split_by_head(model: nn.Module, transcoders, graph: Graph, target: Node | str, source: Node | str) -> HeadSplit:
    """The edge graph[target, source] split by the heads (and skips) its paths first cross (module docstring),
    recomputed from the model and the transcoders on the graph's prompt. Raises KeyError for a node not in the
    graph, ValueError for a target that is not a feature or a logit."""
    target, source = graph.nodes[graph.index(target)], graph.nodes[graph.index(source)]
    if target.kind not in ("feature", "logit"):
        raise ValueError(f"an edge's target is a feature or a logit, not a {target.kind}")
    check_fits(model, transcoders)
    rep = Replacement(model, transcoders, prompt_ids(model, graph.meta["prompt_ids"]))
    T, L = len(rep.ids), rep.n_layers
    read_layer, start, at_mid, at_post = target_gradients(rep, target)
    writes = source_writes(rep, source, T)
    parts: dict = {}
    for layer, w, q in writes:  # w [E] written at resid_post(layer) (layer -1: the embeddings), position q
        if layer >= read_layer:
            continue  # written after the target reads: no path
        if q == target.column:
            parts["residual"] = parts.get("residual", 0.0) + float(start[q] @ w)
        for k in range(layer + 1, min(read_layer, L - 1) + 1):
            for head, value in enumerate(head_moves(rep, k, at_mid[k], w, q).tolist()):
                parts[(k, head)] = parts.get((k, head), 0.0) + value
            if rep.skips[k] is not None and k < read_layer:
                moved = normed_at(rep, k, w, q) @ rep.skips[k] if rep.reads_normed(k) else w @ rep.skips[k]
                parts[(k, "skip")] = parts.get((k, "skip"), 0.0) + float(at_post[k][q] @ moved)
    edge = float(graph.adjacency[graph.index(target), graph.index(source)])
    total = sum(parts.values())
    error = abs(total - edge) / max(1.0, sum(abs(v) for v in parts.values()))
    check = f"the parts add up to the edge ({edge:.6g}): difference {abs(total - edge):.2g}, {error:.2g} of their sizes"
    return HeadSplit(target, source, parts, edge, check, error)


def target_gradients(rep: Replacement, target: Node) -> tuple[int, torch.Tensor, list, list]:
    """(the layer it reads at (n_layers for a logit), its reading vector's gradient where it reads [T, E], and its
    gradient at each attention's output and at each MLP's output: per layer [T, E], None above the target)."""
    T, L, E = len(rep.ids), rep.n_layers, rep.embed.size(1)
    g = torch.zeros(T, E, device=rep.device)
    if target.kind == "logit":
        vector = rep.logit_vectors(torch.tensor([target.index], device=rep.device))[0]
        g[T - 1] = rep.final_norm.transpose_at(vector[None], T - 1)[0]
        read_layer = L
    else:
        encoder = rep.transcoders.layers[target.layer].W_enc.detach()[:, target.index].float().to(rep.device)
        g[target.column] = rep.input_transpose_at(target.layer, encoder[None], target.column)[0]
        read_layer = target.layer
    start = g.clone()
    at_mid, at_post = [None] * L, [None] * L
    for k in reversed(range(min(read_layer, L - 1) + 1)):
        if k < read_layer:  # the MLP of layer k is below the target: back through its skip
            at_post[k] = g.clone()
            if rep.skips[k] is not None:
                through = g @ rep.skips_back[k]
                g = g + (through * rep.mlp_norms[k].scale[:, None] if rep.reads_normed(k) else through)
        at_mid[k] = g.clone()
        g = g + one_row_transpose(rep, k, g)
    return read_layer, start, at_mid, at_post


def one_row_transpose(rep: Replacement, layer: int, g: torch.Tensor) -> torch.Tensor:
    """[T, E] one row's gradient at the attention sublayer's output -> what it adds at its input (resid_pre),
    every position: the sublayer's transpose (replacement.FrozenSublayer), written out for a single row."""
    sublayer = rep.sublayers[layer]
    a = sublayer.attention
    T = g.size(0)
    u = (g @ a.w_o).view(T, a.n_heads, a.d_head)  # (T, H, D)
    dv = torch.einsum("hpq,phd->qhd", a.pattern[:, :T, :T], u)  # (T, H, D): to each key q
    dv = dv.view(T, a.n_kv, a.group, a.d_head).sum(2) * sublayer.norm.scale[:T, None, None]  # (T, K, D)
    return dv.reshape(T, -1) @ sublayer.w_back


def normed_at(rep: Replacement, layer: int, w: torch.Tensor, q: int) -> torch.Tensor:
    """[E]: w through the MLP norm's linear part at position q (its frozen scale there)."""
    norm = rep.mlp_norms[layer]
    x = w - w.mean() if norm.centred else w
    return x * norm.scale[q] * norm.gain


def head_moves(rep: Replacement, layer: int, gradient: torch.Tensor, w: torch.Tensor, q: int) -> torch.Tensor:
    """[H]: gradient . A_{layer,h}(w at position q) for every head h: w normed and moved by each head alone."""
    a, norm = rep.sublayers[layer].attention, rep.sublayers[layer].norm
    H, K, D = a.n_heads, a.n_kv, a.d_head
    x = w - w.mean() if norm.centred else w
    v = ((x * norm.scale[q] * norm.gain) @ a.w_v.T).view(K, D).repeat_interleave(a.group, dim=0)  # (H, D): its values
    u = (gradient @ a.w_o).view(-1, H, D)  # (T, H, D): each head's share of the gradient at the output
    towards = torch.einsum("hp,phd->hd", a.pattern[:, :, q], u)  # (H, D): sum_p A_h[p, q] u_h[p]
    return (towards * v).sum(-1)


def source_writes(rep: Replacement, source: Node, T: int) -> list[tuple[int, torch.Tensor, int]]:
    """[(layer it writes after (-1: the embeddings), its vector [E], its position)] for a token, feature or error."""
    if source.kind == "token":
        return [(-1, rep.embed[source.column], source.column)]
    if source.kind == "error":
        active, vectors = read_features(rep)
        return [(source.layer, errors_of(rep, active, vectors)[source.layer, source.column], source.column)]
    if source.kind == "feature":
        rows = rep.transcoders.decoder_vectors(source.layer)[source.index].detach().float() * source.value  # (O, E)
        return [(source.layer + j, rows[j], source.column) for j in range(rows.size(0))]
    raise ValueError(f"an edge's source is a token, a feature or an error, not a {source.kind}")
