"""TranscoderSet: every layer's features, the CLT's writes to later layers, the skip path, and the one-line
refusal of a set that does not fit a model."""

from __future__ import annotations

import pytest
import torch

import anatomy
from anatomy.sae import SAE, TranscoderSet
from analysis_models import ids, tiny  # tests/analysis, through conftest


def plt(n_layers=2, d_model=32, d_tc=48, skip=False, kind="jumprelu", seed=0) -> TranscoderSet:
    layers = []
    for layer in range(n_layers):
        sae = SAE(d_model, d_tc, kind=kind, transcoder=True, skip=skip, seed=seed + layer)
        with torch.no_grad():
            for parameter in sae.parameters():
                parameter.add_(0.1 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(seed + 9)))
            if kind == "jumprelu":
                sae.threshold.abs_()
        layers.append(sae.eval())
    return TranscoderSet(layers)


def test_the_contract_of_a_per_layer_set():
    transcoders = plt(skip=True)
    assert (transcoders.n_layers, transcoders.d_model, transcoders.d_transcoder, transcoders.kind,
            transcoders.cross_layer) == (2, 32, 48, "jumprelu", False)
    assert (transcoders.input_point(1), transcoders.output_point(1)) == ("blocks.1.mlp_norm.out", "blocks.1.mlp.out")
    assert transcoders.decoder_vectors(0).shape == (48, 1, 32) and transcoders.output_bias(1).shape == (32,)
    x = torch.randn(5, 32)
    sae = transcoders.layers[1]
    f = transcoders.encode(1, x)
    assert torch.equal(f, sae.encode(x))
    expected = f @ sae.W_dec + sae.b_dec + x @ sae.W_skip.T  # SAELens's y^ = f W_dec + b_dec + W_skip x
    assert torch.allclose(transcoders.reconstruct(1, [None, f], [None, x]), expected, atol=1e-6)
    assert torch.allclose(sae(x), expected, atol=1e-6)
    assert torch.equal(transcoders.skip(1), sae.W_skip.T)  # [E_in, E_out]: x @ skip
    with pytest.raises(ValueError, match=r"a skip transcoder reconstructs layer 1 from its input: give inputs\[1\]"):
        transcoders.reconstruct(1, [None, f])
    with pytest.raises(ValueError, match=r"layer must be an integer in \[0, n_layers=2\), got 2"):
        transcoders.input_point(2)


def test_tl_names_are_read_as_anatomy_points():
    transcoders = TranscoderSet(plt().layers, input_point="blocks.L.ln2.hook_normalized", output_point="blocks.L.hook_mlp_out")
    assert (transcoders.input_point(0), transcoders.output_point(1)) == ("blocks.0.mlp_norm.normalized", "blocks.1.mlp.out")


def test_layers_that_disagree_are_refused():
    layers = plt().layers
    with pytest.raises(ValueError, match="layer 1 has d_sae=64; allowed: 48"):
        TranscoderSet([layers[0], SAE(32, 64, kind="jumprelu", transcoder=True)])
    with pytest.raises(ValueError, match="layer 1 has kind='relu'; allowed: 'jumprelu'"):
        TranscoderSet([layers[0], SAE(32, 48, kind="relu", transcoder=True)])
    clt = [SAE(8, 16, kind="relu", d_out=16, transcoder=True), SAE(8, 16, kind="relu", d_out=8, transcoder=True)]
    with torch.no_grad():
        clt[0].b_dec[8:] = 1.0
    with pytest.raises(ValueError, match="has b_dec or W_skip beyond its own output's first 8"):
        TranscoderSet(clt, cross_layer=True)


def test_a_per_layer_set_spliced_into_a_model_changes_nothing_until_told():
    model = tiny(arch="decoder")
    transcoders = plt()
    transcoders.check_fits(model)
    batch = ids()
    with torch.no_grad():
        clean = model(batch).logits
        with anatomy.trace(model, ["blocks.*.mlp.out.sae.features"], saes=transcoders.saes()) as t:
            spliced = model(batch).logits
        assert torch.equal(clean, spliced)
        assert t["blocks.1.mlp.out.sae.features"].shape == (2, 9, 48)


@pytest.mark.parametrize("transcoders, message", [
    (lambda: plt(n_layers=3), r"n_layers=3 does not fit this model; allowed: 2"),
    (lambda: plt(d_model=16), r"d_model=16 does not fit the input point 'blocks.L.mlp_norm.out' of this model, of width 32; allowed: 32"),
    (lambda: TranscoderSet(plt().layers, input_point="blocks.L.mlp_input"), r"input point 'blocks.L.mlp_input' is not in block 0 of this model; allowed: blocks.L.\{attn"),
    (lambda: TranscoderSet(plt().layers, output_point="blocks.L.mlp_out_norm.out"), r"output point 'blocks.L.mlp_out_norm.out' is not in block 0"),
])
def test_a_set_that_does_not_fit_is_refused_in_one_line(transcoders, message):
    with pytest.raises(ValueError, match=message) as error:
        transcoders().check_fits(tiny(arch="decoder"))
    assert "\n" not in str(error.value)


def test_a_clt_is_not_spliced_as_one_sae_per_point():
    layers = [SAE(8, 16, kind="relu", d_out=16, transcoder=True), SAE(8, 16, kind="relu", d_out=8, transcoder=True)]
    with pytest.raises(ValueError, match="write to every later layer"):
        TranscoderSet(layers, cross_layer=True).saes()


