"""Tokenizers and data loading: round trips, caches, shards, and clear errors on bad input."""

from pathlib import Path

import numpy as np
import pytest

from anatomy.training.data import (EpochBatches, LMBatches, classification_data, parallel_text, read_tsv,
                                   seq2seq_batch, tokenize_to_memmap)
from anatomy.training.tokenizers import KINDS, Tokenizer, train_tokenizer

# ../shared beside the repository (tests/training/ -> tests/ -> repository -> its parent)
SHAKESPEARE = Path(__file__).resolve().parents[3] / "shared" / "data" / "tinyshakespeare" / "input.txt"
TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 20


@pytest.fixture
def corpus(tmp_path) -> Path:
    """A few KB of real text (tinyshakespeare's start) or, without the shared data, a stand-in."""
    path = tmp_path / "corpus.txt"
    text = SHAKESPEARE.read_text()[:20000] if SHAKESPEARE.exists() else TEXT
    path.write_text(text)
    return path


@pytest.mark.parametrize("kind", KINDS)
def test_special_ids_are_fixed_and_save_load_round_trips(kind, corpus, tmp_path):
    tok = train_tokenizer(kind, files=[corpus], vocab_size=300)
    assert (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id) == (0, 1, 2, 3)
    tok.save(tmp_path / "tok")
    again = Tokenizer.load(tmp_path / "tok")
    assert again.kind == kind and again.vocab_size == tok.vocab_size
    sample = corpus.read_text()[:500]
    assert again.encode(sample, add_bos=True, add_eos=True) == tok.encode(sample, add_bos=True, add_eos=True)


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_char_and_bpe_decode_gives_back_the_text(kind, corpus):
    tok = train_tokenizer(kind, files=[corpus], vocab_size=300)
    sample = corpus.read_text()[:1000]
    assert tok.decode(tok.encode(sample, add_bos=True, add_eos=True)) == sample


def test_word_level_is_seed_004s_vocabulary():
    tok = train_tokenizer("word", texts=["Hello World, this is Alejandro!"])
    ids = tok.encode("Hello World, this is Alejandro!", add_bos=True, add_eos=True)
    assert tok.id_to_token(ids[0]) == "<SOS>" and tok.id_to_token(ids[-1]) == "<EOS>"
    assert [tok.id_to_token(i) for i in ids[1:-1]] == ["Hello", "World,", "this", "is", "Alejandro!"]
    assert tok.encode("unseen")[0] == tok.unk_id


def test_lm_tokens_are_memory_mapped_once_and_equal_encode(corpus, tmp_path):
    tok = train_tokenizer("char", files=[corpus])
    ids = tokenize_to_memmap(corpus, tok, cache_dir=tmp_path / "cache")
    assert isinstance(ids, np.memmap) and ids.dtype == np.uint16
    assert ids.tolist() == tok.encode(corpus.read_text())
    cached = list((tmp_path / "cache").glob("*.bin"))
    assert len(cached) == 1
    mtime = cached[0].stat().st_mtime_ns
    tokenize_to_memmap(corpus, tok, cache_dir=tmp_path / "cache")  # second use reads the cache
    assert cached[0].stat().st_mtime_ns == mtime


def test_lm_targets_are_inputs_shifted_and_ranks_split_one_global_batch(corpus, tmp_path):
    tok = train_tokenizer("char", files=[corpus])
    ids = tokenize_to_memmap(corpus, tok, cache_dir=tmp_path)
    whole = LMBatches(ids, block_size=16, batch_size=8, seed=3).batch(5)
    assert (whole["input_ids"][:, 1:] == whole["labels"][:, :-1]).all()
    halves = [LMBatches(ids, 16, 4, seed=3, rank=r, world_size=2).batch(5) for r in (0, 1)]
    assert (np.concatenate([h["input_ids"] for h in halves]) == whole["input_ids"].numpy()).all()


