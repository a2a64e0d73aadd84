"""Integrated gradients is complete and equals Captum's; gradient x input is the integrand at the
input; attention rollout follows Abnar & Zuidema 2020 and its rows are distributions."""

from __future__ import annotations

import pytest
import torch

import anatomy
from analysis_models import FAMILIES, ids, tiny


@pytest.mark.parametrize("family", ["decoder", "encoder", "encoder-decoder"])
def test_integrated_gradients_is_complete(family):
    model = tiny(**FAMILIES[family])
    inputs = (ids(2, 7, seed=1), ids(2, 5, seed=2)) if family == "encoder-decoder" else ids(2, 8)
    result = anatomy.integrated_gradients(model, inputs, target=3, steps=64)
    delta = result.extra["f_input"] - result.extra["f_baseline"]
    torch.testing.assert_close(result.values.sum(-1), delta.float(), atol=1e-3 * delta.abs().max().item(), rtol=0)
    assert result.error < 1e-3 and "completeness" in result.check


def test_integrated_gradients_equals_captum():
    captum = pytest.importorskip("captum.attr")
    model = tiny()
    x, baseline = ids(2, 8), torch.full((2, 8), 4)
    ours = anatomy.integrated_gradients(model, x, target=3, baseline_ids=baseline, steps=20, steps_per_pass=7)
    layer_ig = captum.LayerIntegratedGradients(lambda i: model(i).logits[:, -1, 3], model.token_embedding)
    theirs = layer_ig.attribute(x, baselines=baseline, n_steps=20, method="gausslegendre")
    scale = theirs.abs().max()
    torch.testing.assert_close(ours.extra["per_dim"], theirs.detach(), atol=1e-3 * scale.item(), rtol=0)


def spiky_path_model() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor, int]:
    """A Llama-style model whose baseline embedding is nearly the negative of the last input token's,
    so that the straight path passes close to zero, where RMSNorm's x / rms(x) turns round and the
    gradient spikes (what real models do between a padding embedding and a word's: measured on
    SmolLM2). The embeddings are scaled to a real model's size relative to RMSNorm's eps.
    Returns (model, ids, baseline ids, the predicted token)."""
    model = tiny(**FAMILIES["decoder-llama"])
    x, baseline = ids(1, 6, seed=3), torch.full((1, 6), 5)
    with torch.no_grad():
        table = model.token_embedding.weight
        table.mul_(30)
        noise = torch.randn(table.size(1), generator=torch.Generator().manual_seed(0))
        table[5] = -0.97 * table[x[0, -1]] + 0.01 * noise
    return model, x, baseline, int(model(x).logits[0, -1].argmax())


def test_integrated_gradients_place_their_points_until_complete():
    model, x, baseline, target = spiky_path_model()
    fixed = anatomy.integrated_gradients(model, x, target, baseline_ids=baseline, steps=50)
    adaptive = anatomy.integrated_gradients(model, x, target, baseline_ids=baseline)
    reference = anatomy.integrated_gradients(model, x, target, baseline_ids=baseline, steps=3000)
    assert fixed.error > 0.05 and "not converged" in fixed.check  # Captum's default misses the spike
    assert adaptive.error <= 0.05 and adaptive.extra["converged"] and "not converged" not in adaptive.check
    assert f"{adaptive.extra['steps']} gradients" in adaptive.check
    assert reference.error < 1e-3
    # Not completeness by luck: each token's share is the fine rule's, within the tolerance.
    scale = reference.values.abs().sum()
    assert (adaptive.values - reference.values).abs().max() <= 0.05 * scale
    assert (fixed.values - reference.values).abs().max() > (adaptive.values - reference.values).abs().max()


def test_the_adaptive_rule_says_when_it_ran_out_of_steps():
    model, x, baseline, target = spiky_path_model()
    capped = anatomy.integrated_gradients(model, x, target, baseline_ids=baseline, tolerance=1e-9, max_steps=80)
    assert capped.extra["steps"] <= 80 and not capped.extra["converged"] and "not converged" in capped.check


def test_gradient_x_input_by_hand():
    model = tiny()
    x = ids(1, 6)
    embedded = model.token_embedding(x).detach().requires_grad_(True)
    with anatomy.trace(model, [], interventions={"embed": lambda _: embedded}):
        logit = model(x).logits[0, -1, 3]
    (grad,) = torch.autograd.grad(logit, embedded)
    result = anatomy.gradient_x_input(model, x, target=3)
    torch.testing.assert_close(result.values, (grad * embedded).sum(-1).detach())


def test_rollout_follows_abnar_and_zuidema():
    model = tiny()
    x = ids(2, 7)
    with torch.no_grad(), anatomy.trace(model, "*attn.pattern") as t:
        model(x)
    eye = torch.eye(7)
    step = [0.5 * t[f"blocks.{i}.attn.pattern"].mean(1) + 0.5 * eye for i in range(2)]
    step = [a / a.sum(-1, keepdim=True) for a in step]
    result = anatomy.attention_rollout(model, x)
    torch.testing.assert_close(result.values[0], step[0])
    torch.testing.assert_close(result.values[1], step[1] @ step[0])
    torch.testing.assert_close(result.values.sum(-1), torch.ones(2, 2, 7))
    assert torch.all(result.values[-1].triu(1) == 0)  # causal: no flow from the future


def test_rollout_runs_through_cross_attention():
    model = tiny(**FAMILIES["encoder-decoder"])
    source, target = ids(1, 6, seed=1), ids(1, 4, seed=2)
    result = anatomy.attention_rollout(model, (source, target))
    final = result.values[-1, 0]  # [source + target, source + target]
    torch.testing.assert_close(final.sum(-1), torch.ones(10))
    assert torch.all(final[6:, :6].sum(-1) > 0.2)  # each target token takes part of its flow from the source
    assert torch.all(final[:6, 6:] == 0)  # and the source never from the target
    assert len(result.tokens[0]) == 10


def test_bad_arguments_are_named():
    model = tiny()
    with pytest.raises(ValueError, match="steps must be None .adaptive. or an integer"):
        anatomy.integrated_gradients(model, ids(1, 4), 3, steps=0)
    with pytest.raises(ValueError, match="tolerance must be"):
        anatomy.integrated_gradients(model, ids(1, 4), 3, tolerance=0)
    with pytest.raises(ValueError, match="max_steps must be"):
        anatomy.integrated_gradients(model, ids(1, 4), 3, max_steps=10)
    with pytest.raises(ValueError, match="position must be"):
        anatomy.integrated_gradients(model, ids(1, 4), 3, position=9)
    with pytest.raises(ValueError, match="one id per sequence"):
        anatomy.integrated_gradients(model, ids(2, 4), [1, 2, 3])
    with pytest.raises(ValueError, match="vocab_size=99"):
        anatomy.gradient_x_input(model, ids(1, 4), 500)
    with pytest.raises(ValueError, match="baseline_ids"):
        anatomy.integrated_gradients(model, ids(1, 4), 3, baseline_ids=torch.zeros(1, 5, dtype=torch.long))
