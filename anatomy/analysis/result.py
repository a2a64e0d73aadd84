"""What every analysis returns: numbers with named axes, their labels, and the identity it checked.

Each analysis proves itself on the inputs it was given, the way `anatomy walk` does: `check`
says which identity holds and `error` is the measured difference, e.g.
"the components sum to the final residual: max |diff| 3.0e-07".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch


# axis -> (its name for one, for several)
AXIS_WORDS = {"layer": ("layer", "layers"), "batch": ("sequence", "sequences"), "pos": ("position", "positions"),
              "vocab": ("vocabulary entry", "vocabulary entries"), "component": ("component", "components"),
              "head": ("head", "heads"), "query": ("query", "queries"), "key": ("key", "keys"),
              "d_model": ("dimension", "dimensions"), "feature": ("feature", "features"), "rank": ("rank", "ranks")}


@dataclass
class Result:
    """values [axes...]; labels[axis] names each index of an axis (tokens, layers, components). A result is
    data on the CPU wherever the model ran: its values and the tensors of extra are moved there."""

    kind: str  # "logit lens", "decomposition", "activation patching", ...
    values: torch.Tensor
    axes: tuple[str, ...]
    labels: dict[str, list[str]] = field(default_factory=dict)
    check: str = ""  # the identity this result satisfies, with the measured difference
    error: float = float("nan")  # that difference (nan: the analysis has no identity to check)
    tokens: list[list[str]] = field(default_factory=list)  # [batch][pos] string tokens
    extra: dict = field(default_factory=dict)  # anything else an analysis reports (e.g. top tokens)
    about: str = ""  # what was analysed, in words, for titles (the command line: the model and the text)

    def __post_init__(self) -> None:
        if self.values.dim() != len(self.axes):
            raise ValueError(f"{self.kind}: values have {self.values.dim()} axes but {len(self.axes)} names {self.axes}")
        self.values = self.values.cpu()
        self.extra = {key: value.cpu() if torch.is_tensor(value) else value for key, value in self.extra.items()}

    @property
    def shape_text(self) -> str:
        """The axes in words: "31 layers × 1 sequence × 5 positions × 49152 tokens of vocabulary"."""
        return " × ".join(f"{size} {AXIS_WORDS.get(axis, (axis, axis))[size != 1]}"
                          for axis, size in zip(self.axes, self.values.shape))

    def __repr__(self) -> str:
        shape = ", ".join(f"{name}={size}" for name, size in zip(self.axes, self.values.shape))
        return f"<{self.kind} [{shape}]: {self.check}>"

    def view(self, **options):
        """The offline HTML view (a viz View: shown in Jupyter, `.save("x.html")`)."""
        from .views import html_view  # matplotlib and the page assets load only when asked

        return html_view(self, **options)

    def save(self, path: str | Path, **options) -> Path:
        """Write the view: .html (interactive, offline) or .png / .svg (matplotlib)."""
        from .views import save

        return save(self, path, **options)


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| in float64 (nan if either holds a NaN, so that a NaN never reads as agreement)."""
    return (a.double() - b.double()).abs().max().item()
