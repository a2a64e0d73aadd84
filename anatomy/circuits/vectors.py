"""What a graph reads of the transcoders, one layer at a time: the features that fire, and their vectors.

Shape letters: T positions, E d_model, F features per layer, O the layers a feature writes to (1 for a
per-layer set), m the features active at one layer (all positions), U the distinct features among them.

A graph needs three things of layer l's transcoder:

    which features fire      f_l = sigma(x_l W_enc + b_enc) at every position: the whole encoder, once
    their reading vectors    W_enc[:, i] for each feature i that fires: where a target's row starts
    their writing vectors    W_dec[i] (to each layer it writes): what a source adds, times its a_i

The first touches every weight of the layer, the other two only the U features that fire (U <= F, and
U <= T x the features a token fires). So each layer is read once, in turn (a memory-mapped set is paged in a
layer at a time), and what the graph keeps of it is those U columns and rows, in float32, on the model's
device. A set held in bfloat16 is widened a layer at a time, so that every sum the graph makes is a float32
sum of the values it holds.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from .layout import Active
from .replacement import Replacement, release


@dataclass
class Vectors:
    """Per layer l: distinct[l] [U] the features of l that fire somewhere; reading[l] [U, E] their encoder
    vectors (W_enc columns); writing[l] [U, O, E] their decoder rows (one per layer written); slot[l] [m]
    for each of l's active features (Active's order), the row of its feature in those."""

    distinct: list[torch.Tensor]
    reading: list[torch.Tensor]
    writing: list[torch.Tensor]
    slot: list[torch.Tensor]

    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.reading + self.writing)


def float32_layer(sae: torch.nn.Module) -> torch.nn.Module:
    """The transcoder layer itself when it is held in float32; else a float32 copy of it (one layer's worth)."""
    return sae if sae.W_enc.dtype == torch.float32 else copy.deepcopy(sae).float()


@torch.no_grad()
def read_features(rep: Replacement) -> tuple[Active, Vectors]:
    """Encode every layer's input, a layer at a time (module docstring): the active features, position 0
    zeroed as circuit-tracer zeroes it, with their pre-activations (the targets' values), and their vectors."""
    device = rep.device
    layers, positions, features, activations, pres = [], [], [], [], []
    vectors = Vectors([], [], [], [])
    for layer in range(rep.n_layers):
        sae = float32_layer(rep.transcoders.layers[layer])
        pre = sae.pre_activations(rep.inputs[layer].to(sae.W_enc.device)).float()  # (T, F)
        acts = sae.activate(pre)
        acts[0] = 0
        position, feature = acts.nonzero(as_tuple=True)
        distinct, slot = torch.unique(feature, return_inverse=True)  # (U,), (m,)
        vectors.distinct.append(distinct.to(device))
        vectors.slot.append(slot.to(device))
        vectors.reading.append(sae.W_enc.detach()[:, distinct].T.float().to(device))  # (U, E)
        vectors.writing.append(rep.transcoders.decoder_vectors(layer).detach()[distinct].float().to(device))  # (U, O, E)
        layers.append(torch.full_like(position, layer).to(device))
        positions.append(position.to(device)), features.append(feature.to(device))
        activations.append(acts[position, feature].to(device)), pres.append(pre[position, feature].to(device))
        del sae, pre, acts
        release(rep.transcoders, layer)
    active = Active(torch.cat(layers), torch.cat(positions), torch.cat(features), torch.cat(activations), torch.cat(pres))
    return active, vectors


def written(active: Active, vectors: Vectors, source: int, layer: int, start: int, stop: int) -> torch.Tensor:
    """[n, E]: a_i W_dec[i] to `layer`, the vectors the active features start .. stop (indices into Active's
    arrays, all of layer `source`) write there."""
    first = active.span(source)[0]
    rows = vectors.writing[source][vectors.slot[source][start - first:stop - first], layer - source]  # (n, E)
    return rows * active.activation[start:stop, None]


def errors_of(rep: Replacement, active: Active, vectors: Vectors) -> torch.Tensor:
    """[L, T, E]: each MLP's output minus what the transcoders write there (position 0's left at 0: no node),

        e_l = y_l - (sum over writers l' of sum_i a_i W_dec^{l' -> l}[i] + b_dec^l (+ x_l skip(l)))

    TranscoderSet.reconstruct's sum, over the features that fire alone (the others write 0), in float32."""
    T, E = rep.embed.shape
    errors = torch.zeros(rep.n_layers, T, E, device=rep.device)
    for layer in range(rep.n_layers):
        made = rep.transcoders.output_bias(layer).detach().to(rep.device, torch.float32, copy=True).expand(T, E).clone()  # (T, E)
        release(rep.transcoders, layer)
        for source in rep.transcoders.writers(layer):
            start, stop = active.span(source)
            made.index_add_(0, active.position[start:stop], written(active, vectors, source, layer, start, stop))
        if rep.skips[layer] is not None:
            made += rep.inputs[layer] @ rep.skips[layer]
        errors[layer] = rep.outputs[layer] - made
    errors[:, 0] = 0
    return errors
