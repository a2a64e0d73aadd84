"""What a request to the explorer may say and what its reply says: the settings checked, the numbers as JSON.

A setting outside its range is an ExploreError (a 4xx) naming the setting and its allowed values, before
any computation; numbers go back rounded to a few significant digits (the JSON stays small), and NaN and
infinities as null (browsers refuse them in JSON).
"""

from __future__ import annotations

import math


class ExploreError(ValueError):
    """A request the explorer refuses, with the reason and the allowed values (a 4xx)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def rounded(values, digits: int = 5):
    """A tensor as nested lists of floats with `digits` significant digits (JSON stays small);
    NaN and infinities as None."""
    flat = values.detach().double().flatten().tolist()
    out = [None if not math.isfinite(v) else float(f"{v:.{digits}g}") for v in flat]
    if values.dim() == 0:
        return out[0]
    for size in reversed(values.shape[1:]):
        out = [out[i:i + size] for i in range(0, len(out), size)]
    return out


def finite(value):
    """JSON's view of a value: NaN and infinities become null (browsers refuse NaN in JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def int_setting(settings: dict, name: str, default: int, low: int, high: int) -> int:
    value = settings.get(name, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ExploreError(f"'{name}' must be an integer in [{low}, {high}], got {str(value)[:40]!r}")
    return value


def float_setting(settings: dict, name: str, default: float | None, low: float, high: float) -> float | None:
    value = settings.get(name, default)
    if value is None:
        return default  # null means "not given", as int_setting reads it
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not low <= value <= high:
        raise ExploreError(f"'{name}' must be a number in [{low}, {high}], got {str(value)[:40]!r}")
    return float(value)
