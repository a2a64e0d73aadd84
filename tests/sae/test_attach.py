"""An SAE attached to a pass: the outputs stay the model's (to the bit) until something changes the
features or the error; features, reconstruction and error are trace points; interventions on features
move the point by exactly their decoder directions; gradients are the model's."""

from __future__ import annotations

import pytest
import torch

import anatomy
from anatomy.sae import SAE
from anatomy.sae.attach import clamp, no_error, scale, steer, zero

from analysis_models import inputs_for, tiny  # tests/analysis, put on the path by conftest.py

KINDS = [("relu", None), ("topk", 6), ("batchtopk", 6.0), ("jumprelu", None)]


def _sae(kind: str, k, d_in: int = 32, seed: int = 0, **options) -> SAE:
    """Random weights of every part (biases and thresholds too), so that each term is exercised."""
    sae = SAE(d_in, 96, kind=kind, k=k, seed=seed, **options).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for parameter in sae.parameters():
            parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))
        if kind in ("jumprelu", "batchtopk"):
            sae.threshold.copy_(0.05 * torch.rand(96, generator=generator))
    return sae


def _logits(model, inputs, **trace_options):
    with torch.no_grad(), anatomy.trace(model, [], **trace_options):
        if model.config.arch == "encoder-decoder":
            return model(*inputs).logits
        return model(inputs).logits


def _point(model) -> str:
    return ("decoder." if model.config.arch == "encoder-decoder" else "") + "blocks.1.resid_mid"


@pytest.mark.parametrize("kind, k", KINDS)
def test_with_the_error_term_the_outputs_are_the_models_for_every_family(family_model, kind, k):
    model, inputs = family_model, inputs_for(family_model)
    sae = _sae(kind, k)
    expected = _logits(model, inputs)
    spliced = _logits(model, inputs, saes={_point(model): sae})
    assert (spliced - expected).abs().max() < 1e-5
    assert torch.equal(spliced, expected)  # in fact to the bit: x + 0 + 0
    # recording the features (which decodes them again) changes nothing either
    with torch.no_grad(), anatomy.trace(model, ["*.sae.*"], saes={_point(model): sae}):
        recorded = model(*inputs).logits if model.config.arch == "encoder-decoder" else model(inputs).logits
    assert torch.equal(recorded, expected)


def test_features_recon_and_error_are_recorded_with_their_axes():
    model, ids = tiny(), inputs_for(tiny())
    sae = _sae("topk", 6)
    point = "blocks.1.resid_post"
    with torch.no_grad(), anatomy.trace(model, [point, f"{point}.sae.*"], saes={"blocks.1.hook_resid_post": sae}) as t:
        model(ids)
    x = t[point]
    assert torch.equal(t[f"{point}.sae.features"], sae.encode(x))
    assert torch.equal(t[f"{point}.sae.recon"], sae.decode(sae.encode(x)))
    assert torch.equal(t[f"{point}.sae.error"], x - t[f"{point}.sae.recon"])
    assert (t[f"{point}.sae.features"] > 0).sum(-1).eq(6).all()
    assert t.axes(f"{point}.sae.features") == ("batch", "pos", "feature")
    assert t.axes(f"{point}.sae.error") == ("batch", "pos", "d_model")


@pytest.mark.parametrize("kind, k", KINDS)
def test_without_the_error_term_the_point_is_the_reconstruction(kind, k):
    """Zeroing the error splices the SAE in alone: the same as replacing the point by sae(x)."""
    model, ids = tiny(), inputs_for(tiny())
    sae = _sae(kind, k)
    point = "blocks.1.resid_mid"
    alone = _logits(model, ids, saes={point: sae}, interventions={f"{point}.sae.error": no_error})
    replaced = _logits(model, ids, interventions={point: lambda x: sae(x)})
    assert (alone - replaced).abs().max() < 1e-5
    assert (alone - _logits(model, ids)).abs().max() > 1e-2  # a random SAE costs something


