"""The field's transcoder sets by name, offline, from a Hugging Face cache the tests fill with small files in
each published layout: circuit-tracer's presets ("gemma": Gemma Scope's params.npz listed by hf:// URIs in
another repository; "llama": layer_{i}.safetensors with a skip), a cross-layer set in a folder of a
repository, and Gemma Scope 2's variants. Each set computes what its arrays say, read a layer at a time
from memory-mapped files; what is not cached is named with the command that fetches it.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save

from anatomy.checkpoints.files import CheckpointError
from anatomy.sae import load_transcoders
from transcoder_cases import (arrays, expected_features, expected_output, fake_repo, layer_safetensors, params_npz,
                              params_safetensors)

D_MODEL, D_SAE, N_LAYERS = 8, 16, 2
GEMMA_FILES = [f"layer_{i}/width_16k/average_l0_{70 + i}/params.npz" for i in range(N_LAYERS)]
GEMMA_CONFIG = ("model_name: google/gemma-2-2b\nmodel_kind: transcoder_set\nfeature_input_hook: ln2.hook_normalized\n"
                "feature_output_hook: hook_mlp_out\nscan: gemma-2-2b\ntranscoders:\n" +
                "".join(f"  - hf://google/gemma-scope-2b-pt-transcoders/{f}\n" for f in GEMMA_FILES))


def outputs(transcoders, x):
    with torch.no_grad():
        features = [transcoders.encode(layer, torch.from_numpy(x[layer])) for layer in range(transcoders.n_layers)]
        return [transcoders.reconstruct(layer, features, [torch.from_numpy(v) for v in x]).double().numpy()
                for layer in range(transcoders.n_layers)], [f.double().numpy() for f in features]


def check_computes(transcoders, layers):
    x = np.random.default_rng(9).normal(size=(len(layers), 5, D_MODEL)).astype(np.float32)
    recon, features = outputs(transcoders, x)
    for layer, values in enumerate(layers):
        assert np.abs(features[layer] - expected_features(values, x[layer])).max() < 1e-4
        assert np.abs(recon[layer] - expected_output(values, x[layer])).max() < 1e-4


def gemma_cache(offline_cache, skip=False):
    layers = [arrays(D_MODEL, D_SAE, seed=i, skip=skip) for i in range(N_LAYERS)]
    fake_repo(offline_cache, "mwhanna/gemma-scope-transcoders", {"config.yaml": GEMMA_CONFIG.encode(), "README.md": b"hi"})
    fake_repo(offline_cache, "google/gemma-scope-2b-pt-transcoders",
              {f: params_npz(values) for f, values in zip(GEMMA_FILES, layers)})
    return layers


@pytest.mark.parametrize("skip", [False, True])
def test_gemma_is_circuit_tracers_preset_read_from_the_cache(offline_cache, skip):
    layers = gemma_cache(offline_cache, skip)
    transcoders = load_transcoders("gemma")
    assert transcoders.metadata["model_name"] == "google/gemma-2-2b"
    # ln2.hook_normalized: the stream before the norm's gain, as Gemma Scope's transcoders read it
    assert (transcoders.input_point(1), transcoders.output_point(1)) == ("blocks.1.mlp_norm.normalized", "blocks.1.mlp_out_norm.out")
    assert (transcoders.kind, transcoders.n_layers, transcoders.d_model, transcoders.has_skip) == ("jumprelu", 2, D_MODEL, skip)
    check_computes(transcoders, layers)


def test_layers_are_read_when_used_memory_mapped_and_kept_as_asked(offline_cache):
    gemma_cache(offline_cache)
    transcoders = load_transcoders("gemma", resident=1)
    assert transcoders.lazy and transcoders.layers.built() == []  # only headers were read
    W_enc = transcoders.layers[1].W_enc
    assert transcoders.layers.built() == [1]
    if os.path.exists("/proc/self/maps"):  # the weights are the file's own pages, not a copy
        pointer = W_enc.data_ptr()
        mapped = [line for line in open("/proc/self/maps") if
                  int(line.split("-")[0], 16) <= pointer < int(line.split()[0].split("-")[1], 16)]
        assert mapped and mapped[0].rstrip().endswith(".npz") is False and "blobs" in mapped[0]
    transcoders.layers[0]
    assert transcoders.layers.built() == [0]  # resident=1: layer 1 was let go
    transcoders.release()
    assert transcoders.layers.built() == []


def test_llama_reads_per_layer_files_and_nothing_else_of_the_repository(offline_cache):
    layers = [arrays(D_MODEL, D_SAE, seed=10 + i, skip=True) for i in range(N_LAYERS)]
    config = b"model_kind: transcoder_set\nfeature_input_hook: mlp.hook_in\nfeature_output_hook: mlp.hook_out\nscan: llama\n"
    fake_repo(offline_cache, "mntss/transcoder-Llama-3.2-1B", {"config.yaml": config, "README.md": b"# sets",
              **{f"layer_{i}.safetensors": layer_safetensors(values) for i, values in enumerate(layers)}})
    transcoders = load_transcoders("llama")
    assert (transcoders.input_point(0), transcoders.output_point(0)) == ("blocks.0.mlp_norm.out", "blocks.0.mlp.out")
    check_computes(transcoders, layers)


def test_a_folder_of_a_repository_in_the_cross_layer_layout(offline_cache):
    rng = np.random.default_rng(4)
    files = {"clt/config.yaml": b"model_kind: cross_layer_transcoder\nfeature_input_hook: hook_resid_mid\n"
                                b"feature_output_hook: hook_mlp_out\n", "other/layer_0.safetensors": b"not read"}
    for i in range(N_LAYERS):
        files[f"clt/W_enc_{i}.safetensors"] = save({
            f"W_enc_{i}": torch.tensor(rng.normal(size=(D_SAE, D_MODEL)), dtype=torch.float32),
            f"b_enc_{i}": torch.zeros(D_SAE), f"b_dec_{i}": torch.full((D_MODEL,), float(i))})
        files[f"clt/W_dec_{i}.safetensors"] = save({f"W_dec_{i}": torch.ones(D_SAE, N_LAYERS - i, D_MODEL)})
    fake_repo(offline_cache, "someone/clt-tiny", files)
    transcoders = load_transcoders("someone/clt-tiny/clt")
    assert transcoders.cross_layer and [transcoders.decoder_vectors(i).shape for i in range(2)] == [(16, 2, 8), (16, 1, 8)]
    assert torch.equal(transcoders.output_bias(1), torch.ones(D_MODEL))


def gemma_scope_2_cache(offline_cache):
    layers = {variant: [arrays(D_MODEL, D_SAE, seed=20 + 2 * i + k, skip=True) for i in range(N_LAYERS)]
              for k, variant in enumerate(["width_16k_l0_small_affine", "width_16k_l0_big_affine"])}
    config = (b'{"hf_hook_point_in": "model.layers.0.pre_feedforward_layernorm.output", '
              b'"hf_hook_point_out": "model.layers.0.post_feedforward_layernorm.output", "model_name": "gemma-3-tiny"}')
    files = {}
    for variant, values in layers.items():
        for i, layer in enumerate(values):
            files[f"transcoder_all/layer_{i}_{variant}/params.safetensors"] = params_safetensors(layer)
            files[f"transcoder_all/layer_{i}_{variant}/config.json"] = config
    fake_repo(offline_cache, "google/gemma-scope-2-tiny-pt", files)
    return layers


@pytest.mark.parametrize("source, variant", [("google/gemma-scope-2-tiny-pt", "width_16k_l0_big_affine"),
                                             ("google/gemma-scope-2-tiny-pt/transcoder_all", "width_16k_l0_big_affine"),
                                             ("google/gemma-scope-2-tiny-pt/transcoder_all/width_16k_l0_big_affine", None)])
def test_gemma_scope_2_by_id_with_its_variant(offline_cache, source, variant):
    layers = gemma_scope_2_cache(offline_cache)
    transcoders = load_transcoders(source, variant=variant)
    assert transcoders.output_point(0) == "blocks.0.mlp_out_norm.out" and transcoders.metadata["model_name"] == "gemma-3-tiny"
    check_computes(transcoders, layers["width_16k_l0_big_affine"])


def test_gemma_scope_2_without_a_variant_names_them(offline_cache):
    gemma_scope_2_cache(offline_cache)
    with pytest.raises(CheckpointError, match="several variants; choose one .*width_16k_l0_big_affine, width_16k_l0_small"):
        load_transcoders("google/gemma-scope-2-tiny-pt")


def test_a_set_not_in_the_cache_names_the_id_the_cache_and_the_command(offline_cache):
    with pytest.raises(CheckpointError) as error:
        load_transcoders("gemma")
    message = str(error.value)
    assert "'gemma' (mwhanna/gemma-scope-transcoders)" in message and str(offline_cache) in message
    assert "HF_HUB_OFFLINE is set" in message and "anatomy.load_transcoders('gemma')" in message


def test_files_a_config_lists_but_the_cache_lacks_are_named_in_one_command(offline_cache):
    gemma_cache(offline_cache)
    blob = (offline_cache / "models--google--gemma-scope-2b-pt-transcoders" / "snapshots").rglob("params.npz")
    for link in blob:
        link.unlink()
    with pytest.raises(CheckpointError) as error:
        load_transcoders("gemma")
    assert f"`hf download google/gemma-scope-2b-pt-transcoders {GEMMA_FILES[0]} {GEMMA_FILES[1]}`" in str(error.value)


def test_a_pinned_revision_that_is_not_cached_is_named(offline_cache):
    gemma_cache(offline_cache)
    with pytest.raises(CheckpointError, match="at revision 'v2'.*--revision v2"):
        load_transcoders("mwhanna/gemma-scope-transcoders@v2")


def test_a_repository_without_a_set_says_what_it_expected(offline_cache):
    fake_repo(offline_cache, "someone/models", {"config.json": b"{}", "model.safetensors": b"x"})
    with pytest.raises(CheckpointError, match="holds no transcoder set at its root .*config.yaml"):
        load_transcoders("someone/models")


def test_a_local_folder_wins_over_a_short_name(offline_cache, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gemma").mkdir()
    with pytest.raises(CheckpointError, match="no transcoder set in 'gemma'"):
        load_transcoders("gemma")


def test_a_compressed_npz_is_read_as_well(tmp_path):
    layers = [arrays(D_MODEL, D_SAE, seed=30 + i) for i in range(N_LAYERS)]
    folder = tmp_path / "set"
    folder.mkdir()
    (folder / "config.yaml").write_text("model_kind: transcoder_set\nfeature_input_hook: mlp.hook_in\n"
                                        "feature_output_hook: mlp.hook_out\ntranscoders: [l0.npz, l1.npz]\n")
    for i, values in enumerate(layers):
        (folder / f"l{i}.npz").write_bytes(params_npz(values, compressed=True))
    check_computes(load_transcoders(folder), layers)


def test_many_missing_files_are_named_by_the_one_call_that_fetches_them(offline_cache):
    files = [f"layer_{i}/width_16k/average_l0_{i}/params.npz" for i in range(26)]
    config = GEMMA_CONFIG.split("transcoders:")[0] + "transcoders:\n" + "".join(
        f"  - hf://google/gemma-scope-2b-pt-transcoders/{f}\n" for f in files)
    fake_repo(offline_cache, "mwhanna/gemma-scope-transcoders", {"config.yaml": config.encode()})
    with pytest.raises(CheckpointError) as error:
        load_transcoders("gemma")
    message = str(error.value)
    assert "26 files of 'google/gemma-scope-2b-pt-transcoders'; 26 of them are not in the Hugging Face cache" in message
    assert """`HF_HUB_OFFLINE=0 python -c "import anatomy; anatomy.load_transcoders('gemma')"`""" in message
    assert len(message) < 500  # one line the command line prints whole


def test_the_command_line_resolves_gemma_offline_and_checks_it_against_the_model(offline_cache, tmp_path, capsys):
    """`--transcoders gemma` from the filled cache: read, then checked against the model before any pass (the
    fixture Llama has no norm after its MLP, which the Gemma Scope set writes to)."""
    from anatomy.cli import main

    llama = Path(__file__).parent.parent / "circuits" / "fixtures" / "graphs" / "llama"
    layers = [arrays(32, D_SAE, seed=40 + i) for i in range(3)]
    files = [f"layer_{i}/width_16k/average_l0_{i}/params.npz" for i in range(3)]
    config = GEMMA_CONFIG.split("transcoders:")[0] + "transcoders:\n" + "".join(
        f"  - hf://google/gemma-scope-2b-pt-transcoders/{f}\n" for f in files)
    fake_repo(offline_cache, "mwhanna/gemma-scope-transcoders", {"config.yaml": config.encode()})
    fake_repo(offline_cache, "google/gemma-scope-2b-pt-transcoders", {f: params_npz(v) for f, v in zip(files, layers)})
    code = main(["circuits", "The capital", "--model", str(llama), "--transcoders", "gemma", "--out", str(tmp_path / "g.json")])
    error = capsys.readouterr().err
    assert code == 2 and len(error.strip().splitlines()) == 1
    assert "output point 'blocks.L.mlp_out_norm.out' is not in block 0 of this model" in error
    assert not (tmp_path / "g.json").exists()
