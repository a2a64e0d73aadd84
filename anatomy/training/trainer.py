"""The training loop: one loop, three tasks (lm, seq2seq, classify; see tasks.py).

One optimizer update ("step") is:

    1. draw the step's micro-batches: a pure function of (seed, step), see data.py
    2. for each micro-batch: loss = sum of per-token losses / tokens in the whole global batch,
       backward (DDP averages gradients over ranks; gradients accumulate over micro-batches)
    3. clip the global gradient norm, optimizer update (optimizers.py), next learning rate (schedules.py)

At the end, `average_last` > 1 replaces the weights by the mean of the last checkpoints'
(averaging.py), or `ema` > 0 by their exponential moving average over every step (ema.py), and
evaluates that model too.

Dividing by the token count of the *global* batch (all micro-batches, all ranks) makes the
gradient the same whether a batch of 64 runs as 1 x 64, 4 x 16 accumulated, or 2 ranks x 32.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..terminal import printable
from . import distributed
from .averaging import average_checkpoints, last_checkpoints
from .checkpoint import load_newest, save_checkpoint
from .ema import WeightAverage
from .metrics import ProgressBar, append_metrics, plot_metrics, read_metrics, rewrite_metrics
from .optimizers import make_optimizer, param_groups
from .schedules import make_scheduler
from .tasks import ClassifyTask, LMTask, Seq2SeqTask, count_targets, to_device

__all__ = ["ClassifyTask", "LMTask", "Seq2SeqTask", "TrainConfig", "Trainer", "make_optimizer", "param_groups",
           "read_metrics"]


@dataclass
class TrainConfig:
    """Everything about *how* to train (the model's shape lives in ModelConfig)."""

    max_steps: int = 1000
    batch_size: int = 32  # per rank, per micro-batch
    grad_accum: int = 1  # micro-batches per optimizer step
    lr: float = 1e-3  # peak learning rate (inverse-sqrt: a multiplier of the paper's formula)
    min_lr_ratio: float = 0.1  # cosine, linear and wsd end at lr * min_lr_ratio
    schedule: str = "cosine"  # one of schedules.SCHEDULES
    warmup: int = 100
    decay_fraction: float = 0.2  # wsd: the last share of max_steps, decaying
    optimizer: str = "adamw"  # one of optimizers.OPTIMIZERS
    layer_decay: float = 1.0  # layer-wise LR decay (optimizers.py); 1 = every layer at lr
    head_lr_scale: float = 1.0  # the head (above the blocks) learns at lr x this (optimizers.py)
    ns_coefficients: str = "jordan"  # muon: the Newton-Schulz schedule (muon.NS_COEFFICIENTS)
    ns_steps: int = 5  # muon: Newton-Schulz iterations per step
    ns_norm: str = "frobenius"  # muon: the bound on the largest singular value (muon.NS_NORMS)
    weight_decay: float = 0.1  # on matrices only; never on norms, biases, embeddings
    betas: tuple[float, float] = (0.9, 0.99)
    eps: float = 1e-8
    label_smoothing: float = 0.0
    clip: float = 1.0  # max global gradient norm; 0 = no clipping
    eval_every: int = 250  # steps; 0 = only at the end
    log_every: int = 10
    save_every: int = 0  # steps; 0 = only at the end
    keep: int = 2  # checkpoints kept on disk
    average_last: int = 1  # the final model: the mean of the last N checkpoints' weights (1: the last's)
    ema: float = 0.0  # the final model: the weights' moving average with this decay (ema.py); 0 = none
    seed: int = 1337
    precision: str = "auto"  # "auto" (bf16/fp16 autocast on GPU, fp32 on CPU) | "fp32" | "bf16" | "fp16"
    progress: bool = True  # rich progress bar (rank 0, on a terminal)
    quiet: bool = False  # no printing at all (tests)


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype, or None for plain fp32."""
    if precision == "fp32" or (precision == "auto" and device.type != "cuda"):
        return None
    if precision == "auto":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]


class Objective(nn.Module):
    """The task's summed loss as a module's forward: what DistributedDataParallel wraps, since DDP
    prepares its gradient all-reduce in forward (a bare model.loss call would bypass it)."""

    def __init__(self, model: nn.Module, task):
        super().__init__()
        self.model, self.task = model, task

    def forward(self, batch: dict, label_smoothing: float) -> torch.Tensor:
        return self.task.loss(self.model, batch, label_smoothing)


# ---- the loop -----------------------------------------------------------------------------------
@dataclass
class Trainer:
    """Train `model` on `task` under `config`, writing to `run_dir` (rank 0 only):

        metrics.jsonl   one JSON object per logged step and per evaluation (see metrics.py)
        loss.png        train and validation loss against step
        checkpoints/    see checkpoint.py; `resume=True` continues from the newest good one

    The caller holds the run folder's lock (rundir.RunLock) while a Trainer writes there.
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
        self.optimizer = make_optimizer(self.model, c, self.device)
        self.scheduler = make_scheduler(self.optimizer, c.schedule, warmup=c.warmup, max_steps=c.max_steps,
                                        min_ratio=c.min_lr_ratio, d_model=self.d_model,
                                        decay_fraction=c.decay_fraction)
        self.amp_dtype = autocast_dtype(c.precision, self.device)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.amp_dtype == torch.float16)
        self.step = 0
        self.history: list[dict] = []
        if self.dist.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.resume:
            self._resume()
        if c.ema and self.step:
            raise ValueError("the weights' moving average (--ema) is kept in memory only: a resumed run "
                             "cannot continue it; start the run again without --resume")
        self.ema = WeightAverage(self.model, c.ema) if c.ema else None
        self.objective = Objective(self.model, self.task)
        self.ddp = None
        if self.dist.enabled:
            self.ddp = nn.parallel.DistributedDataParallel(
                self.objective, device_ids=[self.device.index] if self.device.type == "cuda" else None)

    # -- resume --
    def _resume(self) -> None:
        found = load_newest(self.run_dir, self.model, self.optimizer, self.scheduler, self.scaler)
        if found is None:
            self._say(f"no checkpoint in {self.run_dir}/checkpoints: starting from step 0")
        else:
            self.step = found[1]["step"]
        # steps after the checkpoint were lost with the kill; they will be run again
        self.history = [r for r in read_metrics(self.run_dir) if r.get("step", math.inf) <= self.step]
        if self.dist.is_main:
            rewrite_metrics(self.run_dir, self.history)
        if found is not None:
            self._say(f"resumed from {found[0]} (step {self.step})")

    # -- one update --
    def _autocast(self):
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def train_step(self) -> tuple[float, int]:
        """One optimizer update; returns (mean loss over the global batch, tokens this rank read)."""
        c, net = self.config, self.ddp or self.objective
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
                    part = net(batch, c.label_smoothing)
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
        if self.ema is not None:
            self.ema.update()
        self.step += 1
        loss = distributed.all_reduce_sum(loss_sum).item() / global_count
        tokens = sum(b[k].numel() for b in batches for k in ("input_ids", "src_ids", "tgt_ids") if k in b)
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
            append_metrics(self.run_dir, record)

    def save(self) -> None:
        if self.dist.is_main:
            save_checkpoint(self.run_dir, self.step, self.model, self.optimizer, self.scheduler, self.scaler,
                            state={"sampler": {"seed": self.config.seed, "next_step": self.step}},
                            keep=self.config.keep)
        distributed.barrier()

    def _say(self, text: str) -> None:
        if self.dist.is_main and not self.config.quiet:
            print(printable(text), flush=True)  # it names the run folder, which may hold any character

    def fit(self) -> list[dict]:
        """Train from `self.step` to `config.max_steps`; returns every logged record."""
        c = self.config
        self.model.train()
        start_time, tokens_since, t_since = time.time(), 0, time.time()
        start_cpu = time.process_time()  # CPU time: the work done, whatever the neighbours on the machine
        progress = ProgressBar(c.max_steps, self.step, enabled=c.progress and not c.quiet and self.dist.is_main)
        with progress:
            while self.step < c.max_steps:
                loss, tokens = self.train_step()
                if not math.isfinite(loss):  # a ValueError: the command line reports it in one line
                    raise ValueError(f"the loss is {loss} at step {self.step}: lower --lr or check the data")
                tokens_since += tokens * self.dist.world_size
                last = self.step == c.max_steps
                if self.step % c.log_every == 0 or last:
                    now = time.time()
                    # the peak rate: the head's with layer-wise decay, the highest group's in general
                    record = {"step": self.step, "loss": loss, "lr": max(self.scheduler.get_last_lr()),
                              "tokens_per_s": tokens_since / max(now - t_since, 1e-9),
                              "elapsed_s": now - start_time, "cpu_s": time.process_time() - start_cpu}
                    tokens_since, t_since = 0, now
                    self.log(record)
                    progress.update(self.step, loss, record["tokens_per_s"])
                    if not progress.enabled:
                        self._say(f"step {self.step:>6}/{c.max_steps}  loss {loss:.4f}  "
                                  f"lr {record['lr']:.2e}  {record['tokens_per_s']:,.0f} tok/s")
                paused = False  # evaluation and saving do not count toward tokens/s
                if (c.eval_every and self.step % c.eval_every == 0) or last:
                    if self.dist.is_main:
                        self._evaluate_and_log(progress, last, start_time, start_cpu)
                    distributed.barrier()
                    paused = True
                if (c.save_every and self.step % c.save_every == 0) or last:
                    self.save()
                    paused = True
                if paused:
                    t_since = time.time()
        if c.average_last > 1 and self.step >= c.max_steps:
            paths = last_checkpoints(self.run_dir, c.average_last)
            average_checkpoints(self.model, paths)
            self._say(f"averaged the weights of {', '.join(p.name for p in paths)}")
            self._evaluate_averaged("averaged", {"averaged_checkpoints": len(paths)}, start_time, start_cpu)
        if self.ema is not None and self.step >= c.max_steps:
            self.ema.copy_to_model()
            self._evaluate_averaged("moving average", {"ema": c.ema}, start_time, start_cpu)
        return self.history

    def _evaluate_averaged(self, name: str, what: dict, start_time: float, start_cpu: float) -> None:
        """After every rank put averaged weights in the model (the mean of the last checkpoints',
        or the moving average), rank 0 evaluates that model as finally as the last step's and logs
        it with `what` ({"averaged_checkpoints": N} or {"ema": decay}), after the last step's record."""
        if self.dist.is_main:
            metrics = self.evaluate(final=True)
            self.log({"step": self.step, **what, **metrics,
                      "elapsed_s": time.time() - start_time, "cpu_s": time.process_time() - start_cpu})
            self._say(f"{name}: " + "  ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
        distributed.barrier()

    def _evaluate_and_log(self, progress: ProgressBar, final: bool, start_time: float, start_cpu: float) -> None:
        metrics = self.evaluate(final=final)
        if metrics:
            self.log({"step": self.step, **metrics, "elapsed_s": time.time() - start_time,
                      "cpu_s": time.process_time() - start_cpu})
            text = "  ".join(f"{k} {v:.4f}" for k, v in metrics.items())
            progress.print(text, self.step)
            if not progress.enabled:
                self._say(f"step {self.step:>6}  {text}")
        plot_metrics(self.run_dir, self.history)
