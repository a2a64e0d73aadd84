"""The walkthrough in a terminal (rich): every number visible at any width of 80 columns or more.

A matrix wider than the terminal wraps into blocks of columns, as numpy and pandas print them;
no cell is cut and row labels keep their full width. The row a step works through by hand is
highlighted. Every string is made printable first: a token is text, never a control sequence.
"""

from __future__ import annotations

import io

from rich.console import Console
from rich.text import Text

from .render_common import COLUMN_GAP, ROW_GAP, footer, grid, header, printable
from .types import Matrix, Step, WalkResult

GAP = 2  # spaces between columns
INDENT = 2


def matrix_blocks(matrix: Matrix, width: int) -> list[Text]:
    """The matrix as lines of text, wrapped into column blocks that fit in `width` columns."""
    rows, cols, row_labels, col_labels, cells = grid(matrix)
    labels = [ROW_GAP if label is None else printable(label) for label in row_labels]
    heads = [COLUMN_GAP if label is None else printable(label) for label in col_labels]
    label_width = max([len(label) for label in labels] + [0])
    widths = [max([len(heads[j])] + [len(COLUMN_GAP if row[j] is None else row[j]) for row in cells])
              for j in range(len(cols))]
    available = max(width - INDENT - label_width - GAP, 1)
    blocks, current, used = [], [], 0
    for j, w in enumerate(widths):
        if current and used + GAP + w > available:
            blocks.append(current)
            current, used = [], 0
        current.append(j)
        used += GAP + w
    blocks.append(current)
    lines = []
    for number, block in enumerate(blocks):
        if len(blocks) > 1:
            first, last = cols[block[0]], cols[block[-1]]
            span = ("column " + str(first) if first == last else f"columns {first}–{last}") if None not in (first, last) else "columns"
            lines.append(Text(" " * INDENT + f"({span})", style="dim"))
        line = " " * (INDENT + label_width)
        for j in block:
            line += " " * GAP + heads[j].rjust(widths[j])
        lines.append(Text(line, style="magenta"))
        for i, (label, row) in enumerate(zip(labels, cells)):
            line = Text(" " * INDENT + label.ljust(label_width), style="magenta")
            for j in block:
                value = COLUMN_GAP if row[j] is None else row[j]
                if label == ROW_GAP and row_labels[i] is None:
                    value = ROW_GAP
                style = "dim" if value in ("−∞", "·", COLUMN_GAP, ROW_GAP) else None
                line.append(" " * GAP + value.rjust(widths[j]), style=style)
            if matrix.highlight is not None and rows[i] == matrix.highlight:
                line.stylize("bold yellow")
            lines.append(line)
    return lines


def step_lines(step: Step, width: int) -> list[Text]:
    lines = [Text(printable(f"━━ Step {step.number} · {step.section} · {step.title}"), style="bold"),
             Text(printable(step.text)), Text(""),
             Text(" " * INDENT + printable(step.equation), style="bold cyan")]
    for matrix in step.matrices:
        lines.append(Text(""))
        lines.append(Text(printable(f"  {matrix.name}  ({matrix.shape_text})  {matrix.source}"), style="bold"))
        lines.extend(matrix_blocks(matrix, width))
    if step.worked:
        lines.append(Text(""))
        lines.append(Text("  By hand:", style="bold"))
        for line in step.worked:
            mark = "✓" if line.check.ok else "✗ MISMATCH:"
            lines.append(Text(printable(f"  {mark} {line.text}"), style="green" if line.check.ok else "bold red"))
            if not line.check.ok:
                lines.append(Text(printable("    " + line.check.summary), style="bold red"))
    if step.check is not None:
        lines.append(Text(printable("  " + step.check.summary), style="green" if step.check.ok else "bold red"))
    lines.append(Text(""))
    return lines


def render_terminal(walk: WalkResult, console: Console | None = None) -> None:
    """Print the walkthrough to a rich console (colour when the terminal has it)."""
    console = console or Console(highlight=False)
    width = console.width
    title, sub = header(walk)
    console.print(Text(printable(title), style="bold underline"))
    console.print(Text(printable(sub)))
    for note in walk.notes:
        console.print(Text(printable(note), style="italic"))
    console.print()
    for step in walk.steps:
        for line in step_lines(step, width):
            console.print(line, overflow="fold", highlight=False)
    console.print(Text(footer(walk), style="bold green" if walk.ok else "bold red"))


def render_text(walk: WalkResult, width: int = 80) -> str:
    """The terminal rendering as plain text (no colour codes), `width` columns wide."""
    buffer = io.StringIO()
    render_terminal(walk, Console(file=buffer, width=width, color_system=None, force_terminal=False,
                                  highlight=False, emoji=False))
    return buffer.getvalue()