def test_epoch_batches_visit_each_example_once_per_epoch_and_ranks_are_disjoint():
    lengths = np.random.default_rng(0).integers(1, 30, size=100)
    seen = [np.concatenate([EpochBatches(lengths, 5, seed=1, rank=r, world_size=2, bucket=4).indices(k)
                            for k in range(10)]) for r in (0, 1)]
    together = np.concatenate(seen)
    assert len(set(together.tolist())) == 100  # 10 global batches of 10 = one epoch, no repeats


def test_empty_files_are_refused_with_their_name(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    tok = train_tokenizer("char", texts=["abc"])
    with pytest.raises(ValueError, match="empty.txt is empty"):
        tokenize_to_memmap(empty, tok, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="empty.txt is empty"):
        parallel_text(empty, empty, tok, tok, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="empty.txt is empty"):
        read_tsv(empty)
    with pytest.raises(ValueError, match="empty.txt is empty"):
        train_tokenizer("word", files=[empty])
    (tmp_path / "blank.txt").write_text("\n \n")
    with pytest.raises(ValueError, match="blank.txt holds no text"):
        train_tokenizer("word", files=[tmp_path / "blank.txt"])


def test_parallel_files_of_different_lengths_name_both_counts(tmp_path):
    (tmp_path / "a.de").write_text("eins\nzwei\ndrei\n")
    (tmp_path / "a.en").write_text("one\ntwo\n")
    tok = train_tokenizer("word", texts=["eins zwei drei one two"])
    with pytest.raises(ValueError, match=r"a\.de has 3, .*a\.en has 2"):
        parallel_text(tmp_path / "a.de", tmp_path / "a.en", tok, tok, cache_dir=tmp_path)


def test_parallel_text_pairs_line_i_with_line_i(tmp_path):
    (tmp_path / "p.de").write_text("ein hund\nzwei katzen laufen\n")
    (tmp_path / "p.en").write_text("a dog\ntwo cats run\n")
    tok = train_tokenizer("word", texts=["ein hund zwei katzen laufen a dog two cats run"])
    src, tgt = parallel_text(tmp_path / "p.de", tmp_path / "p.en", tok, tok, cache_dir=tmp_path)
    assert tok.decode(src[1]) == "zwei katzen laufen" and tok.decode(tgt[1]) == "two cats run"
    batch = seq2seq_batch([src[0], src[1]], [tgt[0], tgt[1]], tok.pad_id, tok.bos_id, tok.eos_id, 10, 10)
    # teacher forcing: the decoder input is <SOS> + target, the label is target + <EOS>
    assert batch["tgt_ids"][1].tolist() == [tok.bos_id, *tgt[1].tolist()]
    assert batch["labels"][1].tolist() == [*tgt[1].tolist(), tok.eos_id]
    assert batch["labels"][0, -1].item() == -100 and not batch["tgt_padding_mask"][0, -1]


def test_tsv_header_is_detected_and_labels_are_indexed(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text("sentence\tlabel\ngood film \t1\nbad film \t0\nfine \t1\n")
    rows = read_tsv(path)
    assert rows.texts == ["good film", "bad film", "fine"]
    assert rows.label_names == ["0", "1"] and rows.labels.tolist() == [1, 0, 1]
    assert read_tsv(path, header=False, label_names=["0", "1", "label"]).texts[0] == "sentence"


def test_unknown_label_names_the_line_and_the_allowed_labels(tmp_path):
    path = tmp_path / "dev.tsv"
    path.write_text("sentence\tlabel\ngood\t1\nmeh\tneutral\n")
    with pytest.raises(ValueError, match=r"dev\.tsv:3: unknown label 'neutral'; allowed labels are '0', '1'"):
        read_tsv(path, label_names=["0", "1"])
    tok = train_tokenizer("word", texts=["good meh"])
    with pytest.raises(ValueError, match="dev.tsv:3"):
        classification_data(path, tok, label_names=["0", "1"], cache_dir=tmp_path)


def test_a_row_without_a_label_is_refused(tmp_path):
    path = tmp_path / "bad.tsv"
    path.write_text("good\t1\nno label here\n")
    with pytest.raises(ValueError, match=r"bad\.tsv:2: expected text<TAB>label"):
        read_tsv(path)
