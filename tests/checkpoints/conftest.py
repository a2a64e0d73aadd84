"""Fixtures: tiny random transformers models (hidden 32, 2 layers, vocab 99) saved to temporary folders."""

from __future__ import annotations

import pytest
from checkpoint_cases import CASES, checkpoint_factory, tiny_config


@pytest.fixture(scope="session")
def transformers():
    return pytest.importorskip("transformers")


@pytest.fixture(scope="session")
def hf_checkpoint(transformers, tmp_path_factory):
    """hf_checkpoint(case) -> the folder of a saved random transformers model (built once per session)."""
    return checkpoint_factory(CASES, tmp_path_factory, tiny_config)
