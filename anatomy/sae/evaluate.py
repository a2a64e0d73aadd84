"""How good an SAE is, on held-out text: the numbers SAELens, Gemma Scope and Neuronpedia report.

Shape letters: R rows (held-out activation vectors), O width, F features, N contexts, T tokens.

    L0                  mean number of active features per token
    FVE                 fraction of variance explained, 1 - sum ||y - y^||^2 / sum ||y - mean(y)||^2
    CE loss recovered   (CE_zero - CE_spliced) / (CE_zero - CE_clean): the next-token loss with the SAE
                        spliced in alone (no error term), between the model's own (1) and the point
                        zero-ablated (0); for a transcoder on every layer (evaluate_transcoders), every
                        MLP replaced at once, against every MLP zero-ablated
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


class Tally:
    """Running sums, in float64, of what L0, FVE, dead and dense are computed from, over batches of rows."""

    def __init__(self, d_sae: int):
        self.fired = torch.zeros(d_sae, dtype=torch.float64)
        self.squared_error = self.sum_y2 = self.rows = self.active = 0.0
        self.sum_y = torch.zeros((), dtype=torch.float64)

    def add(self, y: torch.Tensor, y_hat: torch.Tensor, f: torch.Tensor) -> None:
        """Targets y and reconstructions y^ [R, ...], feature activations f [R, F]."""
        y, y_hat = y.flatten(1).double(), y_hat.flatten(1).double()  # (R, O)
        self.squared_error += (y - y_hat).pow(2).sum().item()
        self.sum_y = self.sum_y + y.sum(0)
        self.sum_y2 += y.pow(2).sum().item()
        self.rows += y.size(0)
        on = (f > 0).flatten(0, -2)  # (R, F)
        self.fired += on.sum(0).double()
        self.active += on.sum().item()

    def result(self) -> dict:
        """{"l0", "fve", "dead", "dense", "frequency" [F], "tokens", "mean" [O] (of the targets)}."""
        variance = self.sum_y2 - (self.sum_y.pow(2).sum().item() / self.rows)  # sum ||y - mean||^2
        frequency = self.fired / self.rows
        return {"l0": self.active / self.rows, "fve": 1.0 - self.squared_error / variance,
                "dead": float((self.fired == 0).double().mean()), "dense": float((frequency > DENSE).double().mean()),
                "frequency": frequency.float(), "tokens": int(self.rows), "mean": (self.sum_y / self.rows).float()}


@torch.no_grad()
def reconstruction_stats(model: nn.Module, sae: SAE, ids: torch.Tensor, skip: int = 1, batch: int = 16,
                         progress=None) -> dict:
    """{"l0", "fve", "dead", "dense", "frequency" [F], "tokens", "outliers"} over every position >= skip of
    the contexts ids [N, T]; progress(contexts) is called after each batch with the number of contexts it read."""
    points = [sae.point] if not sae.is_transcoder else [sae.point, sae.point_out]
    tally, outliers = Tally(sae.d_sae), 0
    for start in range(0, len(ids), batch):
        values = harvest(model, ids[start:start + batch], points)
        kept = typical(values[-1], skip)  # (B, T): as where the SAE writes
        outliers += int((~kept[:, skip:]).sum())
        x, y = values[0][kept], values[-1][kept]  # (R, ...)
        f = sae.encode(x)
        tally.add(y, sae.decode(f, x), f)
        if progress is not None:
            progress(len(ids[start:start + batch]))
    result = tally.result()
    result.pop("mean")
    return {**result, "outliers": outliers}


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
    if not has_lm_loss(model):
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


def has_lm_loss(model: nn.Module) -> bool:
    """Whether the model is a decoder language model, whose next-token loss the CE numbers read."""
    return getattr(model.config, "arch", None) == "decoder" and hasattr(model, "lm_head")


def _counter(total: int, progress):
    """A callback advance(contexts) that adds them up and calls progress(done, total), if given."""
    done = 0

    def advance(contexts: int) -> None:
        nonlocal done
        done += contexts
        if progress is not None:
            progress(done, total)
    return advance


def evaluate(model: nn.Module, sae: SAE, tokens: np.ndarray, *, context: int = 128, skip: int = 1,
             ce_contexts: int = 64, progress=None) -> dict:
    """Every number of the module docstring on held-out `tokens`: reconstruction over all of them, the
    cross-entropy over the first `ce_contexts` contexts (three full passes each; 0 skips it).
    progress(done, total) is called as passes finish, counting one context's pass as 1."""
    model.eval()
    sae.eval()
    ids = contexts_of(tokens, context)
    with_ce = has_lm_loss(model) and bool(ce_contexts)
    advance = _counter(len(ids) + (3 * len(ids[:ce_contexts]) if with_ce else 0), progress)
    stats = reconstruction_stats(model, sae, ids, skip, progress=advance)
    stats.pop("frequency")
    if with_ce:
        stats.update(loss_recovered(model, sae, ids[:ce_contexts], skip, progress=advance))
    return stats


