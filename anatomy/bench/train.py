"""One training step (forward, backward, AdamW), side by side with a nanoGPT-shaped model and with transformers.

Three rows:

- **nanoGPT's CPU recipe shapes** (4 layers, 4 heads, d_model 128, context 64, batch 12, 65 characters):
  anatomy's step as `anatomy train lm` runs it (DecoderModel.loss, the chunked LM loss; the trainer's
  own AdamW from make_optimizer), against a nanoGPT-shaped model defined below as nanoGPT's model.py
  writes it (one fused QKV matrix, F.scaled_dot_product_attention with is_causal, bias-free
  Linear and LayerNorm as its CPU recipe sets bias=False, tied embeddings, logits then F.cross_entropy)
  and trained as its train.py does on a CPU (AdamW over two weight-decay groups; fused only on CUDA).
  Both start from the same weights (anatomy's, copied into the nanoGPT layout), so the first losses match.
- **a 6 x 384 GPT-2 shape, batch 8 x 128**, against Hugging Face transformers on the same weights.
- **Muon's step on the char-LM recipe's modern variant** (its 28 block matrices): anatomy's Muon as
  `VARIANT=muon` runs it (two Polar Express iterations, Gram-matrix bound, shapes stacked) against
  torch.optim.Muon (Jordan's five, one matrix at a time), with anatomy's Muon at torch's settings and
  the fused AdamW step of the AdamW recipe in the notes. Gradients are fixed; only the step is timed.

Runs alternate (A B, B A, ...) in this one process; medians are reported.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..models import build_model
from ..training.trainer import TrainConfig, make_optimizer
from .common import Row, Settings, alternate, gpt2_pair, load_average, memory_note, peak_memory_mb


# A nanoGPT-shaped model (Karpathy's nanoGPT, model.py), bias=False ---------------------------------

class _NanoAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.c_attn = nn.Linear(d_model, 3 * d_model, bias=False)  # Q, K, V in one matrix
        self.c_proj = nn.Linear(d_model, d_model, bias=False)
        self.resid_dropout = nn.Dropout(0.0)
        self.n_heads = n_heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, E)
        return self.resid_dropout(self.c_proj(y))


class _NanoBlock(nn.Module):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model, bias=False)
        self.attn = _NanoAttention(d_model, n_heads)
        self.ln_2 = nn.LayerNorm(d_model, bias=False)
        self.c_fc = nn.Linear(d_model, 4 * d_model, bias=False)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * d_model, d_model, bias=False)
        self.dropout = nn.Dropout(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.dropout(self.c_proj(self.gelu(self.c_fc(self.ln_2(x)))))


class NanoGPT(nn.Module):
    """nanoGPT's GPT at the given shape: wte + wpe, pre-norm blocks, ln_f, lm_head tied to wte."""

    def __init__(self, vocab_size: int, max_seq_len: int, n_layers: int, n_heads: int, d_model: int):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab_size, d_model), nn.Embedding(max_seq_len, d_model)
        self.drop = nn.Dropout(0.0)
        self.h = nn.ModuleList(_NanoBlock(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model, bias=False)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, V)
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)

    @torch.no_grad()
    def copy_from(self, ours) -> "NanoGPT":
        """Take anatomy's weights: Q, K, V stacked into c_attn, the rest one to one (LayerNorm biases are 0)."""
        self.wte.weight.copy_(ours.token_embedding.weight)
        self.wpe.weight.copy_(ours.position_embedding.weight)
        for mine, block in zip(self.h, ours.blocks):
            mine.ln_1.weight.copy_(block.attn_norm.weight)
            mine.attn.c_attn.weight.copy_(torch.cat([block.attn.q_proj.weight, block.attn.k_proj.weight,
                                                     block.attn.v_proj.weight]))  # (3E, E)
            mine.attn.c_proj.weight.copy_(block.attn.o_proj.weight)
            mine.ln_2.weight.copy_(block.mlp_norm.weight)
            mine.c_fc.weight.copy_(block.mlp.fc_in.weight)
            mine.c_proj.weight.copy_(block.mlp.fc_out.weight)
        self.ln_f.weight.copy_(ours.final_norm.weight)
        return self


