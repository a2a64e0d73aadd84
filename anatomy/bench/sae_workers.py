"""The SAE rows' worker processes: each side trains in a process of its own, on the same rows, and writes what
it measured to a JSON file.

anatomy's side is this module, `python -m anatomy.bench.sae_workers ROWS.safetensors OUT.json OPTIONS`
(anatomy_worker); SAELens's are saelens_worker.py and saelens_multi_worker.py, run by the python of SAELens's
own environment (peers.py); run_worker runs either and reads its JSON, and alternate_workers runs both
sides in turn on the same rows. smollm2_tokens is the text both SAE benches harvest from.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from .peers import peer_python


def anatomy_worker(rows_path: str, out_path: str, options: str) -> None:
    """anatomy's side, in its own process: the same batches, SAETrainer.train_step, the held-out FVE and L0.
    With options "layers" N (default 1), N SAEs of options "kind" (default topk) each read their own E columns
    of the rows (E = the width / N); the FVE and L0 are then lists, one a SAE."""
    from safetensors.torch import load_file

    from ..sae import SAE
    from ..sae.train import SAETrainConfig, SAETrainer

    o = json.loads(options)
    torch.set_num_threads(o["threads"])
    rows = load_file(rows_path)
    train, held = rows["train"], rows["held_out"]
    batch, n, kind = o["batch_size"], o.get("layers", 1), o.get("kind", "topk")
    width, k = train.size(1) // n, o["k"] if kind == "topk" else float(o["k"])

    class Batches:
        def batch(self, step: int) -> torch.Tensor:
            start = (step * batch) % (len(train) - batch + 1)
            return train[start:start + batch]

    config = SAETrainConfig(kind=kind, features=o["d_sae"], k=k, max_steps=o["steps"], batch_size=batch,
                            lr=o["lr"], warmup=o["warmup"], min_lr_ratio=o["min_lr_ratio"], eps=1e-8,
                            aux_coefficient=o["aux_coefficient"], dead_tokens=o["dead_steps"] * batch,
                            eval_every=0, save_every=0, progress=False, quiet=True, seed=o["seed"])
    saes = [SAE(width, o["d_sae"], kind=kind, k=k, seed=o["seed"] + i) for i in range(n)]
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = SAETrainer(saes if n > 1 else saes[0], Batches(), config, run_dir, offsets=[i * width for i in range(n)])
        seconds = []
        for _ in range(o["steps"]):
            start = time.perf_counter()
            trainer.train_step()
            seconds.append(time.perf_counter() - start)
        trainer.calibrate()
        trained = trainer.trained_saes()
    fves, l0s = [], []
    for i, sae in enumerate(trained):
        x = held[:, i * width:(i + 1) * width].float()
        with torch.no_grad():
            f = sae.encode(x)
            fves.append(1 - (x - sae.decode(f)).pow(2).sum().item() / (x - x.mean(0)).pow(2).sum().item())
            l0s.append((f > 0).sum(-1).float().mean().item())
    with open(out_path, "w") as handle:
        json.dump({"seconds": seconds, "fve": fves if n > 1 else fves[0], "l0": l0s if n > 1 else l0s[0]}, handle)


def run_worker(command: list[str]) -> dict:
    """A worker process's JSON result (its command ends in OUT.json OPTIONS), or RuntimeError with its stderr."""
    out = command[-2]
    run = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                         timeout=3600)
    if run.returncode != 0:
        raise RuntimeError(f"{Path(command[1]).name if len(command) > 1 else command[0]} failed: {run.stderr[-600:]}")
    return json.loads(Path(out).read_text())


def alternate_workers(train: torch.Tensor, held: torch.Tensor, options: dict, peer_worker: Path,
                      install: bool) -> tuple[dict[str, list[dict]], str]:
    """Each side's worker on the same rows (train [R, W], held out [H, W]) with the same options, in turn:
    anatomy, SAELens, SAELens, anatomy (anatomy twice when SAELens's environment is absent; install: make
    it, peers.py). Returns ({side: each of its runs' JSON}, how SAELens's environment was found or
    why not); the SAELens side is absent without it."""
    from safetensors.torch import save_file

    python, how = peer_python("saelens", install=install)
    with tempfile.TemporaryDirectory() as folder:
        rows_path = str(Path(folder) / "rows.safetensors")
        save_file({"train": train, "held_out": held}, rows_path)
        commands = {"anatomy": lambda out: [sys.executable, "-m", "anatomy.bench.sae_workers", rows_path, out,
                                            json.dumps(options)],
                    "SAELens": lambda out: [python, str(peer_worker), rows_path, out, json.dumps(options)]}
        order = ["anatomy", "SAELens", "SAELens", "anatomy"] if python else ["anatomy", "anatomy"]
        results: dict[str, list[dict]] = {side: [] for side in dict.fromkeys(order)}
        for i, side in enumerate(order):
            results[side].append(run_worker(commands[side](str(Path(folder) / f"{side}-{i}.json"))))
    return results, how


def smollm2_tokens(model) -> np.ndarray:
    """tinyshakespeare's first 400,000 characters as `model`'s token ids, from the repository's neighbour
    ../shared/data (a checkout); installed elsewhere, 80,000 random ids."""
    text = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "tinyshakespeare" / "input.txt"
    if not text.is_file():
        return np.random.default_rng(0).integers(0, model.config.vocab_size, 80_000)
    return np.asarray(model.tokenizer.encode(text.read_text(encoding="utf-8")[:400_000], add_special_tokens=False))


if __name__ == "__main__":
    anatomy_worker(*sys.argv[1:4])
