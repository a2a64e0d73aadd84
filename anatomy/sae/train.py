"""Training an SAE or a transcoder on the activations of any model anatomy opens.

Shape letters: B rows per batch, E input width, O output width, F features.

One step (objectives.py has the losses):

    1. the batch of step s: a pure function of (seed, s) (store.py), x [B, E] and its target y [B, O]
       (y = x for an SAE), both scaled so that E ||x||^2 = E (the width): one learning rate fits every
       model and layer (Anthropic's "April update" normalisation; folded into the weights at the end);
       rows more than OUTLIER times the typical norm (attention sinks, see evaluate.py) left out
    2. loss and backward; the gradient's component along each decoder row removed, since the row is
       renormalised after the step (Bricken et al. 2023; Gao et al. 2024, section 2.3); clipping
    3. Adam (the training floor's fused AdamW with no weight decay), the learning-rate schedule (linear
       warmup, cosine decay), decoder rows back to unit norm
    4. dead-feature bookkeeping: tokens since each feature last fired, summed over ranks; a feature
       silent for `dead_tokens` is dead and AuxK trains it on the live features' error

The run folder is the training floor's: its lock (one writer), atomic checkpoints that `resume`
continues exactly (weights, Adam's moments, the schedule, the dead-feature counts, every RNG),
metrics.jsonl and a progress bar; at the end `sae/` holds the SAE in SAELens's format and eval.json
the held-out evaluation (evaluate.py). It runs under torchrun: each rank harvests its own share of
the contexts and DistributedDataParallel averages the gradients.
"""

from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..cli import printable
from ..training import distributed
from ..training.checkpoint import load_newest, save_checkpoint, write_text_atomically
from ..training.metrics import ProgressBar, append_metrics, read_metrics, rewrite_metrics
from ..training.schedules import make_scheduler
from ..training.trainer import TrainConfig, make_optimizer
from .evaluate import OUTLIER
from .modules import KINDS, SAE, WITH_THRESHOLD
from .objectives import dense_step, topk_step

NORM_ROWS = 16384  # rows of the first fill that estimate E ||x||^2 and the initial b_dec


@dataclass
class SAETrainConfig:
    """How to train (the SAE's own shape: kind, features, k; the rest is the optimisation)."""

    kind: str = "topk"
    features: int = 4608
    k: float | None = 32
    l1: float = 5e-3  # relu: lambda of the L1 penalty (on activations of normalised inputs)
    l0: float = 1e-3  # jumprelu: lambda of the L0 penalty
    bandwidth: float = 1e-3  # jumprelu: the straight-through estimator's kernel width
    threshold_lr: float = 0.01  # batchtopk: the moving average of the smallest kept activation
    max_steps: int = 2000
    batch_size: int = 4096  # rows per rank
    lr: float = 4e-4
    warmup: int = 100
    min_lr_ratio: float = 0.0  # the cosine decays to lr x this
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 6.25e-10  # Gao et al. 2024: Adam's epsilon small enough not to damp rare features
    clip: float = 1.0
    aux_k: int | None = None  # dead features per row in AuxK (default: half the input width)
    aux_coefficient: float = 1 / 32
    dead_tokens: int = 500_000  # tokens without firing after which a feature counts as dead
    seed: int = 0
    log_every: int = 10
    eval_every: int = 250
    save_every: int = 500
    keep: int = 2
    progress: bool = True
    quiet: bool = False

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind={self.kind!r} is not supported; allowed values: {', '.join(KINDS)}")


