"""A transcoder set for benchmarking graphs before trained ones exist: random, calibrated to fire as trained ones do.

Shape letters: E d_model, F features per layer, R calibration rows.

Each layer gets F JumpReLU features with random unit encoder and decoder directions and one threshold, the
quantile of the layer's pre-activations over the calibration tokens at which `active` of the F fire per token
on average (42 of 2,304 in the measurements of shared/notes/circuit-tracer-on-a-cpu.md; calibrated on the
prompt itself, the graph has 42 per token and layer). A graph's cost depends on how many features fire, not on what
they mean, so its timings transfer to trained transcoders of the same width and sparsity.
"""

from __future__ import annotations

import torch
from torch import nn

from ..sae import SAE, TranscoderSet
from ..sae.store import harvest


@torch.no_grad()
def calibrated_random_transcoders(model: nn.Module, ids: torch.Tensor, *, features: int = 2304, active: float = 42,
                                  seed: int = 0, dtype: torch.dtype = torch.float32) -> TranscoderSet:
    """A per-layer JumpReLU set on every layer of `model` (blocks.L.mlp_norm.out -> blocks.L.mlp.out), its
    thresholds set on ids [C, T] (the first position of each left out) so that `active` features fire per
    token on average; each layer made in float32 and held in `dtype` (a 26 x 16,384 x 2304 set is 7.9 GB in
    float32, 3.9 GB in bfloat16)."""
    n_layers, d_model = model.config.n_layers, model.config.d_model
    inputs = harvest(model, ids, [f"blocks.{layer}.mlp_norm.out" for layer in range(n_layers)])  # L x (C, T, E)
    outputs = harvest(model, ids, [f"blocks.{layer}.mlp.out" for layer in range(n_layers)])
    inputs, outputs = [x.float() for x in inputs], [y.float() for y in outputs]
    generator = torch.Generator().manual_seed(seed)
    layers = []
    for layer in range(n_layers):
        sae = SAE(d_model, features, kind="jumprelu", transcoder=True, seed=None)
        W_enc = torch.randn(d_model, features, generator=generator)
        W_enc /= W_enc.norm(dim=0, keepdim=True)
        rows = inputs[layer][:, 1:].reshape(-1, d_model).float()  # (R, E): the first position left out
        quantile_rows = rows if rows.size(0) * features <= 2**24 else rows[:2**24 // features]  # torch.quantile's limit
        pre = rows @ W_enc  # (R, F)
        threshold = torch.quantile((quantile_rows @ W_enc).flatten(), 1 - active / features).clamp(min=1e-3).expand(features)  # (F,)
        W_dec = torch.randn(features, d_model, generator=generator)
        W_dec /= W_dec.norm(dim=1, keepdim=True)
        # decoder rows scaled so that a token's active features write about the MLP output's norm
        scale = outputs[layer][:, 1:].float().norm(dim=-1).mean() / (active ** 0.5 * float(pre.clamp(min=0).max(dim=0).values.mean()))
        sae.W_enc.copy_(W_enc)
        sae.b_enc.zero_()
        sae.W_dec.copy_(W_dec * scale)
        sae.b_dec.zero_()
        sae.threshold.copy_(threshold)
        layers.append(sae.to(dtype))
    return TranscoderSet(layers, metadata={"scan": f"random-calibrated-{features}-{active:g}"}).eval()
