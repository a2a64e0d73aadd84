"""Training an SAE or a transcoder, or one on every layer at once, on the activations of any model anatomy opens.

Shape letters: B rows per batch, E input width, O output width, F features, W the width of a harvested row.

Several SAEs train in one process on one harvest: each reads its own columns of the same rows (a
transcoder set: layer l's MLP input and output, side by side with every other layer's, store.py).
Each is a `Training` (its scales, its dead-feature counts); the step below runs for each in turn,
its backward before the next one's forward (the memory of one at a time), and Adam steps them all.

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
the contexts, and the gradients are averaged over ranks (one all-reduce per SAE, after its backward;
what DistributedDataParallel does, with one backward per SAE in a step).
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..terminal import printable
from ..training import distributed
from ..training.checkpoint import load_newest, save_checkpoint, write_text_atomically
from ..training.metrics import ProgressBar, append_metrics, read_metrics, rewrite_metrics
from ..training.schedules import make_scheduler
from ..training.trainer import TrainConfig, make_optimizer
from .evaluate import OUTLIER
from .modules import KINDS, SAE, WITH_THRESHOLD
from .objectives import batchtopk_step, dense_step, largest, topk_step

NORM_ROWS = 16384  # rows of the first fill that estimate E ||x||^2, the initial b_dec and W_skip
SKIP_ENCODER_SCALE = 0.1  # a skip transcoder's encoder starts at this fraction of its norm (Training.initialise)


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
    """One SAE and what training keeps beside it, all saved in a checkpoint: the input and output scales,
    and the tokens since each feature fired. It reads the columns offset .. offset + d_in (x) and, for a
    transcoder, the d_out after them (y) of each harvested row. forward = the step's loss."""

    def __init__(self, sae: SAE, config: SAETrainConfig, offset: int = 0):
        super().__init__()
        self.sae, self.config, self.offset = sae, config, offset
        self.register_buffer("scale_in", torch.ones((), dtype=torch.float64))
        self.register_buffer("scale_out", torch.ones((), dtype=torch.float64))
        self.register_buffer("tokens_since_fired", torch.zeros(sae.d_sae, dtype=torch.int64))

    def raw(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, W] harvested rows -> (x [B, E], y [B, O]) as the model computed them, in float32."""
        start, sae = self.offset, self.sae
        x = rows[:, start:start + sae.d_in].float()
        y = rows[:, start + sae.d_in:start + sae.d_in + sae.d_out].float() if sae.is_transcoder else x
        return x, y

    def split(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, W] harvested rows -> (x [B, E], y [B, O]), scaled, the attention sinks' rows left out."""
        x, y = self.raw(rows)
        x, y = x * self.scale_in.float(), y * self.scale_out.float()
        typical = y.flatten(1).pow(2).sum(-1) <= OUTLIER**2 * y[0].numel()  # scaled: E ||y||^2 = width
        return x[typical], y[typical]  # an attention sink's vector is no text's (evaluate.OUTLIER)

    def dead(self) -> torch.Tensor:
        """[F] bool: the features silent for more than dead_tokens tokens."""
        return self.tokens_since_fired > self.config.dead_tokens

    def forward(self, x: torch.Tensor, y: torch.Tensor, dead: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """(loss, stats) of the batch x [B, E] -> y [B, O], by kind (objectives.py)."""
        c = self.config
        aux_k = c.aux_k or max(1, self.sae.d_in // 2)
        if self.sae.kind in ("topk", "batchtopk"):
            step = topk_step if self.sae.kind == "topk" else batchtopk_step
            return step(self.sae, x, y, dead, aux_k, c.aux_coefficient)
        return dense_step(self.sae, x, y, dead, l1=c.l1, l0=c.l0, bandwidth=c.bandwidth)

    @torch.no_grad()
    def initialise(self, rows: torch.Tensor) -> None:
        """From the first rows, summed over every rank's (all ranks start alike): the scales, E ||x||^2 = E;
        b_dec at the scaled targets' mean, the point every reconstruction starts from (Gao et al. start it at
        the geometric median); a skip transcoder's W_skip at the least-squares linear map M [E, O] from x to y
        (y ~ x M), so that the features start on what no linear map explains (given at least 8 E rows, else 0:
        fewer would fit the rows, not the map), and its encoder at SKIP_ENCODER_SCALE of its norm: beside a
        path that already explains what is linear, features that start at full strength add their random
        decoder rows as noise, and the first steps shrink them until they barely learn (measured on SmolLM2's
        MLPs: after 150 steps they added nothing to the linear map's FVE; started small, 0.05 to 0.1)."""
        sae = self.sae
        x, y = (v.double() for v in self.raw(rows))
        norms = y.norm(dim=-1)
        x, y = x[norms <= OUTLIER * norms.median()], y[norms <= OUTLIER * norms.median()]
        sums = distributed.all_reduce_sum(torch.cat([x.new_tensor([len(x), x.pow(2).sum(), y.pow(2).sum()]),
                                                     x.sum(0), y.sum(0)]))
        count, x2, y2 = sums[0].item(), sums[1].item(), sums[2].item()
        x_mean, y_mean = sums[3:3 + x.size(1)] / count, sums[3 + x.size(1):] / count
        self.scale_in.copy_(math.sqrt(sae.d_in * count / x2))
        self.scale_out.copy_(math.sqrt(y.size(-1) * count / y2))
        bias = y_mean
        if sae.W_skip is not None and count >= 8 * x.size(1):  # centred normal equations (X^T X + eps I) M = X^T Y
            xc, yc = x - x_mean, y - y_mean
            gram = distributed.all_reduce_sum(torch.cat([xc.T @ xc, xc.T @ yc], dim=1))  # (E, E + O)
            xx, xy = gram[:, :x.size(1)], gram[:, x.size(1):]
            ridge = 1e-6 * xx.diagonal().mean() * torch.eye(len(xx), dtype=xx.dtype, device=xx.device)
            linear = torch.linalg.solve(xx + ridge, xy)  # (E, O)
            sae.W_skip.copy_((linear.T * self.scale_out / self.scale_in).to(sae.W_skip.dtype))  # scaled: c_out y ~ (c_in x) M'
            bias = y_mean - x_mean @ linear
            sae.W_enc.mul_(SKIP_ENCODER_SCALE)
        sae.b_dec.copy_((bias * self.scale_out).to(sae.b_dec.dtype))
        if sae.kind == "jumprelu":
            sae.threshold.fill_(0.001)  # Rajamanoharan et al. 2024 start theta at 0.001

    @torch.no_grad()
    def after_step(self, stats: dict, rows: int, world_size: int) -> None:
        """Decoder rows back to unit norm, thresholds kept, dead-feature counts (over every rank's rows)."""
        sae, c = self.sae, self.config
        sae.W_dec /= sae.W_dec.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        if sae.kind == "jumprelu":
            sae.threshold.clamp_(min=0.0)
        if sae.kind == "batchtopk" and (stats["acts"] > 0).any():
            smallest = distributed.all_reduce_sum(stats["acts"][stats["acts"] > 0].min()) / world_size
            if sae.threshold.any():
                sae.threshold.mul_(1 - c.threshold_lr).add_(c.threshold_lr * smallest)
            else:  # the first step's value, not a pull from 0 that would take hundreds of steps
                sae.threshold.fill_(smallest.item())
        fired = distributed.all_reduce_sum(stats["fired"].float()) > 0
        self.tokens_since_fired += rows * world_size
        self.tokens_since_fired[fired] = 0

    @torch.no_grad()
    def smallest_kept(self, rows: torch.Tensor) -> torch.Tensor:
        """A BatchTopK SAE on the rows [B, W]: the smallest positive activation its batch top-k keeps (0-dim)."""
        x, _ = self.split(rows)
        kept = largest(self.sae.pre_activations(x).relu().flatten(), max(1, math.floor(self.sae.k * x.size(0))))[1]
        return kept[kept > 0].min() if (kept > 0).any() else kept.new_zeros(())

    @torch.no_grad()
    def held_out(self, rows: torch.Tensor) -> tuple[float, float]:
        """(FVE, L0) on held-out rows (the scaled SAE on scaled rows: the same ratios)."""
        self.sae.eval()
        x, y = self.split(rows)
        f = self.sae.encode(x)
        error = (y - self.sae.decode(f, x)).pow(2).sum()
        self.sae.train()
        return 1.0 - (error / (y - y.mean(0)).pow(2).sum()).item(), (f > 0).sum(-1).float().mean().item()


@dataclass
class SAETrainer:
    """Train `sae` (one SAE, or a list of them, each reading its own columns of the rows: `offsets`) on
    `store`, the held-out `eval_rows` [R, W] for the periodic FVE and L0, writing to `run_dir` (rank 0
    only). The caller holds the run folder's lock (training.rundir)."""

    sae: SAE | Sequence[SAE]
    store: object
    config: SAETrainConfig
    run_dir: Path
    eval_rows: torch.Tensor | None = None
    dist: distributed.DistInfo = field(default_factory=lambda: distributed.DistInfo(0, 1, 0, torch.device("cpu")))
    resume: bool = False
    offsets: Sequence[int] | None = None

    def __post_init__(self):
        c = self.config
        self.run_dir, self.device = Path(self.run_dir), self.dist.device
        saes = [self.sae] if isinstance(self.sae, SAE) else list(self.sae)
        offsets = self.offsets if self.offsets is not None else [0] * len(saes)
        self.members = nn.ModuleList([Training(sae, c, offset) for sae, offset in zip(saes, offsets)]).to(self.device)
        self.optimizer = make_optimizer(self.members, TrainConfig(lr=c.lr, betas=c.betas, eps=c.eps, weight_decay=0.0),
                                        self.device)
        self.scheduler = make_scheduler(self.optimizer, "cosine", warmup=c.warmup, max_steps=c.max_steps,
                                        min_ratio=c.min_lr_ratio)
        self.step, self.history = 0, []
        if self.dist.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        found = load_newest(self.run_dir, self.members, self.optimizer, self.scheduler) if self.resume else None
        if found is not None:
            self.step = found[1]["step"]
            self._say(f"resumed from {printable(str(found[0]))} (step {self.step})")
        else:
            first = (self.store.first_rows(NORM_ROWS) if hasattr(self.store, "first_rows")
                     else self.store.batch(0)[:NORM_ROWS]).to(self.device)
            for member in self.members:
                member.initialise(first)
        self.history = [r for r in read_metrics(self.run_dir) if r.get("step", math.inf) <= self.step]
        if self.dist.is_main:
            rewrite_metrics(self.run_dir, self.history)

    # ---- one step ---------------------------------------------------------------------------------
    def train_step(self) -> dict:
        """One optimizer step (the module docstring's 1-4) of every SAE; returns its record (loss, mse, fve,
        l0, dead: the SAEs' means; with several, each one's fve, l0 and dead under "layers")."""
        c = self.config
        rows = self.store.batch(self.step).to(self.device)
        done = []
        for member in self.members:
            x, y = member.split(rows)
            loss, stats = member(x, y, member.dead())
            loss.backward()
            self._average_gradients(member)
            with torch.no_grad():
                W_dec = member.sae.W_dec
                if W_dec.grad is not None:  # keep the step tangent to the unit sphere of each row
                    W_dec.grad -= (W_dec.grad * W_dec).sum(-1, keepdim=True) * W_dec
            if c.clip > 0:
                nn.utils.clip_grad_norm_(member.parameters(), c.clip)
            done.append((member, loss.detach(), stats, x.size(0), (y - y.mean(0)).pow(2).sum(-1).mean()))
            del x, y, loss  # the next SAE's step runs in this one's memory
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step += 1
        records = []
        for member, loss, stats, n_rows, variance in done:
            member.after_step(stats, n_rows, self.dist.world_size)
            record = {"loss": loss.item(), "mse": stats["mse"].item(), "fve": 1.0 - (stats["mse"] / variance).item(),
                      "l0": float(stats["l0"]), "dead": member.dead().float().mean().item()}
            if stats["aux"] is not None:
                record["aux"] = stats["aux"].item()
            records.append(record)
        return _summary(records)

    def _average_gradients(self, member: Training) -> None:
        """Each gradient of `member` averaged over ranks (one all-reduce of them all, flattened)."""
        if not self.dist.enabled:
            return
        grads = [p.grad for p in member.parameters() if p.grad is not None]
        flat = distributed.all_reduce_sum(torch.cat([g.flatten() for g in grads])) / self.dist.world_size
        for g, averaged in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(averaged.view_as(g))

    @torch.no_grad()
    def held_out(self) -> dict:
        """FVE and L0 on the held-out rows (their means; with several SAEs, each one's under "layers")."""
        if self.eval_rows is None:
            return {}
        rows = self.eval_rows.to(self.device)
        results = [member.held_out(rows) for member in self.members]
        held = {"val_fve": sum(f for f, _ in results) / len(results), "val_l0": sum(l for _, l in results) / len(results)}
        if len(results) > 1:
            held["layers"] = {"val_fve": [f for f, _ in results], "val_l0": [l for _, l in results]}
        return held

    # ---- the loop ---------------------------------------------------------------------------------
    def fit(self) -> list[dict]:
        """Train from `self.step` to max_steps; returns every logged record."""
        c = self.config
        self.members.train()
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
                    self.log_record(record)
                    progress.update(self.step, record["loss"], record["tokens_per_s"])
                    if not progress.enabled:
                        self._say(f"step {self.step:>6}/{c.max_steps}  fve {record['fve']:.3f}  l0 {record['l0']:.1f}  "
                                  f"dead {record['dead']:.1%}  {record['tokens_per_s']:,.0f} tok/s")
                if (c.eval_every and self.step % c.eval_every == 0) or last:
                    held = self.held_out()
                    if held and self.dist.is_main:
                        self.log_record({"step": self.step, **held})
                        line = f"held-out fve {held['val_fve']:.4f}  l0 {held['val_l0']:.1f}"
                        progress.print(line, self.step)
                        if not progress.enabled:
                            self._say(f"step {self.step:>6}  {line}")
                    t_since = time.time()
                if (c.save_every and self.step % c.save_every == 0) or last:
                    if self.dist.is_main:
                        save_checkpoint(self.run_dir, self.step, self.members, self.optimizer, self.scheduler,
                                        state={"sampler": {"seed": c.seed, "next_step": self.step}}, keep=c.keep)
                    distributed.barrier()
                    t_since = time.time()
        self.calibrate()
        return self.history

    @torch.no_grad()
    def calibrate(self, batches: int = 8) -> None:
        """Each BatchTopK SAE's threshold theta = E[the smallest activation its batch top-k keeps] (Bussmann et al.
        2024, section 3), measured with the final weights on the last `batches` batches of training, averaged
        over ranks: the moving average of training lags the activations as they change."""
        members = [m for m in self.members if m.sae.kind == "batchtopk"]
        steps = range(max(0, self.step - batches), self.step)
        if not members or not steps:
            return
        smallest = torch.zeros(len(members), dtype=torch.float64, device=self.device)
        for step in steps:
            rows = self.store.batch(step).to(self.device)
            smallest += torch.stack([m.smallest_kept(rows).double() for m in members])
        smallest = distributed.all_reduce_sum(smallest) / (len(steps) * self.dist.world_size)
        for member, value in zip(members, smallest.tolist()):
            member.sae.threshold.fill_(value)

    def trained_sae(self) -> SAE:
        """A copy of the (first) SAE with the scales folded in: it reads and writes the model's own activations."""
        return self.trained_saes()[0]

    def trained_saes(self) -> list[SAE]:
        """Copies of every SAE with the scales folded in, in order."""
        return [fold_scales(copy.deepcopy(m.sae).eval(), m.scale_in.item(), m.scale_out.item()) for m in self.members]

    def log_record(self, record: dict) -> None:
        """Append `record` to the history and (rank 0) to metrics.jsonl."""
        self.history.append(record)
        if self.dist.is_main:
            append_metrics(self.run_dir, record)

    def _say(self, text: str) -> None:
        if self.dist.is_main and not self.config.quiet:
            print(text, flush=True)


def _summary(records: list[dict]) -> dict:
    """One record: the only one, or the means of several with each one's fve, l0 and dead under "layers"."""
    if len(records) == 1:
        return records[0]
    summary = {key: sum(r[key] for r in records) / len(records) for key in records[0] if all(key in r for r in records)}
    summary["layers"] = {key: [r[key] for r in records] for key in ("fve", "l0", "dead")}
    return summary


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