def test_the_replacement_of_a_per_layer_set_is_its_splice_without_errors():
    from anatomy.sae import no_error

    model, transcoders, batch = tiny(arch="decoder"), plt(skip=True), ids()
    with torch.no_grad():
        with anatomy.trace(model, [], interventions=transcoders.replacement()):
            replaced = model(batch).logits
        errors = {f"{point}.sae.error": no_error for point in transcoders.saes()}
        with anatomy.trace(model, [], saes=transcoders.saes(), interventions=errors):
            spliced = model(batch).logits
        clean = model(batch).logits
    assert (replaced - spliced).abs().max() < 1e-5
    assert (replaced - clean).abs().max() > 1e-2  # the replacement is not the model


def test_a_clt_replacement_writes_each_output_from_every_earlier_layer():
    """Recorded in the replaced pass itself: each MLP output equals the sum over layers l' <= l of the features
    of l' (encoded from the inputs that pass reached) through their rows to l, plus l's bias."""
    model, batch = tiny(arch="decoder"), ids()
    layers = [SAE(32, 24, kind="relu", d_out=(2 - layer) * 32, transcoder=True, seed=layer) for layer in range(2)]
    with torch.no_grad():
        layers[0].b_enc.fill_(0.05)
        layers[1].b_dec.normal_()
    transcoders = TranscoderSet(layers, cross_layer=True)
    transcoders.check_fits(model)
    with torch.no_grad(), anatomy.trace(model, ["blocks.*.mlp_norm.out", "blocks.*.mlp.out"],
                                        interventions=transcoders.replacement()) as t:
        model(batch)
    x0, x1 = t["blocks.0.mlp_norm.out"], t["blocks.1.mlp_norm.out"]
    f0, f1 = layers[0].encode(x0), layers[1].encode(x1)
    W0 = layers[0].W_dec.view(24, 2, 32)  # (F, O, E)
    assert torch.allclose(t["blocks.0.mlp.out"], f0 @ W0[:, 0], atol=1e-5)
    assert torch.allclose(t["blocks.1.mlp.out"], f0 @ W0[:, 1] + f1 @ layers[1].W_dec + layers[1].b_dec, atol=1e-5)
    assert (f0 @ W0[:, 1]).abs().max() > 1e-3  # layer 0's features do reach layer 1


def test_a_sets_evaluation_is_each_layers_own_and_its_errors_restore_the_model():
    import numpy as np

    from anatomy.sae.evaluate import evaluate_transcoders, reconstruction_stats

    model, transcoders = tiny(arch="decoder"), plt(skip=True)
    tokens = np.random.default_rng(0).integers(0, 99, 16 * 6)
    result = evaluate_transcoders(model, transcoders, tokens, context=16, skip=1, ce_contexts=4)
    ids = torch.from_numpy(tokens.reshape(6, 16))
    for layer, sae in enumerate(transcoders.layers):
        alone = reconstruction_stats(model, sae, ids, skip=1)
        ours = result["layers"][layer]
        assert abs(ours["fve"] - alone["fve"]) < 1e-9 and ours["l0"] == alone["l0"] and ours["dead"] == alone["dead"]
    assert abs(result["ce_with_errors"] - result["ce_clean"]) < 1e-5
    assert abs(result["loss_recovered_with_errors"] - 1) < 1e-4
    assert result["ce_zero"] != result["ce_clean"] and result["ce_replaced"] != result["ce_clean"]
    assert result["fve"] == sum(r["fve"] for r in result["layers"]) / 2


def test_hook_mlp_out_of_a_model_that_normalises_its_mlp_output_is_refused_until_resolved(tmp_path):
    """Gemma's sandwich block: TransformerLens's (and circuit-tracer's) hook_mlp_out is after the MLP's own norm."""
    from anatomy.sae import load_transcoders, save_transcoders

    model = tiny(arch="decoder", norm_position="sandwich")
    save_transcoders(TranscoderSet(plt().layers, output_point="blocks.L.mlp_out_norm.out"), tmp_path / "set")
    with pytest.raises(ValueError, match="hook_mlp_out is, in this model, the output of the MLP's own norm"):
        load_transcoders(tmp_path / "set").check_fits(model)
    resolved = load_transcoders(tmp_path / "set", mlp_out_norm=True)
    resolved.check_fits(model)
    assert resolved.output_point(1) == "blocks.1.mlp_out_norm.out"


def test_a_clt_is_evaluated_and_its_error_terms_restore_the_model():
    """circuit-tracer's cross-layer fixture (3 layers of 16, read at resid_mid) on a model of that shape."""
    from pathlib import Path

    import numpy as np

    from anatomy.sae import load_transcoders
    from anatomy.sae.evaluate import evaluate_transcoders

    transcoders = load_transcoders(Path(__file__).parent / "fixtures" / "circuit_tracer" / "clt_jumprelu")
    model = tiny(arch="decoder", n_layers=3, d_model=16, n_heads=4, d_ff=32)
    tokens = np.random.default_rng(1).integers(0, 99, 16 * 4)
    result = evaluate_transcoders(model, transcoders, tokens, context=16, ce_contexts=2)
    assert len(result["layers"]) == 3 and abs(result["ce_with_errors"] - result["ce_clean"]) < 1e-5
    assert result["ce_replaced"] != result["ce_clean"]
