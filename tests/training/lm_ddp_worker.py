"""One rank of the DDP test (launched by torchrun), or the single-process reference (imported).

Trains a tiny decoder for a few steps on a fixed token stream and writes this rank's final weights
and the logged losses to OUT/rank{r}.safetensors and OUT/rank{r}.json.
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

import anatomy
from anatomy.training import distributed
from anatomy.training.data import LMBatches
from anatomy.training.trainer import LMTask, TrainConfig, Trainer

STEPS = 6


def train(out: Path, batch_size: int, info: distributed.DistInfo) -> None:
    torch.set_num_threads(1)
    ids = (np.arange(3000) * 7 % 23).astype(np.uint16)  # a periodic stream: a learnable pattern
    torch.manual_seed(0)
    # no q/k/v biases: a key bias cannot change softmax, so its true gradient is 0 and Adam would
    # turn float round-off into full-size steps that differ with the order of summation
    model = anatomy.build_model(anatomy.ModelConfig(arch="decoder", vocab_size=23, d_model=32, n_heads=2,
                                                    n_layers=2, d_ff=64, max_seq_len=16, dropout=0.0,
                                                    attn_bias=False))
    task = LMTask(LMBatches(ids, 16, batch_size, seed=0, rank=info.rank, world_size=info.world_size))
    config = TrainConfig(max_steps=STEPS, batch_size=batch_size, lr=1e-2, warmup=1, log_every=1, eval_every=0,
                         quiet=True, progress=False)
    history = Trainer(model, task, config, out / "run", info).fit()
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out / f"rank{info.rank}.safetensors"))
    (out / f"rank{info.rank}.json").write_text(json.dumps([r["loss"] for r in history if "loss" in r]))


if __name__ == "__main__":
    info = distributed.setup("cpu")
    try:
        train(Path(sys.argv[1]), int(sys.argv[2]), info)
    finally:
        distributed.cleanup()
