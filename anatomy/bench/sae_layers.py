"""Every layer at once: the harvest that feeds a transcoder on each layer, and training several SAEs from one
stream against SAELens's MultiSAETrainer.

Three rows, in the sae group:

- **harvesting every layer's MLP input and output** of SmolLM2-135M (60 points) in one pass that stops at the
  last MLP, against one pass per layer (what training one transcoder at a time costs): tokens per second.
- **training N BatchTopK SAEs in one process from one stream** (N of SmolLM2's blocks.L.mlp.out, 576 -> 2304
  features, k 32, batches of 2048, Adam, warmup and cosine decay, AuxK): anatomy's `SAETrainer` over a list
  of SAEs against SAELens's `MultiSAETrainer` (what its MultiSAETrainingRunner drives), on the same rows in
  the same order, each in its own process (sae_workers.py's and saelens_multi_worker.py), alternating: rows per second (each row trains all N), medians
  over the steps after the first 5, and the mean held-out FVE at the end. Both are given the activations:
  the runner's own harvest needs a TransformerLens model, which SmolLM2 is not offline. SAELens's
  MultiSAETrainer trains SAEs only (no transcoders), hence SAEs on both sides.
- **training a transcoder on all 30 layers**: one step of `anatomy sae train-transcoders`'s defaults (30 skip
  transcoders, 2304 BatchTopK features, k 32, batches of 1024): rows per second, anatomy alone (SAELens has
  no multi-layer transcoder trainer); with the harvest row, the expected time of recipes/transcoders_smollm2.sh.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from .common import Row, Settings, alternate, load_average
from .sae_workers import alternate_workers, smollm2_tokens

WORKER = Path(__file__).with_name("saelens_multi_worker.py")


def _model_and_tokens(settings: Settings):
    """(SmolLM2 and tinyshakespeare's tokens, or a tiny random model and random tokens in quick mode)."""
    if settings.quick:
        from ..config import ModelConfig
        from ..models import build_model

        model = build_model(ModelConfig(arch="decoder", vocab_size=99, d_model=32, n_heads=4, n_layers=4, d_ff=64,
                                        max_seq_len=64, norm_position="pre"), seed=0).eval()
        return model, np.random.default_rng(0).integers(0, 99, 64 * 120), 64
    from ..checkpoints import from_pretrained

    model = from_pretrained("smollm2").eval()
    return model, smollm2_tokens(model), 128


def bench_harvest_layers(settings: Settings, model, tokens: np.ndarray, context: int) -> Row:
    """One pass for every layer's MLP input and output against one pass per layer, alternating."""
    from ..sae.store import harvest
    from ..sae.transcoders import mlp_points, points_of

    n_layers = len(model.blocks)
    points = points_of(*mlp_points(model), n_layers)
    ids = torch.from_numpy(tokens[:4 * context].reshape(4, context).astype(np.int64))
    together = harvest(model, ids, points)
    apart = [v for layer in range(n_layers) for v in harvest(model, ids, points[2 * layer:2 * layer + 2])]
    same = all(torch.equal(a, b) for a, b in zip(together, apart))
    with torch.no_grad():
        times = alternate({"one pass": lambda: harvest(model, ids, points),
                           "a pass per layer": lambda: [harvest(model, ids, points[2 * l:2 * l + 2]) for l in range(n_layers)]},
                          settings.repeats or 3, warmup=1)
    ms = {side: statistics.median(v) * 1e3 for side, v in times.items()}
    row = Row("sae", f"harvest every layer's MLP in and out ({n_layers} layers, {len(points)} points) in one pass vs a "
                     f"pass per layer, {ids.size(0)}x{ids.size(1)}", "tokens/s",
              ids.numel() / ms["one pass"] * 1e3, ids.numel() / ms["a pass per layer"] * 1e3, True)
    row.notes = [f"{ms['one pass']:.0f} vs {ms['a pass per layer']:.0f} ms, medians of {len(times['one pass'])}",
                 f"the same values either way: {'yes' if same else 'NO'}; load {load_average()}"]
    return row


def _options(settings: Settings) -> dict:
    if settings.quick:
        return dict(layers=2, kind="batchtopk", d_sae=128, k=8, batch_size=256, steps=12, lr=1e-3, warmup=2,
                    min_lr_ratio=0.0, aux_coefficient=1 / 32, dead_steps=4, seed=0, threads=1)
    return dict(layers=4, kind="batchtopk", d_sae=2304, k=32, batch_size=2048, steps=40, lr=7e-4, warmup=5,
                min_lr_ratio=0.0, aux_coefficient=1 / 32, dead_steps=20, seed=0, threads=1)


def bench_multi_training(settings: Settings, model, tokens: np.ndarray, context: int) -> Row:
    """The N-SAE row: each side's worker process in turn, rows per second and mean held-out FVE."""
    from ..sae.store import rows_of

    o = _options(settings)
    n_layers = len(model.blocks)
    layers = np.linspace(0, n_layers - 1, o["layers"]).round().astype(int).tolist()
    points = [f"blocks.{layer}.mlp.out" for layer in layers]
    rows = rows_of(model, points, tokens, context=context, limit=o["batch_size"] * 8 + 4096)
    rows = rows[torch.from_numpy(np.random.default_rng(0).permutation(len(rows)))]
    held, train = rows[-4096:].contiguous(), rows[:-4096].contiguous()
    results, how = alternate_workers(train, held, o, WORKER, install=not settings.quick)
    python = "SAELens" in results
    skip = min(5, o["steps"] - 1)
    rate = {side: statistics.median(o["batch_size"] / s for r in runs for s in r["seconds"][skip:])
            for side, runs in results.items()}
    fve = {side: statistics.mean(statistics.mean(r["fve"]) for r in runs) for side, runs in results.items()}
    l0 = {side: statistics.mean(statistics.mean(r["l0"]) for r in runs) for side, runs in results.items()}
    case = (f"train {o['layers']} BatchTopK SAEs from one stream (layers {', '.join(map(str, layers))} mlp.out, "
            f"{train.size(1) // o['layers']}->{o['d_sae']}, k {o['k']}, batch {o['batch_size']}, {o['steps']} steps)"
            + (", theirs = SAELens MultiSAETrainer" if python else ""))
    row = Row("sae", case, "rows/s", rate["anatomy"], rate.get("SAELens"), True)
    row.notes = [how, f"a row trains all {o['layers']}"]
    if python:
        row.notes.append(f"SAELens {results['SAELens'][0]['version']}; mean held-out FVE {fve['anatomy']:.4f} vs "
                         f"{fve['SAELens']:.4f}; L0 {l0['anatomy']:.1f} vs {l0['SAELens']:.1f} (SAELens's training SAE "
                         "encodes with its batch top-k, anatomy's with the calibrated threshold)")
    else:
        row.notes.append(f"no SAELens comparison; mean held-out FVE {fve['anatomy']:.4f}")
    row.notes.append(f"{len(results['anatomy'])} runs a side, alternating, one process each; load {load_average()}")
    return row


def bench_transcoder_step(settings: Settings, model, tokens: np.ndarray, context: int, harvest_rate: float) -> Row:
    """One training step of a skip transcoder on every layer (train-transcoders' defaults), anatomy alone."""
    from ..sae import SAE
    from ..sae.store import rows_of
    from ..sae.train import SAETrainConfig, SAETrainer
    from ..sae.transcoders import mlp_points, points_of

    n_layers, width = len(model.blocks), model.config.d_model
    features, batch, steps = (128, 256, 4) if settings.quick else (2304, 1024, 6)
    points = points_of(*mlp_points(model), n_layers)
    rows = rows_of(model, points, tokens, context=context, limit=batch).to(torch.bfloat16)

    class Batches:
        def batch(self, step: int) -> torch.Tensor:
            return rows[:batch]

    config = SAETrainConfig(kind="batchtopk", features=features, k=32.0, max_steps=steps, batch_size=batch, warmup=1,
                            eval_every=0, save_every=0, progress=False, quiet=True)
    saes = [SAE(width, features, kind="batchtopk", k=32.0, transcoder=True, skip=True, seed=i) for i in range(n_layers)]
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = SAETrainer(saes, Batches(), config, run_dir, offsets=[2 * width * i for i in range(n_layers)])
        seconds = []
        for _ in range(steps):
            start = time.perf_counter()
            trainer.train_step()
            seconds.append(time.perf_counter() - start)
    rate = batch / statistics.median(seconds[1:])
    hour = 3600 / (1 / rate + 1 / harvest_rate)
    row = Row("sae", f"train a skip transcoder on all {n_layers} layers ({width}->{features} BatchTopK, k 32, batch "
                     f"{batch}): one step", "rows/s", rate, None, True)
    row.notes = [f"median of {steps - 1} steps after the first; every row trains all {n_layers}",
                 f"with the one-pass harvest above: about {hour / 1e6:.2f}M tokens an hour with {torch.get_num_threads()} "
                 f"thread(s) (recipes/transcoders_smollm2.sh: 600 x 1024 = 0.61M)", f"load {load_average()}"]
    return row


def bench_every_layer(settings: Settings) -> list[Row]:
    """The three rows of the module docstring."""
    model, tokens, context = _model_and_tokens(settings)
    harvest = bench_harvest_layers(settings, model, tokens, context)
    return [harvest, bench_multi_training(settings, model, tokens, context),
            bench_transcoder_step(settings, model, tokens, context, harvest.ours)]
