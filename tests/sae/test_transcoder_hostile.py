"""Hostile transcoder sets (issue 40): each is refused in one CheckpointError naming the file, before it costs
more than a real set would: no range made up to a layer number, no alias tree built, no list read past a
set's length, no zip bomb inflated, no hole of a sparse file read, no pipe waited on, no NaN computed with.
Every file is made here, small."""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from anatomy.checkpoints.files import CheckpointError
from anatomy.sae import load_transcoders
from transcoder_cases import arrays, params_npz

FIXTURES = Path(__file__).parent / "fixtures" / "circuit_tracer"
HOOKS = "model_kind: transcoder_set\nfeature_input_hook: mlp.hook_in\nfeature_output_hook: mlp.hook_out\n"


def copied(tmp_path, name="plt_jumprelu") -> Path:
    shutil.copytree(FIXTURES / name, tmp_path / name)
    return tmp_path / name


def npz_set(tmp_path, files: dict[str, bytes]) -> Path:
    folder = tmp_path / "npz"
    folder.mkdir()
    (folder / "config.yaml").write_text(HOOKS + f"transcoders: {json.dumps(sorted(files))}\n")
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


def test_a_layer_number_is_counted_not_made_a_range(tmp_path):
    folder = copied(tmp_path)
    (folder / "layer_99999999999.safetensors").write_bytes((folder / "layer_1.safetensors").read_bytes())
    with pytest.raises(CheckpointError, match="layer_2.safetensors is missing; a set has one file for every layer 0 .. 2"):
        load_transcoders(folder)


def test_a_gemma_scope_2_layer_number_is_counted_too(tmp_path):
    root = tmp_path / "gemma-scope-2-tiny-pt" / "transcoder_all"
    shutil.copytree(FIXTURES / "gemma-scope-2-tiny-pt" / "transcoder_all", root)
    source = next(root.glob("layer_1_*"))
    shutil.copytree(source, root / source.name.replace("layer_1_", "layer_99999999999_"))
    with pytest.raises(CheckpointError, match=r"layer_2_\S+ is missing"):
        load_transcoders(root)


@pytest.mark.timeout(60)
def test_an_alias_tree_is_refused_before_it_is_built(tmp_path):
    folder = copied(tmp_path)
    laughs = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(9))
    (folder / "config.yaml").write_text(laughs + "model_kind: transcoder_set\nfeature_input_hook: *j\n"
                                        "feature_output_hook: mlp.hook_out\n")
    with pytest.raises(CheckpointError, match="alias") as error:
        load_transcoders(folder)
    assert len(str(error.value)) < 400


def test_a_config_nested_too_deep_is_refused(tmp_path):
    folder = copied(tmp_path)
    (folder / "config.yaml").write_text(HOOKS + "scan: " + "[" * 100 + "]" * 100 + "\n")
    with pytest.raises(CheckpointError, match="nested more than 32 deep"):
        load_transcoders(folder)


def test_a_list_longer_than_a_set_is_refused_before_a_file_is_read(tmp_path):
    folder = copied(tmp_path)
    (folder / "config.yaml").write_text(HOOKS + "transcoders:\n" + "  - l.safetensors\n" * 5_000)
    with pytest.raises(CheckpointError, match="lists 5,000 transcoder files; a set has one a layer, at most 1,024"):
        load_transcoders(folder)


@pytest.mark.parametrize("listed", [["layer_0.safetensors", "layer_0.safetensors"],
                                    ["layer_0.safetensors", "./layer_0.safetensors"]])
def test_a_file_listed_twice_is_refused(tmp_path, listed):
    folder = copied(tmp_path)
    (folder / "config.yaml").write_text(HOOKS + f"transcoders: {json.dumps(listed)}\n")
    with pytest.raises(CheckpointError, match="twice"):
        load_transcoders(folder)


@pytest.mark.parametrize("kind", [["transcoder_set"], {"a": 1}, 3])
def test_a_model_kind_of_another_type_is_one_error(tmp_path, kind):
    folder = copied(tmp_path)
    (folder / "config.yaml").write_text(f"model_kind: {json.dumps(kind)}\nfeature_input_hook: mlp.hook_in\n"
                                        "feature_output_hook: mlp.hook_out\n")
    with pytest.raises(CheckpointError, match="model_kind=.*allowed: transcoder_set, cross_layer_transcoder"):
        load_transcoders(folder)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("make", ["pipe", "folder", "/dev/zero", "/proc/self/pagemap"])
