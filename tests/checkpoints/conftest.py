"""Fixtures: tiny random transformers models (hidden 32, 2 layers, vocab 99) saved to temporary folders."""

from __future__ import annotations

import pytest
import torch
from checkpoint_cases import CASES, randomise, tiny_config


@pytest.fixture(scope="session")
def transformers():
    return pytest.importorskip("transformers")


@pytest.fixture(scope="session")
def hf_checkpoint(transformers, tmp_path_factory):
    """hf_checkpoint(case) -> the folder of a saved random transformers model (built once per session)."""
    made = {}

    def make(case: str):
        if case not in made:
            class_name, config_class, fields = CASES[case]
            torch.manual_seed(0)
            model = getattr(transformers, class_name)(tiny_config(transformers, config_class, fields)).eval()
            randomise(model)
            directory = tmp_path_factory.mktemp(case)
            model.save_pretrained(directory)
            made[case] = directory
        return made[case]

    return make
