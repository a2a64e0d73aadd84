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

    with anatomy.trace(model, ["blocks.1.resid_post.sae.features"], saes={"blocks.1.resid_post": sae}) as t:
        model(ids)                       # an SAE spliced in (anatomy/sae): the outputs unchanged

A trace belongs to the thread that opened it: the functions it installs live in thread-local
state, so a forward pass in another thread, on the same model at the same time, neither sees
an intervention nor records into this trace.

TransformerLens names are accepted wherever a name or pattern is, and `trace(..., grad=True)`
keeps the recorded tensors in the autograd graph. The names (hook_names.ALIASES; L is a layer or *):

    TransformerLens                      anatomy
    hook_embed, hook_pos_embed           embed, pos_embed
    blocks.L.hook_resid_pre / _mid / _post   blocks.L.resid_pre / resid_mid / resid_post
    blocks.L.ln1.hook_normalized         blocks.L.attn_norm.normalized   (ln2: mlp_norm; before the gain)
    blocks.L.attn.hook_q / _k / _v       blocks.L.attn.q / k / v     ([batch head pos d_head] here)
    blocks.L.attn.hook_rot_q / _rot_k    blocks.L.attn.q_rot / k_rot
    blocks.L.attn.hook_attn_scores       blocks.L.attn.scores        (unmasked here)
    blocks.L.attn.hook_pattern           blocks.L.attn.pattern
    blocks.L.attn.hook_z                 blocks.L.attn.z
    blocks.L.attn.hook_result            blocks.L.attn.head_out
    blocks.L.hook_attn_out               blocks.L.attn.out
    blocks.L.mlp.hook_pre / hook_post    blocks.L.mlp.pre / mlp.post
    blocks.L.hook_mlp_out                blocks.L.mlp.out
    ln_final.hook_normalized             final_norm.normalized
"""

from __future__ import annotations

import fnmatch
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import nn

from .hook_names import anatomy_name

# Per-thread state: point -> the function this thread's trace installed on it.
_local = threading.local()
_count_lock = threading.Lock()


def _functions() -> dict:
    functions = getattr(_local, "functions", None)
    if functions is None:
        functions = _local.functions = {}
    return functions


class TracePoint(nn.Module):
    """An identity function with a name, that a trace can listen to or intervene on.

    `on_request` points (per-head outputs, H times the size of the residual) are computed and
    recorded only when named, never by a trace of everything.
    """

    def __init__(self, axes: str, *, on_request: bool = False):
        super().__init__()
        self.axes = tuple(axes.split())
        self.on_request = on_request
        self._n_threads = 0  # how many threads have a function on this point: 0 = the fast path

    @property
    def fn(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """This thread's function on the point (None: identity)."""
        return _functions().get(self) if self._n_threads else None

    @fn.setter
    def fn(self, value: Callable[[torch.Tensor], torch.Tensor] | None) -> None:
        self.set_fn(value)

    def set_fn(self, value: Callable[[torch.Tensor], torch.Tensor] | None) -> None:
        """Put `value` on the point for this thread (None: take it off). What `point.fn = value` does,
        without nn.Module's __setattr__, which looks for parameters and submodules first: a trace of
        every point sets it twice per point, 5,000 times for SmolLM2 (30 ms a pass that way)."""
        functions = _functions()
        with _count_lock:
            object.__setattr__(self, "_n_threads", self._n_threads + (value is not None) - (self in functions))
            if value is None:
                functions.pop(self, None)
            else:
                functions[self] = value

    @property
    def active(self) -> bool:
        return self.fn is not None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        if not self._n_threads:
            return x
        fn = _functions().get(self)
        return x if fn is None else fn(x)

    def extra_repr(self) -> str:
        return " ".join(self.axes) + (", on request" if self.on_request else "")


@contextmanager
def _paused() -> Iterator[None]:
    """Every point an identity in this thread for the block (a recipe may run a module that has points)."""
    saved = _functions()
    _local.functions = {}
    try:
        yield
    finally:
        _local.functions = saved


