"""Building a model for a checkpoint in the memory its weights take, and refusing before allocating.

A loaded model should cost what its weights cost. Three habits get there (as transformers and
accelerate do):

1. The model is built with its parameters on the meta device: shapes without memory, and no
   random initialisation that the checkpoint would overwrite. Buffers (rotary tables, sinusoids,
   ALiBi slopes) are formulas of the config, computed as usual.
2. safetensors files are memory-mapped; a tensor whose dtype already fits is assigned to the
   model as it is (engine.load_into), so its bytes are the file's pages, read once, never copied.
3. A dtype conversion happens one tensor at a time.

Before any of that, `check_fits` compares what the config asks for with the weight files' headers
and with the memory the machine has, on a model built entirely on the meta device (milliseconds,
no bytes), so that a config.json claiming a million layers or a 50-million-token vocabulary is
refused at once with a CheckpointError instead of allocating for minutes.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.nn.modules.module import register_module_parameter_registration_hook

from ..config import ModelConfig
from ..models import FAMILIES
from .engine import Rule
from .files import CheckpointError

# Memory the process keeps for itself beyond the model (activations of a first forward pass, Python).
HEADROOM_BYTES = 256 * 2**20


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Every parameter registered inside this block lives on the meta device (a shape, no memory).

    Uses torch's global parameter-registration hook: do not build other models in other threads
    meanwhile. A parameter already on meta (a tied matrix assigned twice) is kept, so ties hold."""

    def to_meta(module: nn.Module, name: str, parameter: nn.Parameter) -> nn.Parameter | None:
        if parameter is None or parameter.device.type == "meta":
            return None
        return nn.Parameter(parameter.to("meta"), requires_grad=parameter.requires_grad)

    handle = register_module_parameter_registration_hook(to_meta)
    try:
        yield
    finally:
        handle.remove()


def empty_model(config: ModelConfig) -> nn.Module:
    """The model `config` describes, parameters on meta (to be assigned by engine.load_into)."""
    with parameters_on_meta():
        return FAMILIES[config.arch](config)


def layer_counts(rules: list[Rule], names: set[str]) -> dict[str, int]:
    """For each per-layer placeholder ("{i}", "{j}"), how many layers the checkpoint's names hold."""
    counts: dict[str, int] = {}
    for rule in rules:
        for key in ("i", "j"):
            marker = "{" + key + "}"
            if marker not in rule.hf:
                continue
            before, after = rule.hf.split(marker, 1)
            pattern = re.compile(re.escape(before) + r"(\d+)" + re.escape(after).replace(r"\{", "{").replace(r"\}", "}"))
            found = [int(m.group(1)) for name in names if (m := pattern.fullmatch(name))]
            counts[key] = max(counts.get(key, 0), max(found, default=-1) + 1)
    return counts


def check_layers(rules: list[Rule], names: set[str], expected: dict[str, int], source: str) -> None:
    """The config's layer counts must be the checkpoint's (checked on names alone, before building)."""
    found = layer_counts(rules, names)
    wrong = [f"{key}-layers: config says {expected[key]}, the weights hold {found[key]}"
             for key in found if key in expected and found[key] != expected[key]]
    if wrong:
        raise CheckpointError(f"{source}: the config's depth does not match the weights ({'; '.join(wrong)})")


def meta_model(config: ModelConfig) -> nn.Module:
    """The whole model on the meta device, buffers included: every shape, no bytes."""
    with torch.device("meta"):
        return FAMILIES[config.arch](config)


def nbytes(model: nn.Module, dtype: torch.dtype | None) -> tuple[int, int]:
    """(parameter bytes, buffer bytes) of a model, parameters counted in `dtype` when given."""
    params = {id(p): p for p in model.parameters()}.values()
    param_bytes = sum(p.numel() * (dtype.itemsize if dtype is not None and p.is_floating_point() else p.element_size())
                      for p in params)
    return param_bytes, sum(b.numel() * b.element_size() for b in model.buffers())


def available_memory() -> int:
    """Bytes the machine can still give this process (MemAvailable of /proc/meminfo, else free pages)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_memory(config: ModelConfig, dtype: torch.dtype | None, source: str, device=None) -> nn.Module:
    """Estimate the bytes `config` needs (on the meta device) and refuse when the machine lacks them.

    Returns the meta model, whose shapes engine.load_into's checks can use. Raises CheckpointError."""
    model = meta_model(config)
    param_bytes, buffer_bytes = nbytes(model, dtype)
    on_cpu = device is None or torch.device(device).type == "cpu"
    available = available_memory()
    needed = buffer_bytes + (param_bytes if on_cpu else 0) + HEADROOM_BYTES
    if needed > available:
        raise CheckpointError(
            f"{source}: this model needs about {_gb(param_bytes)} of weights and {_gb(buffer_bytes)} of "
            f"position tables, more than the {_gb(available)} of memory available; nothing was allocated"
        )
    return model


def _gb(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"
