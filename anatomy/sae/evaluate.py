"""How good an SAE is, on held-out text: the numbers SAELens, Gemma Scope and Neuronpedia report.

Shape letters: R rows (held-out activation vectors), O width, F features, N contexts, T tokens.

    L0                  mean number of active features per token
    FVE                 fraction of variance explained, 1 - sum ||y - y^||^2 / sum ||y - mean(y)||^2
    CE loss recovered   (CE_zero - CE_spliced) / (CE_zero - CE_clean): the next-token loss with the SAE
                        spliced in alone (no error term), between the model's own (1) and the point
                        zero-ablated (0)
    dead / dense        features that never fire on the held-out tokens / that fire on more than 10%

The first `skip` positions of every context are left as the model computes them (neither spliced nor
ablated), as in training: the first token's outlier activation is no text's feature. So is any other
vector more than OUTLIER times the median norm (a context that starts with blank lines makes its first
two positions attention sinks, each 100 times the median norm): such rows are left out and counted.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ..trace import trace
from .modules import SAE
from .store import harvest

DENSE = 0.1  # a feature firing on more than this share of tokens is "dense"
OUTLIER = 10.0  # a vector this many times the median norm is an attention sink, not text


def typical(x: torch.Tensor, skip: int) -> torch.Tensor:
    """[B, T] bool: positions >= skip whose vector (x [B, T, ...]) is within OUTLIER times the median norm."""
    norms = x.flatten(2).norm(dim=-1)  # (B, T)
    kept = torch.zeros_like(norms, dtype=torch.bool)
    kept[:, skip:] = norms[:, skip:] <= OUTLIER * norms[:, skip:].median()
    return kept


def contexts_of(tokens: np.ndarray, context: int, limit: int | None = None) -> torch.Tensor:
    """[N, T]: consecutive windows of `context` tokens (the first `limit` of them)."""
    n = len(tokens) // context if limit is None else min(limit, len(tokens) // context)
    if n == 0:
        raise ValueError(f"{len(tokens)} held-out tokens make no context of {context}: give more text")
    return torch.from_numpy(np.asarray(tokens[:n * context], dtype=np.int64).reshape(n, context))


@torch.no_grad()
def reconstruction_stats(model: nn.Module, sae: SAE, ids: torch.Tensor, skip: int = 1, batch: int = 16,
                         progress=None) -> dict:
    """{"l0", "fve", "dead", "dense", "frequency" [F], "tokens"} over every position >= skip of the contexts
    ids [N, T]; progress(contexts) is called after each batch with the number of contexts it read."""
    points = [sae.point] if not sae.is_transcoder else [sae.point, sae.point_out]
    fired = torch.zeros(sae.d_sae, dtype=torch.float64)
    total = torch.zeros((), dtype=torch.float64)
    squared_error = sum_y = sum_y2 = rows = active = outliers = 0.0
    for start in range(0, len(ids), batch):
        values = harvest(model, ids[start:start + batch], points)
        kept = typical(values[-1], skip)  # (B, T): as where the SAE writes
        outliers += int((~kept[:, skip:]).sum())
        x, y = values[0][kept], values[-1][kept]  # (R, ...)
        f = sae.encode(x)
        y_hat = sae.decode(f, x)
        y, y_hat = y.flatten(1).double(), y_hat.flatten(1).double()  # (R, O)
        squared_error += (y - y_hat).pow(2).sum().item()
        sum_y = sum_y + y.sum(0)
        sum_y2 += y.pow(2).sum().item()
        rows += y.size(0)
        on = (f > 0).flatten(0, -2)  # (R, F)
        fired += on.sum(0).double()
        active += on.sum().item()
        total += on.size(0)
        if progress is not None:
            progress(len(ids[start:start + batch]))
    variance = sum_y2 - (sum_y.pow(2).sum().item() / rows)  # sum ||y - mean||^2
    frequency = fired / total
    return {"l0": active / rows, "fve": 1.0 - squared_error / variance, "dead": float((fired == 0).double().mean()),
            "dense": float((frequency > DENSE).double().mean()), "frequency": frequency.float(), "tokens": int(rows),
            "outliers": int(outliers)}


def _at_typical(skip: int, fn, mask: dict | None = None):
    """An intervention applying fn at the typical positions of its point's value x [B, T, ...]; with fn
    None it changes nothing and leaves those positions in mask["kept"] for `_masked`."""
    def apply(x: torch.Tensor) -> torch.Tensor | None:
        kept = typical(x, skip)  # (B, T)
        if fn is None:
            mask["kept"] = kept
            return None
        x = x.clone()
        x[kept] = fn(x[kept])
        return x
    return apply


def _masked(mask: dict, fn):
    """An intervention applying fn at the positions mask["kept"] [B, T] holds."""
    def apply(x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        x[mask["kept"]] = fn(x[mask["kept"]])
        return x
    return apply


@torch.no_grad()
def loss_recovered(model: nn.Module, sae: SAE, ids: torch.Tensor, skip: int = 1, batch: int = 8,
                   progress=None) -> dict:
    """{"ce_clean", "ce_spliced", "ce_zero", "loss_recovered"}: mean next-token cross-entropy over the
    contexts ids [N, T] as the model computes it, with the SAE spliced in alone at positions >= skip, and
    with the point it writes zeroed there; progress(contexts) after each batch of each of the three runs.
    Raises ValueError for a model without an LM head."""
    if not hasattr(model, "lm_head") or model.config.arch != "decoder":
        raise ValueError("cross-entropy loss recovered needs a decoder language model")
    where = sae.point_out or sae.point  # the point the SAE writes: spliced, or zero-ablated
    runs = {"ce_clean": lambda: {},
            "ce_zero": lambda: dict(interventions={where: _at_typical(skip, torch.zeros_like)})}

    def spliced() -> dict:
        mask: dict = {}  # the point's typical positions, found before the SAE runs, where its error is dropped
        return dict(saes={where: sae}, interventions={where: _at_typical(skip, None, mask),
                                                      f"{where}.sae.error": _masked(mask, torch.zeros_like)})
    runs["ce_spliced"] = spliced
    result = {}
    for name, options in runs.items():  # each pass gets fresh interventions
        total = 0.0
        for start in range(0, len(ids), batch):
            chunk = ids[start:start + batch]
            with trace(model, [], **options()):
                total += model.loss(chunk, reduction="sum").item()
            if progress is not None:
                progress(len(chunk))
        result[name] = total / (len(ids) * (ids.size(1) - 1))
    clean, spliced, zero = result["ce_clean"], result["ce_spliced"], result["ce_zero"]
    result["loss_recovered"] = (zero - spliced) / (zero - clean)
    return result


def evaluate(model: nn.Module, sae: SAE, tokens: np.ndarray, *, context: int = 128, skip: int = 1,
             ce_contexts: int = 64, progress=None) -> dict:
    """Every number of the module docstring on held-out `tokens`: reconstruction over all of them, the
    cross-entropy over the first `ce_contexts` contexts (three full passes each; 0 skips it).
    progress(done, total) is called as passes finish, counting one context's pass as 1."""
    model.eval()
    sae.eval()
    ids = contexts_of(tokens, context)
    with_ce = bool(ce_contexts) and getattr(model.config, "arch", None) == "decoder" and hasattr(model, "lm_head")
    total = len(ids) + (3 * len(ids[:ce_contexts]) if with_ce else 0)
    done = 0

    def advance(contexts: int) -> None:
        nonlocal done
        done += contexts
        if progress is not None:
            progress(done, total)
    stats = reconstruction_stats(model, sae, ids, skip, progress=advance)
    stats.pop("frequency")
    if with_ce:
        stats.update(loss_recovered(model, sae, ids[:ce_contexts], skip, progress=advance))
    return stats
