"""The direct effects of target rows: a bucket of rows carried down the layers of the local replacement together.

Shape letters: T positions, E d_model, r rows swept together, P the positions they reach (1 .. P), J the most
sources at one position of a layer (its error, then its features), W the nodes below the highest row.

circuit-tracer computes rows by batched backward passes of the whole model through autograd, each batch from
the top. Here the map is written out (replacement.py's transposes) and a bucket of rows travels down the
layers together, each row joining at its own layer and carrying the positions 1 .. P (a row at p < P carries
zeros beyond p, and they stay zero: the mask is causal):

    for layer L = n-1 ... 0:
        project the rows' gradients at L's MLP output on the vectors written there        -> A[rows, sources at L]
        back through the transcoder's skip (if it has one)
        the rows of the features of layer L join, their encoder vectors at the MLP's input
        back through L's attention, patterns and norm scales frozen
    project on the token embeddings                                                     -> A[rows, tokens]

Position 0 is not carried: only the first token's node writes there, so what attention sends back to it at
layer l meets that token's image at resid_pre(l) (its embedding carried up the first position), and the
product is that edge's share, added up over the layers.

A bucket is rows of nearby positions (`buckets`): the whole graph sweeps each position's rows together; a
capped graph, each batch of rows its ranking chose (capped.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .layout import Active, Layout
from .replacement import Replacement
from .vectors import Vectors, written

GRADIENT_BYTES = 256 * 2**20  # a bucket's gradients [r, P, E] at most: its temporaries are about as large again
OUT_BYTES = 256 * 2**20  # a bucket's output rows [r, W] at most
KEEP_SOURCES_BYTES = 256 * 2**20  # every layer's padded sources kept between buckets when they take no more


@dataclass
class Rows:
    """Targets: layer [r] (n_layers for a logit), position [r], reading [r, E] (a feature's encoder vector at its
    transcoder's input, or a logit's demeaned unembedding at the final norm's output)."""

    layer: torch.Tensor
    position: torch.Tensor
    reading: torch.Tensor

    def __len__(self) -> int:
        return len(self.layer)

    def __getitem__(self, index) -> "Rows":
        return Rows(self.layer[index], self.position[index], self.reading[index])


def feature_rows(active: Active, vectors: Vectors, index: torch.Tensor) -> Rows:
    """The rows of the active features `index` (into Active's arrays): each reads its encoder vector."""
    layer = active.layer[index]
    reading = torch.empty(len(index), vectors.reading[0].size(1), device=layer.device)
    for l in layer.unique().tolist():
        here = (layer == l).nonzero().flatten()
        reading[here] = vectors.reading[l][vectors.slot[l][index[here] - active.span(l)[0]]]
    return Rows(layer, active.position[index], reading)


class Sources:
    """What is written at each layer's MLP output, by position: at(layer, P) -> (vectors [P, J, E], their node
    columns [P, J], -1 for padding) for positions 1 .. P; slot 0 is the position's error, then the features of
    every layer that writes there (a CLT's earlier layers too), a_i W_dec[i] each. first_images: what the first
    token's embedding has become at each layer's input (replacement.first_position_images)."""

    def __init__(self, rep: Replacement, active: Active, where: Layout, vectors: Vectors, errors: torch.Tensor):
        self.rep, self.active, self.where, self.vectors, self.errors = rep, active, where, vectors, errors
        self.first_images = rep.first_position_images()
        T, E = rep.embed.shape
        widest = max((int(offsets.diff().max()) for offsets in where.feature_offsets), default=0)
        writers = max(len(rep.transcoders.writers(layer)) for layer in range(rep.n_layers))
        bound = rep.n_layers * T * (1 + writers * widest) * E * 4
        self.kept = {} if bound <= KEEP_SOURCES_BYTES else None

    def at(self, layer: int, P: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.kept is None:
            return self.build(layer, P)
        if layer not in self.kept:
            self.kept[layer] = self.build(layer, self.where.n_tokens - 1)
        vectors, columns = self.kept[layer]
        return vectors[:P], columns[:P]

    def build(self, layer: int, P: int) -> tuple[torch.Tensor, torch.Tensor]:
        active, where, device = self.active, self.where, self.rep.device
        positions, vectors, columns = [], [], []
        for source in self.rep.transcoders.writers(layer):
            start = active.span(source)[0]
            stop = start + int(where.feature_offsets[source][P + 1])  # its features at positions up to P
            positions.append(active.position[start:stop])
            vectors.append(written(active, self.vectors, source, layer, start, stop))
            columns.append(torch.arange(where.feature_start[source], where.feature_start[source] + stop - start, device=device))
        position = torch.cat(positions)
        order = torch.argsort(position, stable=True)
        position = position[order]
        counts = torch.bincount(position, minlength=P + 1)  # (P + 1,): none at position 0
        slot = 1 + torch.arange(len(position), device=device) - (counts.cumsum(0) - counts)[position]
        J = 1 + int(counts.max()) if len(position) else 1
        padded = torch.zeros(P, J, self.rep.embed.size(1), device=device)
        padded[position - 1, slot] = torch.cat(vectors)[order]
        padded[:, 0] = self.errors[layer, 1:P + 1]
        column = torch.full((P, J), -1, dtype=torch.long, device=device)
        column[position - 1, slot] = torch.cat(columns)[order]
        column[:, 0] = where.error_start[layer] + torch.arange(1, P + 1, device=device)
        return padded, column


def buckets(position: torch.Tensor, layer: torch.Tensor, d_model: int, slack: float = 1.0,
            row_bytes: int = 0) -> list[torch.Tensor]:
    """Groups of row indices to sweep together, each sorted by layer, highest first: rows by position, highest
    first, a group closed where the next row's position falls below slack x the group's first (slack 1: one
    position a group), or where its gradients [r, P, E] would pass GRADIENT_BYTES or its output rows (row_bytes
    each) OUT_BYTES."""
    order = torch.argsort(position, descending=True, stable=True).tolist()
    positions = position.tolist()
    groups, current, P = [], [], 0
    for i in order:
        full = (len(current) + 1) * P * d_model * 4 > GRADIENT_BYTES or (len(current) + 1) * row_bytes > OUT_BYTES
        if current and (positions[i] < slack * P or full):
            groups.append(current)
            current = []
        if not current:
            P = positions[i]
        current.append(i)
    if current:
        groups.append(current)
    result = []
    for group in groups:
        index = torch.tensor(group, device=position.device)
        result.append(index[torch.argsort(layer[index], descending=True, stable=True)])
    return result


def width(where: Layout, rows: Rows, n_layers: int) -> int:
    """W: the nodes below the highest of the rows (a logit: every node but the logits)."""
    top = int(rows.layer.max())
    return where.logit_start if top >= n_layers else where.feature_start[top]


def sweep(rep: Replacement, sources: Sources, rows: Rows, out: torch.Tensor, progress=None) -> None:
    """Add to out [r, W] (W >= width(rows)) each row's direct effect on every node below it (module docstring).

    rows: sorted by layer, highest first (logits first), at positions 1 .. P. progress(): after each layer."""
    r, P, E, L = len(rows), int(rows.position.max()), rep.embed.size(1), rep.n_layers
    device = rep.device
    grads = torch.zeros(r, P, E, device=device)  # each row's gradient at positions 1 .. P
    joined = int((rows.layer == L).sum())  # the rows carried so far: the logits, then each layer's features
    logits = torch.arange(joined, device=device)
    grads[logits, rows.position[:joined] - 1] = rep.final_norm.transpose_at(rows.reading[:joined], rows.position[:joined])
    to_first_token = torch.zeros(r, device=device)
    chunk = max(1, GRADIENT_BYTES // (P * E * 4))
    for layer in reversed(range(L if joined else int(rows.layer.max()) + 1)):
        if joined:
            vectors, columns = sources.at(layer, P)
            edges = torch.bmm(grads[:joined].transpose(0, 1), vectors.transpose(1, 2))  # (P, joined, J)
            real = columns.flatten() >= 0
            out[:joined].index_add_(1, columns.flatten()[real], edges.transpose(0, 1).reshape(joined, -1)[:, real])
            rep.add_skip_transpose(layer, grads[:joined])
        before = joined  # the rows that have crossed an attention already; the others join now
        joined += int((rows.layer[joined:] == layer).sum())
        if joined > before:  # the features of this layer join, read at the MLP's input
            new = torch.arange(before, joined, device=device)
            grads[new, rows.position[new] - 1] = rep.input_transpose_at(layer, rows.reading[new], rows.position[new])
        sublayer, image = rep.sublayers[layer], sources.first_images[layer]
        for start in range(0, joined, chunk):
            stop = min(joined, start + chunk)
            split = min(max(before, start), stop)
            if split > start:
                to_first_token[start:split] += sublayer.add_transpose(grads[start:split], image)
            if stop > split:
                to_first_token[split:stop] += sublayer.add_transpose_at(grads[split:stop], image, rows.position[split:stop])
        if progress is not None:
            progress()
    out[:, 1:P + 1] += torch.einsum("rpe,pe->rp", grads, rep.embed[1:P + 1])  # the tokens at positions 1 .. P
    out[:, 0] += to_first_token
