"""Transcoder sets on disk: anatomy computes what circuit-tracer computes from circuit-tracer's own files and
from Gemma Scope 2's layout; what anatomy writes, circuit-tracer reads back; hostile files are refused.

The fixtures were written by circuit-tracer 0.5.0 itself (fixtures/make_circuit_tracer_fixtures.py, run in
its own virtual environment): tiny per-layer and cross-layer sets saved with its own `to_safetensors`, and
its encode and decode of fixed inputs. anatomy must match both within 1e-5.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from anatomy.checkpoints.files import CheckpointError
from anatomy.sae import SAE, TranscoderSet, load_transcoders, save_transcoders

FIXTURES = Path(__file__).parent / "fixtures" / "circuit_tracer"
CASES = {  # fixture -> (cross_layer, kind, skip, input point of layer 1, output point of layer 1)
    "plt_jumprelu": (False, "jumprelu", False, "blocks.1.mlp_norm.out", "blocks.1.mlp.out"),
    "plt_relu_skip": (False, "relu", True, "blocks.1.resid_mid", "blocks.1.mlp.out"),
    "clt_jumprelu": (True, "jumprelu", False, "blocks.1.resid_mid", "blocks.1.mlp.out"),
    "gemma-scope-2-tiny-pt": (False, "jumprelu", True, "blocks.1.mlp_norm.out", "blocks.1.mlp_out_norm.out"),
}


def outputs(transcoders: TranscoderSet, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(features [L, N, F], reconstructions [L, N, E]) of inputs x [L, N, E], every layer's output from the
    features of every layer that writes to it."""
    with torch.no_grad():
        features = [transcoders.encode(layer, x[layer]) for layer in range(transcoders.n_layers)]
        recon = [transcoders.reconstruct(layer, features, list(x)) for layer in range(transcoders.n_layers)]
    return torch.stack(features), torch.stack(recon)


@pytest.mark.parametrize("name", list(CASES))
def test_features_and_reconstructions_equal_circuit_tracers(name):
    transcoders = load_transcoders(FIXTURES / name)
    cross_layer, kind, skip, reads, writes = CASES[name]
    assert (transcoders.cross_layer, transcoders.kind, transcoders.skip(0) is not None) == (cross_layer, kind, skip)
    assert (transcoders.input_point(1), transcoders.output_point(1)) == (reads, writes)
    expected = load_file(str(FIXTURES / f"{name}.expected.safetensors"))
    features, recon = outputs(transcoders, expected["x"])
    assert torch.equal(features > 0, expected["features"] > 0)  # the same features fire
    assert (features - expected["features"]).abs().max() < 1e-5
    assert (recon - expected["recon"]).abs().max() < 1e-5


def test_a_clt_layer_writes_every_later_layer():
    transcoders = load_transcoders(FIXTURES / "clt_jumprelu")
    assert [transcoders.decoder_vectors(layer).shape for layer in range(3)] == [(40, 3, 16), (40, 2, 16), (40, 1, 16)]
    assert [list(transcoders.writers(layer)) for layer in range(3)] == [[0], [0, 1], [0, 1, 2]]
    weights = load_file(str(FIXTURES / "clt_jumprelu" / "W_dec_1.safetensors"))["W_dec_1"]  # (F, 2, E)
    assert torch.equal(transcoders.decoder_vectors(1), weights)
    biases = load_file(str(FIXTURES / "clt_jumprelu" / "W_enc_2.safetensors"))["b_dec_2"]
    assert torch.equal(transcoders.output_bias(2), biases)