# ---- a transcoder on every layer --------------------------------------------------------------------------
@torch.no_grad()
def set_reconstruction_stats(model: nn.Module, transcoders, ids: torch.Tensor, skip: int = 1, batch: int = 8,
                             progress=None) -> list[dict]:
    """For each layer l, {"l0", "fve", "dead", "dense", "tokens"} of y^_l = transcoders.reconstruct(l, ...) (the
    features of every layer that writes to l) against the model's own y_l, over the positions >= skip where y_l
    is typical, from one pass per batch of the contexts ids [N, T] that stops at the last point read."""
    n_layers = transcoders.n_layers
    points = [p for layer in range(n_layers) for p in (transcoders.input_point(layer), transcoders.output_point(layer))]
    tallies = [Tally(transcoders.d_transcoder) for _ in range(n_layers)]
    for start in range(0, len(ids), batch):
        values = harvest(model, ids[start:start + batch], points)
        inputs, outputs = values[0::2], values[1::2]  # (B, T, E) each
        features = [transcoders.encode(layer, inputs[layer]) for layer in range(n_layers)]  # (B, T, F) each
        for layer in range(n_layers):
            kept = typical(outputs[layer], skip)  # (B, T)
            y_hat = transcoders.reconstruct(layer, features, inputs)
            tallies[layer].add(outputs[layer][kept], y_hat[kept], features[layer][kept])
        if progress is not None:
            progress(len(ids[start:start + batch]))
    results = [t.result() for t in tallies]
    for result in results:
        result.pop("frequency")
    return results  # each with "mean" [E], the layer's mean output


@torch.no_grad()
def replacement_loss(model: nn.Module, transcoders, ids: torch.Tensor, skip: int = 1, batch: int = 8,
                     progress=None, means: list[torch.Tensor] | None = None) -> dict:
    """Mean next-token cross-entropy over the contexts ids [N, T]: "ce_clean" the model's; "ce_replaced" with
    every MLP output replaced by its transcoders' reconstruction at once, no error terms (the replacement
    model, TranscoderSet.replacement); "ce_with_errors" the same with the error terms added back (the model
    itself, to rounding: a check of the splice); "ce_zero" with every MLP output zeroed. All at positions
    >= skip whose output is typical. "loss_recovered" = (ce_zero - ce_replaced) / (ce_zero - ce_clean), and
    "loss_recovered_with_errors" likewise. With `means` (each layer's mean output [E]), also "ce_mean", every
    MLP output replaced by its mean, a far stronger baseline than zero, and "loss_recovered_vs_mean" =
    (ce_mean - ce_replaced) / (ce_mean - ce_clean). progress(contexts) after each batch of each run."""
    if not has_lm_loss(model):
        raise ValueError("cross-entropy loss recovered needs a decoder language model")

    def where(x: torch.Tensor) -> torch.Tensor:
        return typical(x, skip)

    outputs = [transcoders.output_point(layer) for layer in range(transcoders.n_layers)]
    runs = {"ce_clean": dict, "ce_replaced": lambda: transcoders.replacement(where),
            "ce_with_errors": lambda: transcoders.replacement(where, errors=True),
            "ce_zero": lambda: {point: _at_typical(skip, torch.zeros_like) for point in outputs}}
    if means is not None:
        runs["ce_mean"] = lambda: {point: _at_typical(skip, lambda x, m=mean: m.to(x).expand_as(x).clone())
                                   for point, mean in zip(outputs, means)}
    result = {}
    for name, interventions in runs.items():
        total = 0.0
        for start in range(0, len(ids), batch):
            chunk = ids[start:start + batch]
            with trace(model, [], interventions=interventions()):
                total += model.loss(chunk, reduction="sum").item()
            if progress is not None:
                progress(len(chunk))
        result[name] = total / (len(ids) * (ids.size(1) - 1))
    gap = result["ce_zero"] - result["ce_clean"]
    result["loss_recovered"] = (result["ce_zero"] - result["ce_replaced"]) / gap
    result["loss_recovered_with_errors"] = (result["ce_zero"] - result["ce_with_errors"]) / gap
    if means is not None:
        result["loss_recovered_vs_mean"] = (result["ce_mean"] - result["ce_replaced"]) / (result["ce_mean"] - result["ce_clean"])
    return result


def evaluate_transcoders(model: nn.Module, transcoders, tokens: np.ndarray, *, context: int = 128, skip: int = 1,
                         ce_contexts: int = 32, progress=None) -> dict:
    """A transcoder set on held-out `tokens`: {"layers": [per layer l0, fve, dead, dense, tokens], the means
    "fve", "l0", "dead", and replacement_loss's numbers over the first `ce_contexts` contexts (0 skips them),
    with the mean-ablation baseline from each layer's mean output on all of `tokens`}.
    progress(done, total) is called as passes finish, counting one context's pass as 1. Raises ValueError
    (transcoders.check_fits) when the set does not fit the model."""
    transcoders.check_fits(model)
    model.eval()
    transcoders.eval()
    ids = contexts_of(tokens, context)
    with_ce = has_lm_loss(model) and bool(ce_contexts)
    advance = _counter(len(ids) + (5 * len(ids[:ce_contexts]) if with_ce else 0), progress)
    layers = set_reconstruction_stats(model, transcoders, ids, skip, progress=advance)
    means = [layer.pop("mean") for layer in layers]
    result = {"layers": layers, **{key: sum(r[key] for r in layers) / len(layers) for key in ("fve", "l0", "dead")}}
    if with_ce:
        result.update(replacement_loss(model, transcoders, ids[:ce_contexts], skip, progress=advance, means=means))
    return result

