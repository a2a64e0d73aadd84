"""Activation patching: batched equals one run at a time, equals TransformerLens's patching module on
the same GPT-2 weights, and patching everything clean gives back the clean run."""

from __future__ import annotations

import pytest
import torch

import anatomy
from analysis_models import FAMILIES, ids, tiny


def logit_difference(logits):
    return logits[:, -1, 1] - logits[:, -1, 2]


def clean_and_corrupt(batch=1, length=8):
    clean = ids(batch, length, seed=3)
    corrupt = clean.clone()
    corrupt[:, 2] = (clean[:, 2] + 5) % 99
    return clean, corrupt


def one_at_a_time(model, clean, corrupt, name, axis, index, metric):
    """The definition: one forward pass per cell, with the clean activation put back at that cell."""
    with torch.no_grad(), anatomy.trace(model, name) as t:
        model(clean)
    value = t[name]

    def put_back(x):
        x = x.clone()
        where = (slice(None),) * axis + (index,)
        x[where] = value[where]
        return x

    with torch.no_grad(), anatomy.trace(model, [], interventions={name: put_back}):
        return metric(model(corrupt).logits).mean()


@pytest.mark.parametrize("point, by, axis", [("resid_pre", "position", 1), ("attn.z", "head", 2),
                                             ("attn.pattern", "position", 2), ("mlp.out", "position", 1)])
def test_batched_patching_equals_one_run_at_a_time(point, by, axis):
    model = tiny()
    clean, corrupt = clean_and_corrupt(batch=2)
    result = anatomy.patch(model, clean, corrupt, point=point, metric=logit_difference, by=by, runs_per_pass=5)
    n_layers, size = result.values.shape
    for layer in range(n_layers):
        for index in range(size):
            expected = one_at_a_time(model, clean, corrupt, f"blocks.{layer}.{point}", axis, index, logit_difference)
            torch.testing.assert_close(result.values[layer, index], expected, atol=1e-5, rtol=0)
    assert result.error < 1e-5 and "one run at a time" in result.check


def test_patching_the_corrupted_token_position_at_layer_0_restores_the_clean_run():
    model = tiny()
    clean, corrupt = clean_and_corrupt()
    result = anatomy.patch(model, clean, corrupt, point="resid_pre", metric=logit_difference)
    with torch.no_grad():
        clean_metric, corrupt_metric = logit_difference(model(clean).logits), logit_difference(model(corrupt).logits)
    # resid_pre of layer 0 at the one differing position: the whole input is the clean one again.
    torch.testing.assert_close(result.values[0, 2], clean_metric[0], atol=1e-5, rtol=0)
    # at any other position it changes nothing: the corrupted run
    torch.testing.assert_close(result.values[0, 5], corrupt_metric[0], atol=1e-5, rtol=0)
    # after the last layer, the last position's residual is everything its prediction reads
    after = anatomy.patch(model, clean, corrupt, point="resid_post", metric=logit_difference)
    torch.testing.assert_close(after.values[-1, -1], clean_metric[0], atol=1e-5, rtol=0)


def test_patching_by_layer_and_through_cross_attention():
    model = tiny(**FAMILIES["encoder-decoder"])
    source, target = ids(1, 7, seed=1), ids(1, 5, seed=2)
    corrupt_source = source.clone()
    corrupt_source[0, 3] = (source[0, 3] + 1) % 99
    by_layer = anatomy.patch(model, (source, target), (corrupt_source, target), point="cross_attn.z", by="layer",
                             metric=logit_difference)
    assert by_layer.values.shape == (2,) and by_layer.axes == ("layer",)
    encoder = anatomy.patch(model, (source, target), (corrupt_source, target), point="encoder.resid_pre",
                            metric=logit_difference)
    assert encoder.values.shape == (2, 7)  # source positions
    with torch.no_grad():
        clean_metric = logit_difference(model(source, target).logits)
    torch.testing.assert_close(encoder.values[0, 3], clean_metric[0], atol=1e-5, rtol=0)


