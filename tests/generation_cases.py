"""Tiny models and ids shared by the generation tests."""

import torch

import anatomy
from anatomy import ModelConfig

TINY = dict(vocab_size=13, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_seq_len=32)


def decoder(**changes):
    return anatomy.build_model(ModelConfig(arch="decoder", **{**TINY, **changes}), seed=0).eval()


def seq2seq(**changes):
    return anatomy.build_model(ModelConfig(arch="encoder-decoder", **{**TINY, **changes}), seed=0).eval()


def ids(batch, length, seed=1, vocab=TINY["vocab_size"]):
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def sequence_log_prob(model, prompt, new, *, stop=None):
    """log p(new | prompt) for one prompt [T] and many continuations [N, L], by one full pass."""
    full = torch.cat([prompt.expand(new.size(0), -1), new], dim=1)
    with torch.no_grad():
        log_p = torch.log_softmax(model(full).logits.float(), dim=-1)
    picked = log_p[:, prompt.numel() - 1:-1].gather(2, new[:, :, None]).squeeze(2)  # (N, L)
    return picked.sum(dim=1)
