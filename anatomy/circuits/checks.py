"""The circuits floor's Python arguments, checked before any work: each refusal one ValueError naming the
argument, what it was (cut short) and what it may be.

    count("batch_size", 512)                          a positive integer (not a bool, not 5.0), within bounds
    number("logit_probability", 0.95, low=0, high=1)  a finite real number (not a bool, not NaN), within bounds
    token_ids([1, 5, 7])                              a prompt given as ids: integers, one sequence
    model_and_transcoders(model, transcoders)         a model with a config, a TranscoderSet
    choice("attention_products", "bfloat16", ATTENTION_PRODUCTS)   one of the allowed names

A loop that runs `count` times or a step of `count` items is only ever given a count that ends it: a step
of 0 or -1 is refused here, not found to hang later. This module imports torch only where a check needs it,
so that the command line's argument types use it before torch loads.
"""

from __future__ import annotations

import math
import numbers

from ..terminal import one_line

__all__ = ["ATTENTION_PRODUCTS", "MAX_CHANGE", "choice", "count", "function", "model_and_transcoders", "number",
           "products_note", "token_ids"]

MAX_IDS = 1_000_000  # a prompt's ids, beyond any context
MAX_CHANGE = 1e6  # a feature's value set or added (interventions): real activations are at most hundreds, and past
# this float32 arithmetic overflows into inf and NaN
ATTENTION_PRODUCTS = ("float32", "bfloat16")  # the dtypes a graph's rows may cross attention in (frozen.FrozenSublayer)


def products_note(products: str) -> str:
    """What a graph's check line adds when its rows crossed attention in a dtype other than float32: its identity
    holds to that dtype's rounding."""
    return "" if products == "float32" else f" (rows crossed attention in {products})"


def _shown(value) -> str:
    return one_line(repr(value), 80)


def count(name: str, value, *, minimum: int = 1, maximum: int | None = None, none: bool = False) -> int | None:
    """`value` if it is an integer in [minimum, maximum] (None too, if `none`); else ValueError."""
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum or \
            (maximum is not None and value > maximum):
        allowed = f"an integer from {minimum}" + (f" to {maximum:,}" if maximum is not None else "") + \
                  (", or None" if none else "")
        raise ValueError(f"{name} must be {allowed}; got {_shown(value)}")
    return int(value)


def number(name: str, value, *, low: float | None = None, high: float | None = None, open_low: bool = False,
           none: bool = False) -> float | None:
    """`value` as a float if it is a finite real number in [low, high] ((low, high] if open_low; None too, if
    `none`); else ValueError."""
    if value is None and none:
        return None
    ok = not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if open_low else value >= low
    if ok and high is not None:
        ok = value <= high
    if not ok:
        bounds = "" if low is None and high is None else \
            f" in {'(' if open_low else '['}{low if low is not None else '-inf'}, {high if high is not None else 'inf'}]"
        raise ValueError(f"{name} must be a finite number{bounds}{' or None' if none else ''}; got {_shown(value)}")
    return float(value)


def choice(name: str, value, allowed: tuple[str, ...]) -> str:
    """`value` if it is one of the strings `allowed`; else ValueError naming them."""
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {_shown(value)}")
    return value


def function(name: str, value) -> None:
    """ValueError unless `value` is None or callable."""
    if value is not None and not callable(value):
        raise ValueError(f"{name} must be a function or None; got {_shown(value)}")


def token_ids(prompt) -> list[int]:
    """The ids of a prompt given as ids: a 1-D integer tensor (or [1, T]), or a list or tuple of integers.
    ValueError for bytes (read as text? as ids?), floats (truncated?), bools, nesting or anything else."""
    import torch

    if torch.is_tensor(prompt):
        if prompt.dtype.is_floating_point or prompt.dtype.is_complex or prompt.dtype == torch.bool:
            raise ValueError(f"a prompt of ids must hold integers; got a tensor of {prompt.dtype}")
        if prompt.dim() == 2 and prompt.size(0) == 1:
            prompt = prompt[0]
        if prompt.dim() != 1:
            raise ValueError(f"a prompt of ids is one sequence, [T] or [1, T]; got a tensor of shape {tuple(prompt.shape)}")
        return prompt.tolist()
    if not isinstance(prompt, (list, tuple)):
        raise ValueError(f"the prompt must be a text (str) or token ids (a list of integers or an integer tensor); "
                         f"got {type(prompt).__name__}")
    if len(prompt) > MAX_IDS:
        raise ValueError(f"the prompt has {len(prompt):,} ids; no model reads more than {MAX_IDS:,}")
    bad = next((i for i, x in enumerate(prompt) if isinstance(x, bool) or not isinstance(x, numbers.Integral)), None)
    if bad is not None:
        raise ValueError(f"a prompt of ids must hold integers; item {bad} is {_shown(prompt[bad])}")
    return [int(x) for x in prompt]


def model_and_transcoders(model, transcoders) -> None:
    """ValueError unless `model` is an anatomy model (a Module with a config) and `transcoders` a TranscoderSet."""
    from torch import nn

    from ..sae.transcoders import TranscoderSet

    if not isinstance(model, nn.Module) or getattr(model, "config", None) is None:
        raise ValueError(f"model must be an anatomy model (anatomy.from_pretrained); got {type(model).__name__}")
    if not isinstance(transcoders, TranscoderSet):
        raise ValueError(f"transcoders must be a TranscoderSet (anatomy.load_transcoders); got {type(transcoders).__name__}")
