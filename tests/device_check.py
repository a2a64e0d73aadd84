"""A CUDA model's device mistakes, found on the CPU: under `off_the_models_device()` the default device is meta
while the model stays on the CPU, so a tensor made without naming the model's device (or that of what it meets)
is a meta tensor, and NoMixedDevices raises at the first operation where it meets a CPU one, as a CPU tensor
would meet a CUDA model's. What a command runs on the model's device runs here."""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class NoMixedDevices(TorchDispatchMode):
    """Raises at the first operation that meets a meta tensor and a CPU tensor (some do so silently: an in-place
    add of a meta tensor into a CPU one does nothing). A meta tensor alone is no mistake: a lazily read set builds
    its layers' modules on meta before their weights are mapped in."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        devices = {t.device.type for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)}
        if "meta" in devices and len(devices) > 1:
            raise AssertionError(f"{func} met a tensor made off the model's device")
        return out


@contextmanager
def off_the_models_device():
    """The default device meta, and NoMixedDevices: for a model on the CPU, built or loaded before."""
    with torch.device("meta"), NoMixedDevices():
        yield
