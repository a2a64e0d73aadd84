"""Checkpoint averaging: the final model is the mean of the last N checkpoints' weights, exactly."""

import pytest
import torch
from safetensors.torch import load_file

from anatomy.checkpoints.files import CheckpointError
from anatomy.training import checkpoint as ckpt
from anatomy.training.averaging import average_checkpoints, last_checkpoints
from anatomy.training.trainer import read_metrics

from test_trainer import train_lm


def test_the_final_model_is_the_mean_of_the_last_checkpoints_weights(tmp_path):
    args = ["--max-steps", "12", "--save-every", "3", "--keep", "4", "--average-last", "3", "--eval-every", "0"]
    assert train_lm(tmp_path, "run", *args) == 0
    kept = sorted((tmp_path / "run" / "checkpoints").glob("step-*"))
    assert [p.name for p in kept] == ["step-00000003", "step-00000006", "step-00000009", "step-00000012"]
    saved = [load_file(p / "model.safetensors") for p in kept[1:]]  # the last three, read without anatomy
    model, _ = ckpt.load_trained(tmp_path / "run" / "model")
    final = model.state_dict()  # a tied weight under both its names
    for name, tensors in ((n, [s[n] for s in saved]) for n in saved[0]):
        mean = (sum(t.double() for t in tensors) / 3).float()
        torch.testing.assert_close(final[name].detach(), mean, rtol=0, atol=0, msg=name)
        assert not torch.equal(tensors[0], tensors[-1])  # the checkpoints differ: the mean is no copy
    averaged = [r for r in read_metrics(tmp_path / "run") if "averaged_checkpoints" in r]
    assert len(averaged) == 1 and averaged[0]["averaged_checkpoints"] == 3 and averaged[0]["step"] == 12
    assert "val_loss" in averaged[0]


def test_too_few_checkpoints_to_average_is_refused_before_and_after_training(tmp_path, capsys):
    assert train_lm(tmp_path, "a", "--max-steps", "4", "--average-last", "3") == 2  # --keep 2 by default
    assert "give --keep 3 or more (now 2) and --save-every above 0" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()
    assert train_lm(tmp_path, "b", "--max-steps", "4", "--save-every", "4") == 0
    with pytest.raises(CheckpointError, match="the last 2 checkpoints needs 2 .* and 1 verify"):
        last_checkpoints(tmp_path / "b", 2)
    with pytest.raises(CheckpointError, match="no checkpoints to average"):
        average_checkpoints(ckpt.load_trained(tmp_path / "b" / "model")[0], [])