class Training(nn.Module):
    """The SAE and what training keeps beside it, all saved in a checkpoint: the input and output
    scales, and the tokens since each feature fired. forward = the step's loss (what DDP wraps)."""

    def __init__(self, sae: SAE, config: SAETrainConfig):
        super().__init__()
        self.sae, self.config = sae, config
        self.register_buffer("scale_in", torch.ones((), dtype=torch.float64))
        self.register_buffer("scale_out", torch.ones((), dtype=torch.float64))
        self.register_buffer("tokens_since_fired", torch.zeros(sae.d_sae, dtype=torch.int64))

    def split(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, E (+ O)] harvested rows -> (x [B, E], y [B, O]), scaled."""
        x = rows[:, :self.sae.d_in] * self.scale_in.float()
        y = rows[:, self.sae.d_in:] * self.scale_out.float() if self.sae.is_transcoder else x
        return x, y

    def dead(self) -> torch.Tensor:
        """[F] bool: the features silent for more than dead_tokens tokens."""
        return self.tokens_since_fired > self.config.dead_tokens

    def forward(self, x: torch.Tensor, y: torch.Tensor, dead: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """(loss, stats) of the batch x [B, E] -> y [B, O], by kind (objectives.py)."""
        c = self.config
        aux_k = c.aux_k or max(1, self.sae.d_in // 2)
        if self.sae.kind == "topk":
            return topk_step(self.sae, x, y, dead, aux_k, c.aux_coefficient)
        return dense_step(self.sae, x, y, dead, l1=c.l1, l0=c.l0, bandwidth=c.bandwidth, aux_k=aux_k,
                          aux_coefficient=c.aux_coefficient)


@dataclass
class SAETrainer:
    """Train `sae` on `store` (the held-out `eval_rows` [R, E (+O)] for the periodic FVE and L0),
    writing to `run_dir` (rank 0 only). The caller holds the run folder's lock (training.rundir)."""

    sae: SAE
    store: object
    config: SAETrainConfig
    run_dir: Path
    eval_rows: torch.Tensor | None = None
    dist: distributed.DistInfo = field(default_factory=lambda: distributed.DistInfo(0, 1, 0, torch.device("cpu")))
    resume: bool = False

    def __post_init__(self):
        c = self.config
        self.run_dir, self.device = Path(self.run_dir), self.dist.device
        self.training = Training(self.sae, c).to(self.device)
        self.optimizer = make_optimizer(self.training, TrainConfig(lr=c.lr, betas=c.betas, eps=c.eps, weight_decay=0.0),
                                        self.device)
        self.scheduler = make_scheduler(self.optimizer, "cosine", warmup=c.warmup, max_steps=c.max_steps,
                                        min_ratio=c.min_lr_ratio)
        self.step, self.history = 0, []
        if self.dist.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        found = load_newest(self.run_dir, self.training, self.optimizer, self.scheduler) if self.resume else None
        if found is not None:
            self.step = found[1]["step"]
            self._say(f"resumed from {printable(str(found[0]))} (step {self.step})")
        else:
            self._initialise()
        self.history = [r for r in read_metrics(self.run_dir) if r.get("step", math.inf) <= self.step]
        if self.dist.is_main:
            rewrite_metrics(self.run_dir, self.history)
        self.net = self.training
        if self.dist.enabled:
            self.net = nn.parallel.DistributedDataParallel(self.training, broadcast_buffers=False,
                                                           device_ids=[self.device.index] if self.device.type == "cuda" else None)

    @torch.no_grad()
    def _initialise(self) -> None:
        """Scales from the first rows: E ||x||^2 = E after scaling; b_dec at their (scaled) mean, the
        point every reconstruction starts from (Gao et al. start it at the geometric median)."""
        rows = self.store.batch(0)[:NORM_ROWS].to(self.device).double()
        sae, t = self.sae, self.training
        x, y = rows[:, :sae.d_in], rows[:, sae.d_in:] if sae.is_transcoder else rows[:, :sae.d_in]
        norms = y.norm(dim=-1)
        x, y = x[norms <= OUTLIER * norms.median()], y[norms <= OUTLIER * norms.median()]
        # sums over every rank's rows: all ranks start from the same scales and b_dec
        sums = distributed.all_reduce_sum(torch.cat([torch.tensor([len(x), x.pow(2).sum(), y.pow(2).sum()],
                                                                  dtype=torch.float64, device=self.device), y.sum(0)]))
        count, x2, y2, y_sum = sums[0].item(), sums[1].item(), sums[2].item(), sums[3:]
        t.scale_in.copy_(math.sqrt(sae.d_in * count / x2))
        t.scale_out.copy_(math.sqrt(y.size(-1) * count / y2))
        sae.b_dec.copy_((y_sum / count * t.scale_out).to(sae.b_dec.dtype))
        if sae.kind == "jumprelu":
            sae.threshold.fill_(0.001)  # Rajamanoharan et al. 2024 start theta at 0.001

    # ---- one step ---------------------------------------------------------------------------------
    def train_step(self) -> dict:
        """One optimizer step (the module docstring's 1-4); returns its record (loss, mse, fve, l0, dead)."""
        c, sae, t = self.config, self.sae, self.training
        x, y = t.split(self.store.batch(self.step).to(self.device))
        typical = y.flatten(1).pow(2).sum(-1) <= OUTLIER**2 * y[0].numel()  # scaled: E ||y||^2 = width
        x, y = x[typical], y[typical]  # an attention sink's vector is no text's (evaluate.OUTLIER)
        loss, stats = self.net(x, y, t.dead())
        loss.backward()
        with torch.no_grad():
            if sae.W_dec.grad is not None:  # keep the step tangent to the unit sphere of each row
                sae.W_dec.grad -= (sae.W_dec.grad * sae.W_dec).sum(-1, keepdim=True) * sae.W_dec
        if c.clip > 0:
            nn.utils.clip_grad_norm_(t.parameters(), c.clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step += 1
        with torch.no_grad():
            sae.W_dec /= sae.W_dec.norm(dim=-1, keepdim=True).clamp_min(1e-12)
            if sae.kind == "jumprelu":
                sae.threshold.clamp_(min=0.0)
            if sae.kind == "batchtopk" and (stats["acts"] > 0).any():
                smallest = distributed.all_reduce_sum(stats["acts"][stats["acts"] > 0].min()) / self.dist.world_size
                sae.threshold.mul_(1 - c.threshold_lr).add_(c.threshold_lr * smallest)
            fired = distributed.all_reduce_sum(stats["fired"].float()) > 0
            t.tokens_since_fired += x.size(0) * self.dist.world_size
            t.tokens_since_fired[fired] = 0
            variance = (y - y.mean(0)).pow(2).sum(-1).mean()
            record = {"loss": loss.item(), "mse": stats["mse"].item(), "fve": 1.0 - (stats["mse"] / variance).item(),
                      "l0": float(stats["l0"]), "dead": t.dead().float().mean().item()}
            if stats["aux"] is not None:
                record["aux"] = stats["aux"].item()
        return record

    @torch.no_grad()
    def held_out(self) -> dict:
        """FVE and L0 on the held-out rows (the scaled SAE on scaled rows: the same ratios)."""
        if self.eval_rows is None:
            return {}
        self.sae.eval()
        x, y = self.training.split(self.eval_rows.to(self.device))
        typical = y.pow(2).sum(-1) <= OUTLIER**2 * y.size(-1)
        x, y = x[typical], y[typical]
        f = self.sae.encode(x)
        error = (y - self.sae.decode(f, x)).pow(2).sum()
        self.sae.train()
        return {"val_fve": 1.0 - (error / (y - y.mean(0)).pow(2).sum()).item(),
                "val_l0": (f > 0).sum(-1).float().mean().item()}

    # ---- the loop ---------------------------------------------------------------------------------
    def fit(self) -> list[dict]:
        """Train from `self.step` to max_steps; returns every logged record."""
        c = self.config
        self.sae.train()
        start, tokens_since, t_since = time.time(), 0, time.time()
        progress = ProgressBar(c.max_steps, self.step, enabled=c.progress and not c.quiet and self.dist.is_main)
        with progress:
            while self.step < c.max_steps:
                record = self.train_step()
                if not math.isfinite(record["loss"]):
                    raise ValueError(f"the loss is {record['loss']} at step {self.step}: lower --lr")
                tokens_since += self.config.batch_size * self.dist.world_size
                last = self.step == c.max_steps
                if self.step % c.log_every == 0 or last:
                    now = time.time()
                    record.update(step=self.step, lr=self.scheduler.get_last_lr()[0],
                                  tokens_per_s=tokens_since / max(now - t_since, 1e-9), elapsed_s=now - start)
                    tokens_since, t_since = 0, now
                    self._log(record)
                    progress.update(self.step, record["loss"], record["tokens_per_s"])
                    if not progress.enabled:
                        self._say(f"step {self.step:>6}/{c.max_steps}  fve {record['fve']:.3f}  l0 {record['l0']:.1f}  "
                                  f"dead {record['dead']:.1%}  {record['tokens_per_s']:,.0f} tok/s")
                if (c.eval_every and self.step % c.eval_every == 0) or last:
                    held = self.held_out()
                    if held and self.dist.is_main:
                        self._log({"step": self.step, **held})
                        line = f"held-out fve {held['val_fve']:.4f}  l0 {held['val_l0']:.1f}"
                        progress.print(line, self.step)
                        if not progress.enabled:
                            self._say(f"step {self.step:>6}  {line}")
                    t_since = time.time()
                if (c.save_every and self.step % c.save_every == 0) or last:
                    if self.dist.is_main:
                        save_checkpoint(self.run_dir, self.step, self.training, self.optimizer, self.scheduler,
                                        state={"sampler": {"seed": c.seed, "next_step": self.step}}, keep=c.keep)
                    distributed.barrier()
                    t_since = time.time()
        return self.history

    def trained_sae(self) -> SAE:
        """A copy of the SAE with the scales folded in: it reads and writes the model's own activations."""
        return fold_scales(copy.deepcopy(self.sae).eval(), self.training.scale_in.item(), self.training.scale_out.item())

    def _log(self, record: dict) -> None:
        self.history.append(record)
        if self.dist.is_main:
            append_metrics(self.run_dir, record)

    def _say(self, text: str) -> None:
        if self.dist.is_main and not self.config.quiet:
            print(text, flush=True)


@torch.no_grad()
def fold_scales(sae: SAE, scale_in: float, scale_out: float) -> SAE:
    """The SAE trained on (c_in x -> c_out y), rewritten to read x and write y, its decoder rows still unit:

        f / c_out = sigma((c_in / c_out) (x - b_dec / c_in) W_enc + b_enc / c_out)    (sigma positively homogeneous)
        y = (f / c_out) W_dec + b_dec / c_out  (+ (c_in / c_out) x W_skip^T, a skip transcoder)

    so W_enc *= c_in / c_out, b_enc /= c_out, b_dec /= c_out (= c_in for an SAE), thresholds /= c_out, W_skip
    *= c_in / c_out, and the activations are those of the unscaled model. Returns `sae`, changed in place."""
    sae.W_enc.mul_(scale_in / scale_out)
    if sae.W_skip is not None:
        sae.W_skip.mul_(scale_in / scale_out)
    sae.b_enc.div_(scale_out)
    sae.b_dec.div_(scale_out)
    if sae.kind in WITH_THRESHOLD:
        sae.threshold.div_(scale_out)
    return sae


def write_summary(run_dir: Path, config: SAETrainConfig, extra: dict) -> None:
    """run_dir/sae_train_config.json: the training configuration and what the command line added."""
    write_text_atomically(Path(run_dir) / "sae_train_config.json", json.dumps({**asdict(config), **extra}, indent=1))
