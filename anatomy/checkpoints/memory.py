"""Building a model for a checkpoint in the memory its weights take, and refusing before allocating.

A loaded model should cost what its weights cost. Three habits get there (as transformers and
accelerate do):

1. The model is built with its parameters on the meta device: shapes without memory, and no
   random initialisation that the checkpoint would overwrite. Buffers (rotary tables, sinusoids,
   ALiBi slopes) are formulas of the config, computed as usual.
2. safetensors files are memory-mapped; a tensor whose dtype already fits is assigned to the
   model as it is (engine.load_into), so its bytes are the file's pages, read once, never copied.
3. A dtype conversion happens one tensor at a time.

Before any tensor is read, a config is checked in this order, each step in milliseconds, so that
nothing iterates, compiles or allocates in proportion to a number no file backs:
every number finite; every size it claims against the weights' headers (check_claimed_sizes on
the raw config, check_config_sizes on the ModelConfig: a layer or an expert holds at least one
tensor, a width is an axis of some tensor; a million layers or experts are refused before a
per-layer list exists); the layer counts against the names; its position tables against the
memory available (a bound, from max_seq_len); the bytes of the tensors it will hold, from the
headers, against the memory available (check_weights_memory: a file larger than memory is refused
before it is mapped); the model built with meta parameters against the headers, name by name and
shape by shape (engine.check_fit); and its bytes with its buffers against the memory available.
Each failure is a CheckpointError.
"""

from __future__ import annotations

import math
import os
import re
import resource
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.nn.modules.module import register_module_parameter_registration_hook
from torch.overrides import TorchFunctionMode

from ..config import ModelConfig
from ..initialization import INIT_FUNCTIONS
from ..models import FAMILIES
from .engine import Rule
from .files import CheckpointError, shorten

# Memory the process keeps for itself beyond the model (activations of a first forward pass, Python).
HEADROOM_BYTES = 256 * 2**20


# One thread's construction must not change another's: a model built in another thread meanwhile
# gets real, initialised parameters. Two mechanisms, both confined to the building thread:
#   1. torch's parameter-registration hook is process-wide, so it is registered once, here, and
#      never removed (registering and removing it per load raced with other threads iterating
#      torch's hook table: "OrderedDict mutated during iteration"); it acts only in a thread that
#      is inside `parameters_on_meta`, as a thread-local depth says.
#   2. torch.nn.init is skipped on meta tensors through a TorchFunctionMode, which torch keeps per
#      thread (torch.device("meta") as a context manager is one too); torch.nn.init itself is
#      never replaced.
_building = threading.local()


def _parameter_to_meta(module: nn.Module, name: str, parameter: nn.Parameter | None) -> nn.Parameter | None:
    """In a thread inside `parameters_on_meta`: the parameter as a meta tensor (a shape, no memory).
    A parameter already on meta (a tied matrix assigned twice) is kept, so ties hold."""
    if not getattr(_building, "depth", 0) or parameter is None or parameter.device.type == "meta":
        return None
    return nn.Parameter(parameter.to("meta"), requires_grad=parameter.requires_grad)


register_module_parameter_registration_hook(_parameter_to_meta)

# torch.nn.init's in-place initialisers (INIT_FUNCTIONS) are skipped on meta tensors while building a
# model whose weights come from a file: a meta tensor holds no values, and the first initialiser run
# on one imports torch's decompositions (about a second).


class _SkipInitOnMeta(TorchFunctionMode):
    """torch.nn.init on a meta tensor returns the tensor as it is; everything else runs as usual."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in INIT_FUNCTIONS:  # torch passes the tensor by keyword
            tensor = kwargs.get("tensor", args[0] if args else None)
            if isinstance(tensor, torch.Tensor) and tensor.is_meta:
                return tensor
        return func(*args, **kwargs)


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Every parameter registered by this thread inside this block lives on the meta device, and
    is not initialised; buffers are computed as usual. Other threads are not affected."""
    _building.depth = getattr(_building, "depth", 0) + 1
    try:
        with _SkipInitOnMeta():
            yield
    finally:
        _building.depth -= 1


def empty_model(config: ModelConfig, source: str = "the checkpoint") -> nn.Module:
    """The model `config` describes, parameters on meta (to be assigned by engine.load_into),
    buffers computed. Raises CheckpointError when the config asks for more than can be allocated."""
    try:
        with parameters_on_meta():
            return FAMILIES[config.arch](config)
    except (RuntimeError, MemoryError, ValueError) as error:
        first = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
        raise CheckpointError(f"{source}: anatomy cannot build the model its config describes ({first})") from None


