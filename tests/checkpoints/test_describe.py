"""config_of: what a model is, without loading it. Its config equals the loaded model's, for every
kind of source, and no tensor is read to know it."""

from __future__ import annotations

import pytest
import torch

import anatomy
from anatomy import CheckpointError
from anatomy.checkpoints import files, gguf, hub
from anatomy.checkpoints.describe import config_of


def plain(config) -> dict:
    """A config's fields without `extra` (where the loader notes the source it read)."""
    return {name: value for name, value in config.to_dict().items() if name != "extra"}


def refuse_tensor_reads(monkeypatch) -> None:
    """From here on, reading a tensor fails the test: config_of reads headers and metadata only."""
    def refuse(*args, **kwargs):
        pytest.fail("config_of read a tensor")
    monkeypatch.setattr(files._SafetensorsShard, "get", refuse)
    monkeypatch.setattr(files._PickleShard, "get", refuse)
    monkeypatch.setattr(gguf.GgufWeights, "get", refuse)


@pytest.mark.parametrize("case", ["bert-mlm", "gpt2", "marian", "llama-gqa", "llama-base"])
def test_the_config_of_a_folder_is_the_loaded_models_without_a_tensor_read(case, hf_checkpoint, monkeypatch):
    folder = hf_checkpoint(case)
    loaded = anatomy.from_pretrained(folder).config
    refuse_tensor_reads(monkeypatch)
    assert plain(config_of(folder)) == plain(loaded)


@pytest.mark.parametrize("name", ["toy", "toy-encoder", "toy-seq2seq"])
def test_the_config_of_a_toy_is_the_built_toys(name):
    assert plain(config_of(name)) == plain(anatomy.from_pretrained(name).config)


def test_the_config_of_anatomys_own_format(tmp_path):
    model = anatomy.build_model(anatomy.preset("toy", arch="encoder-decoder", vocab_size=11, norm_position="pre"))
    anatomy.save_pretrained(model, tmp_path / "native")
    assert (tmp_path / "native" / "anatomy_config.json").is_file()
    assert plain(config_of(tmp_path / "native")) == plain(anatomy.from_pretrained(tmp_path / "native").config)


def test_the_config_of_a_gguf_file_reads_no_tensor(tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    transformers = pytest.importorskip("transformers")
    from gguf_files import byte_level_vocab, write_gguf

    vocab = byte_level_vocab()
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=len(vocab["tokens"]), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64)).eval()
    path = write_gguf(tmp_path / "m.gguf", model, arch="llama", vocab=vocab)
    loaded = anatomy.from_pretrained(path).config
    refuse_tensor_reads(monkeypatch)
    assert plain(config_of(path)) == plain(loaded)
    assert plain(config_of(tmp_path)) == plain(loaded)  # a folder holding one .gguf file


@pytest.mark.parametrize("typed, meant", [("smolm2", "smollm2"), ("SmolLM2", "smollm2"), ("toy-encodr", "toy-encoder"),
                                          ("minlm", "minilm")])
def test_a_misspelt_builtin_name_gets_did_you_mean(typed, meant, monkeypatch):
    monkeypatch.setattr("huggingface_hub.snapshot_download", lambda *a, **k: pytest.fail("a misspelt name went to the Hub"))
    with pytest.raises(CheckpointError, match=f"did you mean '{meant}'"):
        config_of(typed)
    with pytest.raises(CheckpointError, match=f"did you mean '{meant}'"):
        anatomy.from_pretrained(typed)


def test_a_hub_id_that_is_not_cached_is_unknown_without_a_download(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(hub, "_download", lambda *a, **k: pytest.fail("config_of went to the Hub"))
    assert config_of("some-org/some-model") is None


def test_hub_advice_names_only_the_variables_that_are_set(tmp_path, monkeypatch):
    from huggingface_hub.errors import LocalEntryNotFoundError

    def unreachable(*args, **kwargs):
        raise LocalEntryNotFoundError("no connection")

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr("huggingface_hub.snapshot_download", unreachable)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(CheckpointError) as refused:
        anatomy.from_pretrained("some-org/some-model")
    assert "HF_HUB_OFFLINE" not in str(refused.value) and "hf download some-org/some-model" in str(refused.value)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CheckpointError, match="HF_HUB_OFFLINE is set"):
        anatomy.from_pretrained("some-org/some-model")
    with pytest.raises(CheckpointError) as refused:  # a bare name: no Hub advice at all
        anatomy.from_pretrained("no-such-model-anywhere")
    assert "hf download" not in str(refused.value) and "org/name" in str(refused.value)
