"""The trainer: it learns, it resumes exactly, its checkpoints never half-load, its schedules are the paper's."""

import json

import pytest
import torch

import anatomy
from anatomy.cli import main
from anatomy.training import checkpoint as ckpt
from anatomy.training.schedules import inverse_sqrt, warmup_cosine
from anatomy.training.trainer import param_groups, read_metrics

TEXT = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n"


def train_lm(tmp_path, out="run", *extra):
    """`anatomy train lm` on a short text with a tiny model; returns the exit code."""
    data = tmp_path / "text.txt"
    if not data.exists():
        data.write_text(TEXT * 4)
    return main(["train", "lm", "--data", str(data), "--out", str(tmp_path / out), "--cache-dir", str(tmp_path / "cache"),
                 "--tokenizer", "char", "--context", "16", "--batch-size", "16", "--d-model", "64", "--n-layers", "2",
                 "--n-heads", "4", "--log-every", "1", "--eval-every", "0", "--no-progress", "--quiet", *extra])


def test_a_tiny_lm_memorizes_a_short_text(tmp_path):
    # seed 004's setting: words, <EOS> after each line; every word here has one successor, so the
    # loss can go to zero, and only a training loop that works gets it there
    line = "Four score and seven years ago our fathers brought forth on this continent a new nation"
    (tmp_path / "text.txt").write_text((line + "\n") * 40)
    assert train_lm(tmp_path, "run", "--tokenizer", "word", "--max-steps", "60", "--lr", "1e-2",
                    "--warmup", "10", "--d-model", "32") == 0
    losses = [r["loss"] for r in read_metrics(tmp_path / "run") if "loss" in r]
    assert losses[-1] < 0.1, losses[-10:]
    # the saved model and tokenizer say it back: greedy continuation of its first word
    model, tok = ckpt.load_trained(tmp_path / "run" / "model")
    ids = tok.encode("Four")
    with torch.no_grad():
        while ids[-1] != tok.eos_id and len(ids) < 16:
            ids.append(model(torch.tensor([ids])).logits[0, -1].argmax().item())
    assert tok.decode(ids) == line


def test_an_interrupted_run_resumed_has_the_same_loss_curve(tmp_path, monkeypatch):
    args = ["--max-steps", "24", "--save-every", "8", "--dropout", "0.1"]  # dropout: the torch RNG must resume too
    assert train_lm(tmp_path, "whole", *args) == 0
    whole = [r for r in read_metrics(tmp_path / "whole")]

    from anatomy.training.trainer import Trainer

    real_step = Trainer.train_step

    def dies_at_step_19(self):
        if self.step == 19:
            raise KeyboardInterrupt  # the kill: after the step-16 checkpoint, before the end
        return real_step(self)

    monkeypatch.setattr(Trainer, "train_step", dies_at_step_19)
    assert train_lm(tmp_path, "killed", *args) == 130  # interrupted, as the command reports a Ctrl-C
    monkeypatch.setattr(Trainer, "train_step", real_step)
    assert ckpt.find_checkpoint(tmp_path / "killed").name == "step-00000016"
    assert train_lm(tmp_path, "killed", *args, "--resume") == 0
    resumed = read_metrics(tmp_path / "killed")
    assert [r["step"] for r in resumed] == [r["step"] for r in whole]
    assert [r["loss"] for r in resumed if "loss" in r] == [r["loss"] for r in whole if "loss" in r]


def test_a_run_directory_with_checkpoints_is_not_overwritten_by_accident(tmp_path, capsys):
    assert train_lm(tmp_path, "run", "--max-steps", "2") == 0
    assert train_lm(tmp_path, "run", "--max-steps", "2") == 2
    assert "pass --resume" in capsys.readouterr().err