def header_sizes(weights) -> tuple[int, int]:
    """(how many tensors the weights hold, how many values the largest of them holds), from the
    headers alone. Every width a config gives is an axis of some tensor, so none exceeds the
    second; a width that merely differs from the file's is left to the engine, which names every
    mis-shaped tensor."""
    names = list(weights)
    return len(names), max((math.prod(weights.shape(name)) for name in names), default=0)


def check_claimed_sizes(fields: dict, counts: tuple[str, ...], widths: tuple[str, ...], weights, what: str,
                        at_least: dict[str, int] | None = None) -> None:
    """Before a config is built from `fields` (config.json, anatomy_config.json, GGUF metadata), bound
    every size it claims by the weight headers, so that nothing iterates, compiles or allocates in
    proportion to a number no file backs:
        counts  (layers, experts): each layer, each expert, holds at least one tensor, so
                1 <= count <= the number of tensors;
        widths  (model width, heads, vocabulary, ...): each is the length of some tensor's axis, so
                at_least (default 1) <= width <= the values the largest tensor holds.
    A field absent or None is left to the config's own default. Raises CheckpointError naming the
    field, its value and the bound."""
    n_tensors, largest = header_sizes(weights)
    at_least = at_least or {}
    for group, bound, meaning in ((counts, n_tensors, f"the weights hold {n_tensors} tensors (each layer or expert "
                                                      "holds at least one)"),
                                  (widths, largest, f"the largest tensor in the weights holds {largest} values")):
        for name in group:
            value = fields.get(name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise CheckpointError(f"{what} gives {name}={shorten(repr(value), 40)}; it must be an integer")
            low = at_least.get(name, 1)
            if not low <= value <= bound:
                raise CheckpointError(f"{what} gives {name}={value}, outside [{low}, {bound}]: {meaning}")


def check_config_sizes(config: ModelConfig, weights, source: str) -> None:
    """The sizes of a built ModelConfig (derived ones included: d_head, d_ff) against the weight
    headers, before any per-layer table or module exists: the stacks' layers, times the experts of
    each, within the number of tensors; every width within the values of the largest tensor.
    CheckpointError otherwise."""
    n_tensors, largest = header_sizes(weights)
    layers = config.n_layers + (config.decoder_n_layers or 0)
    if layers * max(config.n_experts, 1) > n_tensors:
        experts = f" x {config.n_experts} experts" if config.n_experts else ""
        raise CheckpointError(f"{source}: the config's {layers} layers{experts} need at least "
                              f"{layers * max(config.n_experts, 1)} tensors, the weights hold {n_tensors}")
    widths = ["vocab_size", "d_model", "d_embed", "d_ff", "n_heads", "n_kv_heads", "d_head", "n_experts",
              "type_vocab_size", "decoder_d_ff", "decoder_n_heads"]
    widths += ["relative_buckets"] if config.pos_encoding == "relative" else []
    widths += ["num_labels"] if config.head in ("sequence-classification", "token-classification") else []
    wide = [f"{name}={getattr(config, name)}" for name in widths if (getattr(config, name) or 0) > largest]
    if wide:
        raise CheckpointError(f"{source}: the config gives {', '.join(wide)}, more than the {largest} values of the "
                              "largest tensor in the weights")


def layer_counts(rules: list[Rule], names: set[str]) -> dict[str, int]:
    """For each per-layer placeholder ("{i}", "{j}"), how many layers the checkpoint's names hold."""
    counts: dict[str, int] = {}
    for rule in rules:
        for key in ("i", "j"):
            marker = "{" + key + "}"
            if marker not in rule.hf:
                continue
            before, after = rule.hf.split(marker, 1)
            pattern = re.compile(re.escape(before) + r"(\d+)" + re.escape(after))
            found = [int(m.group(1)) for name in names if (m := pattern.fullmatch(name))]
            counts[key] = max(counts.get(key, 0), max(found, default=-1) + 1)
    return counts


def check_layers(rules: list[Rule], names: set[str], expected: dict[str, int], source: str) -> None:
    """The config's layer counts must be the checkpoint's (checked on names alone, before building)."""
    found = layer_counts(rules, names)
    wrong = [f"{'decoder ' if key == 'j' else ''}layers: the config says {expected[key]}, the weights hold {found[key]}"
             for key in found if key in expected and found[key] != expected[key]]
    if wrong:
        raise CheckpointError(f"{source}: the config's depth does not match the weights ({'; '.join(wrong)})")


def position_table_bytes(config: ModelConfig) -> int:
    """An upper bound on the buffers a config asks for, computed before building: sinusoid and rotary
    tables hold at most max_seq_len x max(d_model, d_head) float32 values each, and a model has at
    most eight (cos and sin, global and local rotary, encoder and decoder)."""
    return 8 * config.max_seq_len * max(config.d_model, config.d_head) * 4


def check_memory(config: ModelConfig, source: str, model: nn.Module | None = None,
                 dtype: torch.dtype | None = None, device=None) -> None:
    """Refuse, with a CheckpointError, what the machine's available memory cannot hold.

    Without `model`: the position tables' bound (position_table_bytes), before building. With the
    model built on meta: its parameters in `dtype` (when they go to the cpu) and its buffers."""
    available = available_memory()
    if model is None:
        needed = position_table_bytes(config)
        what = (f"{_gb(needed)} for position tables (max_seq_len={config.max_seq_len} x "
                f"max(d_model, d_head)={max(config.d_model, config.d_head)})")
    else:
        params, buffers = nbytes(model, dtype)
        on_cpu = device is None or torch.device(device).type == "cpu"
        needed, what = (params if on_cpu else 0) + buffers, f"{_gb(params)} of weights and {_gb(buffers)} of buffers"
    if needed + HEADROOM_BYTES > available:
        raise CheckpointError(f"{source}: this model needs about {what}, more than the {_gb(available)} of memory "
                              "available; nothing was allocated")


def check_tensors_memory(where: str, shapes: list[tuple[int, ...]], dtype: torch.dtype, what: str) -> None:
    """CheckpointError naming `where` when tensors of these shapes in `dtype` (what: "the SAE", "the
    transcoder set") take more than the memory available; read from headers, before any is allocated."""
    need = sum(math.prod(shape) for shape in shapes) * dtype.itemsize
    if need > available_memory():
        raise CheckpointError(f"{where!r}: {what} needs {need / 2**30:.2f} GiB, more than the "
                              f"{available_memory() / 2**30:.2f} GiB of memory available")


def check_weights_memory(weights, names, dtype: torch.dtype, device, source: str) -> None:
    """Before building: the bytes the named checkpoint tensors take once loaded (floating ones in
    `dtype`), read from the headers, against the memory available when they go to the cpu. A weight
    file larger than memory is refused here, before a byte of it is mapped. CheckpointError otherwise."""
    if device is not None and torch.device(device).type != "cpu":
        return
    needed = sum(math.prod(weights.shape(name))
                 * (dtype.itemsize if weights.dtype(name).is_floating_point else weights.dtype(name).itemsize)
                 for name in names if name in weights)
    available = available_memory()
    if needed + HEADROOM_BYTES > available:
        raise CheckpointError(f"{source}: this model's weights take about {_gb(needed)} in "
                              f"{str(dtype).removeprefix('torch.')}, more than the {_gb(available)} of memory "
                              "available; nothing was allocated")


def nbytes(model: nn.Module, dtype: torch.dtype | None) -> tuple[int, int]:
    """(parameter bytes, buffer bytes) of a model, floating parameters counted in `dtype` when given."""
    params = {id(p): p for p in model.parameters()}.values()
    param_bytes = sum(p.numel() * (dtype.itemsize if dtype is not None and p.is_floating_point() else p.element_size())
                      for p in params)
    return param_bytes, sum(b.numel() * b.element_size() for b in model.buffers())


def available_memory() -> int:
    """Bytes this process can still take: the machine's MemAvailable (/proc/meminfo; else its free
    pages), or less where a limit on this process is nearer: an address-space limit (RLIMIT_AS, as
    `ulimit -v` sets; a memory map counts against it) or its container's cgroup memory limit."""
    room = [_meminfo_available()]
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        room.append(soft - _status_bytes("VmSize"))
    for limit, usage in (("memory.max", "memory.current"),  # cgroup v2, then v1
                         ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        limit_bytes, usage_bytes = _read_int(f"/sys/fs/cgroup/{limit}"), _read_int(f"/sys/fs/cgroup/{usage}")
        if limit_bytes is not None and usage_bytes is not None:
            room.append(limit_bytes - usage_bytes)
            break
    return max(0, min(room))


def _meminfo_available() -> int:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _status_bytes(field: str) -> int:
    """A size from /proc/self/status ("VmSize:  123 kB"), in bytes; 0 when unknown."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _read_int(path: str) -> int | None:
    """The integer a one-line file holds (a cgroup's limit: "max" means none), else None."""
    try:
        with open(path) as file:
            text = file.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _gb(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"
