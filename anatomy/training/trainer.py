"""The training loop: one loop, three tasks (lm, seq2seq, classify).

One optimizer update ("step") is:

    1. draw the step's micro-batches: a pure function of (seed, step), see data.py
    2. for each micro-batch: loss = sum of per-token losses / tokens in the whole global batch,
       backward (DDP averages gradients over ranks; gradients accumulate over micro-batches)
    3. clip the global gradient norm, AdamW update, next learning rate

Dividing by the token count of the *global* batch (all micro-batches, all ranks) makes the
gradient the same whether a batch of 64 runs as 1 x 64, 4 x 16 accumulated, or 2 ranks x 32.

Shapes: B batch, T target length, S source length, V vocabulary, C classes.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from . import distributed
from .checkpoint import find_checkpoint, load_checkpoint, save_checkpoint, write_text_atomically
from .data import IGNORE_INDEX, EpochBatches, LMBatches, TokenSequences, classify_batch, seq2seq_batch
from .schedules import make_scheduler


@dataclass
class TrainConfig:
    """Everything about *how* to train (the model's shape lives in ModelConfig)."""

    max_steps: int = 1000
    batch_size: int = 32  # per rank, per micro-batch
    grad_accum: int = 1  # micro-batches per optimizer step
    lr: float = 1e-3  # peak learning rate (inverse-sqrt: a multiplier of the paper's formula)
    min_lr_ratio: float = 0.1  # cosine ends at lr * min_lr_ratio
    schedule: str = "cosine"  # "cosine" | "inverse-sqrt" | "constant"
    warmup: int = 100
    weight_decay: float = 0.1  # on matrices only; never on norms, biases, embeddings
    betas: tuple[float, float] = (0.9, 0.99)
    eps: float = 1e-8
    label_smoothing: float = 0.0
    clip: float = 1.0  # max global gradient norm; 0 = no clipping
    eval_every: int = 250  # steps; 0 = only at the end
    log_every: int = 10
    save_every: int = 0  # steps; 0 = only at the end
    keep: int = 2  # checkpoints kept on disk
    seed: int = 1337
    precision: str = "auto"  # "auto" (bf16/fp16 autocast on GPU, fp32 on CPU) | "fp32" | "bf16" | "fp16"
    progress: bool = True  # rich progress bar (rank 0, on a terminal)
    quiet: bool = False  # no printing at all (tests)


# ---- the tasks: what a batch is, and what the loss is -------------------------------------------
def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """Sum over real positions of -log p(label), smoothed: (1 - eps) * NLL + eps * mean_v(-log p_v).

    logits (B, T, V) or (B, C); labels (B, T) or (B,), IGNORE_INDEX where there is nothing to predict.
    Summed, not averaged: the trainer divides by the global count."""
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), labels.reshape(-1),
                           ignore_index=IGNORE_INDEX, label_smoothing=label_smoothing, reduction="sum")


class LMTask:
    """Next-token prediction on random blocks of a token stream (decoder)."""

    name = "lm"

    def __init__(self, train: LMBatches, val: LMBatches | None = None, eval_batches: int = 20):
        self.train, self.val, self.eval_batches = train, val, eval_batches

    def batch(self, k: int) -> dict:
        return self.train.batch(k)

    def loss(self, model, batch: dict, label_smoothing: float = 0.0) -> torch.Tensor:
        logits = model(batch["input_ids"]).logits  # (B, T, V)
        return token_loss_sum(logits, batch["labels"], label_smoothing)

    @torch.no_grad()
    def evaluate(self, model, device, final: bool = False) -> dict:
        if self.val is None:
            return {}
        total, count = 0.0, 0
        for batch in self.val.eval_batches(self.eval_batches):
            batch = to_device(batch, device)
            total += self.loss(model, batch).item()
            count += count_targets(batch)
        return {"val_loss": total / count}


