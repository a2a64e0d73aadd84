"""Training: the sparse TopK step has the dense step's gradients; JumpReLU's estimator is the paper's;
the trained SAE recovers sparse data; scales fold exactly; a resumed run equals the uninterrupted one."""

from __future__ import annotations

import pytest
import torch

from anatomy.sae import SAE
from sae_data import SparseData  # tests/sae
from anatomy.sae.objectives import _JumpReLU, _Step, dense_step, mse, topk_step
from anatomy.sae.train import SAETrainConfig, SAETrainer, fold_scales


def _random(kind="topk", k=8, d_in=24, d_sae=96, apply=True, d_out=None, seed=0, skip=False):
    sae = SAE(d_in, d_sae, kind=kind, k=k, d_out=d_out, apply_b_dec_to_input=apply, seed=seed, skip=skip)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for parameter in sae.parameters():
            parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))
    return sae


@pytest.mark.parametrize("apply, transcoder", [(True, False), (False, False), (False, True)])
def test_the_sparse_topk_step_has_the_gradients_of_the_dense_one(apply, transcoder):
    sae = _random(apply=apply, d_out=20 if transcoder else None)
    x = torch.randn(50, 24, generator=torch.Generator().manual_seed(5))
    y = torch.randn(50, 20, generator=torch.Generator().manual_seed(6)) if transcoder else x
    dead = torch.zeros(96, dtype=torch.bool)
    dead[::3] = True
    loss, _ = topk_step(sae, x, y, dead, aux_k=12, aux_coefficient=1 / 32)
    ours = torch.autograd.grad(loss, [sae.W_enc, sae.b_enc, sae.W_dec, sae.b_dec])

    pre = (x - sae.b_dec if apply else x) @ sae.W_enc + sae.b_enc  # the textbook step, every product dense
    values, idx = pre.topk(8, dim=-1)
    recon = torch.zeros_like(pre).scatter(-1, idx, values.relu()) @ sae.W_dec + sae.b_dec
    aux_values, aux_idx = pre.masked_fill(~dead, float("-inf")).topk(12, dim=-1)
    predicted = torch.zeros_like(pre).scatter(-1, aux_idx, aux_values.relu()) @ sae.W_dec
    reference = mse(recon, y) + (1 / 32) * min(int(dead.sum()) / 12, 1.0) * mse(predicted, (y - recon).detach())
    assert torch.allclose(loss, reference, rtol=1e-6)
    for a, b in zip(ours, torch.autograd.grad(reference, [sae.W_enc, sae.b_enc, sae.W_dec, sae.b_dec])):
        assert (a - b).abs().max() <= 1e-5 * max(1.0, b.abs().max().item())


@pytest.mark.parametrize("skip", [False, True])
def test_the_sparse_batchtopk_step_has_the_gradients_of_the_dense_one(skip):
    """The textbook step, every product dense: batch_topk's [B, F] activations (modules.py) through W_dec, plus
    a skip transcoder's x W_skip^T; the sparse step must give its loss and every gradient."""
    from anatomy.sae.modules import batch_topk
    from anatomy.sae.objectives import batchtopk_step

    sae = SAE(24, 96, kind="batchtopk", k=5.0, d_out=20, transcoder=True, skip=skip, seed=0)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in sae.parameters():
            parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))
    x, y = torch.randn(50, 24, generator=generator), torch.randn(50, 20, generator=generator)
    dead = torch.zeros(96, dtype=torch.bool)
    dead[::4] = True
    params = [p for p in (sae.W_enc, sae.b_enc, sae.W_dec, sae.b_dec, sae.W_skip) if p is not None]
    loss, stats = batchtopk_step(sae, x, y, dead, aux_k=12, aux_coefficient=1 / 32)
    ours = torch.autograd.grad(loss, params)

    pre = x @ sae.W_enc + sae.b_enc
    acts = batch_topk(pre, 5.0)
    recon = acts @ sae.W_dec + sae.b_dec + (x @ sae.W_skip.T if skip else 0)
    aux_values, aux_idx = pre.masked_fill(~dead, float("-inf")).topk(12, dim=-1)
    predicted = torch.zeros_like(pre).scatter(-1, aux_idx, aux_values.relu()) @ sae.W_dec
    reference = mse(recon, y) + (1 / 32) * min(int(dead.sum()) / 12, 1.0) * mse(predicted, (y - recon).detach())
    assert torch.allclose(loss, reference, rtol=1e-6)
    assert stats["l0"] == (acts > 0).sum() / 50 and torch.equal(stats["fired"], (acts > 0).any(0))
    for a, b in zip(ours, torch.autograd.grad(reference, params)):
        assert (a - b).abs().max() <= 1e-5 * max(1.0, b.abs().max().item())


