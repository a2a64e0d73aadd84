"""The optimizers and LR schedules `anatomy train` offers: layer-wise LR decay gives each depth its
rate, Muon takes exactly the blocks' matrices and resumes exactly, WSD and linear decay are their formulas."""

import pytest
import torch

import anatomy
from anatomy.training.optimizers import Optimizers, layer_depths, make_optimizer, param_groups
from anatomy.training.schedules import make_scheduler, warmup_stable_decay
from anatomy.training.trainer import TrainConfig, read_metrics

from test_trainer import train_lm


def encoder(n_layers=3):
    return anatomy.build_model(anatomy.ModelConfig(arch="encoder", vocab_size=11, d_model=16, n_heads=2,
                                                   n_layers=n_layers, d_ff=32, max_seq_len=8, pos_encoding="learned",
                                                   head="sequence-classification", num_labels=2), seed=0)


@pytest.mark.parametrize("decay, head", [(0.5, 1.0), (0.5, 10.0), (1.0, 10.0)])
def test_layer_decay_gives_each_depth_its_rate_and_the_head_its_own(decay, head):
    model = encoder(n_layers=3)
    lr = 1e-3
    optimizer = make_optimizer(model, TrainConfig(lr=lr, layer_decay=decay, head_lr_scale=head), torch.device("cpu"))
    rate = {id(p): group["lr"] for group in optimizer.param_groups for p in group["params"]}
    for name, p in model.named_parameters():
        if "embedding" in name:
            depth = 0  # below every block: decay^(L + 1)
        elif name.startswith("blocks."):
            depth = int(name.split(".")[1]) + 1
        else:  # the final norm and the classifier
            depth = 4
        assert rate[id(p)] == pytest.approx(lr * (head if depth == 4 else decay ** (4 - depth))), name
    # every parameter in exactly one group, and the scheduler scales every group's rate alike
    assert sorted(rate) == sorted(id(p) for p in model.parameters())
    scheduler = make_scheduler(optimizer, "linear", warmup=0, max_steps=10, min_ratio=0.0)
    optimizer.step()
    scheduler.step()
    for group in optimizer.param_groups:
        assert group["lr"] == pytest.approx(lr * group["lr_scale"] * 0.9)


def test_without_layer_decay_the_groups_are_decay_and_no_decay():
    groups = param_groups(encoder(), 0.1)
    assert [(g["weight_decay"], g["lr_scale"]) for g in groups] == [(0.1, 1.0), (0.0, 1.0)]
    with pytest.raises(ValueError, match="layer_decay must be in"):
        param_groups(encoder(), 0.1, layer_decay=0.0)
    with pytest.raises(ValueError, match="head_lr_scale must be above 0"):
        param_groups(encoder(), 0.1, head_lr_scale=0.0)


