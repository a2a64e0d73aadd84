"""SAELens's side of the every-layer row of `anatomy bench --only sae`: N BatchTopK SAEs trained in lockstep
by SAELens's own MultiSAETrainer (what its MultiSAETrainingRunner drives), on one stream of activations.

Run with the python of SAELens's own virtual environment; it imports SAELens and torch, never anatomy.

    python saelens_multi_worker.py ROWS.safetensors OUT.json '{"d_sae": 2304, "k": 32, "layers": 4, ...}'

ROWS holds "train" [R, N E] (every SAE's E columns side by side, in the order the batches take them) and
"held_out" [H, N E]. The data provider yields {hook: [B, E]} per step, as the runner's multi-hook store
does after its forward pass (the forward pass itself needs a TransformerLens model: see the bench's
notes); OUT gets the seconds of every step and each SAE's held-out FVE and L0.
"""

from __future__ import annotations

import json
import sys
import time

import torch
from safetensors.torch import load_file


def main(rows_path: str, out_path: str, options: str) -> None:
    from sae_lens import __version__ as version
    from sae_lens.saes.batchtopk_sae import BatchTopKTrainingSAE, BatchTopKTrainingSAEConfig
    from sae_lens.training.multi_sae_trainer import MultiSAETrainer
    from saelens_worker import trainer_config  # beside this file: a script's folder is on its path

    o = json.loads(options)
    torch.set_num_threads(o["threads"])
    torch.manual_seed(o["seed"])
    rows = load_file(rows_path)
    train, held = rows["train"].float(), rows["held_out"].float()
    n, batch = o["layers"], o["batch_size"]
    width = train.size(1) // n
    hooks = {f"layer_{i}": f"blocks.{i}.hook_mlp_out" for i in range(n)}

    def batches():
        step = 0
        while True:
            start = (step * batch) % (len(train) - batch + 1)
            chunk = train[start:start + batch]
            yield {hooks[f"layer_{i}"]: chunk[:, i * width:(i + 1) * width] for i in range(n)}
            step += 1

    saes = {name: BatchTopKTrainingSAE(BatchTopKTrainingSAEConfig(
        d_in=width, d_sae=o["d_sae"], k=float(o["k"]), aux_loss_coefficient=o["aux_coefficient"],
        normalize_activations="expected_average_only_in")) for name in hooks}
    config = trainer_config(o)
    provider = batches()
    trainer = MultiSAETrainer(config, saes, hooks, provider)
    trainer._estimate_scaling_factors()  # as fit() does first
    with torch.no_grad():  # b_dec at the scaled mean of the first rows, as anatomy starts it (see saelens_worker.py)
        for i, (name, sae) in enumerate(saes.items()):
            scale = trainer.trainers[name].activation_scaler.scaling_factor
            sae.b_dec.copy_(train[:16384, i * width:(i + 1) * width].mean(0) * scale)
    seconds = []
    for _ in range(o["steps"]):
        start = time.perf_counter()
        multi_batch = next(provider)
        for name, single in trainer.trainers.items():  # MultiSAETrainer.fit's step, without its progress bar
            single.step(multi_batch[hooks[name]])
            single.n_training_steps += 1
        seconds.append(time.perf_counter() - start)
    fves, l0s = [], []
    for i, (name, sae) in enumerate(saes.items()):
        sae.fold_activation_norm_scaling_factor(trainer.trainers[name].activation_scaler.scaling_factor)
        sae.eval()
        x = held[:, i * width:(i + 1) * width]
        with torch.no_grad():
            f = sae.encode(x)
            fves.append(1 - (x - sae.decode(f)).pow(2).sum().item() / (x - x.mean(0)).pow(2).sum().item())
            l0s.append((f > 0).sum(-1).float().mean().item())
    with open(out_path, "w") as handle:
        json.dump({"seconds": seconds, "fve": fves, "l0": l0s, "version": version}, handle)


if __name__ == "__main__":
    main(*sys.argv[1:4])
