"""Training an SAE or a transcoder, or one on every layer at once, on the activations of any model anatomy opens.

Shape letters: B rows per batch, E input width, O output width, F features, W the width of a harvested row.

Several SAEs train in one process on one harvest: each reads its own columns of the same rows (a
transcoder set: layer l's MLP input and output, side by side with every other layer's, store.py).
Each is a `Training` (member.py: its scales, its dead-feature counts); the step below runs for each in turn,
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
from .member import Training, fold_scales
from .modules import KINDS, SAE

NORM_ROWS = 16384  # rows of the first fill that estimate E ||x||^2, the initial b_dec and W_skip


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
        tokens_per_step = c.batch_size * self.dist.world_size
        if c.max_steps * tokens_per_step <= c.dead_tokens:  # a feature is dead after dead_tokens silent ones
            self._say(f"this run trains {c.max_steps * tokens_per_step:,} tokens, no more than the dead-feature window "
                      f"of {c.dead_tokens:,}: no feature can count as dead while it trains (the evaluation counts "
                      f"the features silent on the held-out text)")
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
                        # before the window has passed, no feature can be dead yet: "dead –", not "dead 0.0%"
                        dead = f"{record['dead']:.1%}" if self.step * tokens_per_step > c.dead_tokens else "–"
                        self._say(f"step {self.step:>6}/{c.max_steps}  fve {record['fve']:.3f}  l0 {record['l0']:.1f}  "
                                  f"dead {dead}  {record['tokens_per_s']:,.0f} tok/s")
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


def write_summary(run_dir: Path, config: SAETrainConfig, extra: dict) -> None:
    """run_dir/sae_train_config.json: the training configuration and what the command line added."""
    write_text_atomically(Path(run_dir) / "sae_train_config.json", json.dumps({**asdict(config), **extra}, indent=1))
