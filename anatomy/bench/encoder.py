"""Encoder latency (1 x 16) and throughput (8 x 128) with the all-MiniLM-L6-v2 weights on both sides."""

from __future__ import annotations

import statistics

import torch

from .common import Row, Settings, alternate, memory_note, minilm_pair, peak_memory_mb


def encoder_flops(config, batch: int, length: int) -> float:
    """Matmul flops of one encoder pass: 2 per multiply-add.

    Per token and layer: Q, K, V, O projections 4 E^2 and the FFN 2 E F multiply-adds; per layer the
    scores Q K^T and the weighted sum over V, 2 T^2 E each sequence. Embeddings, norms, softmax: ignored.
    """
    E, F, L = config.d_model, config.d_ff, config.n_layers
    return 2 * L * (batch * length * (4 * E * E + 2 * E * F) + 2 * batch * length * length * E)


def bench_encoder(settings: Settings) -> list[Row]:
    ours, theirs = minilm_pair(tiny=settings.quick)
    config = ours.config
    shapes = [("latency", 1, 16, 40), ("throughput", 8, 128, 6)]
    if settings.quick:
        shapes = [("latency", 1, 16, 2), ("throughput", 2, 32, 2)]
    rows = []
    generator = torch.Generator().manual_seed(0)
    for name, batch, length, repeats in shapes:
        ids = torch.randint(1000 if not settings.quick else 1, config.vocab_size, (batch, length), generator=generator)
        mask = torch.ones(batch, length, dtype=torch.bool)  # what a tokenizer returns: no padding here
        with torch.inference_mode():
            expected = theirs(ids, attention_mask=mask.long()).last_hidden_state
            error = (ours(ids, padding_mask=mask).last_hidden_state - expected).abs().max().item()
            times = alternate({
                "anatomy": lambda: ours(ids, padding_mask=mask),
                "transformers": lambda: theirs(ids, attention_mask=mask.long()),
            }, settings.repeats or repeats, warmup=2)
            memory = {
                "anatomy": peak_memory_mb(lambda: ours(ids, padding_mask=mask)),
                "transformers": peak_memory_mb(lambda: theirs(ids, attention_mask=mask.long())),
            }
        ms = {side: statistics.median(t) * 1e3 for side, t in times.items()}
        gflops = encoder_flops(config, batch, length) / 1e9
        row = Row("encoder", f"{name} {batch}x{length}", "ms", ms["anatomy"], ms["transformers"], False)
        row.notes = [
            f"GFLOP/s {gflops / ms['anatomy'] * 1e3:.1f} vs {gflops / ms['transformers'] * 1e3:.1f}"
            f" = {gflops / ms['anatomy'] * 1e3 / settings.peak_gflops:.0%} vs"
            f" {gflops / ms['transformers'] * 1e3 / settings.peak_gflops:.0%} of peak",
            f"arithmetic alone {gflops / settings.peak_gflops * 1e3:.2f} ms",
            memory_note(memory),
            f"max |diff| {error:.1e}",
        ]
        rows.append(row)
    return rows
