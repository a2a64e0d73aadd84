"""Tiny models of every family (hidden 32, 2 layers, vocab 99) for the analysis tests (a module of its
own name: `conftest` is taken by every test folder)."""

from __future__ import annotations

import torch

import anatomy

TINY = dict(vocab_size=99, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_seq_len=64)


def tiny(**overrides) -> torch.nn.Module:
    """A pre-norm model (GPT-2's block) unless overridden; seeded, in evaluation mode."""
    config = anatomy.ModelConfig(**{**TINY, "norm_position": "pre", "pos_encoding": "learned",
                                    "activation": "gelu_tanh", **overrides})
    model = anatomy.build_model(config, seed=0).eval()
    with torch.no_grad():  # non-trivial norms and biases, so that folding and centring are tested
        generator = torch.Generator().manual_seed(1)
        for name, parameter in model.named_parameters():
            if name.endswith(("norm.weight", "norm.bias")) or name.endswith(".bias"):
                parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))
    return model


def ids(batch: int = 2, length: int = 9, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, TINY["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(seed))


FAMILIES = {
    "decoder": dict(arch="decoder"),
    "decoder-llama": dict(arch="decoder", norm="rmsnorm", pos_encoding="rotary", activation="swiglu",
                          attn_bias=False, attn_out_bias=False, mlp_bias=False, n_kv_heads=2, tie_embeddings=False),
    "encoder": dict(arch="encoder"),
    "encoder-decoder": dict(arch="encoder-decoder"),
}


def inputs_for(model, batch: int = 2):
    if model.config.arch == "encoder-decoder":
        return ids(batch, 7, seed=1), ids(batch, 6, seed=2)
    return ids(batch)
