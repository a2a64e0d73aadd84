"""`anatomy train classify --ensemble-with RUN...`: the final evaluation scores the mean of the
members' class probabilities, each member reading --val with its own tokenizer."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from anatomy.cli import main
from anatomy.training.checkpoint import load_trained
from anatomy.training.ensemble import ensemble_metrics
from anatomy.training.trainer import read_metrics

POSITIVE = ["a great film", "truly lovely work", "great and lovely", "a fine lovely story", "great fun"]
NEGATIVE = ["an awful film", "truly dull work", "awful and dull", "a dull awful story", "dull mess"]
DEV = [("a lovely mess", "pos"), ("dull fun", "neg"), ("great work", "pos"), ("an awful story", "neg"),
       ("fine and dull", "neg"), ("truly great film", "pos"), ("a story", "pos"), ("awful fun", "neg")]


def _data(folder):
    rows = [(t, "pos") for t in POSITIVE] + [(t, "neg") for t in NEGATIVE]
    (folder / "train.tsv").write_text("sentence\tlabel\n" + "".join(f"{t}\t{l}\n" for t, l in rows * 10))
    (folder / "dev.tsv").write_text("sentence\tlabel\n" + "".join(f"{t}\t{l}\n" for t, l in DEV))


def _train(folder, out, seed, tokenizer, *extra):
    return main(["train", "classify", "--train", str(folder / "train.tsv"), "--val", str(folder / "dev.tsv"),
                 "--out", str(folder / out), "--cache-dir", str(folder / "cache"), "--tokenizer", tokenizer,
                 "--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--batch-size", "10", "--max-steps", "6",
                 "--lr", "3e-3", "--warmup", "2", "--eval-every", "0", "--seed", str(seed), "--quiet",
                 "--no-progress", *extra])


def _probabilities(run, texts):
    """Each text's class probabilities from a saved run, computed here one text at a time."""
    model, tok = load_trained(run / "model")
    rows = []
    with torch.no_grad():
        for text in texts:
            ids = torch.tensor([tok.encode(text, add_bos=True, add_eos=True)])
            rows.append(model(ids).logits.float().softmax(-1)[0])
    return torch.stack(rows)


def test_the_ensemble_is_the_mean_of_each_members_probabilities(tmp_path):
    _data(tmp_path)
    assert _train(tmp_path, "a", 1, "word") == 0
    assert _train(tmp_path, "b", 2, "char") == 0  # another vocabulary: each member tokenizes for itself
    assert _train(tmp_path, "c", 3, "word", "--ensemble-with", str(tmp_path / "a"), str(tmp_path / "b")) == 0

    names = json.loads((tmp_path / "c" / "labels.json").read_text())
    labels = torch.tensor([names.index(label) for _, label in DEV])
    texts = [text for text, _ in DEV]
    members = [_probabilities(tmp_path / run, texts) for run in ("a", "b", "c")]
    assert not torch.allclose(members[0], members[1], atol=1e-3)  # the members differ, so the mean matters
    mean = (members[0] + members[1] + members[2]) / 3
    final = read_metrics(tmp_path / "c")[-1]
    assert final["ensemble_accuracy"] == pytest.approx((mean.argmax(-1) == labels).float().mean().item())
    expected_loss = -mean[torch.arange(len(DEV)), labels].log().mean().item()
    assert final["ensemble_loss"] == pytest.approx(expected_loss, rel=1e-4)
    assert final["val_accuracy"] == pytest.approx((members[2].argmax(-1) == labels).float().mean().item())


def test_ensemble_metrics_average_probabilities_not_logits():
    sure = torch.tensor([[0.99, 0.01]])
    unsure = torch.tensor([[0.30, 0.70]])
    metrics = ensemble_metrics([sure, unsure], torch.tensor([0]))
    assert metrics["ensemble_accuracy"] == 1.0  # mean (0.645, 0.355): class 0
    assert metrics["ensemble_loss"] == pytest.approx(-torch.tensor(0.645).log().item())


def test_bad_members_are_refused_before_anything_is_trained(tmp_path, capsys):
    _data(tmp_path)
    (tmp_path / "half").mkdir()
    assert _train(tmp_path, "x", 1, "word", "--ensemble-with", str(tmp_path / "half")) == 2
    assert "not a finished `anatomy train classify` run" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()

    assert _train(tmp_path, "a", 1, "word") == 0
    code = main(["train", "classify", "--train", str(tmp_path / "train.tsv"), "--out", str(tmp_path / "y"),
                 "--ensemble-with", str(tmp_path / "a"), "--quiet"])
    assert code == 2 and "give --val" in capsys.readouterr().err
    assert not (tmp_path / "y").exists()

    code = main(["train", "classify", "--train", str(tmp_path / "train.tsv"), "--val", str(tmp_path / "dev.tsv"),
                 "--labels", "pos,neg", "--out", str(tmp_path / "z"), "--cache-dir", str(tmp_path / "cache"), "--tokenizer",
                 "word", "--max-steps", "2", "--ensemble-with", str(tmp_path / "a"), "--quiet", "--no-progress"])
    assert code == 2 and "an ensemble needs the same classes" in capsys.readouterr().err


def test_the_recipes_ensemble_variant_trains_two_members_and_scores_them(tmp_path):
    """recipes/sst2_scratch.sh VARIANT=ensemble: member-1 (learned positions) and member-2 (rotary), seeds
    SEED and SEED + 1, half the steps each, the second scored with the first."""
    _data(tmp_path)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "DATA": str(tmp_path), "VARIANT": "ensemble", "SEED": "5", "STEPS": "8"}
    recipe = Path(__file__).parents[2] / "recipes" / "sst2_scratch.sh"
    out = tmp_path / "runs"
    done = subprocess.run(["bash", str(recipe), str(out), "--vocab-size", "60", "--d-model", "16", "--n-layers", "1",
                           "--eval-every", "0", "--cache-dir", str(tmp_path / "cache"), "--quiet"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    first, second = (json.loads((out / m / "train_args.json").read_text()) for m in ("member-1", "member-2"))
    assert (first["seed"], second["seed"]) == (5, 6)
    assert first["max_steps"] == second["max_steps"] == 4
    assert (first["pos_encoding"], second["pos_encoding"]) == ("learned", "rotary")
    assert second["ensemble_with"] == [str(out / "member-1")] and not first["ensemble_with"]
    assert "ensemble_accuracy" in read_metrics(out / "member-2")[-1]
    assert "ensemble_accuracy" not in read_metrics(out / "member-1")[-1]
