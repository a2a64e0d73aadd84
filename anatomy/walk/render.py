"""Three renderings of a Walkthrough: the terminal (rich), Markdown with LaTeX, one HTML file.

Small matrices are shown in full; a larger one is cut to its corners, the first and last
CORNER rows and columns, with ellipses between. Every token string is escaped for the medium it
goes to (rich markup, LaTeX, HTML): a token is text, never markup.
"""

from __future__ import annotations

import html
import io
import math

from rich import box
from rich.columns import Columns
from rich.console import Console, Group
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from .steps import Matrix, Step, Walkthrough

LIMIT = 8  # up to this many rows (or columns) are shown in full
CORNER = 3  # otherwise this many from each end
LABEL_WIDTH = 18


def _cut(n: int) -> list[int | None]:
    """Indices to show along an axis of length n; None marks the ellipsis."""
    if n <= LIMIT:
        return list(range(n))
    return list(range(CORNER)) + [None] + list(range(n - CORNER, n))


def _number(x: float) -> str:
    if math.isinf(x):
        return "−∞" if x < 0 else "∞"
    if x != 0 and (abs(x) >= 1e5 or abs(x) < 1e-4):
        return f"{x:.2e}"
    return f"{x:.4f}"


def _cell(matrix: Matrix, value) -> str:
    if matrix.kind == "mask":
        return "✓" if bool(value) else "·"
    if matrix.kind == "int":
        return str(int(value))
    return _number(float(value))


def _short(label: str, width: int = LABEL_WIDTH) -> str:
    return label if len(label) <= width else label[: width - 1] + "…"


def _grid(matrix: Matrix) -> tuple[list[str | None], list[str | None], list[list[str | None]]]:
    """(row labels, column labels, cells) after cutting; None marks an ellipsis."""
    values = matrix.values if matrix.values.dim() == 2 else matrix.values[None, :]
    n_rows, n_cols = values.shape
    rows, cols = _cut(n_rows), _cut(n_cols)
    row_labels = [None if r is None else (matrix.rows[r] if matrix.rows else str(r)) for r in rows]
    col_labels = [None if c is None else (matrix.cols[c] if matrix.cols else str(c)) for c in cols]
    cells = [[None if (r is None or c is None) else _cell(matrix, values[r, c]) for c in cols] for r in rows]
    return row_labels, col_labels, cells


def _header(walk: Walkthrough) -> tuple[str, str]:
    c = walk.config
    title = f"anatomy walk: {walk.model_name}"
    parts = [
        f"{c.arch}", f"d_model {c.d_model}", f"{c.n_heads} heads (d_k {c.d_head})", f"d_ff {c.d_ff}",
        f"{c.n_layers} layers", f"{c.norm_position}-norm {c.norm}", f"{c.activation}",
        f"positions: {c.pos_encoding}", f"vocabulary {c.vocab_size}",
    ]
    sub = ", ".join(parts) + f". Narrated: layer {walk.layer}, head {walk.head}."
    return title, sub


def _footer(walk: Walkthrough) -> str:
    checks = [s.check for s in walk.steps if s.check is not None]
    if walk.ok:
        worst = max((ch.max_diff for ch in checks), default=0.0)
        return (f"All {len(checks)} checks passed: every recomputation matches the model's own tensors "
                f"(largest |diff| = {worst:.1e}).")
    bad = ", ".join(f"step {s.number} ({s.title})" for s in walk.failures)
    return f"{len(walk.failures)} of {len(checks)} checks FAILED: {bad}."


# Terminal ----------------------------------------------------------------------------------------

def _rich_table(matrix: Matrix) -> Table:
    row_labels, col_labels, cells = _grid(matrix)
    caption = Text(f"{matrix.name}  {matrix.shape_text}", style="bold")
    table = Table(title=caption, box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1), title_justify="left",
                  caption=Text(matrix.source, style="dim"), caption_justify="left")
    table.add_column("", style="magenta", no_wrap=True)
    for label in col_labels:
        table.add_column(Text("…" if label is None else _short(label)), justify="right", no_wrap=True, style=None)
    for label, row in zip(row_labels, cells):
        if label is None:
            table.add_row(Text("⋮"), *[Text("⋮" if cell is None else "⋮") for cell in row])
            continue
        rendered = []
        for cell in row:
            if cell is None:
                rendered.append(Text("…", style="dim"))
            elif cell in ("−∞", "·"):
                rendered.append(Text(cell, style="dim"))
            else:
                rendered.append(Text(cell))
        table.add_row(Text(_short(label)), *rendered)
    return table


