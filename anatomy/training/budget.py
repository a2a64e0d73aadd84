"""What one training step holds at least, estimated before anything is read, tokenized or built,
so that a command line asking for more than the machine has is refused in a second, with the sizes
to change (`--context 1e12` used to reach a 512 TB allocation; `--d-model 1e9` a 444 GB one).

    weights, gradients and AdamW's two moments     4 x parameters x 4 bytes (float32)
    activations kept for the backward pass         per block, per micro-batch of B rows of T tokens:
        18 B T d  +  4 B T d_ff  (+ 5 B H T^2 with the eager kernel)  bytes

The activations are Korthikanti et al. (2022), "Reducing Activation Recomputation in Large
Transformer Models", section 4.1: s b h (34 + 5 a s / h) bytes per layer at 16 bits, whose MLP part
(19 s b h) is written here for any d_ff (3 s b h + 4 s b d_ff). Taken at 16 bits, and without the
attention probabilities that SDPA's kernels never hold, the estimate is a lower bound: a run it
refuses cannot fit, and one it lets through may still be tight. An encoder-decoder's decoder
blocks count twice (self- and cross-attention).
"""

from __future__ import annotations

import torch

from ..checkpoints.memory import HEADROOM_BYTES, available_memory, check_memory, empty_model
from ..config import ModelConfig

OPTIMIZER_COPIES = 4  # weights, gradients, AdamW's first and second moments


def activation_bytes(config: ModelConfig, rows: int, tokens: int) -> int:
    """At least the bytes of activations one forward pass keeps for its backward pass, for `rows`
    sequences of `tokens` tokens (the section's formula at 16 bits; see the module docstring)."""
    d, d_ff, heads = config.d_model, config.d_ff, config.n_heads
    probabilities = 5 * rows * heads * tokens * tokens if config.attn_impl == "eager" else 0
    per_block = 18 * rows * tokens * d + 4 * rows * tokens * d_ff + probabilities
    blocks = config.n_layers + 2 * (config.decoder_n_layers or config.n_layers) * (config.arch == "encoder-decoder")
    return blocks * per_block


def check_training_memory(config: ModelConfig, rows: int, tokens: int, device: str, what: str) -> int:
    """At least the bytes a training step of `config` needs (weights, gradients, AdamW's moments
    and one micro-batch's activations), after refusing with a ValueError, naming `what` to change,
    a step that the device's available memory cannot hold. Nothing is allocated: the model is built
    on the meta device to count its parameters."""
    device = torch.device(device)
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else available_memory()

    def refuse_past(parameters: int) -> int:
        needed = OPTIMIZER_COPIES * 4 * parameters + activation_bytes(config, rows, tokens)
        if needed + HEADROOM_BYTES > free:
            raise ValueError(f"{what}: one training step needs at least {needed / 1e9:,.3g} GB ({parameters:,} "
                             f"parameters with their gradients and AdamW's moments, and the activations of {rows} x "
                             f"{tokens} tokens), more than the {free / 1e9:,.3g} GB available on {device}")
        return needed

    refuse_past(minimum_parameters(config))  # first from a formula: building ten million layers takes minutes
    check_memory(config, what)  # the position tables, which are built for real
    return refuse_past(sum(p.numel() for p in empty_model(config, what).parameters()))


def minimum_parameters(config: ModelConfig) -> int:
    """A lower bound on the parameters of any model `config` describes, from its sizes alone: the
    token embeddings, and in every block the query and output projections (d x H d_head each) and
    the feed-forward's two matrices (d x d_ff each, of at least one expert)."""
    d = config.d_model
    blocks = config.n_layers + (config.decoder_n_layers or config.n_layers) * (config.arch == "encoder-decoder")
    per_block = 2 * d * config.n_heads * config.d_head + 2 * d * config.d_ff
    return config.vocab_size * d + blocks * per_block