@pytest.mark.parametrize("name", list(CASES))
def test_save_then_load_gives_the_same_set(tmp_path, name):
    transcoders = load_transcoders(FIXTURES / name)
    save_transcoders(transcoders, tmp_path / "set")
    again = load_transcoders(tmp_path / "set")
    assert [(a.kind, a.d_in, a.d_out) for a in again.layers] == [(a.kind, a.d_in, a.d_out) for a in transcoders.layers]
    assert (again.input_point(1), again.output_point(1)) == (transcoders.input_point(1), transcoders.output_point(1)) \
        or name.startswith("gemma")  # mlp_out_norm.out is circuit-tracer's hook_mlp_out, read back as mlp.out unless told
    for layer in range(transcoders.n_layers):  # the sets are lazy: their layers are compared one by one
        ours, theirs = again.layers[layer].state_dict(), transcoders.layers[layer].state_dict()
        assert list(ours) == list(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_the_circuit_tracer_config_is_what_its_cache_writes(tmp_path):
    save_transcoders(load_transcoders(FIXTURES / "plt_jumprelu"), tmp_path / "set")
    ours, theirs = (yaml.safe_load((folder / "config.yaml").read_text()) for folder in (tmp_path / "set", FIXTURES / "plt_jumprelu"))
    assert ours == theirs
    assert sorted(p.name for p in (tmp_path / "set").iterdir()) == ["config.yaml", "layer_0.safetensors", "layer_1.safetensors"]
    for layer in range(2):
        ours, theirs = (load_file(str(folder / f"layer_{layer}.safetensors")) for folder in (tmp_path / "set", FIXTURES / "plt_jumprelu"))
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_a_new_save_replaces_every_file_of_an_earlier_one(tmp_path):
    """A folder that held a 3-layer CLT gets a 2-layer PLT: no W_enc_2 is left for a reader to glob."""
    save_transcoders(load_transcoders(FIXTURES / "clt_jumprelu"), tmp_path / "set")
    save_transcoders(load_transcoders(FIXTURES / "plt_jumprelu"), tmp_path / "set")
    assert sorted(p.name for p in (tmp_path / "set").iterdir()) == ["config.yaml", "layer_0.safetensors", "layer_1.safetensors"]
    assert not load_transcoders(tmp_path / "set").cross_layer


def test_gemma_scope_2_variants_are_named_when_several(tmp_path):
    root = tmp_path / "gemma-scope-2-tiny-pt"
    shutil.copytree(FIXTURES / "gemma-scope-2-tiny-pt", root)
    for layer in range(2):
        shutil.copytree(root / "transcoder_all" / f"layer_{layer}_width_16k_l0_small_affine",
                        root / "transcoder_all" / f"layer_{layer}_width_16k_l0_big_affine")
    with pytest.raises(CheckpointError, match="several variants; choose one: width_16k_l0_big_affine, width_16k_l0_small_affine"):
        load_transcoders(root)
    assert load_transcoders(root, variant="width_16k_l0_big_affine").n_layers == 2
    with pytest.raises(CheckpointError, match="no Gemma Scope 2 variant 'width_1m'"):
        load_transcoders(root, variant="width_1m")


def test_topk_and_clt_skip_sets_are_refused_before_writing(tmp_path):
    topk = TranscoderSet([SAE(8, 16, kind="topk", k=2, transcoder=True, seed=i) for i in range(2)])
    with pytest.raises(ValueError, match="reads ReLU and JumpReLU transcoders; kind='topk'"):
        save_transcoders(topk, tmp_path / "set")
    assert not (tmp_path / "set").exists()


# ---- hostile and broken files -------------------------------------------------------------------------
def _copy(tmp_path, name="plt_jumprelu") -> Path:
    shutil.copytree(FIXTURES / name, tmp_path / name)
    return tmp_path / name


@pytest.mark.parametrize("text, message", [
    ("model_kind: [unclosed", "not valid YAML"),
    ("- a list", "must hold a mapping"),
    ("!!python/object/apply:os.system ['echo hacked']", "not valid YAML"),
    ("model_kind: sae\nfeature_input_hook: mlp.hook_in\nfeature_output_hook: mlp.hook_out", "model_kind='sae'; allowed: transcoder_set"),
    ("model_kind: transcoder_set\nfeature_input_hook: 3\nfeature_output_hook: mlp.hook_out", "feature_input_hook must be a hook name"),
    ("model_kind: transcoder_set\nfeature_input_hook: hook_embed\nfeature_output_hook: mlp.hook_out",
     "circuit-tracer hook 'hook_embed' is not one anatomy maps; allowed: mlp.hook_in"),
    ("model_kind: transcoder_set\nfeature_input_hook: mlp.hook_in\nfeature_output_hook: mlp.hook_out\ntranscoders: "
     "['hf://org/set/layer_0.safetensors']", "not in the Hugging Face cache .*hf download org/set layer_0.safetensors"),
    ("model_kind: transcoder_set\nfeature_input_hook: mlp.hook_in\nfeature_output_hook: mlp.hook_out\ntranscoders: "
     "['../../etc/passwd']", "leads outside"),
])
def test_a_hostile_config_is_one_checkpoint_error(tmp_path, monkeypatch, text, message):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    folder = _copy(tmp_path)
    (folder / "config.yaml").write_text(text)
    with pytest.raises(CheckpointError, match=message):
        load_transcoders(folder)


def test_a_huge_config_is_refused_before_it_is_parsed(tmp_path):
    folder = _copy(tmp_path)
    (folder / "config.yaml").write_text("a: " + "b" * 2_000_000)
    with pytest.raises(CheckpointError, match="a real one is under 1,000,000"):
        load_transcoders(folder)


def _rewrite(path: Path, change) -> None:
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path))


