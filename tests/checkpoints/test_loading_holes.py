"""The last loading holes: a malformed chat template entry, a safetensors header naming more
tensors than any checkpoint holds, an index naming tens of thousands of missing shards. Each is one
CheckpointError; these tests check the logic that makes the refusal cheap (counted before parsed,
each shard resolved once), and `anatomy bench --only refusals` measures the time."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
from bounds import refused
from safetensors.torch import load_file

import anatomy
from anatomy.checkpoints import files


@pytest.fixture
def gpt2_dir(hf_checkpoint, tmp_path):
    directory = tmp_path / "gpt2"
    shutil.copytree(hf_checkpoint("gpt2"), directory)
    return directory


def write_header(path: Path, header: dict | bytes, data: bytes = b"") -> None:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def with_empty_tensors(directory: Path, extra: int) -> None:
    """model.safetensors with its own tensors and `extra` empty ones (shape [0], no bytes)."""
    header, data = {}, b""
    for name, tensor in load_file(directory / "model.safetensors").items():
        raw = tensor.contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensor.shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    header.update({f"extra.{i}": {"dtype": "F32", "shape": [0], "data_offsets": [len(data)] * 2} for i in range(extra)})
    write_header(directory / "model.safetensors", header, data)


# chat templates ---------------------------------------------------------------------------------


@pytest.mark.parametrize("entries, index", [
    ([{"name": ["x"], "template": "t"}], 0),  # the case: loaded with no template before
    ([{"name": "default", "template": "t"}, {"name": "tool", "template": ["a list"]}], 1),
    ([{"name": "default", "template": "t"}, 5], 1),
    ([{"name": "default"}], 0),
    ([{"name": "default", "template": "a"}, {"name": "default", "template": "b"}], 1),
])
def test_a_malformed_chat_template_entry_is_named(gpt2_dir, entries, index):
    anatomy.load_tokenizer("toy").save(gpt2_dir)
    settings = json.loads((gpt2_dir / "tokenizer_config.json").read_text())
    (gpt2_dir / "tokenizer_config.json").write_text(json.dumps({**settings, "chat_template": entries}))
    refused(lambda: anatomy.load_tokenizer(gpt2_dir), rf"malformed chat_template entry \[{index}\]")


def test_named_templates_without_a_default_are_no_template(gpt2_dir):
    anatomy.load_tokenizer("toy").save(gpt2_dir)
    settings = json.loads((gpt2_dir / "tokenizer_config.json").read_text())
    settings["chat_template"] = [{"name": "tool_use", "template": "{{ messages }}"}]
    (gpt2_dir / "tokenizer_config.json").write_text(json.dumps(settings))
    assert anatomy.load_tokenizer(gpt2_dir).chat_template is None


# a header naming too many tensors -----------------------------------------------------------------


def test_a_header_naming_more_tensors_than_a_file_holds_is_refused_by_its_count_before_parsing(gpt2_dir, monkeypatch):
    with_empty_tensors(gpt2_dir, files.MAX_FILE_TENSORS)  # and the model's own: past the bound
    loads = json.loads

    def parse(text, *args, **kwargs):  # config.json is text; a safetensors header is bytes
        assert not isinstance(text, bytes), "the header was parsed"
        return loads(text, *args, **kwargs)

    monkeypatch.setattr(files.json, "loads", parse)
    error = refused(lambda: anatomy.from_pretrained(gpt2_dir), r"model.safetensors' names 65,5\d\d tensors")
    assert "at most 65,536 per file" in str(error)


def test_a_header_within_the_bound_is_read_and_its_extra_tensors_named(gpt2_dir):
    with_empty_tensors(gpt2_dir, 1000)
    refused(lambda: anatomy.from_pretrained(gpt2_dir), r"unexpected tensors \(1000\)")


def test_the_count_is_of_entries_not_of_text_in_names(tmp_path):
    # a name holding the words "data_offsets" escapes its quotes: it is no entry
    header = {'a "data_offsets" b': {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}
    write_header(tmp_path / "model.safetensors", header, b"\0" * 4)
    assert list(files.read_safetensors_header(tmp_path / "model.safetensors")) == ['a "data_offsets" b']


# an index naming shards that are not there ------------------------------------------------------------


def test_an_index_of_fifty_thousand_missing_shards_resolves_one_shard_before_refusing(gpt2_dir, monkeypatch):
    (gpt2_dir / "model.safetensors").unlink()
    weight_map = {f"t.{i}": f"model-{i:05d}-of-50000.safetensors" for i in range(50_000)}
    (gpt2_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    resolved = []
    resolve = Path.resolve
    monkeypatch.setattr(Path, "resolve", lambda self, *a, **k: resolved.append(self) or resolve(self, *a, **k))
    refused(lambda: anatomy.from_pretrained(gpt2_dir), r"model-00000-of-50000.safetensors' is missing")
    assert len(resolved) <= 3, resolved[:5]  # the folder, the first shard (before: 100,000 resolutions)


def test_every_shard_of_a_good_index_is_resolved_once(gpt2_dir, monkeypatch):
    tensors = load_file(gpt2_dir / "model.safetensors")
    names = sorted(tensors)
    from safetensors.torch import save_file

    for part in range(3):
        save_file({n: tensors[n].contiguous() for n in names[part::3]}, gpt2_dir / f"part-{part}.safetensors")
    (gpt2_dir / "model.safetensors").unlink()
    weight_map = {n: f"part-{i % 3}.safetensors" for i, n in enumerate(names)}
    (gpt2_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    resolved = []
    resolve = Path.resolve
    monkeypatch.setattr(Path, "resolve", lambda self, *a, **k: resolved.append(self.name) or resolve(self, *a, **k))
    weights = files.Weights(gpt2_dir)
    assert sorted(name for name in resolved if name.startswith("part-")) == [f"part-{i}.safetensors" for i in range(3)]
    assert set(weights) == set(names)


# found by probing: each a CheckpointError (or a ChatError) in a few hundred characters --------------


def test_a_header_naming_a_tensor_twice_is_refused(gpt2_dir):
    # json keeps the last entry, a reader may keep the first: the checks and the read would differ
    raw = (gpt2_dir / "model.safetensors").read_bytes()
    length = int.from_bytes(raw[:8], "little")
    header = raw[8:8 + length].decode().rstrip()
    name = next(iter(json.loads(header)))
    twice = header[:-1] + f', "{name}": {{"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}}}'
    write_header(gpt2_dir / "model.safetensors", twice.encode(), raw[8 + length:])
    refused(lambda: anatomy.from_pretrained(gpt2_dir), rf"its header names '{name}' twice")


@pytest.mark.parametrize("metadata", [[1, 2], {"format": 5}, "pt"])
def test_metadata_that_is_not_names_to_strings_is_refused_before_mapping(gpt2_dir, metadata):
    header, data = {}, b""
    for name, tensor in load_file(gpt2_dir / "model.safetensors").items():
        raw = tensor.contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensor.shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    write_header(gpt2_dir / "model.safetensors", {"__metadata__": metadata, **header}, data)
    refused(lambda: anatomy.from_pretrained(gpt2_dir), r"__metadata__ must map names to strings")


def test_an_index_with_no_tensors_and_one_naming_a_folder(gpt2_dir):
    (gpt2_dir / "model.safetensors").unlink()
    (gpt2_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {}}))
    refused(lambda: anatomy.from_pretrained(gpt2_dir), r"maps no tensors: its 'weight_map' is empty")
    (gpt2_dir / "part.safetensors").mkdir()
    (gpt2_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "part.safetensors"}}))
    refused(lambda: anatomy.from_pretrained(gpt2_dir), r"part.safetensors' is not a file")


def test_a_model_type_of_100000_characters_makes_a_short_message(gpt2_dir):
    config = json.loads((gpt2_dir / "config.json").read_text())
    (gpt2_dir / "config.json").write_text(json.dumps({**config, "model_type": "x" * 100_000}))
    refused(lambda: anatomy.from_pretrained(gpt2_dir), r"model_type='xxx.*is not supported")  # was 100,249 characters


def test_a_config_with_a_byte_order_mark_is_read(gpt2_dir):
    (gpt2_dir / "config.json").write_bytes(b"\xef\xbb\xbf" + (gpt2_dir / "config.json").read_bytes())
    assert anatomy.from_pretrained(gpt2_dir).config.n_layers == 2


@pytest.mark.parametrize("template, refusal", [
    ("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}", "loops more than 1,000,000"),
    ("{{ 'x' * 10**10 }}", "builds a value of 10,000,000,000 items"),
    ("{{ [0] * 10**9 }}", "builds a value of 1,000,000,000 items"),
    ("{{ 10 ** 100000000000 }}", "a number too large to write"),
    ("{{ messages }}" * 20_000, "has 280,000 characters; anatomy renders at most 200,000"),
])
def test_a_hostile_chat_template_is_refused_before_it_takes_the_machine(template, refusal):
    from anatomy.checkpoints.chat import ChatError, render_chat

    with pytest.raises(ChatError, match=refusal):
        render_chat(template, [{"role": "user", "content": "Hi"}])


def test_a_template_within_the_bounds_renders_as_before():
    from anatomy.checkpoints.chat import render_chat

    template = "{% for m in messages %}{{ m.content * 2 }}{% endfor %}{% for i in range(3) %}{{ i ** 2 }}{% endfor %}"
    assert render_chat(template, [{"role": "user", "content": "Hi"}]) == "HiHi014"
