"""Greedy generation of 64 tokens at batch 1 with a KV cache: GPT-2 124M and a 6 x 384 shape, same weights.

The time per token is compared with the memory bandwidth's limit: decoding reads every weight once
per token.
"""

from __future__ import annotations

import statistics

import torch

from ..generation import generate
from .common import Row, Settings, alternate, gpt2_pair, memory_note, peak_memory_mb


def greedy_anatomy(model, prompt: torch.Tensor, n_new: int) -> torch.Tensor:
    return generate(model, prompt, max_new_tokens=n_new).new_tokens


def greedy_transformers(model, prompt: torch.Tensor, n_new: int) -> torch.Tensor:
    output = model.generate(
        prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=n_new,
        min_new_tokens=n_new, pad_token_id=model.config.eos_token_id,
    )
    return output[:, prompt.size(1):]


def decode_bytes(model) -> int:
    """Bytes of weights read to produce one token: every parameter once (the tied embedding once, as
    the LM head), except the position table, of which one row is read."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    positions = model.position_embedding.weight
    return total - positions.numel() * positions.element_size()


def bench_generate(settings: Settings) -> list[Row]:
    shapes = [("GPT-2 124M", 12, 768, 12), ("6x384", 6, 384, 6)]
    n_new, prompt_length, repeats = 64, 16, 3
    if settings.quick:
        shapes, n_new, prompt_length = [("2x64", 2, 64, 4)], 8, 4
    rows = []
    for name, n_layers, d_model, n_heads in shapes:
        vocab = 50257 if not settings.quick else 99
        ours, theirs = gpt2_pair(n_layers, d_model, n_heads, vocab_size=vocab, max_seq_len=1024 if not settings.quick else 64)
        prompt = torch.randint(0, vocab, (1, prompt_length), generator=torch.Generator().manual_seed(0))
        with torch.inference_mode():
            same = torch.equal(greedy_anatomy(ours, prompt, n_new), greedy_transformers(theirs, prompt, n_new))
            times = alternate({
                "anatomy": lambda: greedy_anatomy(ours, prompt, n_new),
                "transformers": lambda: greedy_transformers(theirs, prompt, n_new),
            }, settings.repeats or repeats, warmup=1)
            memory = {
                "anatomy": peak_memory_mb(lambda: greedy_anatomy(ours, prompt, n_new)),
                "transformers": peak_memory_mb(lambda: greedy_transformers(theirs, prompt, n_new)),
            }
        rate = {side: n_new / statistics.median(t) for side, t in times.items()}
        limit_ms = decode_bytes(ours) / (settings.bandwidth_gbs * 1e9) * 1e3
        ms = {side: 1e3 / r for side, r in rate.items()}
        row = Row("generate", f"{name}, 64 tokens" if not settings.quick else name, "tokens/s",
                  rate["anatomy"], rate["transformers"], True)
        row.notes = [
            f"{ms['anatomy']:.1f} vs {ms['transformers']:.1f} ms/token; bandwidth allows {limit_ms:.1f}"
            f" ({decode_bytes(ours) / 1e6:.0f} MB/token): {limit_ms / ms['anatomy']:.0%} vs {limit_ms / ms['transformers']:.0%}",
            memory_note(memory),
            f"same tokens: {'yes' if same else 'NO'}",
        ]
        rows.append(row)
        del ours, theirs
    return rows