class _Recipe:
    """A recorded value kept as fn(*args) and computed when first read; an argument may be another recipe.

    Recipes chain (resid_post of layer L is resid_mid + mlp.out, resid_mid is resid_pre + attn.out,
    resid_pre of L + 1 is resid_post of L): reading the last layer's computes the chain below it
    once, each link kept, with a list of the links still to compute rather than one call per link.
    """

    def __init__(self, fn: Callable[..., torch.Tensor], args: tuple, shape: torch.Size):
        self.fn, self.args, self.shape = fn, args, shape
        self._value: torch.Tensor | None = None

    def _waiting(self) -> list["_Recipe"]:
        return [a for a in self.args if isinstance(a, _Recipe) and a._value is None]

    def value(self) -> torch.Tensor:
        pending = [self]  # depth first: a recipe is computed once every recipe it reads is
        while pending:
            recipe = pending[-1]
            waiting = recipe._waiting() if recipe._value is None else []
            if waiting:
                pending += waiting
                continue
            pending.pop()
            if recipe._value is None:
                args = [a._value if isinstance(a, _Recipe) else a for a in recipe.args]
                with _paused(), torch.no_grad():
                    recipe._value = recipe.fn(*args)
                recipe.args = ()  # the inputs are the trace's to keep, not the recipe's
        return self._value

    def tensors(self) -> list[torch.Tensor]:
        """The tensors this recipe itself keeps alive (inputs, weight snapshots, masks); an input that
        is a recipe is a value of the trace too, and answers for its own."""
        if self._value is not None:
            return [self._value]
        held = []
        for a in self.args:
            held += [item for item in (a.values() if isinstance(a, dict) else [a]) if torch.is_tensor(item)]
        return held


def trace_points(model: nn.Module) -> dict[str, TracePoint]:
    """Every trace point of `model`, by name, in the order the modules declare them.

    That is the order a pre-norm pass reaches them; a post-norm block reaches each norm's point
    after its sublayer's. A Trace iterates in the order its pass actually recorded.
    """
    return {name: module for name, module in model.named_modules() if isinstance(module, TracePoint)}


def _select(points: Mapping[str, TracePoint], patterns: Iterable[str]) -> list[str]:
    selected: list[str] = []
    for pattern in patterns:
        ours = anatomy_name(pattern)
        matches = [name for name in points if fnmatch.fnmatchcase(name, ours)]
        if not matches:
            alias = f" (TransformerLens {pattern!r} = anatomy {ours!r})" if ours != pattern else ""
            raise KeyError(
                f"no trace point matches {pattern!r}{alias}; this model has {len(points)} points, e.g. "
                f"{', '.join(list(points)[:6])} (see anatomy.trace_points(model))"
            )
        selected += [name for name in matches if name not in selected]
    return selected


