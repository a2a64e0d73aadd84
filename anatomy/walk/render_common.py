"""What the three renderings share: numbers at 4 decimals, the grid of a matrix (cut to corners
when very large), the header and footer, and escaping of untrusted text for each medium.

Token strings come from the user and from checkpoints: they are text, never markup, never
terminal control sequences, never Markdown inside LaTeX.
"""

from __future__ import annotations

import math
import re

from ..terminal import printable
from .types import Matrix, WalkResult

LIMIT = 16  # up to this many rows (or columns) are shown in full
CORNER = 3  # otherwise this many from each end, with ⋯ / ⋮ between
COLUMN_GAP = "⋯"
ROW_GAP = "⋮"


def cut(n: int) -> list[int | None]:
    """Indices to show along an axis of length n; None marks the elided middle."""
    if n <= LIMIT:
        return list(range(n))
    return list(range(CORNER)) + [None] + list(range(n - CORNER, n))


def number(x: float) -> str:
    """4 decimals; scientific notation for very large or very small magnitudes; NaN named."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "−∞" if x < 0 else "∞"
    if x != 0 and (abs(x) >= 1e5 or abs(x) < 1e-4):
        return f"{x:.2e}"
    return f"{x:.4f}"


def cell(matrix: Matrix, value) -> str:
    if matrix.kind == "mask":
        return "✓" if bool(value) else "·"
    if matrix.kind == "int":
        return str(int(value))
    return number(float(value))


def grid(matrix: Matrix) -> tuple[list[int | None], list[int | None], list[str | None], list[str | None],
                                  list[list[str | None]]]:
    """(row indices, column indices, row labels, column labels, cells) after cutting; None = elided."""
    values = matrix.values if matrix.values.dim() == 2 else matrix.values[None, :]
    n_rows, n_cols = values.shape
    rows, cols = cut(n_rows), cut(n_cols)
    row_labels = [None if r is None else (matrix.rows[r] if matrix.rows else str(r)) for r in rows]
    col_labels = [None if c is None else (matrix.cols[c] if matrix.cols else str(c)) for c in cols]
    cells = [[None if (r is None or c is None) else cell(matrix, values[r, c]) for c in cols] for r in rows]
    return rows, cols, row_labels, col_labels, cells


def header(walk: WalkResult) -> tuple[str, str]:
    c = walk.config
    if walk.source is not None:
        return f"anatomy walk --example {walk.model_name}", f"The numbers of {walk.source}."
    parts = [
        f"{c.arch}", f"d_model {c.d_model}", f"{c.n_heads} heads (d_k {c.d_head})", f"d_ff {c.d_ff}",
        f"{c.n_layers} layers", f"{c.norm_position}-norm {c.norm}", f"{c.activation}",
        f"positions: {c.pos_encoding}", f"vocabulary {c.vocab_size}",
    ]
    sub = ", ".join(parts) + f". Narrated: layer {walk.layer}, head {walk.head}."
    if walk.task:
        sub += f" This model was trained to {walk.task}."
    return f"anatomy walk: {walk.model_name}", sub


def footer(walk: WalkResult) -> str:
    checks = walk.checks
    if walk.ok:
        worst = max((ch.max_diff for ch in checks), default=0.0)
        return (f"All {len(checks)} checks passed: every recomputation matches "
                + ("the source's printed numbers" if walk.source else "the model's own tensors")
                + f" (largest |diff| = {worst:.1e}).")
    bad = ", ".join(f"step {s.number} ({s.title})" for s in walk.failures)
    failed = sum(not check.ok for check in checks)
    return f"{failed} of {len(checks)} checks FAILED: {bad}."


# Escaping -----------------------------------------------------------------------------------------

_LATEX_SPECIAL = {
    "\\": r"\textbackslash{}", "{": r"\{", "}": r"\}", "$": r"\$", "&": r"\&", "#": r"\#",
    "^": r"\^{}", "_": r"\_", "%": r"\%", "~": r"\~{}",
    # Markdown syntax, broken up so that no renderer sees a link, an image, code, emphasis or an
    # autolink inside the formula: `![b](https://x)` stays text.
    "[": "{[}", "]": "{]}", "(": "{(}", ")": "{)}", "!": "{!}", ":": "{:}", "*": "{*}", "`": "ˋ",
    "|": r"\vert{}",
}
_LATEX_MATH = {"<": r"{\lt}", ">": r"{\gt}"}  # outside \text: understood by MathJax, KaTeX and latex2mathml


def latex_text(s: str) -> str:
    """A token as LaTeX: its characters inside \\text{}, every special one escaped."""
    parts, run = [], ""
    for ch in printable(s):
        if ch in _LATEX_MATH:
            if run:
                parts.append(r"\text{" + run + "}")
            parts.append(_LATEX_MATH[ch])
            run = ""
        else:
            run += _LATEX_SPECIAL.get(ch, ch)
    if run or not parts:
        parts.append(r"\text{" + run + "}")
    return "".join(parts)


_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#!|~<>:])")


def md_escape(s: str) -> str:
    """Prose for Markdown: every character with a Markdown meaning backslash-escaped, no raw HTML."""
    return _MD_SPECIAL.sub(r"\\\1", printable(s)).replace("&", "&amp;")
