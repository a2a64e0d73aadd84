"""The direct effects of target rows: a bucket of rows carried down the layers of the local replacement together.

Shape letters: T positions, E d_model, r rows swept together, P the positions they reach (1 .. P), J the most
sources at one position of a layer (its error, then its features), W the nodes below the highest row.

circuit-tracer computes rows by batched backward passes of the whole model through autograd, each batch from
the top. Here the map is written out (replacement.py's transposes) and a bucket of rows travels down the
layers together, each row joining at its own layer and carrying the positions 1 .. P (a row at p < P carries
zeros beyond p, and they stay zero: the mask is causal):

    for layer L = n-1 ... 0:
        (post-norm: back through the norm after the MLP's residual sum)
        project the rows' gradients at L's MLP output on the vectors written there        -> A[rows, sources at L]
        back through the transcoder's skip (if it has one)
        the rows of the features of layer L join, their encoder vectors at the MLP's input
        (post-norm: back through the norm after the attention's residual sum)
        back through L's attention, patterns and norm scales frozen
    project on the token embeddings                                                     -> A[rows, tokens]

In a parallel block the MLP reads the stream the attention reads (resid_pre): the skip's part and the
features of layer L join after L's attention, not before.

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
from .vectors import Vectors

GRADIENT_BYTES = 64 * 2**20  # a bucket's gradients [r, P, E] at most (its temporaries take three times as much again)
OUT_BYTES = 256 * 2**20  # a bucket's output rows [r, W] at most
ROW_CHUNK = 512  # rows carried back through one attention at a time: their temporaries stay in the caches
KEEP_SOURCES_BYTES = 2**31  # the most the layers' padded sources kept between buckets take (the memory plan's share)
KEEP_UNPLANNED_BYTES = 2**29  # what they take where no plan was made (stream.py)


@dataclass
class Rows:
    """Targets: layer [r] (n_layers for a logit), position [r], reading [r, E] (a feature's encoder vector at its
    transcoder's input; a logit's demeaned unembedding carried back to the last block's output,
    Replacement.logit_transpose, so that every row is d_model wide whatever the LM head reads)."""

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


@dataclass
class Slots:
    """Where the vectors of one block of sources come from, per position and slot: a row of the writing layer's
    decoder rows, a_i (0 for padding), a node column (0 for padding: a zero vector adds exactly 0 there).
    positions [Q]: the positions the block's rows are (None: 1 .. T - 1, one row each)."""

    row: torch.Tensor  # [Q, J] long
    scale: torch.Tensor  # [Q, J]
    column: torch.Tensor  # [Q, J] long
    positions: torch.Tensor | None = None