class Trace(Mapping):
    """The recorded intermediates of one traced pass: a read-only mapping from name to tensor.

    `axes(name)` gives the axis names of that tensor. A point the pass never reached (e.g. the
    positions of a rotary model at `pos_embed`) is absent, and asking for it says so.
    TransformerLens names work as keys too. `tokens` holds the string tokens when the inputs
    were text (anatomy.run_with_cache).

    A value recorded as a recipe (trace(..., derive=...)) is computed from the tensors it was
    derived from when first read, and kept: every name is answered, in the order of the pass.
    """

    def __init__(self, points: Mapping[str, TracePoint], names: list[str], grad: bool = False):
        self._points = points
        self._names = names
        self._grad = grad
        self._values: dict[str, torch.Tensor] = {}
        self.tokens: list[list[str]] | None = None

    def _record(self, name: str, value: torch.Tensor, recipe: tuple | None = None) -> None:
        """Keep `value`, or the recipe (fn, args) it equals when every point an argument names (a str)
        was recorded earlier in this pass."""
        if recipe is not None and all(a in self._values for a in recipe[1] if isinstance(a, str)):
            fn, args = recipe
            args = tuple(self._values[a] if isinstance(a, str) else a for a in args)
            self._values[name] = _Recipe(fn, args, value.shape)
            return
        self._values[name] = value if self._grad else value.detach()

    def stored(self) -> list[torch.Tensor]:
        """The tensors this trace holds now: the recorded ones and what its unread recipes keep."""
        held = []
        for value in self._values.values():
            held += value.tensors() if isinstance(value, _Recipe) else [value]
        return held

    def __getitem__(self, name: str) -> torch.Tensor:
        name = anatomy_name(name)
        if name in self._values:
            value = self._values[name]
            if isinstance(value, _Recipe):
                value = self._values[name] = value.value()
            return value
        if name in self._names:
            raise KeyError(f"trace point {name!r} was selected but the forward pass did not reach it")
        raise KeyError(f"{name!r} was not traced; traced points: {', '.join(self._names[:8])}...")

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and anatomy_name(name) in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def axes(self, name: str) -> tuple[str, ...]:
        return self._points[anatomy_name(name)].axes

    def __repr__(self) -> str:
        rows = [f"  {name}: {tuple(value.shape)} [{' '.join(self.axes(name))}]" for name, value in self._values.items()]
        return "Trace(\n" + "\n".join(rows) + "\n)"


Intervention = Callable[[torch.Tensor], "torch.Tensor | None"]


