"""save_pretrained writes what transformers reads: the same tensors, the same outputs."""

from __future__ import annotations

import json

import pytest
import torch
from checkpoint_cases import CASES, VOCAB
from safetensors.torch import load_file

import anatomy
from anatomy.checkpoints import CheckpointError


def _inputs(case: str) -> dict:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB - 1, (2, 6), generator=generator)
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, 4:] = 0
    inputs = {"input_ids": ids, "attention_mask": mask}
    if CASES[case][0] == "MarianMTModel":
        inputs["decoder_input_ids"] = torch.randint(0, VOCAB - 1, (2, 5), generator=generator)
    return inputs


def _outputs(model, case):
    with torch.no_grad():
        out = model(**_inputs(case))
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


@pytest.mark.parametrize("case", list(CASES))
def test_save_pretrained_round_trips_through_transformers(transformers, hf_checkpoint, tmp_path, case):
    source = hf_checkpoint(case)
    model = anatomy.from_pretrained(source)
    saved = model.save_pretrained(tmp_path / "saved")
    config = json.loads((saved / "config.json").read_text())
    class_name = CASES[case][0]
    assert config["architectures"] == [class_name] and config["model_type"] == anatomy.from_pretrained(source).config.extra["hf_config"]["model_type"]

    # tensor by tensor: every tensor transformers wrote comes back identical
    original, written = load_file(source / "model.safetensors"), load_file(saved / "model.safetensors")
    assert set(written) == set(original)
    for key, tensor in original.items():
        assert torch.equal(written[key], tensor), key

    reference = getattr(transformers, class_name).from_pretrained(source).eval()
    reloaded = getattr(transformers, class_name).from_pretrained(saved).eval()
    assert torch.equal(_outputs(reloaded, case), _outputs(reference, case))


FROM_SCRATCH = {
    "gpt2": (anatomy.preset("gpt2-small", vocab_size=VOCAB, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_seq_len=64),
             "GPT2LMHeadModel"),
    "bert": (anatomy.preset("bert-base", vocab_size=VOCAB, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_seq_len=64),
             "BertForMaskedLM"),
    "llama": (anatomy.ModelConfig(arch="decoder", vocab_size=VOCAB, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2,
                                  d_ff=48, max_seq_len=64, pos_encoding="rotary", norm="rmsnorm", activation="swiglu",
                                  attn_bias=False, attn_out_bias=False, mlp_bias=False, tie_embeddings=False,
                                  norm_eps=1e-6), "LlamaForCausalLM"),
    "marian": (anatomy.ModelConfig(arch="encoder-decoder", vocab_size=VOCAB, d_model=32, n_heads=4, n_layers=2, d_ff=48,
                                   max_seq_len=64, pos_encoding="sinusoidal", sinusoid_layout="halves",
                                   norm_position="post", activation="silu", scale_embeddings=True, lm_head_bias=True,
                                   pad_token_id=VOCAB - 1), "MarianMTModel"),
}


@pytest.mark.parametrize("name", list(FROM_SCRATCH))
def test_a_model_built_by_anatomy_loads_in_transformers(transformers, tmp_path, name):
    config, class_name = FROM_SCRATCH[name]
    model = anatomy.build_model(config, seed=0).eval()
    with torch.no_grad():  # norms and biases away from 1 and 0, so that each must land in its place
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    model.save_pretrained(tmp_path)
    theirs = getattr(transformers, class_name).from_pretrained(tmp_path).eval()
    ids = torch.randint(0, VOCAB - 1, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        if config.arch == "encoder-decoder":
            ours, reference = model(ids, ids[:, :5]).logits, theirs(input_ids=ids, decoder_input_ids=ids[:, :5]).logits
        else:
            ours, reference = model(ids).logits, theirs(input_ids=ids).logits
    assert (ours - reference).abs().max() < 1e-5


def test_a_config_no_architecture_expresses_is_refused_in_hf_format(tmp_path):
    model = anatomy.build_model(anatomy.preset("toy"))  # post-norm decoder with sinusoids: none of the four
    with pytest.raises(CheckpointError, match="no Hugging Face architecture") as error:
        model.save_pretrained(tmp_path, format="hf")
    assert "gpt2" in str(error.value) and "llama" in str(error.value)
    assert not (tmp_path / "model.safetensors").exists()


@pytest.mark.parametrize("config", [
    anatomy.preset("toy"),
    anatomy.preset("toy", arch="encoder-decoder", norm_position="pre"),
    anatomy.preset("toy", arch="encoder", head="sequence-classification", pooling="mean", num_labels=3),
])
def test_anatomys_own_format_round_trips_what_hf_cannot_express(tmp_path, config):
    model = anatomy.build_model(config, seed=0).eval()
    saved = model.save_pretrained(tmp_path)  # format="auto": no HF class, so anatomy's own
    assert (saved / "anatomy_config.json").is_file() and not (saved / "config.json").exists()
    loaded = anatomy.from_pretrained(saved)
    assert loaded.config == config
    ids = torch.tensor([[1, 3, 4, 6, 5]])
    with torch.no_grad():
        if config.arch == "encoder-decoder":
            ours, theirs = model(ids, ids[:, :3]).logits, loaded(ids, ids[:, :3]).logits
        else:
            ours, theirs = model(ids).logits, loaded(ids).logits
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def test_anatomys_own_format_is_checked_like_any_checkpoint(tmp_path):
    model = anatomy.build_model(anatomy.preset("toy"), seed=0)
    model.save_pretrained(tmp_path, format="anatomy")
    other = anatomy.preset("toy").replace(d_ff=16)
    other.to_json(tmp_path / "anatomy_config.json")
    with pytest.raises(CheckpointError, match=r"mis-shaped tensors \(6\)") as error:
        anatomy.from_pretrained(tmp_path)
    assert "blocks.0.mlp.fc_in.weight: checkpoint has [8, 4], model expects [16, 4]" in str(error.value)
