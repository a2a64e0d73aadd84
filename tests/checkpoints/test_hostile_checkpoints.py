"""Hostile checkpoints: each is refused with one CheckpointError naming the file and the problem,
before anything large is allocated, and nothing outside the checkpoint folder is read."""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from bounds import refused
from checkpoint_cases import checkpoint_factory
from safetensors.torch import load_file, save_file

import anatomy
from anatomy.checkpoints import CheckpointError, memory
from anatomy.config import ModelConfig


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


# ================================================================================================
# Round two (issue 22): crafted sizes, malformed values of every kind, GGUF metadata, interrupted
# saves. Every case is refused with a CheckpointError of a few hundred characters at most, without
# a hang and without taking memory (bounds.refused: far below what the unguarded code took).
# ================================================================================================
MORE_CASES = {  # case -> (transformers class, config class, config fields), for checkpoint_factory
    "mixtral": ("MixtralForCausalLM", "MixtralConfig", dict(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=40, max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=2)),
    "bert-classify": ("BertForSequenceClassification", "BertConfig", dict(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=64, type_vocab_size=2, num_labels=3)),
}


@pytest.fixture(scope="module")
def more_checkpoints(tmp_path_factory):
    return checkpoint_factory(MORE_CASES, tmp_path_factory)


def _copy(source, tmp_path, name):
    return Path(shutil.copytree(source, tmp_path / name))


@pytest.fixture
def native_dir(tmp_path):
    """anatomy's own format: a decoder with sinusoids and 4 experts a layer (no HF class has that)."""
    config = ModelConfig(arch="decoder", vocab_size=50, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_seq_len=32,
                         pos_encoding="sinusoidal", norm="layernorm", norm_position="post", activation="relu",
                         n_experts=4, n_experts_per_token=2)
    return anatomy.save_pretrained(anatomy.build_model(config, seed=0), tmp_path / "native", format="anatomy")


def _edit_json(path, drop=(), **fields):
    data = json.loads(path.read_text())
    data.update(fields)
    for name in drop:
        data.pop(name, None)
    path.write_text(json.dumps(data))


def _edit_weights(directory, change):
    tensors = load_file(directory / "model.safetensors")
    change(tensors)
    save_file(tensors, directory / "model.safetensors")


# 4. sizes no file backs ---------------------------------------------------------------------------
def test_a_million_layers_and_one_tensor_named_for_the_last(llama_dir):
    # The largest index in the names is 999999, so the names alone allowed a million layers; one
    # tensor cannot back them (80-90 s to the memory cap before).
    _edit_json(llama_dir / "config.json", num_hidden_layers=1_000_000)
    _edit_weights(llama_dir, lambda t: t.update({"model.layers.999999.input_layernorm.weight": torch.ones(32)}))
    refused(lambda: anatomy.from_pretrained(llama_dir), r"num_hidden_layers=1000000, outside \[1, \d+\]")


def test_a_million_mixtral_experts(more_checkpoints, tmp_path):
    # memory.layer_counts compiled one regex per expert: 150+ s.
    directory = _copy(more_checkpoints("mixtral"), tmp_path, "mixtral")
    _edit_json(directory / "config.json", num_local_experts=1_000_000)
    refused(lambda: anatomy.from_pretrained(directory), r"num_local_experts=1000000, outside \[1, \d+\]")


@pytest.mark.parametrize("fields", [
    {"n_layers": 1_000_000, "layer_types": None}, {"n_layers": 10**9, "layer_types": None},
    {"n_experts": 1_000_000}, {"n_experts": 10_000}, {"n_layers": 1, "n_experts": 30},
], ids=["layers", "layers-1e9", "experts", "10000-experts", "layers-x-experts"])
def test_anatomys_own_format_with_layers_or_experts_no_file_backs(native_dir, fields):
    # before: SystemError at the memory cap after 92-97 s; 10,000 experts refused after 11.8 s with a
    # 7.4 MB message listing every missing tensor
    _edit_json(native_dir / "anatomy_config.json", **fields)
    refused(lambda: anatomy.from_pretrained(native_dir), r"anatomy_config.json.*(n_layers|n_experts|layers x)")