def test_interventions_that_change_the_error_or_the_reconstruction_in_place_count():
    model, ids = tiny(), inputs_for(tiny())
    sae = _sae("topk", 6)
    point = "blocks.1.resid_mid"
    direction = sae.W_dec[3].detach()

    def zero_in_place(e):  # returns None: the change is the tensor's own
        e.zero_()

    def add_in_place(r):
        r.add_(direction)

    alone = _logits(model, ids, saes={point: sae}, interventions={f"{point}.sae.error": no_error})
    assert torch.equal(_logits(model, ids, saes={point: sae}, interventions={f"{point}.sae.error": zero_in_place}), alone)
    moved = _logits(model, ids, interventions={point: lambda x: x + direction})
    in_place = _logits(model, ids, saes={point: sae}, interventions={f"{point}.sae.recon": add_in_place})
    assert (in_place - moved).abs().max() < 1e-5


def _with_point_moved(model, ids, point, sae, move):
    """Logits with the point's value x replaced by move(x, features of x): the reference for interventions."""
    return _logits(model, ids, interventions={point: lambda x: x + move(sae.encode(x)) @ sae.W_dec})


@pytest.mark.parametrize("name, intervention, delta", [
    ("zero", zero(3, 7), lambda f: torch.stack([-f[..., 3], -f[..., 7]], -1)),
    ("clamp", clamp(3, 2.5), lambda f: (2.5 - f[..., 3])[..., None]),
    ("scale", scale(7, 3.0), lambda f: (2.0 * f[..., 7])[..., None]),
])
def test_interventions_on_features_move_the_point_by_their_decoder_directions(name, intervention, delta):
    model, ids = tiny(), inputs_for(tiny())
    sae = _sae("relu", None)  # dense activations: features 3 and 7 fire somewhere
    point = "blocks.0.resid_post"
    ours = _logits(model, ids, saes={point: sae}, interventions={f"{point}.sae.features": intervention})
    features = (3, 7) if name == "zero" else (3,) if name == "clamp" else (7,)

    def move(f):  # (B, T, F): the change of each named feature, scattered
        change = torch.zeros_like(f)
        change[..., list(features)] = delta(f)
        return change

    expected = _with_point_moved(model, ids, point, sae, move)
    assert (ours - expected).abs().max() < 1e-5
    assert (ours - _logits(model, ids)).abs().max() > 1e-4


def test_steering_adds_the_decoder_direction_with_or_without_the_sae_attached():
    model, ids = tiny(), inputs_for(tiny())
    sae = _sae("topk", 6)
    point = "blocks.1.resid_post"
    direction = sae.W_dec[11].detach()
    expected = _logits(model, ids, interventions={point: lambda x: x + 4.0 * direction})
    assert torch.equal(_logits(model, ids, interventions={point: steer(sae, 11, 4.0)}), expected)
    attached = _logits(model, ids, saes={point: sae}, interventions={f"{point}.sae.recon": steer(sae, 11, 4.0)})
    assert (attached - expected).abs().max() < 1e-5


def test_gradients_are_the_models_and_reach_features_and_error():
    """d logit / d error = d logit / d point (the error enters with weight 1); d logit / d features =
    W_dec (d logit / d point); and the gradient upstream of the point is unchanged by the splice."""
    model, ids = tiny(), inputs_for(tiny())
    sae = _sae("relu", None)
    point = "blocks.0.resid_post"
    names = [point, "embed", f"{point}.sae.features", f"{point}.sae.error"]
    with torch.enable_grad(), anatomy.trace(model, names, saes={point: sae}, grad=True) as t:
        logit = model(ids).logits[:, -1, 5].sum()
        grads = dict(zip(names, torch.autograd.grad(logit, [t[n] for n in names])))
    with torch.enable_grad(), anatomy.trace(model, [point, "embed"], grad=True) as plain:
        logit_plain = model(ids).logits[:, -1, 5].sum()
        d_point, d_embed = torch.autograd.grad(logit_plain, [plain[point], plain["embed"]])
    assert torch.equal(logit, logit_plain)
    assert (grads[f"{point}.sae.error"] - d_point).abs().max() < 1e-6
    assert (grads[f"{point}.sae.features"] - d_point @ sae.W_dec.detach().T).abs().max() < 1e-5
    assert (grads["embed"] - d_embed).abs().max() < 1e-5