def _tiny_parts():
    model = anatomy.build_model(anatomy.ModelConfig(arch="decoder", vocab_size=11, d_model=16, n_heads=2,
                                                    n_layers=1, d_ff=32, max_seq_len=8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    return model, opt, sched


def test_a_crash_during_save_leaves_the_previous_checkpoint_in_charge(tmp_path, monkeypatch):
    model, opt, sched = _tiny_parts()
    ckpt.save_checkpoint(tmp_path, 1, model, opt, sched)
    real_save = torch.save

    def dies_half_way(obj, path, *a, **k):
        real_save(obj, path, *a, **k)
        with open(path, "r+b") as handle:  # half the bytes reached the disk, then the power went
            handle.truncate(handle.seek(0, 2) // 2)
        raise OSError("killed during save")

    monkeypatch.setattr(ckpt.torch, "save", dies_half_way)
    with pytest.raises(ckpt.CheckpointError, match=r"killed during save.*previous checkpoint \(step-00000001\) is kept"):
        ckpt.save_checkpoint(tmp_path, 2, model, opt, sched)
    monkeypatch.setattr(ckpt.torch, "save", real_save)
    assert ckpt.find_checkpoint(tmp_path).name == "step-00000001"
    assert not (tmp_path / "checkpoints" / "step-00000002").exists()
    assert ckpt.load_checkpoint(ckpt.find_checkpoint(tmp_path), *_tiny_parts())["step"] == 1


def test_a_damaged_latest_checkpoint_is_skipped_and_none_good_is_a_clear_error(tmp_path):
    model, opt, sched = _tiny_parts()
    ckpt.save_checkpoint(tmp_path, 1, model, opt, sched)
    ckpt.save_checkpoint(tmp_path, 2, model, opt, sched)
    weights = tmp_path / "checkpoints" / "step-00000002" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # truncated after the save
    with pytest.warns(UserWarning, match="step-00000002: model.safetensors has 100 bytes"):
        assert ckpt.find_checkpoint(tmp_path).name == "step-00000001"
    with pytest.raises(ckpt.CheckpointError, match="model.safetensors has 100 bytes"):
        ckpt.load_checkpoint(tmp_path / "checkpoints" / "step-00000002", model)
    (tmp_path / "checkpoints" / "step-00000001" / "manifest.json").unlink()
    with pytest.raises(ckpt.CheckpointError, match="no loadable checkpoint"):
        ckpt.find_checkpoint(tmp_path)


class Payload:
    def __reduce__(self):
        return (print, ("this ran while loading a checkpoint",))


def test_optimizer_state_is_loaded_without_unpickling_objects(tmp_path):
    model, opt, sched = _tiny_parts()
    path = ckpt.save_checkpoint(tmp_path, 1, model, opt, sched)
    torch.save({"optimizer": Payload()}, path / "optimizer.pt")
    manifest = json.loads((path / "manifest.json").read_text())  # even a consistent manifest does not help
    manifest["optimizer.pt"] = {"bytes": (path / "optimizer.pt").stat().st_size,
                                "sha256": ckpt._sha256(path / "optimizer.pt")}
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(Exception, match="[Ww]eights only load failed"):
        ckpt.load_checkpoint(path, model, opt, sched)


def test_inverse_sqrt_is_the_papers_formula():
    d_model, warmup = 512, 4000
    for step_num in (1, 100, 4000, 4001, 100000):
        paper = d_model ** -0.5 * min(step_num ** -0.5, step_num * warmup ** -1.5)
        assert inverse_sqrt(step_num - 1, d_model, warmup) == pytest.approx(paper)
    peak = max(range(10000), key=lambda s: inverse_sqrt(s, d_model, warmup))
    assert peak == warmup - 1  # rises for warmup steps, then decays


def test_warmup_cosine_rises_then_decays_to_the_floor():
    lrs = [warmup_cosine(s, warmup=10, max_steps=100, min_ratio=0.1) for s in range(120)]
    assert lrs[0] < lrs[9] and max(lrs) == pytest.approx(1.0, abs=0.01)
    assert lrs[100] == lrs[119] == 0.1 and all(a >= b for a, b in zip(lrs[10:100], lrs[11:101]))


def test_weight_decay_skips_norms_biases_and_embeddings():
    model = anatomy.build_model(anatomy.ModelConfig(arch="decoder", vocab_size=11, d_model=16, n_heads=2,
                                                    n_layers=1, d_ff=32, max_seq_len=8, pos_encoding="learned"))
    decay, no_decay = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() == 2 and "embedding" not in names[id(p)] for p in decay["params"])
    assert {names[id(p)] for p in no_decay["params"]} >= {n for n, p in model.named_parameters()
                                                          if p.dim() == 1 or "embedding" in n}
    assert sum(p.numel() for g in (decay, no_decay) for p in g["params"]) == \
        sum(p.numel() for p in model.parameters())


def test_bad_inputs_are_reported_by_the_command_not_as_a_traceback(tmp_path, capsys):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "a.de").write_text("eins\nzwei\n")
    (tmp_path / "a.en").write_text("one\n")
    (tmp_path / "t.tsv").write_text("sentence\tlabel\ngood\tpos\nbad\tneg\n")
    (tmp_path / "v.tsv").write_text("sentence\tlabel\nfine\tneutral\n")
    common = ["--cache-dir", str(tmp_path / "cache"), "--no-progress", "--max-steps", "1"]
    assert main(["train", "lm", "--data", str(tmp_path / "empty.txt"), "--out", str(tmp_path / "r1"), *common]) == 2
    assert "empty.txt is empty" in capsys.readouterr().err
    assert main(["train", "seq2seq", "--src", str(tmp_path / "a.de"), "--tgt", str(tmp_path / "a.en"),
                 "--tokenizer", "word", "--out", str(tmp_path / "r2"), *common]) == 2
    assert "a.de has 2, " in capsys.readouterr().err
    assert main(["train", "classify", "--train", str(tmp_path / "t.tsv"), "--val", str(tmp_path / "v.tsv"),
                 "--tokenizer", "word", "--out", str(tmp_path / "r3"), "--batch-size", "2", *common]) == 2
    assert "v.tsv:2: unknown label 'neutral'; allowed labels are 'neg', 'pos'" in capsys.readouterr().err


def test_accumulated_micro_batches_equal_one_large_batch(tmp_path):
    """2 micro-batches of 8 accumulated give the update of one batch of 16 (same rows, same order)."""
    from anatomy.training.trainer import LMTask, TrainConfig, Trainer

    rows = torch.randint(0, 20, (16, 9), generator=torch.Generator().manual_seed(0))

    class FixedRows(LMTask):
        def __init__(self, per_micro_batch):
            super().__init__(train=None)
            self.per = per_micro_batch

        def batch(self, k):
            start = (k % (16 // self.per)) * self.per
            block = rows[start:start + self.per]
            return {"input_ids": block[:, :-1], "labels": block[:, 1:]}

    finals = {}
    for per, accum in [(16, 1), (8, 2)]:
        model = anatomy.build_model(anatomy.ModelConfig(arch="decoder", vocab_size=20, d_model=16, n_heads=2,
                                                        n_layers=1, d_ff=32, max_seq_len=8), seed=0)
        config = TrainConfig(max_steps=3, batch_size=per, grad_accum=accum, lr=1e-2, warmup=1, eval_every=0,
                             log_every=1, progress=False, quiet=True)
        Trainer(model, FixedRows(per), config, tmp_path / f"run-{per}x{accum}").fit()
        finals[accum] = model.state_dict()
    for name, value in finals[1].items():
        torch.testing.assert_close(finals[2][name], value, atol=1e-5, rtol=1e-4, msg=name)
