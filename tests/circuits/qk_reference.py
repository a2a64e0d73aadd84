"""The reference for QK attributions: the model itself, frozen, in float64, one source at a time.

Every norm module (the stream's and the per-head q/k norms) runs with its scale held at the clean pass's, every
attention pattern is the clean pass's, every transcoder output point holds its clean value (plus a skip's linear
change, which follows its input). The frozen model is then affine in what the nodes write, so a node's vector on
one side of a head (resid_pre(l) at that side's position) is the stream with the node's write added once more,
minus the unchanged stream; and the score is the model's attention module itself (its norm, projections, q/k
norm and rotary) on a stream changed at one position. No code of anatomy/circuits is used.
"""

from __future__ import annotations

import math

import torch

import anatomy
from frozen_reference import clean_scales, frozen_interventions, frozen_norms


class FrozenModel:
    """The model and transcoders in float64 on one prompt, frozen (module docstring)."""

    def __init__(self, model, transcoders, ids: list[int]):
        self.model, self.transcoders = model.double(), transcoders.double()
        self.ids = torch.tensor([ids])
        L = model.config.n_layers
        self.ins = [transcoders.input_point(l) for l in range(L)]
        self.outs = [transcoders.output_point(l) for l in range(L)]
        names = ["embed"] + [f"blocks.{l}.{p}" for l in range(L) for p in ("resid_pre", "attn.pattern", "attn.scores")]
        with torch.no_grad(), anatomy.trace(model, names + self.ins + self.outs) as clean:
            model(self.ids)
        self.scales = clean_scales(model, self.ids)  # every norm's, the q/k norms' too
        self.clean = clean
        self.base = None

    def restore(self) -> None:
        self.model.float(), self.transcoders.float()

    @torch.no_grad()
    def streams(self, extra_out: dict, extra_embed: torch.Tensor | None) -> list[torch.Tensor]:
        """resid_pre of every layer [T, E] with extra_out[layer] [1, T, E] added at the transcoders' output points
        and extra_embed [1, T, E'] at the embeddings (frozen_reference.frozen_interventions)."""
        interventions = frozen_interventions(self.transcoders, self.clean, {}, extra_out, extra_embed)
        names = [f"blocks.{l}.resid_pre" for l in range(self.model.config.n_layers)]
        with frozen_norms(self.model, self.scales), anatomy.trace(self.model, names, interventions=interventions) as t:
            self.model(self.ids)
        return [t[name][0] for name in names]

    def node_vector(self, node, layer: int) -> torch.Tensor:
        """[T, E]: what the node adds to resid_pre(layer), by adding its write once more in the frozen model."""
        T = self.ids.size(1)

        def at(column, vector):  # the embeddings may be narrower than the stream (OPT's project_in)
            add = torch.zeros(1, T, vector.size(-1), dtype=torch.float64)
            add[0, column] = vector
            return add

        if node.kind == "token":
            changed = self.streams({}, at(node.column, self.clean["embed"][0, node.column]))
        elif node.kind == "feature":
            rows = self.transcoders.decoder_vectors(node.layer)[node.index].detach()  # (O, E)
            changed = self.streams({node.layer + j: at(node.column, node.value * rows[j]) for j in range(len(rows))}, None)
        else:
            changed = self.streams({node.layer: at(node.column, self.error_vector(node))}, None)
        if self.base is None:
            self.base = self.streams({}, None)
        return changed[layer] - self.base[layer]

    def error_vector(self, node) -> torch.Tensor:
        """[E]: the MLP's output beyond the transcoders' reconstruction, from the features that fire (not at 0)."""
        L, clean, transcoders = self.model.config.n_layers, self.clean, self.transcoders
        inputs = [clean[self.ins[l]][0] for l in range(L)]
        features = []
        for l in range(L):
            acts = transcoders.encode(l, inputs[l])
            acts[0] = 0
            features.append(acts)
        recon = transcoders.reconstruct(node.layer, features, inputs)
        return clean[self.outs[node.layer]][0, node.column] - recon[node.column]

    @torch.no_grad()
    def score(self, layer: int, head: int, query: int, key: int, add_query=None, add_key=None) -> float:
        """The head's score before any cap, c q . k, from the model's attention module with every norm frozen, the
        query side's stream changed by add_query [E] at `query` only, the key side's by add_key at `key` only."""
        block = self.model.blocks[layer]
        attn = block.attn
        base = self.clean[f"blocks.{layer}.resid_pre"]  # (1, T, E)
        T = base.size(1)
        sides = []
        for which, position, add in (("q", query, add_query), ("k", key, add_key)):
            x = base.clone()
            if add is not None:
                x[0, position] += add
            with frozen_norms(self.model, self.scales):
                reads_stream = self.model.config.norm_position in ("post", "post_sublayer")  # no norm before it
                normed = x if reads_stream else block.attn_norm(x)
                y = attn.project(normed, which)  # (1, heads, T, D)
            if attn.rotary is not None:
                y = attn.rotary(y, torch.arange(T))
            sides.append(y[0, head if which == "q" else head // (attn.n_heads // attn.n_kv_heads), position])
        c = 1 / math.sqrt(attn.d_head) if attn.scale is None else attn.scale
        return float(c * (sides[0] @ sides[1]))
