"""The state the step builders share: the model, its trace, the steps so far, and small helpers.

Each section's builder (input_steps, attention_steps, block_steps, output_steps) is a function
of a Builder: it reads traced tensors, recomputes them with the reference math, and appends Steps.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .reference import compare, f64
from .types import Check, Matrix, Step, Worked

# Up to this many vocabulary entries, one-hot columns and embedding rows are all shown; above it,
# only those of the tokens in the sentence (the rest of a one-hot row is zeros anyway).
FULL_VOCAB = 16
# Weight matrices are shown when the model is this narrow (the toys); wider ones are named only.
SMALL_MODEL = 16


def fmt(x: float) -> str:
    """A number as the walk prints it: 4 decimals."""
    return f"{x:.4f}"


def vec(values: torch.Tensor, keep: int = 3, limit: int = 8) -> str:
    """A vector as text, cut to its ends when long: [0.1, 0.2, ⋯, 0.9]."""
    if len(values) > limit:  # only the ends become Python floats (a row of logits has 49,152)
        ends = [float(v) for v in values[:keep]], [float(v) for v in values[len(values) - keep:]]
        return "[" + ", ".join(map(fmt, ends[0])) + ", ⋯, " + ", ".join(map(fmt, ends[1])) + "]"
    return "[" + ", ".join(fmt(float(v)) for v in values) + "]"


def signed(x: float) -> str:
    """A term of a sum: '+ 0.1234' or '− 0.1234'."""
    return f"− {fmt(-x)}" if x < 0 else f"+ {fmt(x)}"


def sum_text(values, limit: int = 8) -> str:
    """x_0 + x_1 − x_2 …, written out (cut when long): '0.1000 + 0.2000 − 0.3000 ⋯'."""
    items = [float(v) for v in values]
    text = fmt(items[0]) + "".join(" " + signed(v) for v in items[1:limit])
    return text + (" ⋯" if len(items) > limit else "")


def products(a: torch.Tensor, b: torch.Tensor, limit: int = 8) -> str:
    """Σ a_d b_d written out: '0.1000×0.2000 + 0.3000×(−0.4000) …' (cut to its ends when long)."""
    factor = lambda v: f"({fmt(float(v))})" if float(v) < 0 else fmt(float(v))  # noqa: E731
    term = lambda d: f"{factor(a[d])}×{factor(b[d])}"  # noqa: E731
    n = min(len(a), len(b))
    if n > limit:  # only the terms shown are formatted (a feed-forward row has thousands)
        return " + ".join([term(d) for d in range(3)] + [f"⋯ ({n - 6} more)"] + [term(d) for d in range(n - 3, n)])
    return " + ".join(term(d) for d in range(n))


class Builder:
    """Reads the trace, recomputes, and appends steps; one per walkthrough."""

    def __init__(self, model: nn.Module, t, label: Callable[[int], str], head: int, focus: int | None = None,
                 vocabulary: list[str] | None = None):
        self.model = model
        self.config = model.config
        self.t = t
        self.label = label
        self.head = head
        self.focus = focus  # the row worked through by hand (None: each section picks its own)
        self.steps: list[Step] = []
        self.param_names = {id(param): name for name, param in model.named_parameters()}
        self._vocabulary: list[str] = list(vocabulary or [])  # every id's label, when the caller has them

    def vocabulary(self, size: int) -> list[str]:
        """The labels of ids 0 … size − 1 (the one-hot columns, the logits' columns), made once."""
        if len(self._vocabulary) < size:
            self._vocabulary += [self.label(i) for i in range(len(self._vocabulary), size)]
        return self._vocabulary[:size]

    @property
    def small(self) -> bool:
        return self.config.d_model <= SMALL_MODEL

    def row(self, n: int) -> int:
        """The highlighted row of an n-row matrix: the builder's focus, kept inside the matrix."""
        return min(self.focus if self.focus is not None else 4, n - 1)

    def param(self, name: str, latex: str, param: torch.Tensor, rows: slice | list[int] | None = None,
              transpose: bool = True, labels=None, note: str = "") -> Matrix:
        """A weight as the equations use it: W (in × out), i.e. the module's weight transposed."""
        values = param.detach()
        where = self.param_names.get(id(param), "parameter")
        if isinstance(rows, slice):
            values = values[rows]
            where += f"[{rows.start}:{rows.stop}]"
        elif rows is not None:
            values = values[rows]
            where += note
        values = f64(values)  # the rows shown, not all 49,152 of an embedding
        if transpose and values.dim() == 2:
            values, where = values.T, where + "ᵀ"
        if values.dim() == 1:
            values = values[None, :]
        return Matrix(name, latex, values, rows=labels, note="parameter " + where)

    def get(self, point: str, *index) -> torch.Tensor:
        return f64(self.t[point][index] if index else self.t[point])

    def matrix(self, name: str, latex: str, point: str, index: tuple, rows=None, cols=None, **extra) -> Matrix:
        return Matrix(name, latex, self.get(point, *index), rows=rows, cols=cols, point=point, index=index, **extra)

    def check(self, recomputed: str, against: str, mine: torch.Tensor, theirs: torch.Tensor) -> Check:
        return compare(recomputed, against, mine, theirs)

    def worked(self, text: str, latex: str, mine: torch.Tensor | float, theirs: torch.Tensor | float,
               against: str) -> Worked:
        """A line of arithmetic by hand whose result `mine` is checked against the model's `theirs`."""
        mine = torch.as_tensor(mine, dtype=torch.float64)
        theirs = torch.as_tensor(theirs, dtype=torch.float64)
        return Worked(text, latex, compare("this line", against, mine, theirs))

    def add_later(self, section: str, title: str, text: str, equation: str, latex: str,
                  build: Callable[[], tuple[list[Matrix], Check | None, list[Worked]]]) -> Step:
        """A step whose numbers are computed when it is first read (Step.build): those that cost as much
        as a pass, such as the float64 logits over the whole vocabulary."""
        step = self.add(section, title, text, equation, latex)
        step.pending = build
        return step

    def add(self, section: str, title: str, text: str, equation: str, latex: str,
            matrices: list[Matrix] | None = None, check: Check | None = None,
            worked: list[Worked] | None = None) -> Step:
        step = Step(section, title, text, equation, latex, matrices or [], check, len(self.steps) + 1,
                    worked or [])
        self.steps.append(step)
        return step
