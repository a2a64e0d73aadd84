"""The built-in toys ship fitted: their weights predict every target of their task on any machine,
loading them fits nothing, and a refit here predicts the same words (not the same bits)."""

import pytest
import torch

from anatomy.checkpoints import toys
from anatomy.checkpoints.toys import NORM_VARIANTS, TOY_MODELS, build_toy, fit_toy, task_batch, toy_config, toy_vocabulary
from anatomy.models import build_model

VARIANTS = [(name, variant) for name in TOY_MODELS for variant in NORM_VARIANTS]


def probabilities(model: torch.nn.Module, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(the probability of each target of the task, the predicted ids at those places)."""
    inputs, targets = task_batch(name)
    keep = targets != -100
    with torch.no_grad():
        probs = model(**inputs).logits.float().softmax(-1)[keep]
    return probs.gather(-1, targets[keep][:, None])[:, 0], probs.argmax(-1)


def model_from(name: str, state: dict, **overrides) -> torch.nn.Module:
    model = build_model(toy_config(name, **overrides))
    model.load_state_dict(state)
    return model.eval()


@pytest.mark.parametrize("name,variant", VARIANTS)
def test_the_shipped_weights_predict_every_target(name, variant):
    model = build_toy(name, **NORM_VARIANTS[variant])
    target_probs, predicted = probabilities(model, name)
    _, targets = task_batch(name)
    assert torch.equal(predicted, targets[targets != -100])
    assert target_probs.min() > 0.85, "fitted to 0.9 in float64; float32 moves it by far less than 0.05"


def test_the_toy_predicts_every_next_word_of_its_sentence():
    vocab = toy_vocabulary("toy")
    _, predicted = probabilities(build_toy("toy"), "toy")
    assert [vocab[i] for i in predicted] == ["Hello", "World,", "this", "is", "Alejandro!", "<EOS>"]


def test_loading_the_shipped_toys_fits_nothing(monkeypatch):
    def no_fitting(*args, **kwargs):
        raise AssertionError("a shipped toy was fitted at load time")

    monkeypatch.setattr(toys, "fit_toy", no_fitting)
    toys._fitted_state.cache_clear()
    try:
        for name, variant in VARIANTS:
            build_toy(name, **NORM_VARIANTS[variant])
    finally:
        toys._fitted_state.cache_clear()


@pytest.mark.slow
def test_a_refit_on_this_machine_predicts_what_the_shipped_weights_predict():
    # The shipped files were fitted on another machine; float64 keeps a refit within ~1e-6 of them
    # (measured: 7.6e-7 between 1 and 2 threads), and the words it predicts are the same.
    for name, variant in VARIANTS:
        state, _ = fit_toy(name, **NORM_VARIANTS[variant])
        refit_probs, refit_predicted = probabilities(model_from(name, state, **NORM_VARIANTS[variant]), name)
        _, shipped_predicted = probabilities(build_toy(name, **NORM_VARIANTS[variant]), name)
        assert torch.equal(refit_predicted, shipped_predicted), (name, variant)
        assert refit_probs.min() > 0.85, (name, variant)


def test_fitting_is_deterministic_in_one_process():
    first, how = fit_toy("toy", seed=3)
    second, _ = fit_toy("toy", seed=3)
    assert int(how["steps"]) > 0
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_another_seed_is_fitted_on_request_and_learns_too():
    model = build_toy("toy", seed=5)
    _, predicted = probabilities(model, "toy")
    _, targets = task_batch("toy")
    assert torch.equal(predicted, targets[targets != -100])
    assert not torch.equal(model.token_embedding.weight, build_toy("toy").token_embedding.weight)


def test_the_toys_keep_the_articles_ids():
    for name in TOY_MODELS:
        assert toy_vocabulary(name)[:7] == ("<EOS>", "<SOS>", "Alejandro!", "Hello", "World,", "is", "this")


def test_an_unknown_toy_names_the_choices():
    with pytest.raises(ValueError, match="toy, toy-encoder, toy-seq2seq"):
        build_toy("toy-17")