def test_jumprelu_straight_through_estimators_are_the_papers():
    """Rajamanoharan et al. 2024, eq. 11-12: d H(z - t)/dt = -(1/e) K((z - t)/e), d JumpReLU/dt = -(t/e) K(.),
    K the rectangle on (-1/2, 1/2); d JumpReLU/dz = H(z - t)."""
    z = torch.tensor([[0.10, 0.2004, 0.5, -0.3]], requires_grad=True)
    t = torch.tensor([0.2, 0.2, 0.2, 0.2], requires_grad=True)
    eps = 0.001
    (d_step,) = torch.autograd.grad(_Step.apply(z, t, eps).sum(), t)
    assert torch.allclose(d_step, torch.tensor([0.0, -1000.0, 0.0, 0.0]))
    d_z, d_t = torch.autograd.grad(_JumpReLU.apply(z, t, eps).sum(), [z, t])
    assert torch.allclose(d_t, torch.tensor([0.0, -200.0, 0.0, 0.0]))
    assert torch.equal(d_z, torch.tensor([[0.0, 1.0, 1.0, 0.0]]))


@pytest.mark.parametrize("kind, k, options", [("topk", 4, dict(lr=1e-2)), ("batchtopk", 4.0, dict(lr=1e-2)),
                                              ("relu", None, dict(l1=0.3)), ("jumprelu", None, dict(l0=0.3, bandwidth=0.05))])
def test_training_recovers_sparse_data(tmp_path, kind, k, options):
    """300 steps on rows that are sparse sums of 64 directions: most of the variance explained, with few
    features per row, decoder rows at unit norm."""
    data = SparseData()
    held = data.batch_of(10**6, 512)
    config = SAETrainConfig(**{"lr": 3e-3, **options}, kind=kind, features=96, k=k, max_steps=300, batch_size=256,
                            warmup=10, dead_tokens=5000, eval_every=0, save_every=0, progress=False, quiet=True)
    sae = SAE(24, 96, kind=kind, k=k, seed=0)
    trainer = SAETrainer(sae, data, config, tmp_path, eval_rows=held)
    trainer.fit()
    assert torch.allclose(sae.W_dec.norm(dim=-1), torch.ones(96), atol=1e-5)
    trained = trainer.trained_sae()
    with torch.no_grad():
        f = trained.encode(held)
        fve = 1 - (held - trained.decode(f)).pow(2).sum() / (held - held.mean(0)).pow(2).sum()
        untrained = SAE(24, 96, kind=kind, k=k, seed=0).eval()
        before = 1 - (held - untrained(held)).pow(2).sum() / (held - held.mean(0)).pow(2).sum()
    assert fve > 0.65 and before < 0.1, (fve, before)
    l0 = (f > 0).sum(-1).float().mean()
    assert l0 < 32, l0
    if kind == "topk":
        assert l0 == 4
    if kind == "batchtopk":  # the threshold calibrated at the end: k features a row on average, in use too
        assert 3 < l0 < 5.5, l0


