"""--ema: the final model is the exponential moving average of the weights after every step, as
ema.py's equation says, computed here again in float64 from the weights each step left."""

import pytest
import torch

from anatomy.training import checkpoint as ckpt
from anatomy.training.trainer import Trainer, read_metrics

from test_trainer import train_lm


def test_the_final_model_is_the_moving_average_of_every_steps_weights(tmp_path, monkeypatch):
    seen = []  # the weights before the first step and after each one
    real_step = Trainer.train_step

    def recording(self):
        if not seen:
            seen.append({n: p.detach().double().clone() for n, p in self.model.named_parameters()})
        result = real_step(self)
        seen.append({n: p.detach().double().clone() for n, p in self.model.named_parameters()})
        return result

    monkeypatch.setattr(Trainer, "train_step", recording)
    # decay 0.5: the warm-up d_t = (1 + t) / (10 + t) rules steps 1-7, the decay itself steps 8-12
    assert train_lm(tmp_path, "run", "--max-steps", "12", "--ema", "0.5", "--eval-every", "0") == 0
    assert len(seen) == 13
    expected = dict(seen[0])
    for t in range(1, 13):
        d = min(0.5, (1 + t) / (10 + t))
        expected = {n: d * expected[n] + (1 - d) * seen[t][n] for n in expected}
    model, _ = ckpt.load_trained(tmp_path / "run" / "model")
    final = dict(model.named_parameters())
    for name, value in expected.items():
        torch.testing.assert_close(final[name].detach().double(), value, rtol=1e-6, atol=1e-7, msg=name)
        assert not torch.allclose(value, seen[-1][name])  # the average is not the last step's weights
    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records if "val_loss" in r] == [12, 12]
    assert "ema" not in records[-2] and records[-1]["ema"] == 0.5
    assert records[-1]["val_loss"] != records[-2]["val_loss"]  # the average was evaluated, not the last weights


def test_ema_is_refused_where_it_cannot_hold(tmp_path, capsys):
    with pytest.raises(SystemExit):  # argparse's refusal, exit 2
        train_lm(tmp_path, "a", "--max-steps", "4", "--ema", "1")
    assert "a decay of 1 never moves the average" in capsys.readouterr().err
    assert train_lm(tmp_path, "b", "--max-steps", "4", "--ema", "0.9", "--average-last", "2", "--keep", "2") == 2
    assert "--ema and --average-last 2 each make the final model" in capsys.readouterr().err
    assert train_lm(tmp_path, "c", "--max-steps", "4", "--ema", "0.9", "--resume") == 2
    assert "a resumed run cannot continue it" in capsys.readouterr().err
    assert not any((tmp_path / name).exists() for name in "abc")
