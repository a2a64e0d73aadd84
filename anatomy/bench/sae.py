"""Sparse autoencoders: training throughput against SAELens's trainer, and harvesting against the full pass.

Two rows:

- **training a TopK SAE** on SmolLM2-135M's blocks.15.resid_post (576 -> 4608 features, k 32, batches of
  4096, Adam, warmup and cosine decay, AuxK): anatomy's `SAETrainer.train_step` against SAELens's
  `SAETrainer.step`, on the same activations in the same order, with the same hyperparameters, each in
  its own process, alternating (anatomy, SAELens, SAELens, anatomy): rows per second, medians over the
  steps after the first 5, and the fraction of variance explained on the same held-out rows at the end
  (both start b_dec at the rows' mean, as anatomy does; SAELens 6 starts it at 0).
  SAELens pins transformer-lens < 4, so it runs from its own virtual environment: $ANATOMY_SAELENS_PYTHON,
  else one the bench makes under ~/.cache/anatomy/venv-saelens (pip install torch==<this torch> sae-lens,
  said before it starts); without either, the row says why and has no SAELens column.
- **harvesting activations**: a pass that stops at blocks.15 (anatomy.sae.store.harvest) against the full
  forward pass, tokens per second, alternating; the harvested values equal the full pass's trace.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np
import torch

from .common import Row, Settings, alternate, load_average
from .sae_layers import bench_every_layer
from .sae_workers import alternate_workers, smollm2_tokens

POINT = "blocks.15.resid_post"
WORKER = Path(__file__).with_name("saelens_worker.py")


def _activations(settings: Settings) -> tuple[torch.Tensor, torch.Tensor, object]:
    """(train rows [R, E] in batch order, held-out rows [H, E], the model) from SmolLM2 on tinyshakespeare,
    or from a tiny random model in quick mode."""
    from ..sae.store import rows_of

    if settings.quick:
        from ..config import ModelConfig
        from ..models import build_model

        model = build_model(ModelConfig(arch="decoder", vocab_size=99, d_model=32, n_heads=4, n_layers=2, d_ff=64,
                                        max_seq_len=64), seed=0).eval()
        tokens = np.random.default_rng(0).integers(0, 99, 64 * 80)
        rows = rows_of(model, ["blocks.1.resid_post"], tokens, context=64)
    else:
        from ..checkpoints import from_pretrained

        model = from_pretrained("smollm2").eval()
        rows = rows_of(model, [POINT], smollm2_tokens(model), context=128, limit=4096 * 12 + 8192)
    order = torch.from_numpy(np.random.default_rng(0).permutation(len(rows)))
    rows = rows[order]
    norms = rows.norm(dim=-1)
    rows = rows[norms <= 10 * norms.median()]  # the attention sinks, as training leaves them out
    held = rows[-min(8192, len(rows) // 5):]
    return rows[:-len(held)].contiguous(), held.contiguous(), model


def _options(settings: Settings, d_in: int) -> dict:
    if settings.quick:
        return dict(d_sae=128, k=8, batch_size=256, steps=12, lr=1e-3, warmup=2, min_lr_ratio=0.0,
                    aux_coefficient=1 / 32, dead_steps=4, seed=0, threads=1)
    return dict(d_sae=4608, k=32, batch_size=4096, steps=100, lr=7e-4, warmup=10, min_lr_ratio=0.0,
                aux_coefficient=1 / 32, dead_steps=20, seed=0, threads=1)


def bench_training(settings: Settings, train: torch.Tensor, held: torch.Tensor) -> Row:
    """The training row: each side's worker process in turn, rows per second and held-out FVE."""
    options = _options(settings, train.size(1))
    results, how = alternate_workers(train, held, options, WORKER, install=not settings.quick)
    python = "SAELens" in results
    skip = min(5, options["steps"] - 1)
    rate = {side: statistics.median(options["batch_size"] / s for r in runs for s in r["seconds"][skip:])
            for side, runs in results.items()}
    fve = {side: statistics.mean(r["fve"] for r in runs) for side, runs in results.items()}
    case = (f"train TopK SAE {train.size(1)}->{options['d_sae']}, k {options['k']}, batch {options['batch_size']}, "
            f"{options['steps']} steps" + (", theirs = SAELens" if python else ""))
    row = Row("sae", case, "rows/s", rate["anatomy"], rate.get("SAELens"), True)
    row.notes = [how]
    if python:
        row.notes.append(f"SAELens {results['SAELens'][0]['version']}; held-out FVE {fve['anatomy']:.4f} vs "
                         f"{fve['SAELens']:.4f} (|diff| {abs(fve['anatomy'] - fve['SAELens']):.4f}); L0 "
                         f"{results['anatomy'][0]['l0']:.1f} vs {results['SAELens'][0]['l0']:.1f}")
    else:
        row.notes.append(f"no SAELens comparison; held-out FVE {fve['anatomy']:.4f}")
    row.notes.append(f"{len(results['anatomy'])} runs a side, alternating, one process each; load {load_average()}")
    return row


def bench_harvest(settings: Settings, model) -> Row:
    """The harvesting row: a pass stopped at the point against the whole forward pass, alternating."""
    from ..sae.store import harvest
    from ..trace import trace

    point = "blocks.1.resid_post" if settings.quick else POINT
    ids = torch.randint(0, model.config.vocab_size, (4, 64) if settings.quick else (8, 128),
                        generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), trace(model, [point]) as t:
        model(ids)
    same = torch.equal(harvest(model, ids, [point])[0], t[point])
    with torch.no_grad():
        times = alternate({"harvest": lambda: harvest(model, ids, [point]), "full": lambda: model(ids)},
                          settings.repeats or 5, warmup=1)
    ms = {side: statistics.median(v) * 1e3 for side, v in times.items()}
    tokens = ids.numel()
    row = Row("sae", f"harvest {point} vs the full pass, {ids.size(0)}x{ids.size(1)}", "tokens/s",
              tokens / ms["harvest"] * 1e3, tokens / ms["full"] * 1e3, True)
    row.notes = [f"{ms['harvest']:.0f} vs {ms['full']:.0f} ms, medians of {len(times['full'])}",
                 f"theirs = anatomy's own full forward pass; values equal to the full pass's trace: {'yes' if same else 'NO'}"]
    return row


def bench_sae(settings: Settings) -> list[Row]:
    """Both rows of the module docstring, then the every-layer rows (sae_layers.py)."""
    train, held, model = _activations(settings)
    return [bench_harvest(settings, model), bench_training(settings, train, held), *bench_every_layer(settings)]
