"""Trace points: every intermediate of the forward pass has a name, and can be recorded or replaced.

A TracePoint is an identity module placed where an intermediate is computed. Its name is its
module path (`blocks.0.attn.pattern`), so the name *is* where it lives. Each point also declares
the names of its tensor's axes (`batch head query key`), so a reader of a trace knows what
`t["blocks.0.attn.pattern"][0, 3, 2]` means.

With nothing traced a point costs one attribute read: `__call__` is overridden so that the
nn.Module hook machinery is never entered on the default path.

    with anatomy.trace(model, ["blocks.0.attn.pattern", "*.mlp.post"]) as t:
        model(ids)
    t["blocks.0.attn.pattern"]          # [batch, head, query, key]

    def zero_head_3(x):                  # blocks.1.attn.z is [batch, pos, head, d_head]
        x = x.clone(); x[:, :, 3] = 0; return x
    with anatomy.trace(model, interventions={"blocks.1.attn.z": zero_head_3}):
        model(ids)
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import nn


class TracePoint(nn.Module):
    """An identity function with a name, that a trace can listen to or intervene on."""

    def __init__(self, axes: str):
        super().__init__()
        self.axes = tuple(axes.split())
        self.fn: Callable[[torch.Tensor], torch.Tensor] | None = None

    @property
    def active(self) -> bool:
        return self.fn is not None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        fn = self.fn
        return x if fn is None else fn(x)

    def extra_repr(self) -> str:
        return " ".join(self.axes)


def trace_points(model: nn.Module) -> dict[str, TracePoint]:
    """Every trace point of `model`, by name, in the order the modules declare them.

    That is the order a pre-norm pass reaches them; a post-norm block reaches each norm's point
    after its sublayer's. A Trace iterates in the order its pass actually recorded.
    """
    return {name: module for name, module in model.named_modules() if isinstance(module, TracePoint)}


def _select(points: Mapping[str, TracePoint], patterns: Iterable[str]) -> list[str]:
    selected: list[str] = []
    for pattern in patterns:
        matches = [name for name in points if fnmatch.fnmatchcase(name, pattern)]
        if not matches:
            raise KeyError(
                f"no trace point matches {pattern!r}; this model has {len(points)} points, e.g. "
                f"{', '.join(list(points)[:6])} (see anatomy.trace_points(model))"
            )
        selected += [name for name in matches if name not in selected]
    return selected


class Trace(Mapping):
    """The recorded intermediates of one traced pass: a read-only mapping from name to tensor.

    `axes(name)` gives the axis names of that tensor. A point the pass never reached (e.g. the
    positions of a rotary model at `pos_embed`) is absent, and asking for it says so.
    """

    def __init__(self, points: Mapping[str, TracePoint], names: list[str]):
        self._points = points
        self._names = names
        self._values: dict[str, torch.Tensor] = {}

    def _record(self, name: str, value: torch.Tensor) -> None:
        self._values[name] = value.detach()

    def __getitem__(self, name: str) -> torch.Tensor:
        if name in self._values:
            return self._values[name]
        if name in self._names:
            raise KeyError(f"trace point {name!r} was selected but the forward pass did not reach it")
        raise KeyError(f"{name!r} was not traced; traced points: {', '.join(self._names[:8])}...")

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def axes(self, name: str) -> tuple[str, ...]:
        return self._points[name].axes

    def __repr__(self) -> str:
        rows = [f"  {name}: {tuple(value.shape)} [{' '.join(self.axes(name))}]" for name, value in self._values.items()]
        return "Trace(\n" + "\n".join(rows) + "\n)"


Intervention = Callable[[torch.Tensor], "torch.Tensor | None"]


@contextmanager
def trace(
    model: nn.Module,
    names: Iterable[str] | str | None = None,
    interventions: Mapping[str, Intervention] | None = None,
) -> Iterator[Trace]:
    """Record the trace points matching `names` (glob patterns; None = all) during the block.

    `interventions` maps a point's name to a function of its tensor that returns a replacement
    (or None to keep it); the recorded value is the one after the intervention. Recording
    `attn.scores` or `attn.pattern` runs those layers with the eager kernel, which computes them;
    the fused kernel never does. Everything is undone in a `finally`, even if the pass raises.

    Raises KeyError for a name or pattern that matches no point of this model.
    """
    points = trace_points(model)
    if isinstance(names, str):
        names = [names]
    recorded = list(points) if names is None else _select(points, names)
    interventions = dict(interventions or {})
    for name in interventions:
        if name not in points:
            _select(points, [name])  # raises with the list of points
    result = Trace(points, recorded)
    busy = [name for name in set(recorded) | set(interventions) if points[name].fn is not None]
    if busy:
        raise RuntimeError(f"trace points {busy} are already being traced; nested traces are not supported")

    def make_fn(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
        intervene = interventions.get(name)
        record = name in recorded

        def fn(x: torch.Tensor) -> torch.Tensor:
            if intervene is not None:
                replaced = intervene(x)
                if replaced is not None:
                    if replaced.shape != x.shape:
                        raise ValueError(
                            f"intervention on {name!r} returned shape {tuple(replaced.shape)}, "
                            f"expected {tuple(x.shape)} ({' '.join(points[name].axes)})"
                        )
                    x = replaced
            if record:
                result._record(name, x)
            return x

        return fn

    active = set(recorded) | set(interventions)
    try:
        for name in active:
            points[name].fn = make_fn(name)
        yield result
    finally:
        for name in active:
            points[name].fn = None