def nano_optimizer(model: nn.Module, lr: float, fused: bool = False) -> torch.optim.AdamW:
    """nanoGPT's configure_optimizers: decay for tensors of 2+ dimensions, none for the rest."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.99), **({"fused": True} if fused else {}))


def _step(loss_fn, optimizer):
    def run():
        loss = loss_fn()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss
    return run


def bench_nanogpt(settings: Settings) -> Row:
    """anatomy's training step against the nanoGPT-shaped model's, on nanoGPT's CPU recipe shapes."""
    n_layers, n_heads, d_model, context, batch, vocab, repeats = 4, 4, 128, 64, 12, 65, 60
    if settings.quick:
        n_layers, n_heads, d_model, context, batch = 1, 2, 32, 16, 2
    config = ModelConfig(arch="decoder", vocab_size=vocab, d_model=d_model, n_heads=n_heads, n_layers=n_layers,
                         d_ff=4 * d_model, max_seq_len=context, pos_encoding="learned", activation="gelu",
                         attn_bias=False, attn_out_bias=False, mlp_bias=False, dropout=0.0)
    ours = build_model(config, seed=0).train()
    nano = NanoGPT(vocab, context, n_layers, n_heads, d_model).copy_from(ours).train()
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab, (batch, context), generator=generator)
    y = torch.randint(0, vocab, (batch, context), generator=generator)
    recipe = TrainConfig(lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    steps = {
        "anatomy": _step(lambda: ours.loss(x, targets=y), make_optimizer(ours, recipe, torch.device("cpu"))),
        "nanoGPT": _step(lambda: nano(x, y)[1], nano_optimizer(nano, recipe.lr)),
    }
    first = {side: steps[side]().item() for side in steps}  # same weights, same batch: the same loss
    # nanoGPT given the fused AdamW too (a copy that has taken the same first step), for the record
    nano_fused = NanoGPT(vocab, context, n_layers, n_heads, d_model).train()
    nano_fused.load_state_dict(nano.state_dict())
    steps["nanoGPT, fused AdamW"] = _step(lambda: nano_fused(x, y)[1], nano_optimizer(nano_fused, recipe.lr, fused=True))
    times = alternate(steps, settings.repeats or repeats, warmup=3)
    ms = {side: statistics.median(t) * 1e3 for side, t in times.items()}
    # the same again in CPU time: what neighbours on a shared machine cannot inflate
    cpu = alternate(steps, settings.repeats or repeats, clock=time.thread_time)
    cpu_ms = {side: statistics.median(t) * 1e3 for side, t in cpu.items()}
    tokens = batch * context
    row = Row("train", f"step {n_layers}x{d_model}, {batch}x{context}, theirs = nanoGPT-shaped", "tokens/s",
              tokens / ms["anatomy"] * 1e3, tokens / ms["nanoGPT"] * 1e3, True)
    row.notes = [
        f"{ms['anatomy']:.1f} vs {ms['nanoGPT']:.1f} ms/step, medians of {len(times['anatomy'])}",
        f"CPU time {cpu_ms['anatomy']:.1f} vs {cpu_ms['nanoGPT']:.1f} ms/step"
        f" ({cpu_ms['nanoGPT'] / cpu_ms['anatomy']:.2f}x)",
        f"nanoGPT with fused AdamW too: {ms['nanoGPT, fused AdamW']:.1f} ms"
        f" ({ms['nanoGPT, fused AdamW'] / ms['anatomy']:.2f}x; CPU {cpu_ms['nanoGPT, fused AdamW']:.1f} ms,"
        f" {cpu_ms['nanoGPT, fused AdamW'] / cpu_ms['anatomy']:.2f}x)",
        f"load {load_average()}",
        f"first loss {first['anatomy']:.4f} vs {first['nanoGPT']:.4f}",
    ]
    return row


def bench_transformers(settings: Settings) -> Row:
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
    steps = {
        # DecoderModel.loss: the LM head and the cross-entropy a chunk of positions at a time
        "anatomy": _step(lambda: ours.loss(ids), ours_opt),
        "transformers": _step(lambda: theirs(ids, labels=ids).loss, theirs_opt),
        # the plain path: all the logits, then F.cross_entropy
        "anatomy, logits": _step(lambda: F.cross_entropy(ours(ids).logits.view(-1, vocab), targets.view(-1)), ours_opt),
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
    return row


def bench_muon(settings: Settings) -> Row:
    """The optimizer step alone, on the char-LM recipe's modern variant: Muon's against torch's."""
    n_layers, d_model, d_ff, repeats = (1, 32, 48, 5) if settings.quick else (4, 128, 336, 60)
    config = ModelConfig(arch="decoder", vocab_size=65, d_model=d_model, n_heads=4, n_layers=n_layers, d_ff=d_ff,
                         max_seq_len=64, pos_encoding="rotary", activation="swiglu", attn_bias=False,
                         attn_out_bias=False, mlp_bias=False, dropout=0.0)
    model = build_model(config, seed=0)
    x = torch.randint(0, 65, (12, 64), generator=torch.Generator().manual_seed(0))
    model.loss(x).backward()
    cpu = torch.device("cpu")
    recipe = dict(optimizer="muon", lr=5e-3, weight_decay=0.1)
    ours = make_optimizer(model, TrainConfig(**recipe, ns_coefficients="polar-express", ns_steps=2, ns_norm="gram"), cpu)
    jordan = make_optimizer(model, TrainConfig(**recipe), cpu)  # anatomy's Muon, torch's settings
    matrices = [p for group in jordan.members[0].param_groups for p in group["params"]]
    theirs = torch.optim.Muon(matrices, lr=5e-3, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    steps = {"anatomy": ours.members[0].step, "torch.optim.Muon": theirs.step,
             "anatomy, Jordan 5": jordan.members[0].step,
             "AdamW": make_optimizer(model, TrainConfig(lr=1e-3, weight_decay=0.1), cpu).step}
    with torch.no_grad():  # the weights move; the timing does not depend on where they are
        cpu_s = alternate(steps, settings.repeats or repeats, warmup=2, clock=time.thread_time)
    ms = {side: statistics.median(t) * 1e3 for side, t in cpu_s.items()}
    row = Row("train", f"Muon step, {len(matrices)} matrices of the modern char LM, theirs = torch.optim.Muon",
              "ms (CPU)", ms["anatomy"], ms["torch.optim.Muon"], False)
    row.notes = [f"anatomy's Muon at torch's settings (Jordan's 5): {ms['anatomy, Jordan 5']:.1f} ms",
                 f"the AdamW recipe's fused step over the whole model: {ms['AdamW']:.1f} ms",
                 f"CPU-time medians of {len(cpu_s['anatomy'])}, alternating", f"load {load_average()}"]
    return row


def bench_train(settings: Settings) -> list[Row]:
    return [bench_nanogpt(settings), bench_transformers(settings), bench_muon(settings)]