def test_a_25_gb_sparse_safetensors_file_is_refused_before_it_is_mapped(llama_dir, monkeypatch):
    # A header claiming 25.6 GB of embeddings, the data a hole in a sparse file: refused from the
    # header against the memory available (here 1 GiB), before safetensors maps the file.
    vocab = 200_000_000
    _write_sparse_safetensors(llama_dir, vocab)
    monkeypatch.setattr(memory, "available_memory", lambda: 2**30)
    refused(lambda: anatomy.from_pretrained(llama_dir), r"weights take about 47.68 GiB in float32, more than the "
                                                         r"1.00 GiB of memory available; nothing was allocated")


def _write_sparse_safetensors(directory, vocab: int) -> None:
    """model.safetensors with the tiny Llama's tensors, but embeddings and head of `vocab` rows,
    written as a header and a hole (no data): a file of 51 GB that takes no disk."""
    _edit_json(directory / "config.json", vocab_size=vocab)
    header, offset = {}, 0
    for name, tensor in load_file(directory / "model.safetensors").items():
        shape = [vocab, 32] if name in ("model.embed_tokens.weight", "lm_head.weight") else list(tensor.shape)
        size = math.prod(shape) * 4
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(directory / "model.safetensors", "wb") as file:
        file.write(struct.pack("<Q", len(raw)) + raw)
        file.truncate(8 + len(raw) + offset)


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS is enforced on Linux")
def test_a_sparse_file_larger_than_the_address_space_allowed(llama_dir):
    """Under `ulimit -v` (RLIMIT_AS) safetensors' memory map itself failed (MemoryError) before the
    memory check ran; the limit is part of the memory available."""
    _write_sparse_safetensors(llama_dir, 200_000_000)
    child = (
        "import resource, sys, anatomy\n"
        "from anatomy.checkpoints.memory import _status_bytes\n"
        "limit = _status_bytes('VmSize') + 2**31\n"
        "resource.setrlimit(resource.RLIMIT_AS, (limit, limit))\n"
        "try:\n"
        "    anatomy.from_pretrained(sys.argv[1])\n"
        "except anatomy.CheckpointError as error:\n"
        "    print('refused:', error)\n")
    done = subprocess.run([sys.executable, "-c", child, str(llama_dir)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused:" in done.stdout and "more than the" in done.stdout and "memory available" in done.stdout


def test_twenty_thousand_extra_tensors_make_a_short_message(gpt2_dir):
    # every unexpected tensor was listed: 200,000 of them made a 3.9 MB line
    _edit_weights(gpt2_dir, lambda t: t.update({f"extra.{i}": torch.zeros(1) for i in range(20_000)}))
    error = refused(lambda: anatomy.from_pretrained(gpt2_dir), r"unexpected tensors \(20000\)")
    assert "and 19997 more" in str(error)


def test_a_layer_index_of_five_thousand_digits(gpt2_dir):
    # int() of a 5000-digit string raises ValueError (Python's 4300-digit limit)
    _edit_weights(gpt2_dir, lambda t: t.update({f"transformer.h.{'9' * 5000}.x": torch.zeros(1)}))
    refused(lambda: anatomy.from_pretrained(gpt2_dir), r"unexpected tensors \(1\)")


@pytest.mark.parametrize("entry, problem", [
    ({"dtype": "F32", "shape": [2], "data_offsets": [0, 2**70]}, "needs bytes up to"),
    ({"dtype": "F32", "shape": [2**40, 2**40], "data_offsets": [0, 8]}, "has 8 bytes for a F32 tensor"),
    ({"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}, "has a shape that is not a list of sizes"),
    ({"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}, "has data_offsets that are not"),
    ({"shape": [1], "data_offsets": [0, 4]}, "has no dtype"),
])
def test_safetensors_headers_are_checked_in_exact_integers(gpt2_dir, entry, problem):
    raw = json.dumps({"w": entry}).encode()
    (gpt2_dir / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(8))
    refused(lambda: anatomy.from_pretrained(gpt2_dir), rf"corrupt or truncated: tensor 'w' {problem}")


def test_a_header_length_past_the_file(gpt2_dir):
    (gpt2_dir / "model.safetensors").write_bytes(struct.pack("<Q", 2**63) + b"{}")
    refused(lambda: anatomy.from_pretrained(gpt2_dir), r"does not start with the length of a safetensors header")


# 5. malformed values: one CheckpointError, naming the field ----------------------------------------
def test_zero_heads_without_head_dim(llama_dir):
    _edit_json(llama_dir / "config.json", num_attention_heads=0, drop=("head_dim",))  # ZeroDivisionError before
    refused(lambda: anatomy.from_pretrained(llama_dir), r"num_attention_heads=0, outside \[1, ")


def test_infinity_in_a_nested_field(llama_dir):
    rope = {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": float("inf")}  # OverflowError before
    _edit_json(llama_dir / "config.json", rope_parameters=rope)
    refused(lambda: anatomy.from_pretrained(llama_dir),
            r"rope_parameters.original_max_position_embeddings = inf; every number in a config must be finite")


def test_infinitely_many_labels(more_checkpoints, tmp_path):
    directory = _copy(more_checkpoints("bert-classify"), tmp_path, "classify")
    _edit_json(directory / "config.json", num_labels=float("inf"), drop=("id2label", "label2id"))  # OverflowError
    refused(lambda: anatomy.from_pretrained(directory), r"num_labels = inf")


@pytest.mark.parametrize("field, value", [("type_vocab_size", 2.5), ("hidden_size", "32"), ("vocab_size", True),
                                          ("max_position_embeddings", 64.0), ("intermediate_size", [37])])
def test_a_size_that_is_not_an_integer(hf_checkpoint, tmp_path, field, value):
    directory = _copy(hf_checkpoint("bert"), tmp_path, "bert")  # type_vocab_size 2.5: TypeError before
    _edit_json(directory / "config.json", **{field: value})
    refused(lambda: anatomy.from_pretrained(directory), rf"{field}=.*must be an integer")


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.bool])
def test_weights_of_an_integer_or_bool_dtype_are_refused_by_name(gpt2_dir, dtype):
    # RuntimeError "Only Tensors of floating point ... can require gradients" before
    norm = "transformer.h.0.ln_1.weight"
    _edit_weights(gpt2_dir, lambda t: t.update({norm: t[norm].to(dtype)}))
    name = str(dtype).removeprefix("torch.")
    refused(lambda: anatomy.from_pretrained(gpt2_dir), rf"integer or bool dtype.*\n.*{norm} \({name}\)")


def test_a_shard_name_with_a_null_byte_names_the_index(gpt2_dir):
    _shard(gpt2_dir, first="pa\x00rt.safetensors")  # ValueError: embedded null byte, naming no file, before
    refused(lambda: anatomy.from_pretrained(gpt2_dir), r"model.safetensors.index.json.*not weight file names.*\\x00")


@pytest.mark.parametrize("template", [5, {"a": 1}])
def test_a_chat_template_of_another_type(gpt2_dir, template):
    anatomy.load_tokenizer("toy").save(gpt2_dir)
    _edit_json(gpt2_dir / "tokenizer_config.json", chat_template=template)
    refused(lambda: anatomy.load_tokenizer(gpt2_dir), r"tokenizer_config.json' has a chat_template that is a")


def test_a_chat_template_jinja_that_is_not_utf8(gpt2_dir):
    anatomy.load_tokenizer("toy").save(gpt2_dir)
    (gpt2_dir / "chat_template.jinja").write_bytes(b"\xff\xfe{{ messages }}\x80")  # UnicodeDecodeError before
    refused(lambda: anatomy.from_pretrained(gpt2_dir), r"chat_template.jinja' is not UTF-8 text")


@pytest.mark.parametrize("name", ["a" * 5000, "org/" + "b" * 5000, "x" * 300 + ".gguf"])
def test_a_name_too_long_for_the_file_system(name):
    refused(lambda: anatomy.from_pretrained(name), r"\(\d+ characters\) is no path this system can open")
    refused(lambda: anatomy.load_tokenizer(name), r"is no path this system can open")


def test_a_tokenizer_regex_that_panics_in_rust_is_named(gpt2_dir):
    # (a+)+$ on a long run of a's: the Onig engine's retry limit panics; a PanicException derives
    # from BaseException, so it escaped every `except Exception` (89 lines of traceback from walk)
    anatomy.load_tokenizer("toy").save(gpt2_dir)
    _edit_json(gpt2_dir / "tokenizer.json", pre_tokenizer={
        "type": "Split", "pattern": {"Regex": "(a+)+$"}, "behavior": "Isolated", "invert": False})
    tokenizer = anatomy.from_pretrained(gpt2_dir).tokenizer
    assert tokenizer.encode("ab")  # a short text is fine
    refused(lambda: tokenizer.encode("a" * 5000 + "b"), r"failed inside the Rust tokenizers library: .*retry-limit")