def test_folded_scales_read_and_write_the_models_own_activations():
    """Trained on (c_in x -> c_out y), folded: it reads x and writes y. An SAE has c_in = c_out (it writes
    what it reads); a transcoder's scales differ, and so does each weight's share of them."""
    cases = [("topk", 6, None, False, 0.37, 0.37), ("jumprelu", None, None, False, 0.37, 0.37),
             ("relu", None, None, False, 0.37, 0.37), ("topk", 6, 20, True, 0.37, 2.5), ("jumprelu", None, 20, True, 3.1, 0.6)]
    for kind, k, d_out, skip, c_in, c_out in cases:
        sae = _random(kind, k, apply=d_out is None, d_out=d_out, skip=skip).eval()
        if kind == "jumprelu":
            with torch.no_grad():
                sae.threshold.uniform_(0, 0.05)
        x = 3 * torch.randn(40, 24)
        with torch.no_grad():
            scaled_f = sae.encode(c_in * x)
            expected = sae.decode(scaled_f, c_in * x) / c_out
            folded = fold_scales(_clone(sae), c_in, c_out)
            assert torch.allclose(folded.encode(x), scaled_f / c_out, atol=1e-4), kind
            assert torch.allclose(folded.decode(folded.encode(x), x), expected, atol=1e-4), kind


def _clone(sae):
    import copy

    return copy.deepcopy(sae)


def test_a_resumed_run_is_the_uninterrupted_run(tmp_path):
    """Killed after step 7 (a checkpoint at step 5), resumed: every weight equals the uninterrupted run's."""
    config = dict(kind="topk", features=96, k=4, max_steps=12, batch_size=256, lr=3e-3, warmup=2, dead_tokens=500,
                  eval_every=0, progress=False, quiet=True)
    straight = SAE(24, 96, kind="topk", k=4, seed=0)
    uninterrupted = SAETrainer(straight, SparseData(), SAETrainConfig(**config, save_every=0), tmp_path / "a")
    uninterrupted.fit()

    class Killed(Exception):
        pass

    class DiesAtStep8(SparseData):
        def batch(self, step):
            if step == 7:
                raise Killed
            return super().batch(step)

    with pytest.raises(Killed):
        SAETrainer(SAE(24, 96, kind="topk", k=4, seed=0), DiesAtStep8(), SAETrainConfig(**config, save_every=5),
                   tmp_path / "b").fit()
    resumed = SAE(24, 96, kind="topk", k=4, seed=99)  # other weights: all must come from the checkpoint
    trainer = SAETrainer(resumed, SparseData(), SAETrainConfig(**config, save_every=5), tmp_path / "b", resume=True)
    assert trainer.step == 5
    trainer.fit()
    for a, b in zip(straight.state_dict().values(), resumed.state_dict().values()):
        assert torch.equal(a, b)
    assert torch.equal(trainer.members[0].tokens_since_fired, uninterrupted.members[0].tokens_since_fired)
    assert [r["loss"] for r in trainer.history if "loss" in r] == [r["loss"] for r in uninterrupted.history if "loss" in r]


@pytest.mark.parametrize("shape, count", [((64, 300), 1000), ((8, 50), 390), ((1, 5), 5), ((100, 100), 1)])
def test_largest_finds_the_entries_topk_finds(shape, count):
    """The threshold read from a sample only narrows the search: the same entries as topk, whether the sample
    overestimates the threshold (then topk itself) or not."""
    from anatomy.sae.objectives import largest

    values = torch.randn(shape, generator=torch.Generator().manual_seed(count)).flatten()
    indices, chosen = largest(values, count)
    expected = values.topk(count).indices
    assert torch.equal(indices.sort().values, expected.sort().values)
    assert torch.equal(chosen, values[indices])


def test_a_batchtopk_threshold_is_calibrated_on_the_final_weights(tmp_path):
    """After a short run, when the moving average still lags the activations, the threshold is measured
    again with the final weights: in use, the SAE keeps about k features a row on the batches it last saw."""
    data = SparseData()
    config = SAETrainConfig(kind="batchtopk", features=96, k=4.0, max_steps=25, batch_size=256, lr=1e-2, warmup=2,
                            eval_every=0, save_every=0, progress=False, quiet=True)
    sae = SAE(24, 96, kind="batchtopk", k=4.0, seed=0)
    trainer = SAETrainer(sae, data, config, tmp_path)
    trainer.fit()
    member = trainer.members[0]
    with torch.no_grad():
        x = torch.cat([member.split(data.batch(step))[0] for step in range(17, 25)])
        sae.eval()
        l0 = (sae.encode(x) > 0).sum(-1).float().mean().item()
    assert 3.2 < l0 < 4.8, l0
