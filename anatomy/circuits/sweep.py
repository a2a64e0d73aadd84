"""The direct effects of a graph, every row at once: one sweep down the layers of the local replacement.

Shape letters: T positions, E d_model, F transcoder features, N nodes, R rows (targets) at one position,
P = p the positions 1 .. p a row at position p carries.

circuit-tracer computes the rows by batched backward passes of the whole model through autograd, one
batch of rows at a time, each from its row's layer. Here the map is written out (replacement.py's
transposes) and all rows travel down the layers together in one sweep, each carrying only the positions
it can reach (its own and earlier ones: the mask is causal), rows joining at their own layer:

    for layer L = n-1 ... 0:
        (post-norm: back through the norm after the MLP's residual sum)
        project every row's gradient at L's MLP output on the vectors written there   -> A[rows, sources at L]
        back through the transcoder's skip (if it has one)
        rows of the features at layer L join, their encoder vectors at the MLP's input
        (post-norm: back through the norm after the attention's residual sum)
        back through L's attention, patterns and norm scales frozen
    project on the token embeddings                                                    -> A[rows, tokens]

In a parallel block the MLP reads the stream the attention reads (resid_pre): the skip's part and the
features of layer L join after L's attention, not before.
"""

from __future__ import annotations

import torch

from .layout import Active, Layout
from .replacement import Replacement


class Sources:
    """The vectors written at each layer's MLP output, by position: the activation-scaled decoder rows of the
    features that write there (a CLT's earlier layers too) and the error, with their node columns; each as the
    block adds it to the stream (through a frozen norm on the MLP's output, where one follows the output point)."""

    def __init__(self, rep: Replacement, active: Active, where: Layout, errors: torch.Tensor):
        self.by_layer: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
        transcoders = rep.transcoders
        for layer in range(rep.n_layers):
            at_layer = []
            for q in range(where.n_tokens):
                vectors, columns = [], []
                for source in transcoders.writers(layer):
                    nodes, chosen = where.features(source, q)
                    if nodes.stop > nodes.start:
                        rows = transcoders.decoder_vectors(source)[active.feature[chosen], layer - source]  # (n, E)
                        vectors.append(rows.detach().float() * active.activation[chosen, None])
                        columns.append(torch.arange(nodes.start, nodes.stop))
                vectors.append(errors[layer, q][None])
                columns.append(torch.tensor([where.error_start[layer] + q]))
                vectors = torch.cat(vectors)
                at_layer.append((rep.output_images(layer, vectors, torch.full((len(vectors),), q)), torch.cat(columns)))
            self.by_layer.append(at_layer)


def errors_of(rep: Replacement, active: Active, T: int) -> torch.Tensor:
    """[L, T, E]: each MLP's output minus what the transcoders write there (position 0's left at 0: no node)."""
    transcoders = rep.transcoders
    features = []
    for layer in range(rep.n_layers):
        f = torch.zeros(T, transcoders.d_transcoder)
        chosen = active.layer == layer
        f[active.position[chosen], active.feature[chosen]] = active.activation[chosen]
        features.append(f)
    errors = torch.stack([rep.outputs[layer] - transcoders.reconstruct(layer, features, rep.inputs).detach().float()
                          for layer in range(rep.n_layers)])  # (L, T, E)
    errors[:, 0] = 0
    return errors


ROW_CHUNK = 512  # rows carried back through one attention at a time: bounds the temporaries (512 x P x E floats)


