"""The walkthrough in a terminal (rich): every number visible at any width of 80 columns or more.

A matrix wider than the terminal wraps into blocks of columns, as numpy and pandas print them;
no cell is cut and row labels keep their full width. The row a step works through by hand is
highlighted. Every string is made printable first: a token is text, never a control sequence.
"""

from __future__ import annotations

import io
import textwrap

from rich.console import Console
from rich.text import Text

from .render_common import COLUMN_GAP, ROW_GAP, footer, grid, header, printable
from .types import Matrix, Step, WalkResult

GAP = 2  # spaces between columns
INDENT = 2


def column_blocks(widths: list[int], available: int) -> list[list[int]]:
    """Columns (by their widths) cut into as few blocks as fit in `available` columns each, as even
    as they can be: never a last block of one column left over (SmolLM2's 49152 logits once printed
    columns 0–49150, then 49151 alone)."""
    def greedy(limit: int) -> list[list[int]]:
        blocks, current, used = [], [], 0
        for j, w in enumerate(widths):
            if current and used + w > limit:
                blocks.append(current)
                current, used = [], 0
            current.append(j)
            used += w
        return blocks + [current]

    fewest = greedy(available)
    # the narrowest limit that still needs no more blocks spreads the columns evenly
    limit = max(max(widths), -(-sum(widths) // len(fewest)))
    while len(greedy(limit)) > len(fewest):
        limit += 1
    return greedy(limit)


def matrix_blocks(matrix: Matrix, width: int) -> list[Text]:
    """The matrix as lines of text, wrapped into column blocks that fit in `width` columns."""
    rows, cols, row_labels, col_labels, cells = grid(matrix)
    labels = [ROW_GAP if label is None else printable(label) for label in row_labels]
    heads = [COLUMN_GAP if label is None else printable(label) for label in col_labels]
    label_width = max([len(label) for label in labels] + [0])
    widths = [max([len(heads[j])] + [len(COLUMN_GAP if row[j] is None else row[j]) for row in cells])
              for j in range(len(cols))]
    available = max(width - INDENT - label_width - GAP, 1)
    blocks = column_blocks([GAP + w for w in widths], available)
    lines = []
    for number, block in enumerate(blocks):
        if len(blocks) > 1:
            shown = [cols[j] for j in block if cols[j] is not None]  # None: the gap of a cut matrix
            first, last = (shown[0], shown[-1]) if shown else (None, None)
            span = "columns" if first is None else f"column {first}" if first == last else f"columns {first}–{last}"
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


def folded(text: str, width: int, first: str = "", rest: str = "", style: str | None = None) -> list[Text]:
    """`text` wrapped at spaces into lines of at most `width` columns: the first starting with
    `first`, the others indented by `rest`, so that a continued equation or check reads as one.
    A quoted space (' ') is never a break: it is code (the article's .split(' '))."""
    protected = printable(text).replace("' '", "'\u00a0'")
    lines = textwrap.wrap(protected, width, initial_indent=first, subsequent_indent=rest,
                          break_long_words=True, break_on_hyphens=False) or [first.rstrip()]
    return [Text(line.replace("\u00a0", " "), style=style) for line in lines]


def step_lines(step: Step, width: int) -> list[Text]:
    lines = [*folded(f"━━ Step {step.number} · {step.section} · {step.title}", width, style="bold"),
             *folded(step.text, width), Text(""),
             *folded(step.equation, width, " " * INDENT, " " * 2 * INDENT, style="bold cyan")]
    for matrix in step.matrices:
        lines.append(Text(""))
        lines.extend(folded(f"  {matrix.name}  ({matrix.shape_text})  {matrix.source}", width, rest="    ", style="bold"))
        lines.extend(matrix_blocks(matrix, width))
    if step.worked:
        lines.append(Text(""))
        lines.append(Text("  By hand:", style="bold"))
        for line in step.worked:
            mark = "✓" if line.check.ok else "✗ MISMATCH:"
            lines.extend(folded(line.text, width, f"  {mark} ", "    ", style="green" if line.check.ok else "bold red"))
            if not line.check.ok:
                lines.extend(folded(line.check.summary, width, "    ", "      ", style="bold red"))
    if step.check is not None:
        lines.extend(folded(step.check.summary, width, "  ", "    ", style="green" if step.check.ok else "bold red"))
    lines.append(Text(""))
    return lines


def render_terminal(walk: WalkResult, console: Console | None = None) -> None:
    """Print the walkthrough to a rich console (colour when the terminal has it)."""
    console = console or Console(highlight=False)
    width = console.width
    title, sub = header(walk)
    lines = [*folded(title, width, style="bold underline"), *folded(sub, width)]
    for note in walk.notes:
        lines.extend(folded(note, width, style="italic"))
    lines.append(Text(""))
    for step in walk.steps:
        step.build()
        lines.extend(step_lines(step, width))
    lines.extend(folded(footer(walk), width, style="bold green" if walk.ok else "bold red"))
    for line in lines:  # already folded to the width: rich adds no break and no padding of its own
        console.print(line, overflow="fold", no_wrap=True, highlight=False)


def render_text(walk: WalkResult, width: int = 80) -> str:
    """The terminal rendering as plain text (no colour codes), `width` columns wide."""
    buffer = io.StringIO()
    render_terminal(walk, Console(file=buffer, width=width, color_system=None, force_terminal=False,
                                  highlight=False, emoji=False))
    return buffer.getvalue()
