"""--token-dropout (word dropout): each training token deleted with probability p, the same
draws for the same micro-batch, never at evaluation, and never a text left empty."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from anatomy.training.data import TokenSequences, drop_tokens
from anatomy.training.tasks import ClassifyTask


class Tok:
    pad_id, bos_id, eos_id = 0, 1, 2


class Reader:
    """A stand-in model that records how many tokens each text it reads has."""

    def __init__(self):
        self.lengths = []

    def __call__(self, input_ids, padding_mask):
        self.lengths += padding_mask.sum(1).tolist()
        return SimpleNamespace(logits=torch.zeros(len(input_ids), 2))


def task(p, seed=5):
    ids = np.tile(np.arange(10, 50, dtype=np.int64), 64)  # 64 texts of tokens 10..49
    sequences = TokenSequences(ids, np.arange(0, 64 * 40 + 1, 40))
    return ClassifyTask(sequences, np.zeros(64, dtype=np.int64), Tok(), batch_size=32, max_len=64, seed=seed,
                        val=(sequences, np.zeros(64, dtype=np.int64)), token_dropout=p)


def test_each_token_is_dropped_with_probability_p_and_order_kept():
    rng = np.random.default_rng(0)
    texts = [np.arange(100, dtype=np.int64)] * 200
    kept = drop_tokens(texts, 0.25, rng)
    share = sum(len(k) for k in kept) / (100 * 200)
    assert share == pytest.approx(0.75, abs=0.01)  # 20,000 draws: the standard error is 0.003
    assert all(np.all(np.diff(k) > 0) for k in kept)  # a subsequence: order kept, nothing repeated
    assert [len(k) for k in drop_tokens([np.array([7, 8, 9])] * 5, 0.999999, rng)] == [1] * 5  # never empty


def test_the_training_batch_drops_tokens_reproducibly_and_evaluation_reads_all():
    plain, dropped = task(0.0), task(0.3)
    full = plain.batch(3)["padding_mask"].sum(1)
    assert full.tolist() == [42] * 32  # <CLS> + 40 tokens + <SEP>
    lengths = dropped.batch(3)["padding_mask"].sum(1)
    assert (lengths < full).all() and 0.6 < (lengths - 2).float().mean() / 40 < 0.8
    assert (dropped.batch(3)["input_ids"] == task(0.3).batch(3)["input_ids"]).all()  # a pure function of (seed, k)
    assert not (dropped.batch(4)["padding_mask"].sum(1) == lengths).all()  # fresh draws each micro-batch
    reader = Reader()
    dropped.evaluate(reader, "cpu")
    assert reader.lengths == [42] * 64  # evaluation reads every token
