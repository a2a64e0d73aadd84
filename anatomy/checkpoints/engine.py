"""The one engine that applies an architecture's mapping table, in both directions.

An architecture (bert.py, gpt2.py, marian.py, llama.py) is data: how a Hugging Face config becomes
a ModelConfig, and a table of Rules saying which checkpoint tensor holds which anatomy parameter.
Nothing here knows a model name.

A Rule relates one checkpoint tensor to one or more anatomy tensors:
    Rule("h.{i}.attn.c_attn.weight", ("blocks.{i}.attn.q_proj.weight", ...k, ...v), transpose=True)
reads:  checkpoint [E, 3E] --transpose--> [3E, E] --split along dim 0--> q, k, v [E, E] each.
Saving runs the same steps backwards: concatenate, transpose, reshape.

`derived=True` marks a checkpoint tensor that is a copy of something the model already has (an
embedding tied to another, a sinusoid table that is a formula): it may be absent; if present it
must equal what the model computes; it is not written back.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from ..config import ModelConfig
from .files import CheckpointError, Weights, listing, shorten

# How closely a derived tensor in a checkpoint must match the model's own (a formula, a tied copy).
DERIVED_ATOL = 1e-6
# How many problems of each kind a message lists (then how many more): a message stays short
# whatever the file holds (200 000 extra tensors made a 3.9 MB line).
PROBLEMS_SHOWN = 3


@dataclass(frozen=True)
class Rule:
    hf: str  # checkpoint name; "{i}" stands for the layer index ("{j}": a decoder layer's, in an encoder-decoder)
    ours: tuple[str, ...]  # anatomy tensor names; several = fused along dim 0 in the checkpoint
    transpose: bool = False  # the checkpoint stores [in, out] (GPT-2's Conv1D), anatomy [out, in]
    view: tuple[int, ...] | None = None  # the checkpoint's tensor is ours reshaped to this (e.g. (1, -1))
    derived: bool = False  # a copy of something the model has: optional on load, checked, not saved
    heads: int | None = None  # the fused parts alternate head by head: [h0 q, h0 k, h0 v, h1 q, ...] (GPT-NeoX)

    def __init__(self, hf: str, ours: str | tuple[str, ...], *, transpose: bool = False,
                 view: tuple[int, ...] | None = None, derived: bool = False, heads: int | None = None):
        object.__setattr__(self, "hf", hf)
        object.__setattr__(self, "ours", (ours,) if isinstance(ours, str) else tuple(ours))
        object.__setattr__(self, "transpose", transpose)
        object.__setattr__(self, "view", view)
        object.__setattr__(self, "derived", derived)
        object.__setattr__(self, "heads", heads)

    def layer(self, **index: int) -> "Rule":
        """This rule for one layer: layer(i=3) fills "{i}" (or layer(j=3) "{j}") in both names."""
        return dataclasses.replace(self, hf=self.hf.format(**index), ours=tuple(n.format(**index) for n in self.ours))

    # the two directions ------------------------------------------------------------------------
    def to_checkpoint(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """anatomy tensors -> the checkpoint tensor: concatenate (dim 0; head by head with `heads`),
        transpose, reshape."""
        if self.heads is not None:  # each (H*D, ...) -> (H, D, ...); side by side per head; back to rows
            per_head = [x.reshape(self.heads, -1, *x.shape[1:]) for x in tensors]
            t = torch.cat(per_head, dim=1).reshape(-1, *tensors[0].shape[1:])
        else:
            t = tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=0)
        if self.transpose:
            t = t.t()
        if self.view is not None:
            t = t.reshape(self.view)
        return t

    def from_checkpoint(self, t: torch.Tensor, shapes: list[torch.Size]) -> list[torch.Tensor]:
        """The checkpoint tensor -> anatomy tensors of `shapes`: reshape, transpose, split (dim 0)."""
        if self.view is not None:
            t = t.reshape(shapes[0])
        if self.transpose:
            t = t.t()
        if len(shapes) == 1:
            return [t]
        if self.heads is not None:  # (H * sum D_part, ...) -> (H, sum D_part, ...) -> each (H * D_part, ...)
            per_head = t.reshape(self.heads, -1, *t.shape[1:])
            parts = torch.split(per_head, [s[0] // self.heads for s in shapes], dim=1)
            return [part.reshape(shape) for part, shape in zip(parts, shapes)]
        return list(torch.split(t, [s[0] for s in shapes], dim=0))


@dataclass(frozen=True)
class Architecture:
    """A Hugging Face model_type, as data.

    classes: HF class name -> anatomy head ("none", "lm", "masked-lm", ...).
    base_prefix: the prefix a head class puts before the base model's tensors ("bert", "model").
    to_config(hf_config, class_name, checkpoint_keys) -> ModelConfig.
    to_hf_config(config, class_name) -> the HF config fields (raises CheckpointError if inexpressible).
    table(config) -> [Rule], with "{i}" rules repeated per layer by `expand`.
    ignore: regexes of checkpoint names that are buffers, not weights (causal masks, position ids).
    """

    model_type: str
    classes: dict[str, str]
    base_prefix: str
    to_config: Callable[[dict, str, set[str]], ModelConfig]
    to_hf_config: Callable[[ModelConfig, str], dict]
    table: Callable[[ModelConfig], list[Rule]]
    ignore: tuple[str, ...] = ()
    base_classes: tuple[str, ...] = field(default=())  # classes saved without base_prefix

    def class_for(self, config: ModelConfig) -> str:
        for name, head in self.classes.items():
            if head == config.head:
                return name
        raise CheckpointError(
            f"{self.model_type} has no class for head={config.head!r}; heads: {sorted(set(self.classes.values()))}"
        )


def require(model_type: str, config: ModelConfig, **expected) -> None:
    """Raise CheckpointError listing every field of `config` that `model_type` cannot express."""
    wrong = [f"{name}={value!r} (this config has {getattr(config, name)!r})"
             for name, value in expected.items() if getattr(config, name) != value]
    if wrong:
        raise CheckpointError(f"a {model_type} checkpoint needs " + ", ".join(wrong))


def expand(rules: list[Rule], n_layers: int, n_decoder_layers: int | None = None) -> list[Rule]:
    """Repeat each layer rule: "{i}" over n_layers (the only stack, or the encoder), "{j}" over
    n_decoder_layers (an encoder-decoder's decoder; default n_layers)."""
    counts = {"i": n_layers, "j": n_layers if n_decoder_layers is None else n_decoder_layers}
    out = []
    for rule in rules:
        index = next((name for name in counts if "{" + name + "}" in rule.hf), None)
        out += [rule.layer(**{index: n}) for n in range(counts[index])] if index else [rule]
    return out


def _tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer by every name it has (a tied matrix has several)."""
    tensors = dict(model.named_parameters(remove_duplicate=False))
    tensors.update(dict(model.named_buffers(remove_duplicate=False)))
    return tensors


def _shape_str(shape) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def check_coverage(model: nn.Module, rules: list[Rule], model_type: str) -> None:
    """Every parameter of the model must be written by a non-derived rule (a table bug otherwise)."""
    tensors = _tensors(model)
    unknown = sorted({n for r in rules for n in r.ours if n not in tensors})
    covered = {id(tensors[n]) for r in rules if not r.derived for n in r.ours if n in tensors}
    uncovered = [n for n, p in model.named_parameters() if id(p) not in covered]
    if unknown or uncovered:
        raise CheckpointError(
            f"the {model_type} mapping table does not fit the model: "
            + (f"names the model lacks: {listing(unknown)}; " if unknown else "")
            + (f"parameters no rule fills: {listing(uncovered)}" if uncovered else "")
        )


def check_fit(model: nn.Module, rules: list[Rule], weights: Weights, ignore: tuple[str, ...], model_type: str) -> None:
    """Compare the checkpoint's names and header shapes with the model's, reading no tensor.

    `model` may live on the meta device. Raises one CheckpointError that lists every missing,
    unexpected and mis-shaped tensor by name (with both shapes where they differ)."""
    check_coverage(model, rules, model_type)
    tensors = _tensors(model)
    missing, mismatched, not_floating = [], [], []
    for rule in rules:
        expected = _expected_shape(rule, [tensors[n] for n in rule.ours])
        if rule.hf not in weights:
            if not rule.derived:
                missing.append(f"{rule.hf} {_shape_str(expected)} (for {', '.join(rule.ours)})")
        elif tuple(weights.shape(rule.hf)) != expected:
            got = weights.shape(rule.hf)
            mismatched.append(f"{rule.hf}: checkpoint has {_shape_str(got)}, model expects {_shape_str(expected)}")
        elif not rule.derived and not weights.dtype(rule.hf).is_floating_point:
            # A parameter is trained by gradients: an integer or bool tensor cannot be one.
            not_floating.append(f"{rule.hf} ({str(weights.dtype(rule.hf)).removeprefix('torch.')})")
    known = {r.hf for r in rules}
    patterns = [re.compile(p) for p in ignore]
    unexpected = [k for k in weights if k not in known and not any(p.search(k) for p in patterns)]
    _raise_problems(weights.source, model_type, [
        ("missing tensors", missing),
        ("unexpected tensors", [f"{k} {_shape_str(weights.shape(k))}" for k in unexpected]),
        ("mis-shaped tensors", mismatched),
        ("tensors of an integer or bool dtype, where the model has floating-point parameters", not_floating),
    ])


def load_into(model: nn.Module, rules: list[Rule], weights: Weights, ignore: tuple[str, ...], model_type: str, *,
              dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> None:
    """Fill `model` from `weights` by `rules`, after checking everything; never half-loads.

    The model's parameters may be on the meta device (memory.empty_model): each is replaced by the
    checkpoint's tensor itself, assigned rather than copied (a memory-mapped safetensors tensor stays
    the file's pages), converted to `dtype` (floating tensors; None keeps the stored dtype) and moved
    to `device` one tensor at a time. Tied parameters stay one tensor.
    Raises one CheckpointError that lists every missing, unexpected, mis-shaped, non-finite or
    inconsistent tensor by name.
    """
    check_fit(model, rules, weights, ignore, model_type)
    tensors = _tensors(model)
    nonfinite, inconsistent = [], []
    staged: dict[int, torch.Tensor] = {}  # id(target) -> its new value
    present: list[tuple[Rule, torch.Tensor]] = []
    for rule in rules:
        if rule.hf not in weights:
            continue
        value = weights.get(rule.hf)
        if not _finite(value):
            n_nan, n_inf = int(torch.isnan(value).sum()), int(torch.isinf(value).sum())
            nonfinite.append(f"{rule.hf} ({n_nan} NaN, {n_inf} Inf)")
            continue
        present.append((rule, value))
        if not rule.derived:
            targets = [tensors[n] for n in rule.ours]
            for target, part in zip(targets, rule.from_checkpoint(value, [t.shape for t in targets])):
                wanted = dtype if dtype is not None and part.is_floating_point() else part.dtype
                staged[id(target)] = part.to(device=device or part.device, dtype=wanted).contiguous()
    # A derived tensor is compared with what the model will hold once loaded.
    for rule, value in present:
        if rule.derived:
            ours = rule.to_checkpoint([staged.get(id(tensors[n]), tensors[n].detach()) for n in rule.ours])
            if (ours.dtype == value.dtype and torch.equal(ours, value)) or not value.numel():
                continue  # the common case, checked without a temporary copy
            difference = (ours.float() - value.float()).abs().max().item()
            if difference > DERIVED_ATOL:
                inconsistent.append(f"{rule.hf} differs from {', '.join(rule.ours)} by up to {difference:.3g}")
    _raise_problems(weights.source, model_type, [
        ("tensors with NaN or Inf", nonfinite),
        ("tensors that should be copies of others", inconsistent),
    ])
    _assign(model, staged)


def _assign(model: nn.Module, values: dict[int, torch.Tensor]) -> None:
    """Put each new value in place of the tensor it replaces, under every name that tensor has."""
    replaced: dict[int, torch.Tensor] = {}
    for path, old in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        if id(old) not in values:
            continue
        owner_name, _, attribute = path.rpartition(".")
        owner = model.get_submodule(owner_name)
        if isinstance(old, nn.Parameter):
            if id(old) not in replaced:
                replaced[id(old)] = nn.Parameter(values[id(old)], requires_grad=old.requires_grad)
            owner._parameters[attribute] = replaced[id(old)]
        elif old.is_meta:
            owner._buffers[attribute] = values[id(old)]
        else:
            with torch.no_grad():
                old.copy_(values[id(old)])


def _finite(value: torch.Tensor) -> bool:
    """Whether every element is finite. A sum is finite only if every term is (inf + x = inf,
    inf - inf = NaN, NaN + x = NaN): one vectorised pass with no temporary; only a sum that
    overflowed, or a real NaN/Inf, is looked at element by element."""
    if not value.is_floating_point() or not value.numel():
        return True
    return bool(torch.isfinite(value.sum())) or bool(torch.isfinite(value).all())


def _expected_shape(rule: Rule, targets: list[torch.Tensor]) -> tuple[int, ...]:
    """The shape `rule.to_checkpoint` gives tensors of the targets' shapes, from the shapes alone:
    joined along dim 0 (head by head too: the same total), transposed, viewed. (Joining meta
    tensors instead imports torch's compiler, a second on a process's first load.)"""
    shapes = [tuple(t.shape) for t in targets]
    shape = (sum(s[0] for s in shapes), *shapes[0][1:])
    if rule.transpose and len(shape) == 2:
        shape = shape[::-1]
    if rule.view is not None:
        known = math.prod(n for n in rule.view if n != -1)
        shape = tuple(math.prod(shape) // known if n == -1 else n for n in rule.view)
    return shape


def _raise_problems(source: str, model_type: str, sections: list[tuple[str, list[str]]]) -> None:
    problems = [f"{title} ({len(items)}):\n    " + "\n    ".join(map(shorten, items[:PROBLEMS_SHOWN]))
                + (f"\n    ... and {len(items) - PROBLEMS_SHOWN} more" if len(items) > PROBLEMS_SHOWN else "")
                for title, items in sections if items]
    if problems:
        raise CheckpointError(f"{source} does not fit this {model_type} model:\n  " + "\n  ".join(problems))


def export(model: nn.Module, rules: list[Rule]) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors, by the same rules run backwards (derived ones are not written)."""
    tensors = _tensors(model)
    return {r.hf: r.to_checkpoint([tensors[n].detach() for n in r.ours]) for r in rules if not r.derived}
