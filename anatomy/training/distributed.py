"""DistributedDataParallel, the minimum: who am I, on which device, and summing across ranks.

Launch any `anatomy train` command under `torchrun --nproc_per_node=N`: torchrun sets RANK,
WORLD_SIZE, LOCAL_RANK and MASTER_ADDR/PORT, and `setup` joins the group: NCCL when each rank
has a GPU, gloo on CPU. Each rank reads its own slice of every global batch (see data.py);
DDP averages gradients during backward, so all ranks take the same step. Only rank 0 writes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def setup(device: str = "auto") -> DistInfo:
    """Join the process group if launched by torchrun (WORLD_SIZE > 1); pick this rank's device."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() if device == "auto" else device.startswith("cuda")
    dev = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu") if device in ("auto", "cuda") \
        else torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
    return DistInfo(rank, world_size, local_rank, dev)


def is_main() -> bool:
    """Rank 0, or not distributed at all."""
    return not dist.is_initialized() or dist.get_rank() == 0


def cleanup() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """The sum over ranks (a no-op copy when not distributed)."""
    values = values.clone()
    if dist.is_initialized():
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()
