"""Hostile and broken SAE files get the checkpoint loader's guarantees: every size from the headers, checked
before a tensor is allocated; nothing unpickled; one CheckpointError naming the file and the problem."""

from __future__ import annotations

import io
import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from anatomy import CheckpointError
from anatomy.sae import SAE, load_sae

FIXTURES = Path(__file__).parent / "fixtures"


def _copy(tmp_path: Path, name: str = "topk") -> Path:
    folder = tmp_path / name
    shutil.copytree(FIXTURES / name, folder)
    return folder


def _edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "cfg.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (folder / "cfg.json").write_text(json.dumps(config))


@pytest.mark.parametrize("changes, message", [
    (dict(architecture="gated"), "architecture 'gated'"),
    (dict(d_sae=10**12), "shape"),
    (dict(d_in="16"), "d_in must be a positive integer"),
    (dict(k=0), "needs k"),
    (dict(normalize_activations="layer_norm"), "normalize_activations"),
    (dict(hook_head_index=3), "one head"),
    (dict(reshape_activations="hook_q"), "reshape_activations"),
    (dict(dtype="int8"), "dtype"),
])
def test_a_config_that_does_not_fit_is_refused_naming_the_problem(tmp_path, changes, message):
    folder = _copy(tmp_path)
    _edit_config(folder, **changes)
    with pytest.raises(CheckpointError, match=message) as error:
        load_sae(folder)
    assert "cfg.json" in str(error.value) or "sae_weights" in str(error.value)


def test_a_giant_config_is_refused_from_the_header_before_any_allocation(tmp_path, monkeypatch):
    folder = _copy(tmp_path)
    _edit_config(folder, d_in=10**6, d_sae=10**7)
    monkeypatch.setattr(torch, "empty", lambda *a, **k: pytest.fail("allocated"))
    with pytest.raises(CheckpointError, match="d_in|shape"):
        load_sae(folder)


def test_more_than_memory_holds_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr("anatomy.checkpoints.memory.available_memory", lambda: 1000)
    with pytest.raises(CheckpointError, match="memory"):
        load_sae(_copy(tmp_path))


def test_broken_weights_are_named(tmp_path):
    folder = _copy(tmp_path)
    data = (folder / "sae_weights.safetensors").read_bytes()
    (folder / "sae_weights.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="sae_weights.safetensors"):
        load_sae(folder)
    (folder / "cfg.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_sae(folder)
    folder = _copy(tmp_path, "relu")
    tensors = {"W_enc": torch.zeros(16, 48), "W_dec": torch.zeros(48, 16), "b_enc": torch.zeros(48), "b_dec": torch.zeros(16),
               "extra": torch.zeros(3)}
    save_file(tensors, str(folder / "sae_weights.safetensors"))
    with pytest.raises(CheckpointError, match="unexpected tensors"):
        load_sae(folder)
    del tensors["extra"], tensors["b_dec"]
    save_file(tensors, str(folder / "sae_weights.safetensors"))
    with pytest.raises(CheckpointError, match="missing"):
        load_sae(folder)
    with pytest.raises(CheckpointError, match="no SAE"):
        load_sae(tmp_path / "nothing-here")


def _npz(path: Path, arrays: dict) -> None:
    np.savez(path, **arrays)


def _gemma(d_in=8, d_sae=12) -> dict:
    rng = np.random.default_rng(0)
    return {"W_enc": rng.standard_normal((d_in, d_sae)).astype(np.float32),
            "W_dec": rng.standard_normal((d_sae, d_in)).astype(np.float32),
            "b_enc": np.zeros(d_sae, np.float32), "b_dec": np.zeros(d_in, np.float32),
            "threshold": np.zeros(d_sae, np.float32)}


def test_a_params_npz_with_python_objects_is_refused_without_unpickling(tmp_path):
    arrays = _gemma()
    arrays["threshold"] = np.array([{"os": "system"}] * 12, dtype=object)
    np.savez(tmp_path / "params.npz", **arrays)
    with pytest.raises(CheckpointError, match="not numbers"):
        load_sae(tmp_path / "params.npz")


def test_a_params_npz_whose_header_lies_about_its_size_is_refused(tmp_path):
    """A .npy header declaring a billion-row array over a few bytes of data (a zip bomb's promise)."""
    path = tmp_path / "params.npz"
    _npz(path, _gemma())
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (10**9, 12)})
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr("W_big.npy", header.getvalue() + b"\0" * 64)
    with pytest.raises(CheckpointError, match="declares shape"):
        load_sae(path)


def test_a_params_npz_with_shapes_that_disagree_is_refused(tmp_path):
    arrays = _gemma()
    arrays["b_enc"] = np.zeros(13, np.float32)
    _npz(tmp_path / "params.npz", arrays)
    with pytest.raises(CheckpointError, match="b_enc has shape"):
        load_sae(tmp_path / "params.npz")
    (tmp_path / "params.npz").write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(CheckpointError, match="zip"):
        load_sae(tmp_path / "params.npz")


def test_an_anatomy_run_folder_loads_its_sae(tmp_path):
    sae = SAE(8, 16, kind="topk", k=2, point="blocks.0.resid_post", metadata={"model_name": "toy"})
    sae.save(tmp_path / "run" / "sae")
    loaded = load_sae(tmp_path / "run")
    assert (loaded.kind, loaded.k, loaded.point, loaded.metadata["model_name"]) == ("topk", 2, "blocks.0.resid_post", "toy")
    assert all(torch.equal(a, b) for a, b in zip(sae.state_dict().values(), loaded.state_dict().values()))
    assert oct((tmp_path / "run" / "sae" / "sae_weights.safetensors").stat().st_mode & 0o777) == "0o644"


def test_a_hub_id_fetches_only_the_sae_files_of_its_folder(tmp_path, monkeypatch):
    """org/name/path/to/folder: the repository's SAE files in that folder, through the Hugging Face cache."""
    snapshot = tmp_path / "snapshot"
    shutil.copytree(FIXTURES / "topk", snapshot / "blocks.1.hook_resid_post")
    asked = {}

    def fetch(repo_id, patterns, revision=None):
        asked.update(repo=repo_id, patterns=patterns, revision=revision)
        return snapshot

    monkeypatch.setattr("anatomy.checkpoints.hub.fetch", fetch)
    sae = load_sae("someone/tiny-saes/blocks.1.hook_resid_post", revision="v1")
    assert asked == {"repo": "someone/tiny-saes", "revision": "v1", "patterns": [
        "blocks.1.hook_resid_post/cfg.json", "blocks.1.hook_resid_post/sae_weights.safetensors",
        "blocks.1.hook_resid_post/params.npz"]}
    assert (sae.kind, sae.point) == ("topk", "blocks.1.resid_post")