@contextmanager
def trace(
    model: nn.Module,
    names: Iterable[str] | str | None = None,
    interventions: Mapping[str, Intervention] | None = None,
    *,
    grad: bool = False,
    derive: Callable[[str, torch.Tensor], tuple | None] | None = None,
    saes: Mapping[str, nn.Module] | None = None,
) -> Iterator[Trace]:
    """Record the trace points matching `names` (glob patterns or TransformerLens names; None = all
    but the on-request ones) during the block, in this thread only.

    `interventions` maps a point's name to a function of its tensor that returns a replacement
    (or None to keep it); the recorded value is the one after the intervention. Recording
    `attn.scores` or `attn.pattern` runs those layers with the eager kernel, which computes them;
    the fused kernel never does. With `grad=True` the recorded tensors stay in the autograd graph
    (for torch.autograd.grad; the pass must run with gradients enabled). Everything is undone in a
    `finally`, even if the pass raises.

    `derive(name, x)`, asked as each recorded point is reached with its tensor x, may return a recipe
    (fn, args) of the value to record: x equals fn(*args), where a str argument names a point recorded
    earlier in the pass (itself perhaps a recipe); or, for a pass that continues an earlier one from a
    KV cache (analysis/prefix.py), fn(*args) is the earlier positions' value followed by x's. The
    trace then keeps the recipe, not x, and computes the value when it is first read.
    Never for a point with an intervention, nor with grad=True (the graph's own tensors are kept).

    `saes` maps a point to a sparse autoencoder (anatomy.SAE) spliced in there: the point's value x
    (after its own intervention, and as recorded) goes on as sae.splice(x) = reconstruction + error,
    which is x itself until something changes it, and the SAE's trace points join this trace as
    `<point>.sae.features`, `.sae.recon` and `.sae.error`, to record or intervene on like any other.
    A transcoder is keyed by the point it writes (blocks.L.mlp.out) and reads `sae.point` (its input).

    Raises KeyError for a name or pattern that matches no point of this model, RuntimeError when
    this thread already traces one of the points, ValueError when an intervention returns
    something other than a tensor of the same shape, dtype and device.
    """
    points = trace_points(model)
    spliced, sources = _attach(points, saes or {})
    if spliced:
        derive = None  # a recipe would recompute a point from values the SAEs no longer pass on
    if isinstance(names, str):
        names = [names]
    if names is None:
        recorded = [name for name, point in points.items() if not point.on_request]
    else:
        recorded = _select(points, names)
    resolved: dict[str, Intervention] = {}
    for name, fn in (interventions or {}).items():
        ours = anatomy_name(name)
        if ours not in points:
            _select(points, [name])  # raises, listing the points
            raise KeyError(f"an intervention needs one exact point name, not the pattern {name!r}")
        resolved[ours] = fn
    interventions = resolved
    result = Trace(points, recorded, grad=grad)
    active = set(recorded) | set(interventions) | set(spliced) | set(sources)
    busy = sorted(name for name in active if points[name].fn is not None)
    if busy:
        raise RuntimeError(f"trace points {busy} are already being traced in this thread; nested traces are not supported")

    def make_fn(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
        intervene = interventions.get(name)
        record = name in recorded
        may_derive = derive is not None and intervene is None and not grad
        sae, reads = spliced.get(name, (None, None))

        def fn(x: torch.Tensor) -> torch.Tensor:
            if intervene is not None:
                replaced = intervene(x)
                if replaced is not None:
                    _check_replacement(name, points[name], x, replaced)
                    x = replaced
            if record:
                result._record(name, x, derive(name, x) if may_derive else None)
            if name in sources:  # a transcoder further on reads this point
                sources[name] = x
            if sae is not None:
                if reads is not None and sources[reads] is None:
                    raise ValueError(f"the transcoder at {name!r} reads {reads!r}, which this pass has not reached "
                                     f"(it comes later, or not at all)")
                x = sae.splice(x, None if reads is None else sources[reads])
            return x

        return fn

    installed = []
    try:
        for name in active:
            points[name].set_fn(make_fn(name))
            installed.append(name)
        yield result
    finally:
        for name in installed:
            points[name].set_fn(None)


def _attach(points: dict[str, TracePoint], saes: Mapping[str, nn.Module]) -> tuple[dict[str, tuple], dict]:
    """For trace(..., saes=...): (point -> (the SAE spliced there, the point it reads if another one),
    {point a transcoder reads: None}); adds every SAE's own points to `points` as `<point>.sae.<name>`."""
    spliced, sources = {}, {}
    for name, sae in saes.items():
        ours = anatomy_name(name)
        if ours not in points:
            _select(points, [name])  # raises, listing the points
            raise KeyError(f"an SAE is attached to one exact point name, not the pattern {name!r}")
        if not callable(getattr(sae, "splice", None)):
            raise TypeError(f"saes[{name!r}] must be an anatomy.SAE (a module with splice), got {type(sae).__name__}")
        if any(sae is other for other, _ in spliced.values()):
            raise ValueError(f"one SAE is attached at two points ({name!r} too): attach a copy (copy.deepcopy)")
        reads = sae.point if getattr(sae, "is_transcoder", False) else None
        if getattr(sae, "is_transcoder", False):
            if reads is None:
                raise ValueError(f"the transcoder at {ours!r} does not say which point it reads (sae.point)")
            if reads not in points:
                raise KeyError(f"the transcoder at {ours!r} reads {reads!r}, which this model does not have")
            sources[reads] = None
        spliced[ours] = (sae, reads)
        points.update({f"{ours}.sae.{inner}": point for inner, point in trace_points(sae).items()})
    return spliced, sources


def _check_replacement(name: str, point: TracePoint, x: torch.Tensor, replaced) -> None:
    expected = f"a tensor of shape {tuple(x.shape)} ({' '.join(point.axes)}), dtype {x.dtype}, on {x.device}"
    if not torch.is_tensor(replaced):
        raise ValueError(f"intervention on {name!r} returned {type(replaced).__name__}; expected {expected} or None")
    if replaced.shape != x.shape:
        raise ValueError(f"intervention on {name!r} returned shape {tuple(replaced.shape)}, expected {tuple(x.shape)} "
                         f"({' '.join(point.axes)})")
    if replaced.dtype != x.dtype or replaced.device != x.device:
        raise ValueError(f"intervention on {name!r} returned dtype {replaced.dtype} on {replaced.device}; expected {expected}")
