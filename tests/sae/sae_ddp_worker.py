"""One rank of tests/sae/test_sae_distributed.py: train a TopK SAE on its slice of every global batch, save its weights.

    python -m torch.distributed.run --standalone --nproc_per_node=2 sae_ddp_worker.py OUT ROWS_PER_RANK
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from anatomy.sae import SAE
from anatomy.sae.train import SAETrainConfig, SAETrainer
from anatomy.training import distributed
from sae_data import SparseData


class Slice(SparseData):
    """This rank's rows of the global batch of 2 x rows."""

    def __init__(self, rows: int, rank: int, world: int):
        super().__init__(batch=rows * world)
        self.rank, self.share = rank, rows

    def batch(self, step):
        return super().batch(step)[self.rank * self.share:(self.rank + 1) * self.share]


def train(out: Path, rows: int, info) -> None:
    config = SAETrainConfig(kind="topk", features=64, k=4, max_steps=5, batch_size=rows, lr=3e-3, warmup=1,
                            dead_tokens=300, eval_every=0, save_every=5, log_every=1, progress=False, quiet=True)
    sae = SAE(24, 64, kind="topk", k=4, seed=0)
    trainer = SAETrainer(sae, Slice(rows, info.rank, info.world_size), config, out / "run", dist=info)
    history = trainer.fit()
    save_file({k: v.contiguous() for k, v in sae.state_dict().items()}, str(out / f"rank{info.rank}.safetensors"))
    (out / f"rank{info.rank}.json").write_text(json.dumps([r["loss"] for r in history if "loss" in r]))


if __name__ == "__main__":
    info = distributed.setup("cpu")
    try:
        train(Path(sys.argv[1]), int(sys.argv[2]), info)
    finally:
        distributed.cleanup()
