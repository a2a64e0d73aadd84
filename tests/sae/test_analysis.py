"""Features as components of the analyses, each with its identity: DLA over features + error + b_dec + the
rest sums to the logit; patching every feature and the error is patching the point; integrated gradients
over features and error are complete; the lens of a feature is its decoder row through the unembedding."""

from __future__ import annotations

import pytest
import torch

import anatomy
from analysis_models import FAMILIES, ids, tiny
from anatomy.sae import SAE
from anatomy.sae.analysis import feature_integrated_gradients, feature_lens, feature_logit_attribution, patch_features


def _sae(point="blocks.0.resid_post", kind="topk", k=6, **options) -> SAE:
    sae = SAE(32, 96, kind=kind, k=k, point=point, seed=0, **options).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in sae.parameters():
            parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))
    return sae


@pytest.mark.parametrize("family", ["decoder", "decoder-llama", "encoder"])
@pytest.mark.parametrize("point", ["blocks.0.resid_post", "blocks.1.resid_mid", "blocks.1.attn.out", "blocks.0.mlp.out"])
def test_dla_over_features_error_and_the_rest_sums_to_the_logit(family, point):
    model = tiny(**FAMILIES[family])
    result = feature_logit_attribution(model, ids(), _sae(point), target=7)
    assert result.error < 1e-5
    with torch.no_grad():
        logits = model(ids()).logits[..., 7]
    assert torch.allclose(result.values.sum(0), logits, atol=1e-5)
    assert result.labels["component"][-4:] == ["SAE error", "SAE b_dec", "after the SAE", "norm bias + unembed bias"]
    # each feature's row is its activation times its direction through the frozen norm: 0 where it is silent
    features = result.extra["features"]
    with torch.no_grad(), anatomy.trace(model, [f"{point}.sae.features"], saes={point: _sae(point)}) as t:
        model(ids())
    silent = t[f"{point}.sae.features"][..., features].permute(2, 0, 1) == 0
    assert (result.values[:len(features)][silent] == 0).all()


def test_dla_over_a_transcoders_features():
    model = tiny(**FAMILIES["decoder-llama"])
    transcoder = _sae("blocks.1.mlp_norm.out", point_out="blocks.1.mlp.out")
    result = feature_logit_attribution(model, ids(), transcoder)
    with torch.no_grad():
        logits = model(ids()).logits
    assert torch.allclose(result.values.sum(0), logits.gather(-1, logits.argmax(-1, keepdim=True))[..., 0], atol=1e-5)


def _metric(logits):
    return logits[:, -1, 3] - logits[:, -1, 11]


@pytest.mark.parametrize("kind, k", [("topk", 6), ("relu", None)])
def test_patching_every_feature_and_the_error_is_patching_the_point(kind, k):
    model = tiny(**FAMILIES["decoder-llama"])
    sae = _sae("blocks.0.resid_post", kind=kind, k=k)
    clean, corrupt = ids(seed=0), ids(seed=1)
    result = patch_features(model, sae, clean, corrupt, _metric)
    assert result.error < 1e-5
    # batched cells equal the same cell patched alone, through anatomy.trace's own interventions
    first = int(result.labels["component"][0][1:])
    with torch.no_grad(), anatomy.trace(model, ["blocks.0.resid_post.sae.features"], saes={"blocks.0.resid_post": sae}) as t:
        model(clean)
    clean_f = t["blocks.0.resid_post.sae.features"]

    def one(f):
        f = f.clone()
        f[..., first] = clean_f[..., first]
        return f

    with torch.no_grad(), anatomy.trace(model, [], saes={"blocks.0.resid_post": sae},
                                        interventions={"blocks.0.resid_post.sae.features": one}):
        alone = _metric(model(corrupt).logits).mean()
    assert abs(alone - result.values[0]) < 1e-5
    estimate = patch_features(model, sae, clean, corrupt, _metric, method="attribution")
    assert estimate.values.shape == result.values.shape and estimate.labels == result.labels


def test_integrated_gradients_over_features_and_error_are_complete():
    model = tiny(**FAMILIES["decoder-llama"])
    result = feature_integrated_gradients(model, ids(), _sae("blocks.1.resid_mid"), target=5, steps=64)
    assert result.error < 1e-3
    delta = result.extra["f_input"] - result.extra["f_baseline"]
    assert torch.allclose(result.values.sum(0), delta, rtol=1e-3, atol=1e-4)
    # the baseline is the point held at b_dec
    sae = _sae("blocks.1.resid_mid")
    with torch.no_grad(), anatomy.trace(model, [], interventions={"blocks.1.resid_mid": lambda x: sae.b_dec.expand_as(x).clone()}):
        baseline = model(ids()).logits[:, -1, 5]
    assert torch.allclose(result.extra["f_baseline"], baseline, atol=1e-5)


def test_the_feature_lens_is_the_decoder_row_through_the_unembedding_centred():
    model = tiny(**FAMILIES["decoder-llama"])
    sae = _sae("blocks.1.resid_post")
    result = feature_lens(model, sae, [4, 9], top=5)
    gain = model.final_norm.weight.detach()
    expected = (sae.W_dec[[4, 9]].detach() * gain) @ model.lm_head.proj.weight.detach().T
    expected -= expected.mean(dim=1, keepdim=True)  # centred: softmax ignores a shift every logit shares
    assert torch.allclose(result.values, expected, atol=1e-6)
    assert (result.extra["promoted_logits"] >= 0).all() and (result.extra["suppressed_logits"] <= 0).all()
    assert torch.equal(result.extra["promoted"], expected.topk(5, dim=1).indices)
    assert torch.equal(result.extra["suppressed"], expected.topk(5, dim=1, largest=False).indices)


def test_what_features_cannot_be_components_of_is_named():
    model = tiny(**FAMILIES["decoder-llama"])
    with pytest.raises(ValueError, match="residual stream"):
        feature_logit_attribution(model, ids(), SAE(32, 64, kind="topk", k=4, point="blocks.0.attn_norm.out"))
    with pytest.raises(ValueError, match="pre-norm"):
        feature_logit_attribution(tiny(norm_position="post"), ids(), _sae())
    with pytest.raises(ValueError, match="method"):
        patch_features(model, _sae(), ids(), ids(seed=1), _metric, method="exact")
    with pytest.raises(ValueError, match="same shape"):
        patch_features(model, _sae(), ids(), ids(length=4), _metric)
