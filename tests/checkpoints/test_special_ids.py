"""Special token ids travel with the model: a translator trained to start from <SOS> is saved and
reloaded starting from <SOS>, and generation uses it without being told."""

import json

import torch

import anatomy


def test_decoder_start_and_eos_ids_survive_save_and_load(tmp_path):
    config = anatomy.ModelConfig(
        arch="encoder-decoder", vocab_size=20, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=16,
        pos_encoding="sinusoidal", sinusoid_layout="halves", norm_position="post", activation="relu",
        lm_head_bias=True, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
    )
    model = anatomy.build_model(config, seed=0).eval()
    model.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert (written["decoder_start_token_id"], written["eos_token_id"], written["pad_token_id"]) == (1, 2, 0)

    loaded = anatomy.from_pretrained(tmp_path)
    assert (loaded.config.decoder_start_token_id, loaded.config.bos_token_id, loaded.config.eos_token_id) == (1, 1, 2)
    src = torch.tensor([[3, 4, 5, 6]])
    generated = anatomy.generate(loaded, src_ids=src, max_new_tokens=3)
    assert generated.sequences[0, 0].item() == 1
