"""config.json in transformers 4's and 5's spellings (issue 31), without transformers 4 itself:
- the rotary settings anatomy writes read back the same from either spelling alone;
- a folder whose two spellings describe different rotations is refused, naming what each version reads;
- keys no reader looks at are named in an UnknownConfigKeysWarning; known harmless ones are not.
(test_transformers_versions.py runs the folders through both versions of transformers.)
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch

import anatomy
from anatomy.checkpoints import CheckpointError, UnknownConfigKeysWarning
from anatomy.checkpoints.rope import read_rope, write_rope

VOCAB = 99
LINEAGE = dict(arch="decoder", vocab_size=VOCAB, d_model=32, n_heads=4, n_kv_heads=2, n_layers=3, d_ff=40,
               max_seq_len=64, pos_encoding="rotary", norm="rmsnorm", activation="swiglu", attn_bias=False,
               attn_out_bias=False, mlp_bias=False, norm_eps=1e-6)
LLAMA3 = dict(rope_scaling="llama3", rope_scaling_factor=8.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
              rope_original_max_len=16)
# model_type -> a config of it with rotary settings away from every default
ROTATIONS = {
    "llama": anatomy.ModelConfig(**LINEAGE, **LLAMA3, rope_theta=5e5),
    "mixtral": anatomy.ModelConfig(**LINEAGE, rope_scaling="linear", rope_scaling_factor=2.0, n_experts=2),
    "phi3": anatomy.ModelConfig(**LINEAGE, rotary_dim=4, rope_theta=900.0),
    "gpt_neox": anatomy.ModelConfig(**dict(LINEAGE, n_kv_heads=4), rotary_dim=2, rope_theta=7e4),
    "gemma3_text": anatomy.ModelConfig(**LINEAGE, rope_scaling="linear", rope_scaling_factor=8.0, rope_theta=3e5,
                                       rope_local_theta=50.0, sliding_window=4, layer_types=("sliding", "sliding", "full")),
}
VERSION_4_KEYS = ("rope_theta", "rope_scaling", "rotary_emb_base", "rotary_pct", "partial_rotary_factor",
                  "rope_local_base_freq")


def _fields(config: anatomy.ModelConfig) -> dict:
    names = ("rope_theta", "rope_scaling", "rope_scaling_factor", "rope_low_freq_factor", "rope_high_freq_factor",
             "rope_original_max_len", "rope_local_theta")
    fields = {name: getattr(config, name) for name in names}
    return dict(fields, fraction=config.rotary_dim / config.d_head)


def _read(hf: dict, model_type: str) -> dict:
    fields = read_rope(hf, model_type)
    defaults = dict(rope_scaling="none", rope_scaling_factor=1.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
                    rope_original_max_len=8192, rope_local_theta=None)
    return {**defaults, **fields}


@pytest.mark.parametrize("model_type", list(ROTATIONS))
def test_each_spelling_alone_reads_as_both_together(model_type):
    config = ROTATIONS[model_type]
    both = write_rope(config, model_type)
    version_5 = {"rope_parameters": both["rope_parameters"]}
    version_4 = {k: v for k, v in both.items() if k in VERSION_4_KEYS}
    assert set(both) == {"rope_parameters", *version_4}
    assert _read(both, model_type) == _read(version_5, model_type) == _read(version_4, model_type) == _fields(config)


def _saved_llama(tmp_path, **fields):
    model = anatomy.build_model(anatomy.ModelConfig(**LINEAGE, **fields), seed=0)
    model.save_pretrained(tmp_path, format="hf")
    return tmp_path, json.loads((tmp_path / "config.json").read_text())


def test_a_folder_whose_two_spellings_differ_is_refused(tmp_path):
    """What transformers 4.57 writes back from a transformers 5 folder: its own default base at the top
    level, the folder's beside it in rope_parameters."""
    folder, hf = _saved_llama(tmp_path, rope_theta=5e5)
    hf["rope_theta"] = 10_000.0
    (folder / "config.json").write_text(json.dumps(hf))
    with pytest.raises(CheckpointError, match=r"transformers 5 reads rope_parameters as rope_theta=500000.0.*"
                                              r"transformers 4 reads rope_theta as rope_theta=10000.0"):
        anatomy.from_pretrained(folder)
    hf["rope_theta"], hf["rope_scaling"] = 5e5, {"rope_type": "linear", "factor": 2.0}  # 5 reads this one too
    (folder / "config.json").write_text(json.dumps(hf))
    assert anatomy.from_pretrained(folder).config.rope_scaling == "linear"