def test_muon_takes_the_blocks_matrices_and_steps_as_torch_muon_alone():
    model = encoder(n_layers=2)
    depths, top = layer_depths(model)
    optimizer = make_optimizer(model, TrainConfig(optimizer="muon", lr=1e-2, weight_decay=0.1), torch.device("cpu"))
    muon, adamw = optimizer.members
    without_decay = make_optimizer(encoder(n_layers=2), TrainConfig(optimizer="muon", weight_decay=0.0),
                                   torch.device("cpu")).members[0]
    assert sum(len(g["params"]) for g in without_decay.param_groups) == 12  # q, k, v, o, fc_in, fc_out, 2 blocks
    names = {id(p): n for n, p in model.named_parameters()}
    in_muon = {names[id(p)] for g in muon.param_groups for p in g["params"]}
    assert in_muon == {n for n, p in model.named_parameters() if p.dim() == 2 and n.startswith("blocks.")}
    assert not in_muon & {names[id(p)] for g in adamw.param_groups for p in g["params"]}
    # one step of the pair moves the matrices exactly as torch.optim.Muon alone would
    copy = encoder(n_layers=2)
    reference = torch.optim.Muon([p for n, p in copy.named_parameters() if n in in_muon], lr=1e-2,
                                 weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    ids = torch.tensor([[1, 2, 3, 4]])
    for net in (model, copy):
        net(ids).logits.sum().backward()
    optimizer.step()
    reference.step()
    mine, theirs = dict(model.named_parameters()), dict(copy.named_parameters())
    for name in in_muon:
        torch.testing.assert_close(mine[name], theirs[name], rtol=0, atol=0, msg=name)
    assert not torch.equal(mine["classifier.weight"], theirs["classifier.weight"])  # AdamW moved the head


def test_the_pair_saves_and_loads_its_members_state():
    model = encoder()
    optimizer = make_optimizer(model, TrainConfig(optimizer="muon"), torch.device("cpu"))
    assert isinstance(optimizer, Optimizers)
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimizer.step()
    other = make_optimizer(encoder(), TrainConfig(optimizer="muon"), torch.device("cpu"))
    other.load_state_dict(optimizer.state_dict())
    assert len(other.state) == len(optimizer.state) == sum(1 for p in model.parameters())
    with pytest.raises(ValueError, match="this optimizer has 2"):
        other.load_state_dict({"0": optimizer.state_dict()["0"]})


def test_a_muon_run_resumed_after_a_kill_has_the_same_loss_curve(tmp_path, monkeypatch):
    args = ["--max-steps", "12", "--save-every", "4", "--optimizer", "muon", "--schedule", "wsd", "--warmup", "2"]
    assert train_lm(tmp_path, "whole", *args) == 0
    from anatomy.training.trainer import Trainer

    real_step = Trainer.train_step

    def dies_at_step_10(self):
        if self.step == 10:
            raise KeyboardInterrupt
        return real_step(self)

    monkeypatch.setattr(Trainer, "train_step", dies_at_step_10)
    assert train_lm(tmp_path, "killed", *args) == 130
    monkeypatch.setattr(Trainer, "train_step", real_step)
    assert train_lm(tmp_path, "killed", *args, "--resume") == 0
    losses = [[r["loss"] for r in read_metrics(tmp_path / run) if "loss" in r] for run in ("whole", "killed")]
    assert losses[0] == losses[1] and len(losses[0]) == 12


def test_wsd_holds_then_falls_in_a_straight_line_and_linear_is_wsd_decaying_throughout():
    lrs = [warmup_stable_decay(s, warmup=10, max_steps=100, min_ratio=0.0, decay_steps=20) for s in range(110)]
    assert lrs[0] == pytest.approx(1 / 11) and lrs[9] == pytest.approx(10 / 11)
    assert lrs[10:80] == [1.0] * 70
    assert lrs[90] == pytest.approx(0.5) and lrs[100] == lrs[109] == 0.0
    steps = [lrs[s] - lrs[s + 1] for s in range(80, 100)]
    assert steps == pytest.approx([0.05] * 20)  # a straight line
    model = encoder()
    for name, fraction in (("linear", 0.3), ("wsd", 1.0)):
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        scheduler = make_scheduler(optimizer, name, warmup=0, max_steps=50, min_ratio=0.1, decay_fraction=fraction)
        curve = []
        for _ in range(50):
            curve.append(scheduler.get_last_lr()[0])
            optimizer.step()
            scheduler.step()
        assert curve == pytest.approx([1.0 - 0.9 * s / 50 for s in range(50)]), name
    with pytest.raises(ValueError, match="decay_fraction must be in"):
        make_scheduler(torch.optim.SGD(model.parameters(), lr=1.0), "wsd", warmup=0, max_steps=5, decay_fraction=0)


def test_a_run_with_layer_decay_logs_the_heads_rate(tmp_path):
    assert train_lm(tmp_path, "run", "--max-steps", "2", "--layer-decay", "0.5", "--schedule", "constant",
                    "--warmup", "0", "--lr", "1e-2") == 0
    assert [r["lr"] for r in read_metrics(tmp_path / "run") if "lr" in r] == [1e-2, 1e-2]
