"""What a reader sees on a page, measured in Chromium: where every grid cell sits against its
headers, the value it shows, and whether the largest one is visible. Shared by the views' and the
analyses' browser tests (grid.js marks a grid [data-grid], its headers [data-col-header] and
[data-row-header], its cells [data-value] with data-row and data-col; a cell that prints more
than its value marks the value [data-shown])."""

from __future__ import annotations

import math
import re

GRIDS = """() => [...document.querySelectorAll('[data-grid]')].map((grid) => {
  const box = (node) => { const b = node.getBoundingClientRect(); return {left: b.left, right: b.right, top: b.top, bottom: b.bottom}; };
  const headers = (selector, key) => Object.fromEntries([...grid.querySelectorAll(selector)]
    .map((h) => [h.dataset[key], {...box(h), text: h.textContent}]));
  const cells = [...grid.querySelectorAll('[data-value]')].map((cell) => {
    const b = cell.getBoundingClientRect();
    const style = getComputedStyle(cell);
    return {row: cell.dataset.row === undefined ? null : cell.dataset.row, col: cell.dataset.col,
            value: Number(cell.dataset.value), title: cell.title,
            text: (cell.querySelector('[data-shown]') || cell).textContent,  // the printed value, in a cell of more
            x: b.left + b.width / 2, y: b.top + b.height / 2, width: b.width, height: b.height,
            fits: cell.scrollWidth <= cell.clientWidth + 1, background: style.backgroundColor, color: style.color};
  });
  return {name: grid.dataset.grid, cols: headers('[data-col-header]', 'colHeader'),
          rows: headers('[data-row-header]', 'rowHeader'), cells};
})"""


def grids(page) -> list[dict]:
    """Every [data-grid] on the page: its headers' boxes and its cells' centres, values and texts."""
    return page.evaluate(GRIDS)


def grid(page, name: str) -> dict:
    found = [g for g in grids(page) if g["name"] == name]
    assert len(found) == 1, f"{len(found)} grids named {name!r}: {[g['name'] for g in grids(page)]}"
    return found[0]


def misplaced_cells(grid_: dict) -> list[str]:
    """Cells whose centre lies outside their column header's horizontal span, or outside their row
    header's vertical span (when the grid has row headers)."""
    wrong = []
    for cell in grid_["cells"]:
        column = grid_["cols"].get(cell["col"])
        if column is None or not column["left"] <= cell["x"] <= column["right"]:
            wrong.append(f"cell ({cell['row']}, {cell['col']}) at x={cell['x']:.0f} is not under column {cell['col']} "
                         f"{column and (round(column['left']), round(column['right']), column['text'])}")
        if cell["row"] is not None and grid_["rows"]:
            row = grid_["rows"].get(cell["row"])
            if row is None or not row["top"] <= cell["y"] <= row["bottom"]:
                wrong.append(f"cell ({cell['row']}, {cell['col']}) at y={cell['y']:.0f} is not beside row {cell['row']} "
                             f"{row and (round(row['top']), round(row['bottom']), row['text'])}")
    return wrong


def shown_number(text: str) -> float:
    """The number a cell prints ("0.88", "-15.8", "22k", "1.2M", "3e-4", "0.00")."""
    match = re.fullmatch(r"(-?[\d.]+(?:e-?\d+)?)([kM]?)", text.strip())
    assert match, f"{text!r} is not a number as the page prints one"
    return float(match.group(1)) * {"": 1, "k": 1e3, "M": 1e6}[match.group(2)]


def shows(text: str, value: float) -> bool:
    """Whether a cell's printed text is `value` to the precision it prints (three significant
    digits, two decimals for small values)."""
    return math.isclose(shown_number(text), value, rel_tol=0.051, abs_tol=0.0051)


def rgb(css: str) -> tuple[int, int, int]:
    r, g, b = (int(float(x)) for x in re.findall(r"[\d.]+", css)[:3])
    return r, g, b


def contrast(foreground: str, background: str) -> float:
    """WCAG contrast ratio of two CSS colours."""
    def luminance(css):
        channels = [c / 255 for c in rgb(css)]
        channels = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
        return 0.2126 * channels[0] + 0.7152 * channels[1] + 0.0722 * channels[2]
    a, b = sorted([luminance(foreground), luminance(background)], reverse=True)
    return (a + 0.05) / (b + 0.05)


def assert_largest_cell_is_visible(grid_: dict) -> None:
    """The page is not blank: the cell of the largest |value| is coloured, prints its value, whole,
    and in a colour that reads against its background."""
    largest = max(grid_["cells"], key=lambda cell: abs(cell["value"]))
    assert largest["width"] > 0 and largest["height"] > 0, largest
    assert largest["fits"], f"the largest cell's text is cut: {largest}"
    assert shows(largest["text"], largest["value"]), largest
    assert rgb(largest["background"]) != (255, 255, 255) or largest["value"] == 0, largest
    assert contrast(largest["color"], largest["background"]) >= 3, largest
