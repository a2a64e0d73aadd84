"""The walkthrough as Markdown with $$…$$ LaTeX blocks (bmatrix for matrices), one section per step.

Prose is Markdown-escaped; tokens inside formulas go through latex_text, which also breaks up
Markdown syntax, so no token becomes a link, an image or raw HTML.
"""

from __future__ import annotations

from .render_common import COLUMN_GAP, footer, grid, header, latex_text, md_escape
from .types import Matrix, WalkResult


def _latex_cell(matrix: Matrix, value: str) -> str:
    if matrix.kind == "mask":
        return "1" if value == "✓" else "0"
    if value == "−∞":
        return r"-\infty"
    if value == "NaN":
        return r"\text{NaN}"
    if "e" in value:
        mantissa, exponent = value.split("e")
        return f"{mantissa} \\times 10^{{{int(exponent)}}}"
    return value


def bmatrix(matrix: Matrix) -> str:
    rows, _, row_labels, col_labels, cells = grid(matrix)
    lines = []
    for label, row in zip(row_labels, cells):
        if label is None:
            lines.append(" & ".join(r"\ddots" if c is None else r"\vdots" for c in col_labels))
        else:
            lines.append(" & ".join(r"\cdots" if value is None else _latex_cell(matrix, value) for value in row))
    body = " \\\\\n".join(lines)
    labels = ""
    if matrix.rows:
        labels = (r"\begin{matrix} " + r" \\ ".join(r"\vdots" if r is None else latex_text(r) for r in row_labels)
                  + r" \end{matrix}" + "\n")
    dims = " \\times ".join(str(n) for n in matrix.shape)
    return (f"{matrix.latex} =\n{labels}\\begin{{bmatrix}}\n{body}\n\\end{{bmatrix}}"
            f" \\in \\mathbb{{R}}^{{{dims}}}")


def render_markdown(walk: WalkResult) -> str:
    """Markdown with $$…$$ LaTeX blocks, one section per step."""
    title, sub = header(walk)
    out = [f"# {md_escape(title)}", "", md_escape(sub), ""]
    out += [f"> {md_escape(note)}\n" for note in walk.notes]
    for step in walk.steps:
        step.build()
        out += [f"## {step.number}. {md_escape(step.title)}", "", f"*{md_escape(step.section)}*", "",
                md_escape(step.text), "", "$$", step.latex, "$$", ""]
        for matrix in step.matrices:
            note = f"`{matrix.source}`"
            if matrix.cols and matrix.values.dim() == 2 and matrix.name != "ids":
                _, _, _, col_labels, _ = grid(matrix)
                note += "; columns: " + md_escape(", ".join(COLUMN_GAP if c is None else c for c in col_labels))
            if matrix.name == "ids":
                out += ["| token | " + " | ".join(md_escape(t) for t in matrix.cols) + " |",
                        "|---" * (len(matrix.cols) + 1) + "|",
                        "| id | " + " | ".join(str(int(i)) for i in matrix.values[0]) + " |", ""]
                continue
            out += ["$$", bmatrix(matrix), "$$", "", f"<sub>{md_escape(matrix.name)}: {note}</sub>", ""]
        if step.worked:
            out += ["By hand:", ""] + [f"- {'✓' if w.check.ok else '✗ MISMATCH:'} {md_escape(w.text)}" for w in step.worked] + [""]
        if step.check is not None:
            out += [f"> {md_escape(step.check.summary)}", ""]
    out += ["---", "", md_escape(footer(walk)), ""]
    return "\n".join(out)
