"""The built-in toys have learned their tasks, and fitting them is deterministic."""

import pytest
import torch

from anatomy.checkpoints.toys import TOY_MODELS, _fitted_state, build_toy, task_batch, toy_vocabulary


def predictions(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    inputs, targets = task_batch(name)
    with torch.no_grad():
        logits = build_toy(name)(**inputs).logits
    keep = targets != -100
    return logits.argmax(-1)[keep], targets[keep]


def test_the_toy_predicts_every_next_word_of_its_sentence():
    vocab = toy_vocabulary("toy")
    predicted, targets = predictions("toy")
    assert [vocab[i] for i in predicted] == ["Hello", "World,", "this", "is", "Alejandro!", "<EOS>"]
    assert torch.equal(predicted, targets)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["toy-encoder", "toy-seq2seq"])
def test_the_other_toys_learned_their_tasks(name):
    predicted, targets = predictions(name)
    assert torch.equal(predicted, targets)


@pytest.mark.slow
def test_fitting_is_deterministic():
    first = build_toy("toy").state_dict()
    _fitted_state.cache_clear()
    second = build_toy("toy").state_dict()
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


def test_the_toys_keep_the_articles_ids():
    for name in TOY_MODELS:
        assert toy_vocabulary(name)[:7] == ("<EOS>", "<SOS>", "Alejandro!", "Hello", "World,", "is", "this")


def test_an_unknown_toy_names_the_choices():
    with pytest.raises(ValueError, match="toy, toy-encoder, toy-seq2seq"):
        build_toy("toy-17")
