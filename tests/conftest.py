"""Shared test setup.

The suite runs with `pytest -n 2` on two cores: each worker computes on one thread, so that the
workers do not fight over cores (tiny models are faster on one thread anyway).
"""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
