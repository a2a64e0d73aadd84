"""One SAE in training: the SAE, the scales of what it reads and writes, and the tokens since each feature fired.

Shape letters: B rows per batch, E input width, O output width, F features, W the width of a harvested row.

A `Training` reads its own columns of each harvested row (an SAE: x; a transcoder: x and the target y after
it), scales both so that E ||x||^2 = E (the width), computes the step's loss by kind (objectives.py), and after
the optimizer's step keeps its decoder rows unit, its thresholds, and its dead-feature counts (train.py runs
the step for every member). At the end, fold_scales writes the scales into the weights, so that the SAE reads
and writes the model's own activations.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..training import distributed
from .evaluate import OUTLIER
from .modules import SAE, WITH_THRESHOLD
from .objectives import batchtopk_step, dense_step, largest, topk_step

if TYPE_CHECKING:
    from .train import SAETrainConfig

SKIP_ENCODER_SCALE = 0.1  # a skip transcoder's encoder starts at this fraction of its norm (Training.initialise)


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
