"""SAELens's side of `anatomy bench --only sae`: train a TopK SAE with SAELens's own trainer, time its steps.

Run by the bench with the python of SAELens's own virtual environment (SAELens pins transformer-lens < 4,
so it cannot share anatomy's); it imports SAELens and torch, never anatomy.

    python saelens_worker.py ROWS.safetensors OUT.json '{"d_sae": 4608, "k": 32, ...}'

ROWS holds "train" [R, E] (already in the order the batches take them) and "held_out" [H, E]. Each step
is what SAETrainer.fit runs per batch (SAETrainer.step: scaling, the forward and AuxK losses, backward,
clipping, Adam, the schedule, dead-feature bookkeeping), without its progress bar and logging; b_dec
starts at the rows' mean, as anatomy's does. OUT gets
the seconds of every step and the fraction of variance explained on the held-out rows at the end.
"""

from __future__ import annotations

import json
import sys
import time

import torch
from safetensors.torch import load_file


def trainer_config(o: dict):
    """SAELens's SAETrainerConfig for the bench's options: Adam, warmup and cosine decay, its dead-feature window."""
    from sae_lens.config import SAETrainerConfig

    batch = o["batch_size"]
    return SAETrainerConfig(total_training_samples=o["steps"] * batch, train_batch_size_samples=batch, lr=o["lr"],
                            lr_end=o["lr"] * o["min_lr_ratio"], lr_scheduler_name="cosineannealing",
                            lr_warm_up_steps=o["warmup"], adam_beta1=0.9, adam_beta2=0.999,
                            dead_feature_window=o["dead_steps"], feature_sampling_window=10**9,
                            n_batches_for_norm_estimate=4)


def main(rows_path: str, out_path: str, options: str) -> None:
    from sae_lens import __version__ as version
    from sae_lens.saes.topk_sae import TopKTrainingSAE, TopKTrainingSAEConfig
    from sae_lens.training.sae_trainer import SAETrainer

    o = json.loads(options)
    torch.set_num_threads(o["threads"])
    torch.manual_seed(o["seed"])
    rows = load_file(rows_path)
    train, held = rows["train"], rows["held_out"]
    d_in, batch = train.size(1), o["batch_size"]

    def batches():
        step = 0
        while True:
            start = (step * batch) % (len(train) - batch + 1)
            yield train[start:start + batch]
            step += 1

    sae = TopKTrainingSAE(TopKTrainingSAEConfig(d_in=d_in, d_sae=o["d_sae"], k=o["k"],
                                                aux_loss_coefficient=o["aux_coefficient"],
                                                normalize_activations="expected_average_only_in"))
    config = trainer_config(o)
    provider = batches()
    trainer = SAETrainer(config, sae, provider)
    trainer.activation_scaler.estimate_scaling_factor(d_in, batches(), 4)  # as fit() does first
    # b_dec starts where anatomy starts it, at the (scaled) mean of the first rows, as Gao et al. start theirs
    # (at the geometric median): SAELens 6 has no option for it, and from 0 it spends its first hundreds of
    # steps moving b_dec to the residual stream's mean, far from the origin
    with torch.no_grad():
        sae.b_dec.copy_(train[:16384].mean(0) * trainer.activation_scaler.scaling_factor)
    seconds = []
    for _ in range(o["steps"]):
        start = time.perf_counter()
        trainer.step(next(provider))
        trainer.n_training_steps += 1
        seconds.append(time.perf_counter() - start)
    sae.fold_activation_norm_scaling_factor(trainer.activation_scaler.scaling_factor)
    sae.eval()
    with torch.no_grad():
        recon = sae.decode(sae.encode(held))
        fve = 1 - (held - recon).pow(2).sum().item() / (held - held.mean(0)).pow(2).sum().item()
        l0 = (sae.encode(held) > 0).sum(-1).float().mean().item()
    with open(out_path, "w") as handle:
        json.dump({"seconds": seconds, "fve": fve, "l0": l0, "version": version}, handle)


if __name__ == "__main__":
    main(*sys.argv[1:4])
