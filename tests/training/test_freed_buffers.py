"""`anatomy train` keeps freed buffers for the next step (heap.keep_freed_buffers): the optimizer step
of the char LM's Muon recipe stops faulting its temporaries in again, and the command sets it."""

import argparse
import subprocess
import sys

import pytest

STEPS = """
import resource, sys, torch
torch.set_num_threads(1)
from anatomy.heap import keep_freed_buffers
from anatomy.training.muon import Muon, ns_schedule
if sys.argv[1] == "keep":
    keep_freed_buffers()
generator = torch.Generator().manual_seed(0)
shapes = [(128, 128)] * 16 + [(336, 128)] * 8 + [(128, 336)] * 4  # the recipe's 28 block matrices
params = [torch.nn.Parameter(torch.randn(s, generator=generator)) for s in shapes]
for p in params:
    p.grad = torch.randn(p.shape, generator=generator)
optimizer = Muon(params, lr=5e-3, ns=ns_schedule("polar-express", 2, "gram"))
for _ in range(3):
    optimizer.step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    optimizer.step()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // 5)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and getrusage's page faults")
def test_a_step_reuses_the_memory_the_last_one_freed():
    faults = {mode: int(subprocess.run([sys.executable, "-c", STEPS, mode], capture_output=True, text=True,
                                       check=True).stdout) for mode in ("default", "keep")}
    if faults["default"] < 100:
        pytest.skip(f"this allocator reuses the freed memory anyway ({faults} page faults a step)")
    assert faults["keep"] < faults["default"] / 10, faults


def test_the_train_command_keeps_freed_buffers(monkeypatch, tmp_path):
    """run() sets it before anything is built: checked by recording the call, then stopping the run at
    the first thing it does after (the distributed setup)."""
    from anatomy import heap
    from anatomy.training import cli, distributed

    calls = []
    monkeypatch.setattr(heap, "keep_freed_buffers", lambda: calls.append("keep"))

    def stop(device):
        calls.append("setup")
        raise RuntimeError("stopped here")

    monkeypatch.setattr(distributed, "setup", stop)
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    data = tmp_path / "text.txt"
    data.write_text("to be or not to be " * 200)
    args = parser.parse_args(["lm", "--data", str(data), "--out", str(tmp_path / "run"), "--max-steps", "1"])
    with pytest.raises(RuntimeError, match="stopped here"):
        cli.run(args)
    assert calls == ["keep", "setup"]
