"""What a walkthrough is made of: matrices, checks, worked lines, steps, the whole walk.

Plain data: no computation and no rendering, so that the step builders and the renderers both
import this module and neither imports the other.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass
class Matrix:
    """One matrix (or vector) a step shows, in full; renderers cut very large ones to corners.

    `point` and `index` say where it was read: `trace[point][index]` equals `values`. Matrices
    computed by the walkthrough from traced tensors (QK^T, the mask) have `point` None.
    kind: "values" (numbers), "mask" (True = may attend), "int" (ids, one-hot).
    highlight: the row the step works through by hand. operands(i, j): in words, the numbers that
    produced cell (i, j) (the HTML page shows it when the cell is hovered).
    """

    name: str
    latex: str
    values: torch.Tensor  # [rows, cols] or [n], float64 (bool for a mask)
    rows: list[str] | None = None
    cols: list[str] | None = None
    point: str | None = None
    index: tuple = ()
    kind: str = "values"
    note: str | None = None  # where it comes from, when not a trace point (a parameter, the input)
    highlight: int | None = None
    operands: Callable[[int, int], str] | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.values.shape)

    @property
    def shape_text(self) -> str:
        return "×".join(str(n) for n in self.shape)

    @property
    def source(self) -> str:
        """Where the numbers come from, e.g. `blocks.0.attn.q[0, 0]`, or 'computed'."""
        if self.point is None:
            return self.note or "computed from traced tensors"
        index = ", ".join(":" if isinstance(i, slice) else str(i) for i in self.index)
        return f"{self.point}[{index}]" if index else self.point


def _amount(x: float) -> str:
    """A difference in words: NaN and infinities named, never printed as 'nan'."""
    if math.isnan(x):
        return "NaN (not a number: some value is undefined)"
    if math.isinf(x):
        return "infinite"
    return f"{x:.3g}"


@dataclass
class Check:
    """A recomputation compared with the model's own tensor (or a source's printed numbers)."""

    recomputed: str  # what the walkthrough computed, in words
    against: str  # what it was compared with
    max_diff: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.max_diff <= self.tolerance  # False for NaN

    @property
    def summary(self) -> str:
        if self.ok:
            return f"✓ recomputed as {self.recomputed}: matches {self.against} (max |diff| = {self.max_diff:.1e})"
        return (f"✗ MISMATCH: recomputed as {self.recomputed}, differs from {self.against} "
                f"(max |diff| = {_amount(self.max_diff)} > tolerance {self.tolerance:.1e})")


@dataclass
class Worked:
    """One line of arithmetic done by hand, e.g. a dot product as the sum of its products, with
    the check of its result against the model's number."""

    text: str  # plain Unicode
    latex: str
    check: Check


@dataclass
class Step:
    """One step of the pass: what it computes (equation), with which numbers, and its checks."""

    section: str  # e.g. "Input", "Layer 0", "Decoder layer 0", "Output"
    title: str
    text: str  # the narration, plain text
    equation: str  # plain Unicode, for the terminal
    latex: str  # the same, for markdown and MathML
    matrices: list[Matrix] = field(default_factory=list)
    check: Check | None = None
    number: int = 0
    worked: list[Worked] = field(default_factory=list)
    # () -> (matrices, check, worked): what a step costly to recompute left until it is read (built)
    pending: Callable[[], tuple] | None = field(default=None, repr=False, compare=False)

    @property
    def built(self) -> bool:
        """Whether the step's matrices, check and worked lines are computed (else build() computes them)."""
        return self.pending is None

    def build(self) -> "Step":
        """Compute the matrices, check and worked lines a step left for later (Builder.add_later)."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            self.matrices, self.check, self.worked = pending()
        return self

    @property
    def checks(self) -> list[Check]:
        self.build()
        return ([self.check] if self.check is not None else []) + [w.check for w in self.worked]

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)


@dataclass
class WalkResult:
    """The narrated pass: `steps` in order, the `trace` they were read from, and the settings.

    `task`: what the model learned, in words, when it is one of the toys; `source`: the text a
    worked example comes from (title and author), when it is one.
    """

    steps: list[Step]
    trace: object
    config: object
    layer: int
    head: int
    tokens: list[str]
    target_tokens: list[str] | None = None
    model_name: str = "model"
    task: str | None = None
    source: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether every step's recomputation matched."""
        return all(step.ok for step in self.steps)

    @property
    def failures(self) -> list[Step]:
        return [step for step in self.steps if not step.ok]

    @property
    def titles(self) -> list[str]:
        return [step.title for step in self.steps]

    @property
    def checks(self) -> list[Check]:
        return [check for step in self.steps for check in step.checks]