class Sources:
    """What is written at each layer's MLP output, by position: at(layer, P) -> blocks of (vectors [Q, J, E],
    their node columns [Q, J], their positions [Q] or None for 1 .. P), for positions up to P: per layer whose
    features write there (a CLT's earlier layers too) a block of every position, a_i W_dec[i] in each slot, with
    the position's error in slot 0 of the layer's own; and a block of the positions where more features fire
    than that one's width (its width is the usual count, not the largest: padding costs what it holds). Each
    vector is what the block adds to the stream (through a frozen norm on the MLP's output, where one follows
    the output point).
    first_images: what the first token's embedding has become at each layer's input
    (replacement.first_position_images).

    Where each slot's vector comes from is kept (`slots`: a few numbers a slot); the vectors themselves are kept
    for as many layers as fit keep_bytes (the memory plan's, footprint.sources_bytes: every layer of a prompt of a
    few hundred tokens), and gathered for each call for the others."""

    def __init__(self, rep: Replacement, active: Active, where: Layout, vectors: Vectors, errors: torch.Tensor,
                 keep_bytes: int = KEEP_UNPLANNED_BYTES):
        self.rep, self.active, self.where, self.vectors, self.errors = rep, active, where, vectors, errors
        self.keep_bytes = keep_bytes
        self.first_images = rep.first_position_images()
        self.maps: dict[int, list[Slots]] = {}
        self.kept: dict[int, list] = {}
        self.kept_bytes = 0

    def at(self, layer: int, P: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
        writers = self.rep.transcoders.writers(layer)
        if layer not in self.kept:
            blocks = [(source, slots) for source in writers for slots in self.slots(source)]
            size = sum(4 * self.rep.embed.size(1) * slots.row.numel() for _, slots in blocks)
            if self.kept_bytes + size > self.keep_bytes:  # built for each call, as far as it reaches
                return [self.build(source, layer, slots, P) for source, slots in blocks]
            self.kept[layer] = [self.build(source, layer, slots, self.where.n_tokens - 1) for source, slots in blocks]
            self.kept_bytes += size
        return [(vectors[:upto(positions, P)], columns[:upto(positions, P)], positions if positions is None else
                 positions[:upto(positions, P)]) for vectors, columns, positions in self.kept[layer]]

    def slots(self, source: int) -> list[Slots]:
        """The blocks of the source layer's features (class docstring), made once per layer; slot 0 of the first
        is for the error of the layer written."""
        if source not in self.maps:
            active, where, device = self.active, self.where, self.rep.device
            T = where.n_tokens
            start, stop = active.span(source)
            position = active.position[start:stop]  # (n,), in order: Active's is (layer, position, feature)
            counts = torch.bincount(position, minlength=T)  # (T,): none at position 0
            slot = 1 + torch.arange(len(position), device=device) - (counts.cumsum(0) - counts)[position]
            J = 1 + (int(counts[1:].float().quantile(0.75).ceil()) if len(position) else 0)  # the error's slot too
            column = torch.arange(where.feature_start[source], where.feature_start[source] + stop - start, device=device)
            first, over = slot < J, slot >= J
            blocks = [self.fill(T - 1, J, position[first] - 1, slot[first], start + first.nonzero().flatten(),
                                column[first], source)]
            if over.any():
                positions = position[over].unique()  # (Q,) sorted
                here = torch.searchsorted(positions, position[over])
                blocks.append(self.fill(len(positions), int(slot[over].max()) + 1 - J, here, slot[over] - J,
                                        start + over.nonzero().flatten(), column[over], source, positions))
            self.maps[source] = blocks
        return self.maps[source]

    def fill(self, Q: int, J: int, at: torch.Tensor, slot: torch.Tensor, index: torch.Tensor, column: torch.Tensor,
             source: int, positions: torch.Tensor | None = None) -> Slots:
        """A block [Q, J] with the features `index` (into Active's arrays) at rows `at`, slots `slot`."""
        device = self.rep.device
        block = Slots(torch.zeros(Q, J, dtype=torch.long, device=device), torch.zeros(Q, J, device=device),
                      torch.zeros(Q, J, dtype=torch.long, device=device), positions)
        block.row[at, slot] = self.vectors.slot[source][index - self.active.span(source)[0]]
        block.scale[at, slot] = self.active.activation[index]
        block.column[at, slot] = column
        return block

    def build(self, source: int, layer: int, slots: Slots, P: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """A block of `source`'s features at `layer` up to position P (with the errors in the layer's own)."""
        Q = upto(slots.positions, P)
        padded = self.vectors.writing[source][:, layer - source][slots.row[:Q]].mul_(slots.scale[:Q, :, None])  # (Q, J, E)
        column = slots.column[:Q]
        positions = torch.arange(1, P + 1, device=column.device) if slots.positions is None else slots.positions[:Q]
        if source == layer and slots.positions is None:
            padded[:, 0] = self.errors[layer, 1:P + 1]
            column = column.clone()
            column[:, 0] = self.where.error_start[layer] + positions
        padded = self.rep.output_images(layer, padded, positions)  # a padding slot's zero stays zero
        return padded, column, None if slots.positions is None else positions


def upto(positions: torch.Tensor | None, P: int) -> int:
    """How many rows of a block are at positions up to P."""
    return P if positions is None else int(torch.searchsorted(positions, P, right=True))


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


def sweep(rep: Replacement, sources: Sources, rows: Rows, out: torch.Tensor) -> None:
    """Add to out [r, W] (W >= width(rows)) each row's direct effect on every node below it (module docstring).

    rows: sorted by layer, highest first (logits first), at positions 1 .. P."""
    r, P, E, L = len(rows), int(rows.position.max()), rep.embed.size(1), rep.n_layers
    device = rep.device
    grads = torch.zeros(r, P, E, device=device)  # each row's gradient at positions 1 .. P
    joined = int((rows.layer == L).sum())  # the rows carried so far: the logits, then each layer's features
    if joined:
        grads[torch.arange(joined, device=device), rows.position[:joined] - 1] = rows.reading[:joined]
    to_first_token = torch.zeros(r, device=device)
    chunk = max(1, min(ROW_CHUNK, GRADIENT_BYTES // (P * E * 4)))
    for layer in reversed(range(L if joined else int(rows.layer.max()) + 1)):
        skipped = None
        if joined:
            carried = grads[:joined]
            rep.sum_transpose(layer, "mlp", carried)
            project(sources, layer, carried, out[:joined])
            through = rep.skip_transpose(layer, carried)
            if through is not None and rep.parallel:  # the MLP reads resid_pre: added after the attention's part
                skipped = through
            elif through is not None:
                carried += through
        before = joined  # the rows that have crossed an attention already; the others join now
        if not rep.parallel:
            joined = join(rep, rows, grads, layer, joined)
        rep.sum_transpose(layer, "attn", grads[:joined])
        sublayer, image = rep.sublayers[layer], sources.first_images[layer]
        for start in range(0, joined, chunk):
            stop = min(joined, start + chunk)
            split = min(max(before, start), stop)
            if split > start:
                to_first_token[start:split] += sublayer.add_transpose(grads[start:split], image)
            if stop > split:
                to_first_token[split:stop] += sublayer.add_transpose_at(grads[split:stop], image, rows.position[split:stop])
        if skipped is not None:
            grads[:before] += skipped
        if rep.parallel:
            joined = join(rep, rows, grads, layer, joined)
    out[:, 1:P + 1] += torch.einsum("rpe,pe->rp", grads, rep.embed[1:P + 1])  # the tokens at positions 1 .. P
    out[:, 0] += to_first_token


def project(sources: Sources, layer: int, grads: torch.Tensor, out: torch.Tensor) -> None:
    """out [r, W] += each row's gradient where layer's MLP output is added, grads [r, P, E] (positions 1 .. P),
    dotted with every vector written there (sources.at), at the vectors' node columns."""
    r, P = grads.shape[:2]
    for vectors, columns, positions in sources.at(layer, P):
        carried = grads if positions is None else grads[:, positions - 1]  # (r, Q, E)
        edges = torch.bmm(carried.transpose(0, 1), vectors.transpose(1, 2))  # (Q, r, J)
        out.index_add_(1, columns.flatten(), edges.transpose(0, 1).reshape(r, -1))


def join(rep: Replacement, rows: Rows, grads: torch.Tensor, layer: int, joined: int) -> int:
    """The rows of layer's features (next after the first `joined`) join, each reading vector carried from the
    transcoder's input to the stream the MLP reads, at its own position; returns how many rows are carried now."""
    stop = joined + int((rows.layer[joined:] == layer).sum())
    if stop > joined:
        new = torch.arange(joined, stop, device=grads.device)
        grads[new, rows.position[new] - 1] = rep.input_transpose_at(layer, rows.reading[new], rows.position[new])
    return stop
