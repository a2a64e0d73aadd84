"""Every bad checkpoint is a CheckpointError that names what is wrong, raised before a model exists."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import anatomy
from anatomy.checkpoints import CheckpointError


@pytest.fixture
def gpt2_dir(hf_checkpoint, tmp_path):
    """A private, editable copy of the tiny GPT-2 checkpoint."""
    target = tmp_path / "gpt2"
    shutil.copytree(hf_checkpoint("gpt2"), target)
    return target


def _edit(directory, change):
    tensors = load_file(directory / "model.safetensors")
    change(tensors)
    save_file(tensors, directory / "model.safetensors")


def test_missing_directory(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        anatomy.from_pretrained(tmp_path / "nowhere")


def test_missing_config(gpt2_dir):
    (gpt2_dir / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json.* is missing"):
        anatomy.from_pretrained(gpt2_dir)


def test_missing_weights_file(gpt2_dir):
    (gpt2_dir / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no weights .*model.safetensors.*pytorch_model.bin"):
        anatomy.from_pretrained(gpt2_dir)


def test_unknown_model_type_lists_the_supported_ones(gpt2_dir):
    config = json.loads((gpt2_dir / "config.json").read_text())
    (gpt2_dir / "config.json").write_text(json.dumps({**config, "model_type": "mamba"}))
    with pytest.raises(CheckpointError, match="'mamba'.*bert, .*gpt2, .*llama, .*marian"):
        anatomy.from_pretrained(gpt2_dir)


def test_missing_tensor_is_named_with_its_shape(gpt2_dir):
    _edit(gpt2_dir, lambda t: t.pop("transformer.h.1.mlp.c_fc.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensors \(1\):\s+transformer.h.1.mlp.c_fc.weight \[32, 128\]"):
        anatomy.from_pretrained(gpt2_dir)


def test_unexpected_tensor_is_named(gpt2_dir):
    _edit(gpt2_dir, lambda t: t.update({"transformer.h.0.mlp.extra.weight": torch.zeros(3, 4)}))
    with pytest.raises(CheckpointError, match=r"unexpected tensors \(1\):\s+transformer.h.0.mlp.extra.weight \[3, 4\]"):
        anatomy.from_pretrained(gpt2_dir)


def test_mis_shaped_tensor_names_both_shapes(gpt2_dir):
    _edit(gpt2_dir, lambda t: t.update({"transformer.h.0.attn.c_attn.weight": torch.zeros(32, 64)}))
    with pytest.raises(CheckpointError, match=r"c_attn.weight: checkpoint has \[32, 64\], model expects \[32, 96\]"):
        anatomy.from_pretrained(gpt2_dir)


def test_every_problem_is_reported_at_once(gpt2_dir):
    def change(tensors):
        tensors.pop("transformer.ln_f.bias")
        tensors["transformer.wpe.weight"] = torch.zeros(10, 32)
        tensors["surprise"] = torch.zeros(1)

    _edit(gpt2_dir, change)
    with pytest.raises(CheckpointError) as error:
        anatomy.from_pretrained(gpt2_dir)
    for key in ("transformer.ln_f.bias", "transformer.wpe.weight", "surprise"):
        assert key in str(error.value)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_are_named(gpt2_dir, bad):
    def change(tensors):
        tensors["transformer.h.1.ln_2.weight"][3] = bad

    _edit(gpt2_dir, change)
    with pytest.raises(CheckpointError, match=r"NaN or Inf.*\n\s+transformer.h.1.ln_2.weight"):
        anatomy.from_pretrained(gpt2_dir)


def test_truncated_safetensors(gpt2_dir):
    data = (gpt2_dir / "model.safetensors").read_bytes()
    (gpt2_dir / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        anatomy.from_pretrained(gpt2_dir)


def test_garbage_safetensors(gpt2_dir):
    (gpt2_dir / "model.safetensors").write_bytes(b"\x00" * 5)
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        anatomy.from_pretrained(gpt2_dir)


def _to_bin(directory, tensors=None):
    tensors = load_file(directory / "model.safetensors") if tensors is None else tensors
    (directory / "model.safetensors").unlink()
    torch.save(tensors, directory / "pytorch_model.bin")


def test_pytorch_model_bin_loads_the_same(gpt2_dir, hf_checkpoint):
    _to_bin(gpt2_dir)
    ids = torch.tensor([[1, 2, 3, 4]])
    assert torch.equal(anatomy.from_pretrained(gpt2_dir)(ids).logits, anatomy.from_pretrained(hf_checkpoint("gpt2"))(ids).logits)


def test_truncated_pytorch_model_bin(gpt2_dir):
    _to_bin(gpt2_dir)
    data = (gpt2_dir / "pytorch_model.bin").read_bytes()
    (gpt2_dir / "pytorch_model.bin").write_bytes(data[: len(data) // 3])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        anatomy.from_pretrained(gpt2_dir)


class Payload:
    """An object a malicious pickle could carry; loading must refuse to rebuild it."""

    def __reduce__(self):
        return (print, ("this must never run",))


def test_pickled_objects_are_never_unpickled(gpt2_dir, capsys):
    tensors = load_file(gpt2_dir / "model.safetensors")
    _to_bin(gpt2_dir, {**tensors, "payload": Payload()})
    with pytest.raises(CheckpointError, match="never unpickles arbitrary objects"):
        anatomy.from_pretrained(gpt2_dir)
    assert "must never run" not in capsys.readouterr().out


def _shard(directory, index_name="model.safetensors.index.json"):
    tensors = load_file(directory / "model.safetensors")
    (directory / "model.safetensors").unlink()
    keys = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": keys[: len(keys) // 2],
              "model-00002-of-00002.safetensors": keys[len(keys) // 2:]}
    for file, names in halves.items():
        save_file({k: tensors[k] for k in names}, directory / file)
    weight_map = {k: file for file, names in halves.items() for k in names}
    (directory / index_name).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return halves


def test_sharded_checkpoint_loads_the_same(gpt2_dir, hf_checkpoint):
    _shard(gpt2_dir)
    ids = torch.tensor([[5, 6, 7]])
    assert torch.equal(anatomy.from_pretrained(gpt2_dir)(ids).logits, anatomy.from_pretrained(hf_checkpoint("gpt2"))(ids).logits)


def test_sharded_checkpoint_with_a_missing_shard(gpt2_dir):
    halves = _shard(gpt2_dir)
    (gpt2_dir / list(halves)[1]).unlink()
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors.* is missing"):
        anatomy.from_pretrained(gpt2_dir)


def test_tied_copy_that_differs_is_refused(gpt2_dir):
    _edit(gpt2_dir, lambda t: t.update({"lm_head.weight": torch.randn(99, 32)}))
    with pytest.raises(CheckpointError, match="lm_head.weight differs from lm_head.proj.weight"):
        anatomy.from_pretrained(gpt2_dir)


def test_marian_position_table_must_match_the_formula(hf_checkpoint, tmp_path):
    from anatomy.positional import sinusoidal_table

    directory = tmp_path / "marian"
    shutil.copytree(hf_checkpoint("marian"), directory)
    table = sinusoidal_table(64, 32, "halves")
    _edit(directory, lambda t: t.update({"model.encoder.embed_positions.weight": table.clone(),
                                         "model.decoder.embed_positions.weight": table.clone()}))
    anatomy.from_pretrained(directory)  # older checkpoints store the table: accepted when it is the formula
    _edit(directory, lambda t: t.update({"model.decoder.embed_positions.weight": table.flip(0)}))
    with pytest.raises(CheckpointError, match="model.decoder.embed_positions.weight differs"):
        anatomy.from_pretrained(directory)


def test_unsupported_option_is_named(hf_checkpoint, tmp_path):
    directory = tmp_path / "llama"
    shutil.copytree(hf_checkpoint("llama-gqa"), directory)
    config = json.loads((directory / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="rope_type='yarn'"):
        anatomy.from_pretrained(directory)
