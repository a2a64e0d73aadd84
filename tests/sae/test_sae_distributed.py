"""Two gloo ranks train an SAE exactly like one process that sees the same global batch."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from anatomy.training import distributed

HERE = Path(__file__).parent
ROOT = HERE.parent.parent


@pytest.mark.slow
@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch built without distributed")
def test_two_ranks_match_each_other_and_one_process_with_the_same_global_batch(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             str(HERE / "sae_ddp_worker.py"), str(tmp_path / "ddp"), "128"],
                            env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    sys.path.insert(0, str(HERE))
    from sae_ddp_worker import train

    train(tmp_path / "single", 256, distributed.DistInfo(0, 1, 0, torch.device("cpu")))  # 1 rank x 256 = 2 x 128
    rank0, rank1 = (load_file(str(tmp_path / "ddp" / f"rank{r}.safetensors")) for r in (0, 1))
    single = load_file(str(tmp_path / "single" / "rank0.safetensors"))
    for name in single:
        assert torch.equal(rank0[name], rank1[name]), f"ranks diverged at {name}"
        torch.testing.assert_close(rank0[name], single[name], rtol=1e-4, atol=1e-5, msg=name)
    # the logged loss is rank 0's half of the batch; the weights, above, are the whole batch's
    assert len(json.loads((tmp_path / "ddp" / "rank0.json").read_text())) == 5
    assert (tmp_path / "ddp" / "run" / "metrics.jsonl").is_file() and not (tmp_path / "ddp" / "run1").exists()
    assert len(list((tmp_path / "ddp" / "run" / "checkpoints").glob("step-*"))) == 1