def test_one_rotation_per_layer_type_is_refused_where_the_architecture_has_one(tmp_path):
    folder, hf = _saved_llama(tmp_path)
    hf.pop("rope_theta")
    hf["rope_parameters"] = {"full_attention": {"rope_type": "default", "rope_theta": 1e4},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 1e6}}
    hf["layer_types"] = ["full_attention"] * 3
    (folder / "config.json").write_text(json.dumps(hf))
    with pytest.raises(CheckpointError, match="rotates each layer type differently"):
        anatomy.from_pretrained(folder)


def test_keys_no_reader_looks_at_are_named(tmp_path):
    folder, hf = _saved_llama(tmp_path)
    hf.update(shiny_new_option=True, pruned_heads={"0": [1]}, partial_rotary_factor=0.5)
    (folder / "config.json").write_text(json.dumps(hf))
    with pytest.warns(UnknownConfigKeysWarning) as caught:
        model = anatomy.from_pretrained(folder)
    message = str(caught[0].message)
    for key in ("shiny_new_option=True", "pruned_heads={'0': [1]}", "partial_rotary_factor=0.5"):
        assert key in message
    assert "initializer_range" not in message and model.config.rotary_dim == model.config.d_head
    # written back, they would make transformers compute something other than the model saved
    with pytest.warns(UnknownConfigKeysWarning, match="config.json leaves out .*shiny_new_option=True"):
        model.save_pretrained(tmp_path / "again", format="hf")
    written = json.loads((tmp_path / "again" / "config.json").read_text())
    assert not {"shiny_new_option", "pruned_heads", "partial_rotary_factor"} & set(written)
    assert written["rope_theta"] == hf["rope_theta"]


def test_known_harmless_keys_and_keys_the_reader_reads_are_not(tmp_path):
    folder, hf = _saved_llama(tmp_path)
    hf.update(initializer_range=0.02, pruned_heads={}, pretraining_tp=1, use_cache=True, temperature=0.7,
              _name_or_path="org/name", torch_dtype="float32", transformers_version="4.57.3")
    (folder / "config.json").write_text(json.dumps(hf))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnknownConfigKeysWarning)
        anatomy.from_pretrained(folder)


def test_special_ids_are_written_null_rather_than_left_to_each_class(tmp_path):
    """LlamaConfig's defaults are bos 1 and eos 2: a key left out would give those."""
    _, hf = _saved_llama(tmp_path)
    assert hf["bos_token_id"] is None and hf["eos_token_id"] is None and hf["pad_token_id"] is None
    assert hf["dtype"] == hf["torch_dtype"] == "float32"


def test_a_t5_head_only_transformers_5_expresses_names_that_version(tmp_path):
    config = anatomy.ModelConfig(arch="encoder-decoder", vocab_size=VOCAB, d_model=32, n_heads=4, d_head=8, n_layers=2,
                                 d_ff=37, pos_encoding="relative", norm="rmsnorm", norm_position="pre", final_norm=True,
                                 attn_bias=False, attn_out_bias=False, mlp_bias=False, query_pre_attn_scalar=1.0,
                                 activation="relu", tie_embeddings=True, lm_head_rescale=False, pad_token_id=0,
                                 decoder_start_token_id=0)
    built = anatomy.build_model(config, seed=0).eval()
    with pytest.warns(UserWarning, match="transformers before 5.0.0 reads this t5 config as another model"):
        built.save_pretrained(tmp_path / "t5", format="hf")
    assert json.loads((tmp_path / "t5" / "config.json").read_text())["transformers_version"] == "5.0.0"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        anatomy.build_model(config.replace(lm_head_rescale=True)).save_pretrained(tmp_path / "t5-rescaled", format="hf")
    assert "transformers_version" not in json.loads((tmp_path / "t5-rescaled" / "config.json").read_text())
    again = anatomy.from_pretrained(tmp_path / "t5").eval()
    ids = torch.randint(2, VOCAB, (1, 5), generator=torch.Generator().manual_seed(0))
    assert again.config.lm_head_rescale is False
    with torch.no_grad():  # read back as it was written: the same function, no d_model^-0.5 on the logits
        torch.testing.assert_close(again(ids, ids).logits, built(ids, ids).logits, atol=1e-6, rtol=0)
