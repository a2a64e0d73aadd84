import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """Small models train faster on one thread, and the machine may be shared: no oversubscription."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