class Seq2SeqTask:
    """Translation with teacher forcing (encoder-decoder); greedy-decoded BLEU when a test set is given."""

    name = "seq2seq"

    def __init__(self, src: TokenSequences, tgt: TokenSequences, tokenizer, batch_size: int, max_len: int,
                 seed: int, rank: int = 0, world_size: int = 1, val: tuple | None = None,
                 bleu_set: tuple | None = None, bleu_max: int | None = None):
        self.src, self.tgt, self.tok, self.max_len = src, tgt, tokenizer, max_len
        lengths = np.maximum(src.lengths(), tgt.lengths())
        self.sampler = EpochBatches(lengths, batch_size, seed, rank, world_size, bucket=50)
        self.batch_size, self.val, self.bleu_set, self.bleu_max = batch_size, val, bleu_set, bleu_max

    def _collate(self, src, tgt, idx) -> dict:
        t = self.tok
        return seq2seq_batch([src[i] for i in idx], [tgt[i] for i in idx], t.pad_id, t.bos_id, t.eos_id,
                             self.max_len, self.max_len)

    def batch(self, k: int) -> dict:
        return self._collate(self.src, self.tgt, self.sampler.indices(k))

    def loss(self, model, batch: dict, label_smoothing: float = 0.0) -> torch.Tensor:
        out = model(batch["src_ids"], batch["tgt_ids"], src_padding_mask=batch["src_padding_mask"],
                    tgt_padding_mask=batch["tgt_padding_mask"])
        return token_loss_sum(out.logits, batch["labels"], label_smoothing)  # logits (B, T, V)

    @torch.no_grad()
    def evaluate(self, model, device, final: bool = False) -> dict:
        metrics = {}
        if self.val is not None:
            src, tgt = self.val
            total, count = 0.0, 0
            for start in range(0, len(src), 2 * self.batch_size):
                batch = to_device(self._collate(src, tgt, range(start, min(len(src), start + 2 * self.batch_size))),
                                  device)
                total += self.loss(model, batch).item()
                count += count_targets(batch)
            metrics["val_loss"] = total / count
        if self.bleu_set is not None and (final or self.bleu_max):
            from .evaluate import bleu

            src, refs = self.bleu_set
            n = len(src) if final or not self.bleu_max else min(self.bleu_max, len(src))
            metrics["bleu" if n == len(src) else f"bleu_first{n}"] = bleu(
                model, self.tok, [src[i] for i in range(n)], refs[:n], self.max_len, device)
        return metrics


class ClassifyTask:
    """Sequence classification (encoder with a classification head): one label per text."""

    name = "classify"

    def __init__(self, seqs: TokenSequences, labels: np.ndarray, tokenizer, batch_size: int, max_len: int,
                 seed: int, rank: int = 0, world_size: int = 1, val: tuple | None = None):
        self.seqs, self.labels, self.tok, self.max_len = seqs, labels, tokenizer, max_len
        self.sampler = EpochBatches(np.minimum(seqs.lengths(), max_len), batch_size, seed, rank, world_size,
                                    bucket=50)
        self.batch_size, self.val = batch_size, val

    def _collate(self, seqs, labels, idx) -> dict:
        t = self.tok
        idx = list(idx)
        return classify_batch([seqs[i] for i in idx], labels[idx], t.pad_id, t.bos_id, t.eos_id, self.max_len)

    def batch(self, k: int) -> dict:
        return self._collate(self.seqs, self.labels, self.sampler.indices(k))

    def loss(self, model, batch: dict, label_smoothing: float = 0.0) -> torch.Tensor:
        logits = model(batch["input_ids"], padding_mask=batch["padding_mask"]).logits  # (B, C)
        return token_loss_sum(logits, batch["labels"], label_smoothing)

    @torch.no_grad()
    def evaluate(self, model, device, final: bool = False) -> dict:
        if self.val is None:
            return {}
        seqs, labels = self.val
        total, correct = 0.0, 0
        for start in range(0, len(seqs), 2 * self.batch_size):
            batch = to_device(self._collate(seqs, labels, range(start, min(len(seqs), start + 2 * self.batch_size))),
                              device)
            logits = model(batch["input_ids"], padding_mask=batch["padding_mask"]).logits
            total += token_loss_sum(logits, batch["labels"], 0.0).item()
            correct += (logits.argmax(-1) == batch["labels"]).sum().item()
        return {"val_loss": total / len(seqs), "val_accuracy": correct / len(seqs)}


def count_targets(batch: dict) -> int:
    """How many positions the loss sums over (tokens for lm/seq2seq, examples for classify)."""
    return int((batch["labels"] != IGNORE_INDEX).sum())


def to_device(batch: dict, device) -> dict:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