def test_a_transcoder_replaces_the_mlp_output_by_its_prediction_from_the_mlp_input():
    model, ids = tiny(), inputs_for(tiny())
    transcoder = _sae("topk", 6, point="blocks.1.mlp_norm.out", point_out="blocks.1.mlp.out")
    saes = {"blocks.1.mlp.out": transcoder}
    assert torch.equal(_logits(model, ids, saes=saes), _logits(model, ids))
    with torch.no_grad(), anatomy.trace(model, ["blocks.1.mlp_norm.out", "blocks.1.mlp.out.sae.features"], saes=saes) as t:
        model(ids)
    assert torch.equal(t["blocks.1.mlp.out.sae.features"], transcoder.encode(t["blocks.1.mlp_norm.out"]))
    alone = _logits(model, ids, saes=saes, interventions={"blocks.1.mlp.out.sae.error": no_error})
    inputs = {}
    replaced = _logits(model, ids, interventions={"blocks.1.mlp_norm.out": lambda x: inputs.setdefault("x", x),
                                                  "blocks.1.mlp.out": lambda y: transcoder(inputs["x"])})
    assert (alone - replaced).abs().max() < 1e-5


def test_an_sae_on_attention_heads_reads_them_flattened():
    """SAELens's hook_z SAEs: attn.z is [batch, pos, head, d_head]; the SAE reads head x d_head."""
    model, ids = tiny(), inputs_for(tiny())
    sae = _sae("topk", 6, flatten_heads=True)  # 4 heads x 8 = 32
    point = "blocks.0.attn.z"
    assert torch.equal(_logits(model, ids, saes={point: sae}), _logits(model, ids))
    steered = _logits(model, ids, interventions={point: steer(sae, 2, 3.0)})
    direction = sae.W_dec[2].detach().view(4, 8)
    assert torch.equal(steered, _logits(model, ids, interventions={point: lambda z: z + 3.0 * direction}))


def test_mistakes_are_named():
    model = tiny()
    sae = _sae("topk", 6)
    with pytest.raises(KeyError, match="exact point"):
        with anatomy.trace(model, saes={"blocks.*.resid_post": sae}):
            pass
    with pytest.raises(KeyError, match="no trace point"):
        with anatomy.trace(model, saes={"blocks.9.resid_post": sae}):
            pass
    with pytest.raises(TypeError, match="anatomy.SAE"):
        with anatomy.trace(model, saes={"blocks.0.resid_post": torch.nn.Linear(32, 32)}):
            pass
    with pytest.raises(ValueError, match="two points"):
        with anatomy.trace(model, saes={"blocks.0.resid_post": sae, "blocks.1.resid_post": sae}):
            pass
    with pytest.raises(ValueError, match="width 40"):
        with torch.no_grad(), anatomy.trace(model, saes={"blocks.0.resid_post": _sae("topk", 6, d_in=40)}):
            model(inputs_for(model))
    for bad in (dict(kind="gated"), dict(kind="topk"), dict(kind="topk", k=0), dict(kind="relu", k=3),
                dict(kind="topk", k=500), dict(kind="topk", k=2.5)):
        with pytest.raises(ValueError, match="kind|k"):
            SAE(32, 96, **bad)
    with pytest.raises(ValueError, match="width"):
        SAE(32, 96, kind="relu", d_out=16, transcoder=False)
    with pytest.raises(ValueError, match="feature must be"):
        steer(sae, 96, 1.0)
    with pytest.raises(ValueError, match="features"):
        zero()
    # nothing stays installed after a refused trace
    assert all(point.fn is None for point in anatomy.trace_points(model).values())
