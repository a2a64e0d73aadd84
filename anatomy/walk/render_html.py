"""The walkthrough as one self-contained HTML page, an explorer:

- equations as MathML (latex2mathml; every current browser renders it, no JavaScript, no CDN);
- matrices shaded by value (blue positive, red negative), the worked row highlighted;
- a contents sidebar (<nav>) with a link per step;
- hovering a cell shows the operands that produced it (the cell's title).

The page is anatomy's one HTML page shell (anatomy.viz.page), without a script: its
Content-Security-Policy forbids scripts and every fetch. Every token is HTML-escaped; MathML is
made only from formulas the walk writes, never from token text.
"""

from __future__ import annotations

import html

from latex2mathml.converter import convert

from ..viz import page
from .render_common import COLUMN_GAP, ROW_GAP, footer, grid, header, printable
from .types import Matrix, Step, WalkResult

SHADES = 5  # levels of shading each side of zero

PAGE_CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 0; color: #1d2330; line-height: 1.5; }
nav { position: fixed; top: 0; left: 0; bottom: 0; width: 17rem; overflow-y: auto; padding: 1rem;
      background: #f6f7fb; border-right: 1px solid #d8dce6; font-size: .82rem; box-sizing: border-box; }
nav ol { padding-left: 1.4rem; margin: .4rem 0; }
nav a { color: #2d3a8c; text-decoration: none; }
nav a:hover { text-decoration: underline; }
main { margin-left: 18rem; max-width: 72rem; padding: 1rem 2rem 4rem; }
h1 { font-size: 1.6rem; margin-bottom: .2rem; }
"""
# How one step looks (`section`): the page's, and the live explorer's walk panel's.
STEP_CSS = """
section { border-top: 1px solid #d8dce6; padding: .6rem 0 1rem; scroll-margin-top: .5rem; }
h2 { font-size: 1.15rem; margin: .4rem 0; }
.section { color: #6b7385; font-size: .85rem; text-transform: uppercase; letter-spacing: .04em; }
.eq { font-size: 1.15rem; background: #f3f5fa; padding: .5rem .8rem; border-left: 3px solid #4c6ef5;
      margin: .6rem 0; overflow-x: auto; }
.mats { display: flex; flex-wrap: wrap; gap: 1.4rem; align-items: flex-start; }
figure { margin: 0; max-width: 100%; overflow-x: auto; }
figcaption { font-size: .85rem; color: #47506a; }
figcaption code { color: #6b7385; }
table.m { border-collapse: collapse; font-family: ui-monospace, 'SFMono-Regular', Menlo, monospace; font-size: .8rem; }
table.m th { font-weight: normal; color: #8a3ea8; padding: 1px 6px; text-align: right; white-space: nowrap; }
table.m td { padding: 1px 6px; text-align: right; border-left: 1px solid #eceef4; }
table.m tr.hl th, table.m tr.hl td { outline: 1px solid #f59f00; font-weight: 700; }
table.m td[title] { cursor: help; }
table.m td:hover { outline: 2px solid #1d2330; }
td.dim, th.dim { color: #a2a8b8; }
.p1 { background: #e7f0ff; } .p2 { background: #cfe0ff; } .p3 { background: #a9c8ff; } .p4 { background: #7eaaf7; }
.p5 { background: #4f86ea; color: #fff; }
.n1 { background: #ffeceb; } .n2 { background: #ffd6d3; } .n3 { background: #ffb3ad; } .n4 { background: #f98880; }
.n5 { background: #e4574c; color: #fff; }
.worked { margin: .5rem 0; padding-left: 1.2rem; }
.worked li { margin: .2rem 0; }
.ok { color: #1f7a3a; font-weight: 600; }
.bad { color: #b3261e; font-weight: 700; }
"""
CSS = PAGE_CSS + STEP_CSS


def mathml(latex: str, plain: str, display: str = "block") -> str:
    """A formula as MathML (display "block" or "inline"); the plain text where latex2mathml cannot
    parse it."""
    try:
        return convert(latex, display=display)
    except Exception:  # noqa: BLE001 - any parser failure falls back to the escaped plain form
        return f"<code>{html.escape(printable(plain))}</code>"


def _shade(matrix: Matrix, value: float, top: float) -> str:
    if matrix.kind != "values" or top == 0 or value != value or abs(value) == float("inf"):
        return ""
    level = min(SHADES, int(abs(value) / top * SHADES + 0.5))
    return "" if level == 0 else f"{'p' if value > 0 else 'n'}{level}"


def table(matrix: Matrix) -> str:
    rows, cols, row_labels, col_labels, cells = grid(matrix)
    e = lambda s: html.escape(printable(s))  # noqa: E731
    values = matrix.values if matrix.values.dim() == 2 else matrix.values[None, :]
    finite = values[values.isfinite()] if matrix.kind == "values" else values.new_zeros(0)
    top = float(finite.abs().max()) if finite.numel() else 0.0
    head = "<tr><th></th>" + "".join(
        f'<th class="dim">{COLUMN_GAP}</th>' if c is None else f"<th>{e(c)}</th>" for c in col_labels) + "</tr>"
    body = []
    for r, label, row in zip(rows, row_labels, cells):
        if label is None:
            body.append(f'<tr><th class="dim">{ROW_GAP}</th>' + "".join(f'<td class="dim">{ROW_GAP}</td>' for _ in row) + "</tr>")
            continue
        tds = []
        for c, value in zip(cols, row):
            if value is None:
                tds.append(f'<td class="dim">{COLUMN_GAP}</td>')
                continue
            classes = "dim" if value in ("−∞", "·") else _shade(matrix, float(values[r, c]), top)
            title = f' title="{e(matrix.operands(r, c))}"' if matrix.operands is not None else ""
            tds.append(f'<td class="{classes}"{title}>{e(value)}</td>' if classes else f"<td{title}>{e(value)}</td>")
        highlight = ' class="hl"' if matrix.highlight is not None and r == matrix.highlight else ""
        body.append(f"<tr{highlight}><th>{e(label)}</th>{''.join(tds)}</tr>")
    caption = f"<figcaption><b>{e(matrix.name)}</b> ({e(matrix.shape_text)}) <code>{e(matrix.source)}</code></figcaption>"
    return f'<figure>{caption}<table class="m">{head}{"".join(body)}</table></figure>'


def section(step: Step) -> str:
    e = lambda s: html.escape(printable(s))  # noqa: E731
    step.build()
    parts = [f'<section id="step-{step.number}"><div class="section">{e(step.section)}</div>'
             f"<h2>{step.number}. {e(step.title)}</h2><p>{e(step.text)}</p>"
             f'<div class="eq">{mathml(step.latex, step.equation)}</div>']
    if step.matrices:
        parts.append('<div class="mats">' + "".join(table(m) for m in step.matrices) + "</div>")
    if step.worked:
        items = "".join(f'<li><span class="{"ok" if w.check.ok else "bad"}">{"✓" if w.check.ok else "✗"}</span> '
                        f"{e(w.text)} &nbsp; {mathml(w.latex, '', 'inline')}</li>" for w in step.worked)
        parts.append(f'<p><b>By hand:</b></p><ul class="worked">{items}</ul>')
    if step.check is not None:
        parts.append(f'<p class="{"ok" if step.check.ok else "bad"}">{e(step.check.summary)}</p>')
    parts.append("</section>")
    return "".join(parts)


def render_html(walk: WalkResult) -> str:
    """One self-contained HTML page: inline CSS, MathML, no script, nothing fetched from anywhere."""
    e = lambda s: html.escape(printable(s))  # noqa: E731
    title, sub = header(walk)
    contents = "".join(f'<li><a href="#step-{s.number}">{e(s.title)}</a></li>' for s in walk.steps)
    notes = "".join(f"<p><i>{e(note)}</i></p>" for note in walk.notes)
    body = "\n".join([
        f'<nav aria-label="Steps"><b>Steps</b><ol>{contents}</ol></nav>',
        f"<main><h1>{e(title)}</h1><p>{e(sub)}</p>{notes}",
        *[section(step) for step in walk.steps],
        f'<p class="{"ok" if walk.ok else "bad"}">{e(footer(walk))}</p></main>',
    ])
    return page(printable(title), body, style=CSS)