# ---- the optimizer ------------------------------------------------------------------------------
def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: decay for weight matrices; none for norms, biases (1-D) and embeddings.

    Decay pulls weights toward 0; a norm's gain pulled toward 0 (or an embedding row that is rarely
    seen, decayed every step) only hurts, so they are left out (as in GPT-2, BERT, nanoGPT)."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay, no_decay, seen = [], [], set()
    for p in model.parameters():  # parameters() yields a tied weight once
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (no_decay if p.dim() < 2 or id(p) in embeddings else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype, or None for plain fp32."""
    if precision == "fp32" or (precision == "auto" and device.type != "cuda"):
        return None
    if precision == "auto":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]


# ---- the loop -----------------------------------------------------------------------------------
@dataclass
class Trainer:
    """Train `model` on `task` under `config`, writing to `run_dir` (rank 0 only):

        metrics.jsonl   one JSON object per logged step and per evaluation
        loss.png        train and validation loss against step
        checkpoints/    see checkpoint.py; `resume=True` continues from the newest good one
    """

    model: nn.Module
    task: object
    config: TrainConfig
    run_dir: Path
    dist: distributed.DistInfo = field(default_factory=lambda: distributed.DistInfo(0, 1, 0, torch.device("cpu")))
    resume: bool = False
    d_model: int | None = None  # for the inverse-sqrt schedule

    def __post_init__(self):
        c = self.config
        self.run_dir = Path(self.run_dir)
        self.device = self.dist.device
        self.model.to(self.device)
        self.optimizer = torch.optim.AdamW(param_groups(self.model, c.weight_decay), lr=c.lr, betas=c.betas,
                                           eps=c.eps, fused=self.device.type == "cuda" or None)
        self.scheduler = make_scheduler(self.optimizer, c.schedule, warmup=c.warmup, max_steps=c.max_steps,
                                        min_ratio=c.min_lr_ratio, d_model=self.d_model)
        self.amp_dtype = autocast_dtype(c.precision, self.device)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.amp_dtype == torch.float16)
        self.step = 0
        self.history: list[dict] = []
        if self.dist.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.resume:
            self._resume()
        self.ddp = None
        if self.dist.enabled:
            self.ddp = nn.parallel.DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)

    # -- resume --
    def _resume(self) -> None:
        path = find_checkpoint(self.run_dir)
        if path is None:
            self._say(f"no checkpoint in {self.run_dir}/checkpoints: starting from step 0")
        else:
            self.step = load_checkpoint(path, self.model, self.optimizer, self.scheduler, self.scaler)["step"]
        # steps after the checkpoint were lost with the kill; they will be run again
        self.history = [r for r in read_metrics(self.run_dir) if r["step"] <= self.step]
        if self.dist.is_main:
            write_text_atomically(self.run_dir / "metrics.jsonl",
                                  "".join(json.dumps(r) + "\n" for r in self.history))
        if path is not None:
            self._say(f"resumed from {path} (step {self.step})")

    # -- one update --
    def _autocast(self):
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def train_step(self) -> tuple[float, int]:
        """One optimizer update; returns (mean loss over the global batch, tokens this rank read)."""
        c, net = self.config, self.ddp or self.model
        # micro-batch k of the whole run: the data is a pure function of k (see data.py)
        ks = range(self.step * c.grad_accum, (self.step + 1) * c.grad_accum)
        batches = [to_device(self.task.batch(k), self.device) for k in ks]
        local_count = sum(count_targets(b) for b in batches)
        global_count = distributed.all_reduce_sum(torch.tensor(float(local_count), device=self.device)).item()
        loss_sum = torch.zeros((), device=self.device)
        for m, batch in enumerate(batches):
            # skip the gradient all-reduce on all but the last micro-batch: gradients just accumulate
            sync = contextlib.nullcontext() if self.ddp is None or m == c.grad_accum - 1 else self.ddp.no_sync()
            with sync:
                with self._autocast():
                    part = self.task.loss(net, batch, c.label_smoothing)
                # DDP averages over ranks, so scale by world_size to get the global sum / global count
                self.scaler.scale(part * self.dist.world_size / global_count).backward()
            loss_sum += part.detach()
        if c.clip > 0:
            self.scaler.unscale_(self.optimizer)
            nn.utils.clip_grad_norm_(self.model.parameters(), c.clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step += 1
        loss = distributed.all_reduce_sum(loss_sum).item() / global_count
        tokens = sum(b[k].numel() for b in batches for k in ("input_ids", "tgt_ids") if k in b)
        return loss, tokens

    # -- evaluation, logging, saving --
    def evaluate(self, final: bool = False) -> dict:
        self.model.eval()
        with self._autocast():
            metrics = self.task.evaluate(self.model, self.device, final=final)
        self.model.train()
        return metrics

    def log(self, record: dict) -> None:
        self.history.append(record)
        if self.dist.is_main:
            with open(self.run_dir / "metrics.jsonl", "a") as handle:
                handle.write(json.dumps(record) + "\n")

    def save(self) -> None:
        if self.dist.is_main:
            save_checkpoint(self.run_dir, self.step, self.model, self.optimizer, self.scheduler, self.scaler,
                            state={"sampler": {"seed": self.config.seed, "next_step": self.step}},
                            keep=self.config.keep)
        distributed.barrier()

    def _say(self, text: str) -> None:
        if self.dist.is_main and not self.config.quiet:
            print(text, flush=True)

    def fit(self) -> list[dict]:
        """Train from `self.step` to `config.max_steps`; returns every logged record."""
        c = self.config
        self.model.train()
        start_time, tokens_since, t_since = time.time(), 0, time.time()
        progress = _Progress(c.max_steps, self.step, enabled=c.progress and not c.quiet and self.dist.is_main)
        with progress:
            while self.step < c.max_steps:
                loss, tokens = self.train_step()
                if not math.isfinite(loss):
                    raise FloatingPointError(f"loss is {loss} at step {self.step}: lower --lr or check the data")
                tokens_since += tokens * self.dist.world_size
                last = self.step == c.max_steps
                if self.step % c.log_every == 0 or last:
                    now = time.time()
                    record = {"step": self.step, "loss": loss, "lr": self.scheduler.get_last_lr()[0],
                              "tokens_per_s": tokens_since / max(now - t_since, 1e-9),
                              "elapsed_s": now - start_time}
                    tokens_since, t_since = 0, now
                    self.log(record)
                    progress.update(self.step, loss, record["tokens_per_s"])
                    if not progress.enabled:
                        self._say(f"step {self.step:>6}/{c.max_steps}  loss {loss:.4f}  "
                                  f"lr {record['lr']:.2e}  {record['tokens_per_s']:,.0f} tok/s")
                paused = False  # evaluation and saving do not count toward tokens/s
                if (c.eval_every and self.step % c.eval_every == 0) or last:
                    if self.dist.is_main:
                        metrics = self.evaluate(final=last)
                        if metrics:
                            self.log({"step": self.step, **metrics, "elapsed_s": time.time() - start_time})
                            text = "  ".join(f"{k} {v:.4f}" for k, v in metrics.items())
                            progress.print(text, self.step)
                            if not progress.enabled:
                                self._say(f"step {self.step:>6}  {text}")
                        plot_metrics(self.run_dir, self.history)
                    distributed.barrier()
                    paused = True
                if (c.save_every and self.step % c.save_every == 0) or last:
                    self.save()
                    paused = True
                if paused:
                    t_since = time.time()
        return self.history


class _Progress:
    """A rich progress bar showing loss, tokens/s and ETA; does nothing when disabled."""

    def __init__(self, total: int, start: int, enabled: bool):
        from rich.console import Console

        # not a terminal (a log file, nohup): plain log lines are more useful than a frozen bar
        self.enabled = enabled and Console().is_terminal
        if not self.enabled:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
            TimeRemainingColumn

        self.bar = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[tps]} tok/s"),
                            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
        self.task = self.bar.add_task("train", total=total, completed=start, loss="-", tps="-")

    def __enter__(self):
        if self.enabled:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        if self.enabled:
            self.bar.__exit__(*exc)

    def update(self, step: int, loss: float, tokens_per_s: float) -> None:
        if self.enabled:
            self.bar.update(self.task, completed=step, loss=f"{loss:.4f}", tps=f"{tokens_per_s:,.0f}")

    def print(self, text: str, step: int) -> None:
        if self.enabled:
            self.bar.console.print(f"step {step}: {text}")


def read_metrics(run_dir: str | os.PathLike) -> list[dict]:
    """The records of `run_dir/metrics.jsonl` (a torn last line, from a kill, is dropped)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            break
    return records


def plot_metrics(run_dir: str | os.PathLike, history: list[dict]) -> Path | None:
    """Write `run_dir/loss.png`: train loss and validation loss (and accuracy/BLEU if any) per step.
    Returns None (and writes nothing) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    train = [(r["step"], r["loss"]) for r in history if "loss" in r]
    val = [(r["step"], r["val_loss"]) for r in history if "val_loss" in r]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    if train:
        ax.plot(*zip(*train), label="train loss", lw=1)
    if val:
        ax.plot(*zip(*val), "o-", label="val loss", lw=1.5, ms=3)
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats per prediction)")
    ax.grid(alpha=0.3)
    ax.legend()
    out = Path(run_dir) / "loss.png"
    tmp = out.with_name(".loss.tmp.png")
    fig.tight_layout()
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, out)
    return out