def sweep(rep: Replacement, active: Active, where: Layout, sources: Sources, logit_vectors: torch.Tensor,
          adjacency: torch.Tensor, progress=None) -> None:
    """Fill adjacency's target rows (features, logits) with every direct effect, in one sweep down the layers
    (module docstring).

    The rows at position p carry their gradients at positions 1 .. p: grads[p] [R_p, p, E], joining at their
    own layer (in order: logits, then the features of layer L-1, ..., 0, so that the rows joined so far are
    the first ones). Position 0 is not carried: only the first token's node writes there, so what attention
    sends back to it at layer l meets that token's image at resid_pre(l) (its embedding carried up the first
    position), and the product is that edge's share, added up over the layers."""
    T, L, E = where.n_tokens, rep.n_layers, rep.embed.size(1)
    n_logits = logit_vectors.size(0)
    row_nodes = [torch.zeros(0, dtype=torch.long)]  # per position: the rows' node indices, in joining order
    for p in range(1, T):
        nodes = [torch.arange(where.logit_start, where.logit_start + n_logits)] if p == T - 1 else []
        nodes += [torch.arange(where.features(layer, p)[0].start, where.features(layer, p)[0].stop)
                  for layer in reversed(range(L))]
        row_nodes.append(torch.cat(nodes))
    grads = [torch.zeros(0)] + [torch.zeros(len(row_nodes[p]), p, E) for p in range(1, T)]  # (R_p, p, E)
    joined = [0] * T
    grads[T - 1][:n_logits, T - 2] = rep.logit_transpose(logit_vectors)
    joined[T - 1] = n_logits
    first_images = rep.first_position_images()
    to_first_token = torch.zeros(where.total)  # each row's edge from the first token, summed over layers
    encoders = [rep.transcoders.layers[layer].W_enc.detach().float() for layer in range(L)]  # (E, F) each

    for layer in reversed(range(L)):
        for p in range(1, T):
            rep.sum_transpose(layer, "mlp", grads[p][:joined[p]])
        for q in range(1, T):  # every row that reaches position q, against what is written there
            vectors, columns = sources.by_layer[layer][q]
            groups = [p for p in range(q, T) if joined[p]]
            if not groups:
                continue
            edges = torch.empty(sum(joined[p] for p in groups), len(columns))
            start = 0
            for p in groups:
                torch.mm(grads[p][:joined[p], q - 1], vectors.T, out=edges[start:start + joined[p]])
                start += joined[p]
            rows = torch.cat([row_nodes[p][:joined[p]] for p in groups])
            adjacency.index_put_((rows[:, None], columns[None, :]), edges, accumulate=True)
        if rep.parallel:  # the MLP reads resid_pre: its skip's part is taken before the attention's is added
            skipped = [None] + [rep.skip_transpose(layer, grads[p][:joined[p]]) for p in range(1, T)]
        else:
            mlp_reads(rep, active, where, layer, encoders[layer], grads, joined)
        before = list(joined)  # the rows that have crossed an attention already; the others join now
        sublayer = rep.sublayers[layer]
        for p in range(1, T):
            rep.sum_transpose(layer, "attn", grads[p][:joined[p]])
            for start in range(0, joined[p], ROW_CHUNK):
                stop = min(joined[p], start + ROW_CHUNK)
                split = min(max(before[p], start), stop)  # rows before it crossed an attention; from it, joined now
                if split > start:
                    to_first_token[row_nodes[p][start:split]] += sublayer.add_transpose(grads[p][start:split],
                                                                                        first_images[layer])
                if stop > split:
                    to_first_token[row_nodes[p][split:stop]] += sublayer.add_transpose_at(grads[p][split:stop],
                                                                                          first_images[layer])
        if rep.parallel:
            mlp_reads(rep, active, where, layer, encoders[layer], grads, joined, skipped)
        if progress is not None:
            progress(L - layer, L + 1)
    for p in range(1, T):
        if joined[p]:
            rows = row_nodes[p][:joined[p]]
            at_embeddings = (grads[p][:joined[p]] * rep.embed[1:p + 1]).sum(-1)  # (R, p)
            adjacency[rows[:, None], torch.arange(1, p + 1)[None, :]] = at_embeddings
            adjacency[rows, 0] = to_first_token[rows]


def mlp_reads(rep: Replacement, active: Active, where: Layout, layer: int, encoder: torch.Tensor, grads: list,
              joined: list, skipped: list | None = None) -> None:
    """At the stream layer's MLP reads (resid_mid; resid_pre in a parallel block): add each row's part through the
    skip (skipped[p] [R_p, p, E], or computed here from the gradients as they are), and let the features of the
    layer join, their encoder vectors (encoder [E, F]) read at the MLP's input."""
    for p in range(1, len(grads)):
        through = rep.skip_transpose(layer, grads[p][:joined[p]]) if skipped is None else skipped[p]
        if through is not None:
            grads[p][:len(through)] += through
        chosen = where.features(layer, p)[1]
        k = chosen.stop - chosen.start
        if k:
            reading = encoder[:, active.feature[chosen]].T  # (k, E)
            grads[p][joined[p]:joined[p] + k, p - 1] = rep.input_transpose_at(layer, reading, p)
            joined[p] += k
