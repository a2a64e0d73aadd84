"""A transcoder set's layers read from their files when first used, one layer at a time.

A set of 26 layers of 16,384 features over d_model 2304 (Gemma Scope on gemma-2-2b) is 7.9 GB in float32.
load_transcoders reads only the headers (every name, shape and size checked); each layer is built when
something first asks for it (`transcoders.layers[l]`, or any per-layer method of TranscoderSet):

    its tensors memory-mapped from the files (mapped.py): no copy where the file's dtype is the one asked
        and the layout needs no reordering; the pages are read as they are touched
    every tensor checked finite (a NaN weight or threshold is refused, naming the file), once per layer
    an SAE made around them (modules.py), with what was done to the set since (.to(device), .eval())

`resident` bounds how many built layers are kept (the least recently used let go first; None: all);
`release()` lets every one go. Building is under a lock, so that threads sharing a set build each layer
once and see the same tensors.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..checkpoints.files import CheckpointError
from .mapped import check_finite
from .modules import SAE


@dataclass(frozen=True)
class LayerSpec:
    """What one layer's transcoder is, from its headers: kind, widths (d_out: every layer it writes, side by
    side), whether it has a skip path, and its files (for messages)."""

    kind: str
    d_in: int
    d_sae: int
    d_out: int
    skip: bool
    where: str = ""

    @classmethod
    def of(cls, sae: SAE) -> "LayerSpec":
        return cls(sae.kind, sae.d_in, sae.d_sae, sae.d_out, sae.W_skip is not None)


@dataclass(frozen=True)
class LayerPlan:
    """How to build one layer: its spec, and read() -> {parameter: tensor} in anatomy's layout (W_enc [E, F],
    b_enc [F], W_dec [F, O], b_dec [O], threshold [F] for a JumpReLU, W_skip [O, E] with a skip), mapped."""

    spec: LayerSpec
    read: Callable[[], dict[str, torch.Tensor]]


class LazyLayers(Sequence):
    """The layers of a set, built on first use from their plans (module docstring). dtype: the parameters'."""

    def __init__(self, plans: Sequence[LayerPlan], dtype: torch.dtype, resident: int | None = None):
        if resident is not None and (isinstance(resident, bool) or not isinstance(resident, int) or resident < 1):
            raise ValueError(f"resident must be a positive number of layers or None (all), got {resident!r}")
        self.plans, self.dtype, self.resident = list(plans), dtype, resident
        self.specs = [plan.spec for plan in self.plans]
        self.applied: list[Callable] = []  # what nn.Module._apply did to the set (.to, .float, ...), in order
        self.training = False
        self.prepare: Callable[[int, SAE], None] = lambda layer, sae: None
        self._built: OrderedDict[int, SAE] = OrderedDict()
        self._checked: set[int] = set()
        self._lock = threading.RLock()

    def __len__(self) -> int:
        return len(self.plans)

    def __getitem__(self, layer):
        if isinstance(layer, slice):
            return [self[i] for i in range(len(self))[layer]]
        if isinstance(layer, bool) or not isinstance(layer, int) or not -len(self) <= layer < len(self):
            raise IndexError(f"layer {layer!r} is not one of this set's {len(self)}")
        layer %= len(self)
        with self._lock:
            if layer in self._built:
                self._built.move_to_end(layer)
                return self._built[layer]
            sae = self._build(layer)
            self._built[layer] = sae
            while self.resident is not None and len(self._built) > self.resident:
                self._built.popitem(last=False)
            return sae

    def built(self) -> list[int]:
        """The layers held now, least recently used first."""
        with self._lock:
            return list(self._built)

    def release(self, layer: int | None = None) -> None:
        """Let go of one built layer (or of all): the next use builds it again from its files."""
        with self._lock:
            if layer is None:
                self._built.clear()
            else:
                self._built.pop(layer, None)

    def apply(self, fn: Callable) -> None:
        """nn.Module._apply's fn, applied to the layers built and recorded for those built later."""
        with self._lock:
            self.applied.append(fn)
            for sae in self._built.values():
                sae._apply(fn)

    def train(self, mode: bool) -> None:
        with self._lock:
            self.training = mode
            for sae in self._built.values():
                sae.train(mode)

    def _build(self, layer: int) -> SAE:
        plan = self.plans[layer]
        spec = plan.spec
        tensors = plan.read()
        if layer not in self._checked:
            for name, tensor in tensors.items():
                check_finite(tensor, f"{spec.where}: {name} of layer {layer}")
            self._checked.add(layer)
        with torch.device("meta"):
            sae = SAE(spec.d_in, spec.d_sae, kind=spec.kind, d_out=spec.d_out, transcoder=True, skip=spec.skip,
                      apply_b_dec_to_input=False, dtype=self.dtype, seed=None)
        for name, tensor in tensors.items():
            setattr(sae, name, nn.Parameter(tensor.to(self.dtype), requires_grad=False))
        left = [name for name, parameter in sae.named_parameters() if parameter.is_meta]
        if left:
            raise CheckpointError(f"{spec.where}: layer {layer} has no {', '.join(left)}")
        for fn in self.applied:
            sae._apply(fn)
        self.prepare(layer, sae)
        return sae.train(self.training)


def first_block(vector: torch.Tensor, blocks: int) -> torch.Tensor:
    """[E] -> [blocks E]: the vector, then zeros (a CLT layer's bias, written to its own output only)."""
    return vector if blocks == 1 else torch.cat([vector, vector.new_zeros((blocks - 1) * vector.numel())])