def _rich_step(step: Step):
    parts = [
        Rule(Text(f"Step {step.number} · {step.section} · {step.title}", style="bold"), align="left"),
        Text(step.text),
        Text(""),
        Text("  " + step.equation, style="bold cyan"),
    ]
    if step.matrices:
        shapes = ",  ".join(f"{m.name}: {m.shape_text}" for m in step.matrices)
        parts.append(Text("  shapes: " + shapes, style="dim"))
        parts.append(Columns([_rich_table(m) for m in step.matrices], padding=(0, 3)))
    if step.check is not None:
        parts.append(Text("  " + step.check.summary, style="green" if step.check.ok else "bold red"))
    parts.append(Text(""))
    return Group(*parts)


def render_terminal(walk: Walkthrough, console: Console | None = None) -> None:
    """Print the walkthrough to a rich console (colour when the terminal has it)."""
    console = console or Console()
    title, sub = _header(walk)
    console.print(Text(title, style="bold underline"))
    console.print(Text(sub))
    console.print()
    for step in walk.steps:
        console.print(_rich_step(step))
    console.print(Text(_footer(walk), style="bold green" if walk.ok else "bold red"))


def render_text(walk: Walkthrough, width: int = 110) -> str:
    """The terminal rendering as plain text (no colour codes): for files and tests."""
    buffer = io.StringIO()
    render_terminal(walk, Console(file=buffer, width=width, color_system=None, force_terminal=False,
                                  highlight=False, emoji=False))
    return buffer.getvalue()


# Markdown -----------------------------------------------------------------------------------------

_LATEX_SPECIAL = {
    "\\": r"\textbackslash{}", "{": r"\{", "}": r"\}", "$": r"\$", "&": r"\&", "#": r"\#",
    "^": r"\^{}", "_": r"\_", "%": r"\%", "~": r"\~{}",
}
_LATEX_MATH = {"<": r"{\lt}", ">": r"{\gt}"}  # outside \text: understood by MathJax and KaTeX alike


def latex_text(s: str) -> str:
    """A token as LaTeX: its characters inside \text{}, every special one escaped."""
    parts, run = [], ""
    for ch in s:
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


def _md_escape(s: str) -> str:
    """Prose for Markdown: no raw HTML, no accidental emphasis."""
    s = html.escape(s, quote=False)
    for ch in "*_`[]":
        s = s.replace(ch, "\\" + ch)
    return s


def _latex_cell(matrix: Matrix, cell: str) -> str:
    if matrix.kind == "mask":
        return "1" if cell == "✓" else "0"
    if cell == "−∞":
        return r"-\infty"
    if "e" in cell:
        mantissa, exponent = cell.split("e")
        return f"{mantissa} \\times 10^{{{int(exponent)}}}"
    return cell


def _bmatrix(matrix: Matrix) -> str:
    row_labels, col_labels, cells = _grid(matrix)
    lines = []
    for label, row in zip(row_labels, cells):
        if label is None:
            lines.append(" & ".join(r"\ddots" if c is None else r"\vdots" for c in col_labels))
        else:
            lines.append(" & ".join(r"\cdots" if cell is None else _latex_cell(matrix, cell) for cell in row))
    body = " \\\\\n".join(lines)
    labels = ""
    if matrix.rows:
        labels = (r"\begin{matrix} " + r" \\ ".join(r"\vdots" if r is None else latex_text(r) for r in row_labels)
                  + r" \end{matrix}" + "\n")
    dims = " \\times ".join(str(n) for n in matrix.shape)
    return (f"{matrix.latex} =\n{labels}\\begin{{bmatrix}}\n{body}\n\\end{{bmatrix}}"
            f" \\in \\mathbb{{R}}^{{{dims}}}")