def test_attribution_patching_is_exact_for_a_linear_metric_of_a_linear_path():
    """At the last layer's resid_post, the logits are W_U(FinalNorm(x)); the first-order estimate of
    patching the last position agrees with the activation patching result to first order."""
    model = tiny()
    clean, corrupt = clean_and_corrupt()
    exact = anatomy.patch(model, clean, corrupt, point="resid_pre", metric=logit_difference)
    estimate = anatomy.patch(model, clean, corrupt, point="resid_pre", metric=logit_difference, method="attribution")
    assert estimate.values.shape == exact.values.shape
    untouched = exact.values[:, 3:-1]  # positions after the corruption that the metric does not read directly
    torch.testing.assert_close(estimate.values[:, 3:-1], untouched, atol=1e-6, rtol=0)
    assert torch.corrcoef(torch.stack([estimate.values.flatten(), exact.values.flatten()]))[0, 1] > 0.9


def test_bad_arguments_are_named():
    model = tiny()
    clean, corrupt = clean_and_corrupt()
    with pytest.raises(ValueError, match="position, head, layer"):
        anatomy.patch(model, clean, corrupt, by="neuron")
    with pytest.raises(ValueError, match="resid_pre"):
        anatomy.patch(model, clean, corrupt, point="resid_middle")
    with pytest.raises(ValueError, match="need as many tokens: the clean one has"):
        anatomy.patch(model, clean, corrupt[:, :5])
    with pytest.raises(ValueError, match="head"):
        anatomy.patch(model, clean, corrupt, point="resid_pre", by="head")
    with pytest.raises(ValueError, match="one value per sequence"):
        anatomy.patch(model, clean, corrupt, metric=lambda logits: logits.sum())


@pytest.mark.slow  # importing transformer_lens takes seconds
@pytest.mark.parametrize("name, point, by", [
    ("get_act_patch_resid_pre", "resid_pre", "position"),
    ("get_act_patch_attn_out", "attn_out", "position"),
    ("get_act_patch_mlp_out", "mlp_out", "position"),
    ("get_act_patch_attn_head_out_all_pos", "z", "head"),
    ("get_act_patch_attn_head_pattern_all_pos", "pattern", "head"),
])
def test_patching_equals_transformer_lens(gpt2_and_transformer_lens, name, point, by):
    from transformer_lens import patching

    ours, bridge = gpt2_and_transformer_lens
    clean, corrupt = clean_and_corrupt(length=10)
    with torch.no_grad():
        _, cache = bridge.run_with_cache(clean)
        theirs = getattr(patching, name)(bridge, corrupt, cache, lambda logits: logit_difference(logits).mean())
    result = anatomy.patch(ours, clean, corrupt, point=point, by=by, metric=logit_difference)
    assert result.values.shape == theirs.shape
    torch.testing.assert_close(result.values, theirs, atol=1e-4, rtol=0)


def test_logits_at_last_equals_reading_the_last_position_of_all_logits():
    model = tiny()
    clean, corrupt = clean_and_corrupt(batch=2)
    everything = anatomy.patch(model, clean, corrupt, point="resid_mid", metric=logit_difference)
    last_only = anatomy.patch(model, clean, corrupt, point="resid_mid", metric=logit_difference, logits_at="last")
    torch.testing.assert_close(last_only.values, everything.values, atol=1e-5, rtol=0)
    default = anatomy.patch(model, clean, corrupt)  # the clean top token's log-prob, read at the last position
    assert default.values.shape == everything.values.shape and torch.isfinite(default.values).all()


def test_patching_and_integrated_gradients_report_progress_and_stop_when_told():
    model = tiny()
    clean, corrupt = clean_and_corrupt()
    seen = []
    anatomy.patch(model, clean, corrupt, runs_per_pass=3, progress=lambda done, total: seen.append((done, total)))
    total = seen[-1][1]
    assert total == 2 * 8 and seen[-1][0] == total  # 2 layers x 8 positions
    assert [done for done, _ in seen] == sorted({done for done, _ in seen}) and len(seen) == 7  # 0, then 6 passes
    assert seen[0] == (0, total)  # before the first pass: a caller may stop it before any

    class Stop(Exception):
        pass

    def stop(done, total):
        raise Stop

    with pytest.raises(Stop):
        anatomy.patch(model, clean, corrupt, progress=stop)
    counts = []
    anatomy.integrated_gradients(model, clean, 3, steps=20, steps_per_pass=7,
                                 progress=lambda done, total: counts.append((done, total)))
    assert counts == [(0, 20), (7, 20), (14, 20), (20, 20)]
    with pytest.raises(Stop):
        anatomy.integrated_gradients(model, clean, 3, progress=stop)