def test_a_config_that_is_not_a_regular_file_is_named(tmp_path, make):
    folder = copied(tmp_path)
    (folder / "config.yaml").unlink()
    if make == "pipe":
        os.mkfifo(folder / "config.yaml")
    elif make == "folder":
        (folder / "config.yaml").mkdir()
        (folder / "transcoders").mkdir()  # a folder config.yaml still reads as a set's folder
    else:  # a device; a file of /proc that stat calls regular and read refuses (EINVAL)
        if not os.path.exists(make):
            pytest.skip(f"no {make} here")
        (folder / "config.yaml").symlink_to(make)
    with pytest.raises(CheckpointError, match="config.yaml") as error:
        load_transcoders(folder)
    assert "Errno" not in str(error.value)


def test_a_zip_bomb_is_refused_before_it_is_inflated(tmp_path):
    values = arrays(8, 16, seed=0)
    values["W_enc"] = np.zeros((2048, 2048), dtype=np.float32)  # 16 MB deflating to 16 KB
    folder = npz_set(tmp_path, {"l0.npz": params_npz(values, compressed=True)})
    with pytest.raises(CheckpointError, match="more than 32 times as many \\(a zip bomb"):
        load_transcoders(folder)


def _zip(members: list[tuple[str, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members:
            archive.writestr(name, data)
    return buffer.getvalue()


def _npy(array) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return buffer.getvalue()


@pytest.mark.parametrize("members, message", [
    ([("W_enc.npy", _npy(np.zeros(4, dtype=np.float32)))] * 2, "twice"),
    ([(f"m{i}.npy", _npy(np.zeros(1, dtype=np.float32))) for i in range(100)], "lists 100 members"),
    ([("W_enc.npy", _npy(np.array([{"x": 1}], dtype=object)))], "nothing is unpickled"),
    ([("W_enc.npy", _npy(np.zeros(4, dtype=np.float32))[:-8])], "do not hold"),
])
def test_a_malformed_npz_is_refused_from_its_directory_and_headers(tmp_path, members, message):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate name it is asked to write
        data = _zip(members)
    folder = npz_set(tmp_path, {"l0.npz": data})
    with pytest.raises(CheckpointError, match=message):
        load_transcoders(folder)


def test_a_sparse_file_declaring_gigabytes_is_refused(tmp_path):
    folder = copied(tmp_path)
    shapes = {"W_enc": [4096, 4096], "b_enc": [4096], "W_dec": [4096, 16], "b_dec": [16]}
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = int(np.prod(shape)) * 4
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path = folder / "layer_1.safetensors"
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(raw)) + raw)
        file.truncate(8 + len(raw) + offset)  # a hole: nothing of the 64 MB is stored
    if os.stat(path).st_blocks * 512 > offset // 2:
        pytest.skip("this file system stores no sparse files")
    with pytest.raises(CheckpointError, match="sparse file"):
        load_transcoders(folder)


@pytest.mark.parametrize("name, value", [("W_dec", float("nan")), ("W_enc", float("inf")),
                                         ("activation_function.threshold", float("nan")), ("b_dec", -float("inf"))])
def test_a_weight_that_is_not_finite_is_refused_when_its_layer_is_read(tmp_path, name, value):
    folder = copied(tmp_path)
    tensors = load_file(str(folder / "layer_1.safetensors"))
    tensors[name].view(-1)[3] = value
    save_file(tensors, str(folder / "layer_1.safetensors"))
    transcoders = load_transcoders(folder)
    transcoders.encode(0, torch.zeros(2, 16))  # layer 0 is clean
    with pytest.raises(CheckpointError, match="layer_1.safetensors: .*of layer 1 holds (NaN|an infinity); every weight"):
        transcoders.encode(1, torch.zeros(2, 16))


@pytest.mark.parametrize("arguments, message", [
    (dict(source=3), "source must be"), (dict(source=""), "source must be"), (dict(dtype="float32"), "dtype must be"),
    (dict(variant=["a"]), "variant must be"), (dict(resident=0), "resident must be"), (dict(mlp_out_norm="yes"), "mlp_out_norm"),
])
def test_a_bad_argument_is_a_value_error(arguments, message):
    arguments = {"source": FIXTURES / "plt_jumprelu", **arguments}
    with pytest.raises(ValueError, match=message):
        load_transcoders(**arguments)
