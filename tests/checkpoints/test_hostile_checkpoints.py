"""Hostile checkpoints: each is refused with one CheckpointError naming the file and the problem,
before anything large is allocated, and nothing outside the checkpoint folder is read."""

from __future__ import annotations

import json
import os
import shutil

import pytest

import anatomy
from anatomy.checkpoints import CheckpointError


@pytest.fixture
def gpt2_dir(hf_checkpoint, tmp_path):
    directory = tmp_path / "gpt2"
    shutil.copytree(hf_checkpoint("gpt2"), directory)
    return directory


@pytest.fixture
def llama_dir(hf_checkpoint, tmp_path):
    directory = tmp_path / "llama"
    shutil.copytree(hf_checkpoint("llama-gqa"), directory)
    return directory


def _edit_config(directory, **fields):
    config = json.loads((directory / "config.json").read_text())
    config.update(fields)
    (directory / "config.json").write_text(json.dumps(config))


KEEP = object()


def _shard(directory, first=KEEP):
    """Replace model.safetensors by part.safetensors and an index naming it for every tensor, the
    first tensor excepted when `first` is given (it is mapped to `first` instead)."""
    (directory / "model.safetensors").rename(directory / "part.safetensors")
    from safetensors import safe_open

    with safe_open(str(directory / "part.safetensors"), "pt") as f:
        weight_map = dict.fromkeys(f.keys(), "part.safetensors")
    if first is not KEEP:
        weight_map[next(iter(weight_map))] = first
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


# 1. sizes: refused from the config and the headers, before building -----------------------------
@pytest.mark.parametrize("layers", [1_000_000, 1_514_834_315])
def test_a_million_layers_is_refused_from_the_names_alone(gpt2_dir, layers):
    # Before any ModelConfig exists: a config builds per-layer tables (1.5e9 layers hung the fuzz test).
    _edit_config(gpt2_dir, n_layer=layers)
    with pytest.raises(CheckpointError, match=f"the config says {layers}, the weights hold 2"):
        anatomy.from_pretrained(gpt2_dir)


@pytest.mark.parametrize("vocab", [50_000_000, 10**12])
def test_a_vocabulary_the_weights_do_not_have_is_refused_before_reading(gpt2_dir, vocab):
    _edit_config(gpt2_dir, vocab_size=vocab)
    with pytest.raises(CheckpointError, match=rf"wte.weight: checkpoint has \[99, 32\], model expects \[{vocab}, 32\]"
                                              rf"|cannot build the model|gives vocab_size={vocab}, outside"):
        anatomy.from_pretrained(gpt2_dir)


def test_position_tables_beyond_the_memory_are_refused_before_building(llama_dir):
    _edit_config(llama_dir, max_position_embeddings=10**12)
    with pytest.raises(CheckpointError, match=r"position tables \(max_seq_len=1000000000000 x .*nothing was allocated"):
        anatomy.from_pretrained(llama_dir)


@pytest.mark.parametrize("field, value", [
    ("rms_norm_eps", float("nan")), ("rms_norm_eps", float("inf")), ("rms_norm_eps", -1e-6),
    ("rope_theta", float("nan")), ("rope_theta", 0.0),
])
def test_non_finite_or_negative_floats_are_refused_by_name(llama_dir, field, value):
    config = json.loads((llama_dir / "config.json").read_text())
    config[field] = value
    config.pop("rope_parameters", None)
    (llama_dir / "config.json").write_text(json.dumps(config))  # json writes NaN / Infinity, as Python reads them
    name = "norm_eps" if field == "rms_norm_eps" else "rope_theta"
    with pytest.raises(CheckpointError, match=rf"{name} must be a finite number > 0|{field} = {value}; every number"):
        anatomy.from_pretrained(llama_dir)


# 2. shard paths stay inside the folder ----------------------------------------------------------
@pytest.mark.parametrize("kind", ["relative", "absolute"])
def test_shards_outside_the_folder_are_refused(gpt2_dir, tmp_path, kind):
    # "../../outside/x.safetensors", or an absolute path to a file outside the checkpoint folder
    outside = gpt2_dir / "../../outside/x.safetensors" if kind == "relative" else tmp_path / "abs.safetensors"
    outside.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(gpt2_dir / "model.safetensors", outside)
    _shard(gpt2_dir, first="../../outside/x.safetensors" if kind == "relative" else str(outside))
    with pytest.raises(CheckpointError, match="leads outside the checkpoint folder"):
        anatomy.from_pretrained(gpt2_dir)


def test_a_shard_symlinked_out_of_the_folder_is_refused(gpt2_dir, tmp_path):
    _shard(gpt2_dir)
    shutil.move(gpt2_dir / "part.safetensors", tmp_path / "elsewhere.safetensors")
    os.symlink(tmp_path / "elsewhere.safetensors", gpt2_dir / "part.safetensors")
    with pytest.raises(CheckpointError, match="leads outside the checkpoint folder"):
        anatomy.from_pretrained(gpt2_dir)


@pytest.mark.parametrize("value", [5, None, "/etc/passwd", "config.json"])
def test_weight_map_values_that_are_not_weight_files_are_refused(gpt2_dir, value):
    _shard(gpt2_dir, first=value)
    with pytest.raises(CheckpointError, match="not weight file names"):
        anatomy.from_pretrained(gpt2_dir)


# 3. malformed files -----------------------------------------------------------------------------
@pytest.mark.parametrize("content", [b"this is a text file, not weights\n" * 20, os.urandom(4096), b""])
def test_a_pytorch_model_bin_that_is_not_one(gpt2_dir, content):
    (gpt2_dir / "model.safetensors").unlink()
    (gpt2_dir / "pytorch_model.bin").write_bytes(content)
    with pytest.raises(CheckpointError, match="pytorch_model.bin.*(corrupt|never unpickles)"):
        anatomy.from_pretrained(gpt2_dir)


@pytest.mark.parametrize("content", ['{"model": {"type": "BPE"', "", '{"version": "1.0", "model": 5}', "[1, 2]"])
def test_a_malformed_tokenizer_json_is_named(gpt2_dir, content):
    (gpt2_dir / "tokenizer.json").write_text(content)
    with pytest.raises(CheckpointError, match="tokenizer.json.* is malformed"):
        anatomy.load_tokenizer(gpt2_dir)
    with pytest.raises(CheckpointError, match="tokenizer.json.* is malformed"):
        anatomy.from_pretrained(gpt2_dir)


def test_a_tokenizer_config_that_is_not_an_object(gpt2_dir, hf_checkpoint):
    anatomy.load_tokenizer("toy").save(gpt2_dir)
    (gpt2_dir / "tokenizer_config.json").write_text("[1]")
    with pytest.raises(CheckpointError, match="tokenizer_config.json.* must hold an object, got list"):
        anatomy.load_tokenizer(gpt2_dir)


def test_a_config_nested_200000_deep(gpt2_dir):
    (gpt2_dir / "config.json").write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(CheckpointError, match="config.json.* nested too deeply"):
        anatomy.from_pretrained(gpt2_dir)


@pytest.mark.parametrize("modules", ['{"a": 1}', "[1]", '[{"type": "Pooling", "path": "../../elsewhere"}]',
                                     '[{"type": 5}]', "not json"])
def test_a_malformed_modules_json(gpt2_dir, modules):
    (gpt2_dir / "modules.json").write_text(modules)
    with pytest.raises(CheckpointError, match="modules.json"):
        anatomy.from_pretrained(gpt2_dir)
