"""The residual stream of one prompt as the sum of what its nodes write, and any reading of it carried back to them.

Shape letters: T positions, E d_model, R rows (readings carried together), P the positions 1 .. P they reach,
N nodes (tokens, every active feature, errors: the whole graph's layout, no logits).

In the local replacement model (replacement.py, in any block layout: attention patterns and norm scales frozen,
each MLP its transcoder's features plus an error) the stream entering layer l is linear in what the nodes write,

    resid_pre(l)[p] = sum over nodes s of M_{l,p <- s} w_s  +  b_{l,p}

M: the replacement's linear paths from s's writing point (the residual, attention with its patterns frozen, a
skip); b: what no node carries (positional embeddings, biases, everything the first position writes). So any
linear reading of the stream, r . resid_pre(l)[p], splits into one term per node, r . M w_s, plus r . b. The
terms are computed as the graph's rows are (sweep.py): the reading vectors carried down the layers through the
replacement's transposes, every row at once, meeting each node's vector where it writes. b is the replacement's
forward pass with every node switched off (identity.no_node_mlp, as identity.unexplained computes it).
"""

from __future__ import annotations

import torch
from torch import nn

from .attribute import build_nodes, check_fits, prompt_ids
from .identity import no_node_mlp
from .layout import layout
from .replacement import Replacement
from .sweep import Sources, project
from .vectors import errors_of, read_features


class NodeStream:
    """The nodes of one prompt's replacement and their vectors: rep (Replacement), active (the features that fire),
    where (Layout, no logits), errors [L, T, E], sources (each layer's written vectors, sweep.Sources), nodes [N].

    Built once and shared by every edge split (heads.py) and QK attribution (qk.py) of one graph."""

    def __init__(self, model: nn.Module, transcoders, prompt, labels: list[str] | None = None):
        """prompt: a text or ids (attribute.prompt_ids); labels: the tokens' labels (default: the tokenizer's). Raises
        ValueError, before any pass, for a model or set that cannot make a graph, or a prompt that cannot be read."""
        check_fits(model, transcoders)
        self.rep = rep = Replacement(model, transcoders, prompt_ids(model, prompt))
        T = len(rep.ids)
        self.active, vectors = read_features(rep)
        self.where = layout(self.active, rep.n_layers, T, 0)
        self.errors = errors_of(rep, self.active, vectors)
        self.sources = Sources(rep, self.active, self.where, vectors, self.errors)
        tokenizer = getattr(model, "tokenizer", None)
        ids = rep.ids.tolist()
        labels = labels or (tokenizer.labels(ids) if tokenizer else [str(i) for i in ids])
        none = torch.zeros(0, dtype=torch.long, device="cpu")  # no logits
        self.nodes = build_nodes(rep.ids, rep.n_layers, self.active, self.where, none, none.float(), labels, [])
        self.positions = torch.tensor([node.column for node in self.nodes], device=rep.device)  # (N,): each node's position
        self.first_images = self.sources.first_images
        self._no_node: list[torch.Tensor] | None = None
        self.gradients: dict = {}  # a target's gradients down the layers, by node id (heads.target_gradients)

    def no_node_stream(self, layer: int) -> torch.Tensor:
        """[T, E]: resid_pre(layer) of the replacement with every node switched off (b above): positional
        embeddings, every bias, the first position's whole output but for what its token's node carries."""
        if self._no_node is None:
            rep = self.rep
            streams = [rep.embed_rest]  # (T, E)
            for k in range(rep.n_layers - 1):
                streams.append(rep.block_forward(k, streams[-1], no_node_mlp(rep, k)))
            self._no_node = streams
        return self._no_node[layer]

    @torch.no_grad()
    def read_back(self, readings: list[tuple[int, int, torch.Tensor]]) -> list[torch.Tensor]:
        """For each reading (layer l, position p, rows r [R, E]) of resid_pre(l)[p]: [R, W], each node's term
        r . M_{l,p <- s} w_s (module docstring), over the first W nodes (those below layer l, width(l); the rest
        write nothing there). The readings of one position travel down the layers together,
        each joining at its own layer; rows at position 0 meet the first token alone (its image there)."""
        out: list[torch.Tensor | None] = [None] * len(readings)
        for position in sorted({p for _, p, _ in readings}):
            chosen = [i for i, (_, p, _) in enumerate(readings) if p == position]
            if position == 0:
                for i in chosen:
                    layer, _, rows = readings[i]
                    out[i] = torch.zeros(len(rows), self.width(layer), device=rows.device)
                    out[i][:, 0] = rows @ self.first_images[layer]
                continue
            for i, terms in zip(chosen, self.sweep(position, [readings[i][0] for i in chosen],
                                                   [readings[i][2] for i in chosen])):
                out[i] = terms
        return out

    def width(self, layer: int) -> int:
        """W: how many nodes lie below resid_pre(layer) (tokens, then every layer under it: a prefix of the node
        order); the nodes past it write nothing there."""
        return self.where.feature_start[layer] if layer < self.rep.n_layers else len(self.nodes)

    def sweep(self, P: int, layers: list[int], rows: list[torch.Tensor]) -> list[torch.Tensor]:
        """Rows reading resid_pre(layers[i]) at position P, carried down together (sweep.py's loop, rows joining
        where they read): [R_i, W] each, over the nodes below the highest layer read (width)."""
        rep, E = self.rep, self.rep.embed.size(1)
        order = sorted(range(len(rows)), key=lambda i: -layers[i])  # the highest layer joins first
        W = self.width(layers[order[0]])  # the nodes below the highest reading: a prefix of the node order
        starts = [0]
        for i in order:
            starts.append(starts[-1] + len(rows[i]))
        device = rep.device
        grads = torch.zeros(starts[-1], P, E, device=device)  # (R, P, E): each row's gradient at positions 1 .. P
        terms = torch.zeros(starts[-1], W, device=device)
        to_first = torch.zeros(starts[-1], device=device)
        joined = 0
        for layer in reversed(range(-1, layers[order[0]])):  # rows that read resid_pre(layer + 1) join, then cross it
            while joined < len(order) and layers[order[joined]] == layer + 1:
                grads[starts[joined]:starts[joined + 1], P - 1] = rows[order[joined]]
                joined += 1
            if layer < 0:
                break
            g = grads[:starts[joined]]
            rep.sum_transpose(layer, "mlp", g)
            project(self.sources, layer, g, terms[:len(g)])  # what is added to the stream at this layer's MLP output
            skipped = rep.skip_transpose(layer, g)  # the MLP's skip, to the stream it reads
            if skipped is not None and not rep.parallel:  # a sequential MLP reads after the attention
                g += skipped
            rep.sum_transpose(layer, "attn", g)
            to_first[:len(g)] += rep.sublayers[layer].add_transpose(g, self.first_images[layer])
            if skipped is not None and rep.parallel:  # a parallel MLP reads resid_pre, as the attention does
                g += skipped
        terms[:, 1:P + 1] += torch.einsum("rpe,pe->rp", grads, rep.embed[1:P + 1])  # the tokens at positions 1 .. P
        terms[:, 0] += to_first
        result: list[torch.Tensor] = [torch.zeros(0)] * len(rows)
        for j, i in enumerate(order):
            result[i] = terms[starts[j]:starts[j + 1]]
        return result