@pytest.mark.parametrize("change, message", [
    (lambda t: t.update(W_dec=torch.zeros(41, 16)), r"W_dec has shape \(41, 16\), the configuration says \(40, 16\)"),
    (lambda t: t.pop("b_enc"), r"tensors \['b_enc'\] are missing"),
    (lambda t: t.update(extra=torch.zeros(2)), r"unexpected tensors \['extra'\]"),
    (lambda t: t.pop("activation_function.threshold"), "every layer of a set has the same tensors"),
    (lambda t: t.update(b_enc=torch.zeros(40, dtype=torch.int32)), "not floating point"),
])
def test_a_layer_that_disagrees_is_refused_naming_its_file(tmp_path, change, message):
    folder = _copy(tmp_path)
    _rewrite(folder / "layer_1.safetensors", change)
    with pytest.raises(CheckpointError, match=message) as error:
        load_transcoders(folder)
    assert "layer_1.safetensors" in str(error.value)


def test_a_missing_layer_and_a_truncated_file_are_refused(tmp_path):
    folder = _copy(tmp_path)
    shutil.copy(folder / "layer_1.safetensors", folder / "layer_3.safetensors")
    with pytest.raises(CheckpointError, match="layer_2.safetensors is missing"):
        load_transcoders(folder)
    (folder / "layer_3.safetensors").unlink()
    data = (folder / "layer_1.safetensors").read_bytes()
    (folder / "layer_1.safetensors").write_bytes(data[:len(data) // 2])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_transcoders(folder)


def test_a_clt_decoder_of_the_wrong_depth_is_refused(tmp_path):
    folder = _copy(tmp_path, "clt_jumprelu")
    _rewrite(folder / "W_dec_1.safetensors", lambda t: t.update(W_dec_1=torch.zeros(40, 3, 16)))
    with pytest.raises(CheckpointError, match=r"W_dec_1 has shape \(40, 3, 16\), the configuration says \(40, 2, 16\)"):
        load_transcoders(folder)


def test_a_set_larger_than_memory_is_refused_before_reading(tmp_path, monkeypatch):
    monkeypatch.setattr("anatomy.checkpoints.memory.available_memory", lambda: 1000)
    with pytest.raises(CheckpointError, match="GiB, more than the"):
        load_transcoders(FIXTURES / "plt_jumprelu")


# ---- circuit-tracer reads anatomy's files back -----------------------------------------------------------
READ_BACK = """
import sys, torch
from safetensors.torch import load_file, save_file
from circuit_tracer.utils.caching import load_transcoders_from_cache
for folder in sys.argv[1:]:
    parent, name = folder.rsplit("/", 1)
    transcoders, config = load_transcoders_from_cache(name, cache_dir=parent, device=torch.device("cpu"),
                                                      dtype=torch.float32, lazy_decoder=False)
    x = load_file(parent + "/x.safetensors")["x"]
    with torch.no_grad():
        if config["model_kind"] == "cross_layer_transcoder":
            features = transcoders.encode(x)
            recon = transcoders.decode(features.to_sparse())
        else:
            features = torch.stack([t.encode(x[i]) for i, t in enumerate(transcoders)])
            recon = torch.stack([t.decode(features[i], x[i]) for i, t in enumerate(transcoders)])
    save_file({"features": features.contiguous(), "recon": recon.contiguous()}, parent + "/theirs.safetensors")
    print(type(transcoders).__name__, config["feature_input_hook"], config["feature_output_hook"])
"""
WRITTEN = [(False, "jumprelu", False), (False, "relu", True), (False, "batchtopk", False), (True, "jumprelu", False),
           (True, "relu", False)]


@pytest.fixture(scope="module")
def read_by_circuit_tracer(tmp_path_factory) -> dict[tuple, tuple[TranscoderSet, torch.Tensor, Path, list[str]]]:
    """(cross_layer, kind, skip) -> (the set anatomy saved, the inputs, its folder, what circuit-tracer printed
    of it): every set read by one circuit-tracer process (importing it takes seconds)."""
    n_layers, d_model, d_tc = 3, 12, 30
    torch.manual_seed(0)
    written = {}
    for cross_layer, kind, skip in WRITTEN:
        layers = []
        for layer in range(n_layers):
            d_out = (n_layers - layer) * d_model if cross_layer else d_model
            sae = SAE(d_model, d_tc, kind=kind, k=4.0 if kind == "batchtopk" else None, d_out=d_out, transcoder=True,
                      skip=skip, seed=layer)
            with torch.no_grad():
                for name, parameter in sae.named_parameters():
                    parameter.add_(0.2 * torch.randn_like(parameter))
                sae.b_dec[d_model:] = 0
                if kind != "relu":
                    sae.threshold.copy_(torch.rand(d_tc) * 0.3)
            layers.append(sae.eval())
        transcoders = TranscoderSet(layers, cross_layer=cross_layer, input_point="blocks.L.resid_mid")
        folder = tmp_path_factory.mktemp(f"{'clt' if cross_layer else 'plt'}-{kind}-{skip}")
        save_transcoders(transcoders, folder / "set")
        x = torch.randn(n_layers, 7, d_model)
        save_file({"x": x}, str(folder / "x.safetensors"))
        written[cross_layer, kind, skip] = transcoders, x, folder
    run = subprocess.run([os.environ["ANATOMY_CIRCUIT_TRACER_PYTHON"], "-c", READ_BACK,
                          *(str(folder / "set") for *_, folder in written.values())],
                         capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    printed = run.stdout.strip().splitlines()[-len(written):]
    return {key: (*made, line.split()) for (key, made), line in zip(written.items(), printed)}


@pytest.mark.slow
@pytest.mark.peer("ANATOMY_CIRCUIT_TRACER_PYTHON")  # circuit-tracer 0.5.0 pins its own stack
@pytest.mark.parametrize("cross_layer, kind, skip", WRITTEN)
def test_circuit_tracer_loads_anatomy_files_back(read_by_circuit_tracer, cross_layer, kind, skip):
    """circuit-tracer's own cache loader reads what save_transcoders wrote, and computes the same features
    and reconstructions within 1e-5 (a BatchTopK set is written, and read, as the JumpReLU it is in use)."""
    transcoders, x, folder, printed = read_by_circuit_tracer[cross_layer, kind, skip]
    assert printed[1:] == ["hook_resid_mid", "mlp.hook_out"]
    theirs = load_file(str(folder / "theirs.safetensors"))
    features, recon = outputs(transcoders, x)
    assert (features - theirs["features"]).abs().max() < 1e-5
    assert (recon - theirs["recon"]).abs().max() < 1e-5
