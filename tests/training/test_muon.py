"""anatomy's Muon: Jordan's schedule steps exactly as torch.optim.Muon, each schedule applies its
polynomials in order to every singular value, and a stacked momentum survives save and load."""

import io
import json

import pytest
import torch

import anatomy
from anatomy.training.choices import NS_SCHEDULES
from anatomy.training.muon import NS_COEFFICIENTS, Muon, ns_schedule, orthogonalize
from anatomy.training.optimizers import make_optimizer
from anatomy.training.trainer import TrainConfig


def matrices(seed=0):
    """Square, wide and tall matrices, two of each shape, with gradients."""
    generator = torch.Generator().manual_seed(seed)
    shapes = [(16, 16), (16, 16), (16, 40), (16, 40), (40, 16), (40, 16)]
    params = [torch.nn.Parameter(torch.randn(*s, generator=generator)) for s in shapes]
    return params, generator


def test_jordans_schedule_steps_exactly_as_torch_muon():
    mine, generator = matrices()
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in mine]
    ours = Muon(mine, lr=0.02, weight_decay=0.1, ns=ns_schedule("jordan", 5))
    reference = torch.optim.Muon(theirs, lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    for _ in range(3):
        for a, b in zip(mine, theirs):
            a.grad = torch.randn(a.shape, generator=generator)
            b.grad = a.grad.clone()
        ours.step()
        reference.step()
    for a, b in zip(mine, theirs):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(ours.state[a]["momentum_buffer"], reference.state[b]["momentum_buffer"],
                                   rtol=0, atol=0)


@pytest.mark.parametrize("name,steps,norm", [("jordan", 5, "frobenius"), ("polar-express", 3, "frobenius"),
                                            ("polar-express", 10, "frobenius"), ("polar-express", 3, "gram"),
                                            ("polar-express", 2, "gram")])  # two: on the Gram matrix alone
def test_each_schedule_applies_its_polynomials_in_order_to_every_singular_value(name, steps, norm):
    # a diagonal matrix's singular values are its entries; each iteration maps s -> a s + b s^3 + c s^5,
    # after G is divided by h (sum s^2)^(1/2) ("frobenius") or h (sum s^8)^(1/8) ("gram")
    values = [1.0, 0.5, 0.1, 0.02, 0.003]
    schedule = ns_schedule(name, steps, norm)
    headroom, coefficients, _ = schedule
    power = 2 if norm == "frobenius" else 8
    scale = headroom * sum(v**power for v in values) ** (1 / power)
    expected = []
    for v in values:
        s = v / scale
        for a, b, c in coefficients:
            s = a * s + b * s**3 + c * s**5
        expected.append(s)
    G = torch.zeros(5, 7, dtype=torch.float64)
    G[range(5), range(5)] = torch.tensor(values, dtype=torch.float64)
    for stack in (G[None], G.mT[None]):  # wide, and tall (transposed inside)
        out = orthogonalize(stack, schedule, dtype=torch.float64)[0]
        diagonal = (out if out.shape == (5, 7) else out.mT)[range(5), range(5)]
        assert diagonal.tolist() == pytest.approx(expected, rel=1e-9)
    if steps == 10:  # Polar Express converges: every singular value above 1e-3 x the norm ends at 1
        assert expected == pytest.approx([1.0] * 5, abs=1e-3)


@pytest.mark.parametrize("norm", ["frobenius", "gram"])
def test_a_zero_or_tiny_gradient_comes_out_finite(norm):
    G = torch.zeros(3, 8, 12)
    G[1] = 1e-12 * torch.randn(8, 12, generator=torch.Generator().manual_seed(0))  # s^4 underflows in bfloat16
    G[2] = torch.randn(8, 12, generator=torch.Generator().manual_seed(1))
    out = orthogonalize(G, ns_schedule("polar-express", 2, norm))
    assert torch.isfinite(out).all() and not out[0].any()
    assert torch.linalg.svdvals(out[2]).max() < 2  # the largest singular value came in below 1, and stayed bounded


def test_a_schedule_is_its_table_then_its_last_entry_repeated():
    assert set(NS_COEFFICIENTS) == set(NS_SCHEDULES)
    headroom, coefficients, norm = ns_schedule("polar-express", 10)
    assert headroom == 1.01 and coefficients[7:] == [(1.875, -1.25, 0.375)] * 3 and norm == "frobenius"
    assert coefficients[0] == pytest.approx((8.28721201814563 / 1.01, -23.595886519098837 / 1.01**3,
                                             17.300387312530933 / 1.01**5))
    assert ns_schedule("jordan", 3, "gram") == (1.0, [(3.4445, -4.7750, 2.0315)] * 3, "gram")
    with pytest.raises(ValueError, match="choose one of jordan, polar-express"):
        ns_schedule("newton", 5)
    with pytest.raises(ValueError, match="choose one of frobenius, gram"):
        ns_schedule("jordan", 5, "spectral")
    with pytest.raises(ValueError, match="at least 1"):
        ns_schedule("jordan", 0)
    with pytest.raises(ValueError, match="weight matrices only"):
        Muon([torch.nn.Parameter(torch.zeros(3))])


def test_a_loaded_state_continues_exactly_as_the_saved_one():
    first, generator = matrices()
    second = [torch.nn.Parameter(p.detach().clone()) for p in first]
    schedule = ns_schedule("polar-express", 3)
    a, b = Muon(first, lr=0.01, ns=schedule), Muon(second, lr=0.01, ns=schedule)
    grads = [[torch.randn(p.shape, generator=generator) for p in first] for _ in range(3)]
    for step in range(2):
        for p, q, g in zip(first, second, grads[step]):
            p.grad, q.grad = g.clone(), g.clone()
        a.step()
        b.step()
    buffer = io.BytesIO()  # through bytes, as a checkpoint: a state_dict's tensors are the optimizer's own
    torch.save(a.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    assert [tuple(s["momentum_buffer"].shape) for s in saved["state"].values()] == [tuple(p.shape) for p in first]
    b.load_state_dict(saved)  # replaces b's stacked buffers: the next step must rebuild the stack from them
    for p, q, g in zip(first, second, grads[2]):
        p.grad, q.grad = g.clone(), g.clone()
    a.step()
    b.step()
    for p, q in zip(first, second):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_the_training_options_choose_the_schedule():
    model = anatomy.build_model(anatomy.ModelConfig(arch="decoder", vocab_size=11, d_model=16, n_heads=2,
                                                    n_layers=1, d_ff=24, max_seq_len=8), seed=0)
    config = TrainConfig(optimizer="muon", ns_coefficients="polar-express", ns_steps=3, ns_norm="gram")
    muon = make_optimizer(model, config, torch.device("cpu")).members[0]
    assert all(group["ns"] == ns_schedule("polar-express", 3, "gram") for group in muon.param_groups)


def test_the_command_line_takes_the_schedule_and_names_a_wrong_one(tmp_path, capsys):
    from test_trainer import train_lm

    flags = ["--optimizer", "muon", "--ns-coefficients", "polar-express", "--ns-steps", "2", "--ns-norm", "gram"]
    assert train_lm(tmp_path, "run", "--max-steps", "2", *flags) == 0
    saved = json.loads((tmp_path / "run" / "train_args.json").read_text())
    assert (saved["ns_coefficients"], saved["ns_steps"], saved["ns_norm"]) == ("polar-express", 2, "gram")
    with pytest.raises(SystemExit) as exit:  # argparse's exit, status 2, naming the choices
        train_lm(tmp_path, "bad", "--optimizer", "muon", "--ns-norm", "spectral")
    assert exit.value.code == 2 and "'frobenius', 'gram'" in capsys.readouterr().err
