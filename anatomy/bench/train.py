"""One training step (forward, backward, AdamW) of a 6 x 384 GPT-2-shaped decoder, batch 8 x 128."""

from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F

from .common import Row, Settings, alternate, gpt2_pair, memory_note, peak_memory_mb


def bench_train(settings: Settings) -> list[Row]:
    """One step of AdamW on next-token cross-entropy, batch 8 x 128, a 6 x 384 GPT-2 shape."""
    n_layers, d_model, n_heads, vocab, batch, length, repeats = 6, 384, 6, 50257, 8, 128, 5
    if settings.quick:
        n_layers, d_model, n_heads, vocab, batch, length = 2, 64, 4, 99, 2, 16
    ours, theirs = gpt2_pair(n_layers, d_model, n_heads, vocab_size=vocab, max_seq_len=max(length, 64))
    ours.train(), theirs.train()
    ids = torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(0))

    # Position t predicts token t + 1; the last position has no target (-100, ignored), as in
    # transformers' loss, which avoids copying the [B, T - 1, V] slice of the logits.
    targets = F.pad(ids[:, 1:], (0, 1), value=-100)  # (B, T)
    ours_opt, theirs_opt = torch.optim.AdamW(ours.parameters(), lr=1e-4), torch.optim.AdamW(theirs.parameters(), lr=1e-4)

    def step(loss_fn, opt):
        def run():
            loss = loss_fn()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss
        return run

    steps = {
        # DecoderModel.loss: the LM head and the cross-entropy a chunk of positions at a time
        "anatomy": step(lambda: ours.loss(ids), ours_opt),
        "transformers": step(lambda: theirs(ids, labels=ids).loss, theirs_opt),
        # the plain path: all the logits, then F.cross_entropy
        "anatomy, logits": step(lambda: F.cross_entropy(ours(ids).logits.view(-1, vocab), targets.view(-1)), ours_opt),
    }
    first = {side: steps[side]().item() for side in ("anatomy", "transformers")}  # same weights, batch: same loss
    times = alternate(steps, settings.repeats or repeats, warmup=1)
    memory = {side: peak_memory_mb(steps[side]) for side in ("anatomy", "transformers")}
    rate = {side: batch * length / statistics.median(t) for side, t in times.items()}
    # forward 2 N flops per token for the matrices (N parameters, LM head included), backward twice that.
    n_matrix = sum(p.numel() for p in ours.parameters() if p.dim() == 2) - ours.position_embedding.weight.numel()
    flops = 6 * n_matrix + 6 * 2 * n_layers * length * d_model  # + attention scores and sums, per token
    row = Row("train", f"step {n_layers}x{d_model}, {batch}x{length}", "tokens/s", rate["anatomy"], rate["transformers"], True)
    row.notes = [
        f"GFLOP/s {flops * rate['anatomy'] / 1e9:.1f} vs {flops * rate['transformers'] / 1e9:.1f}"
        f" = {flops * rate['anatomy'] / 1e9 / settings.peak_gflops:.0%} vs"
        f" {flops * rate['transformers'] / 1e9 / settings.peak_gflops:.0%} of peak",
        f"plain logits + F.cross_entropy: {rate['anatomy, logits']:.0f} tokens/s"
        f" ({rate['anatomy, logits'] / rate['transformers']:.2f}x)",
        memory_note(memory),
        f"first loss {first['anatomy']:.4f} vs {first['transformers']:.4f}",
    ]
    return [row]