def render_markdown(walk: Walkthrough) -> str:
    """Markdown with $$…$$ LaTeX blocks (bmatrix for matrices), one section per step."""
    title, sub = _header(walk)
    out = [f"# {_md_escape(title)}", "", _md_escape(sub), ""]
    for step in walk.steps:
        out += [f"## {step.number}. {_md_escape(step.title)}", "", f"*{_md_escape(step.section)}*", "",
                _md_escape(step.text), "", "$$", step.latex, "$$", ""]
        for matrix in step.matrices:
            note = f"`{matrix.source}`"
            if matrix.cols and matrix.values.dim() == 2 and matrix.name != "ids":
                _, col_labels, _ = _grid(matrix)
                shown = ", ".join("…" if c is None else c for c in col_labels)
                note += f"; columns: {_md_escape(shown)}"
            if matrix.name == "ids":
                out += ["| token | " + " | ".join(_md_escape(t).replace("|", "\\|") for t in matrix.cols) + " |",
                        "|---" * (len(matrix.cols) + 1) + "|",
                        "| id | " + " | ".join(str(int(i)) for i in matrix.values[0]) + " |", ""]
                continue
            out += ["$$", _bmatrix(matrix), "$$", "", f"<sub>{_md_escape(matrix.name)}: {note}</sub>", ""]
        if step.check is not None:
            out += [f"> {_md_escape(step.check.summary)}", ""]
    out += ["---", "", _md_escape(_footer(walk)), ""]
    return "\n".join(out)


# HTML ---------------------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; max-width: 72rem; margin: 2rem auto;
       padding: 0 1rem; color: #1d2330; line-height: 1.5; }
h1 { font-size: 1.6rem; margin-bottom: .2rem; }
section { border-top: 1px solid #d8dce6; padding: .6rem 0 1rem; }
h2 { font-size: 1.15rem; margin: .4rem 0; }
.section { color: #6b7385; font-size: .85rem; text-transform: uppercase; letter-spacing: .04em; }
.eq { font-family: 'STIX Two Math', 'Cambria Math', Georgia, serif; font-size: 1.1rem; background: #f3f5fa;
      padding: .5rem .8rem; border-left: 3px solid #4c6ef5; margin: .6rem 0; white-space: pre-wrap; }
.mats { display: flex; flex-wrap: wrap; gap: 1.4rem; align-items: flex-start; }
figure { margin: 0; }
figcaption { font-size: .85rem; color: #47506a; }
figcaption code { color: #6b7385; }
table.m { border-collapse: collapse; font-family: ui-monospace, 'SFMono-Regular', Menlo, monospace;
          font-size: .8rem; }
table.m th { font-weight: normal; color: #8a3ea8; padding: 1px 6px; text-align: right; white-space: nowrap; }
table.m td { padding: 1px 6px; text-align: right; border-left: 1px solid #eceef4; }
td.dim, th.dim { color: #a2a8b8; }
.ok { color: #1f7a3a; font-weight: 600; }
.bad { color: #b3261e; font-weight: 700; }
"""


def _html_table(matrix: Matrix) -> str:
    row_labels, col_labels, cells = _grid(matrix)
    e = html.escape
    head = "<tr><th></th>" + "".join(
        '<th class="dim">…</th>' if c is None else f"<th>{e(_short(c))}</th>" for c in col_labels) + "</tr>"
    body = []
    for label, row in zip(row_labels, cells):
        if label is None:
            body.append('<tr><th class="dim">⋮</th>' + "".join('<td class="dim">⋮</td>' for _ in row) + "</tr>")
            continue
        tds = "".join('<td class="dim">…</td>' if c is None else
                      (f'<td class="dim">{e(c)}</td>' if c in ("−∞", "·") else f"<td>{e(c)}</td>") for c in row)
        body.append(f"<tr><th>{e(_short(label))}</th>{tds}</tr>")
    caption = (f"<figcaption><b>{e(matrix.name)}</b> ({e(matrix.shape_text)}) "
               f"<code>{e(matrix.source)}</code></figcaption>")
    return f'<figure>{caption}<table class="m">{head}{"".join(body)}</table></figure>'


def render_html(walk: Walkthrough) -> str:
    """One self-contained HTML page: inline CSS, no script, nothing fetched from anywhere."""
    e = html.escape
    title, sub = _header(walk)
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{e(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{e(title)}</h1><p>{e(sub)}</p>",
    ]
    for step in walk.steps:
        parts.append(f'<section id="step-{step.number}"><div class="section">{e(step.section)}</div>'
                     f"<h2>{step.number}. {e(step.title)}</h2><p>{e(step.text)}</p>"
                     f'<div class="eq">{e(step.equation)}</div>')
        if step.matrices:
            parts.append('<div class="mats">' + "".join(_html_table(m) for m in step.matrices) + "</div>")
        if step.check is not None:
            css = "ok" if step.check.ok else "bad"
            parts.append(f'<p class="{css}">{e(step.check.summary)}</p>')
        parts.append("</section>")
    parts.append(f'<p class="{"ok" if walk.ok else "bad"}">{e(_footer(walk))}</p></body></html>')
    return "\n".join(parts)
