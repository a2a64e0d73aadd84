"use strict";
// anatomy's one grid: a heatmap drawn as ONE CSS grid whose header cells are items of the same
// grid as its data cells, so every cell sits under its column's header and beside its row's
// header by construction (no second table of labels to drift). Headers are sticky: row labels on
// the left, column labels at the top, below the page's sticky control bar.
// Used by the analysis pages (analysis.js) and by the views (the generation view's strip).
// Runs after common.js (el). Every label reaches the page as text (textContent, title).
//
// Colour scales (computed in Python, robust: the limit is the 98th percentile of |value| when the
// largest values would otherwise wash every other cell out; a value beyond it is drawn in the end
// colour and marked with a small triangle):
//   {kind: "diverging", limit}            red (negative) <- white (0) -> blue (positive)
//   {kind: "sequential", lo, hi}          white (lo) -> blue (hi)
//   {kind: "sequential", lo, hi, color: "#1f77b4", gamma: 0.5}   white -> that colour, by t^gamma

// ColorBrewer's RdBu and Blues (as matplotlib draws them in the PNGs), light to dark.
const BLUES = [[247, 251, 255], [222, 235, 247], [198, 219, 239], [158, 202, 225], [107, 174, 214],
               [66, 146, 198], [33, 113, 181], [8, 81, 156], [8, 48, 107]];
const REDS_OF_RDBU = [[247, 247, 247], [253, 219, 199], [244, 165, 130], [214, 96, 77], [178, 24, 43]];
const BLUES_OF_RDBU = [[247, 247, 247], [209, 229, 240], [146, 197, 222], [67, 147, 195], [33, 102, 172]];
const NO_VALUE_RGB = [226, 228, 232];

// The colour at t in [0, 1] along a list of stops, linearly between neighbours.
function alongStops(stops, t) {
  const x = Math.max(0, Math.min(1, t)) * (stops.length - 1);
  const i = Math.min(stops.length - 2, Math.floor(x));
  const f = x - i;
  return stops[i].map((c, k) => c + (stops[i + 1][k] - c) * f);
}

// Where a value falls on a scale: t in [-1, 1] (diverging) or [0, 1] (sequential), and whether
// it lies beyond the scale's ends (clipped: -1 below, 1 above, 0 inside).
function scalePosition(value, scale) {
  if (scale.kind === "diverging") {
    const t = value / (scale.limit || 1);
    return { t: Math.max(-1, Math.min(1, t)), clipped: t > 1 ? 1 : t < -1 ? -1 : 0 };
  }
  const span = scale.hi - scale.lo;
  const t = span > 0 ? (value - scale.lo) / span : 0;
  return { t: Math.max(0, Math.min(1, t)), clipped: t > 1 + 1e-9 ? 1 : t < -1e-9 ? -1 : 0 };
}

// [r, g, b] of a value on a scale (grey for a missing or non-finite value).
function scaleRgb(value, scale) {
  if (value === null || value === undefined || !Number.isFinite(value)) return NO_VALUE_RGB;
  const { t } = scalePosition(value, scale);
  if (scale.kind === "diverging") return alongStops(t >= 0 ? BLUES_OF_RDBU : REDS_OF_RDBU, Math.abs(t));
  const shaped = Math.pow(t, scale.gamma || 1);
  if (scale.color) return ramp(rgb(scale.color), shaped);
  return alongStops(BLUES, shaped);
}

// The largest |value| a scale reaches.
function scaleExtent(scale) {
  return scale.kind === "diverging" ? scale.limit : Math.max(Math.abs(scale.lo), Math.abs(scale.hi));
}

function cssRgb([r, g, b]) {
  return `rgb(${Math.round(r)}, ${Math.round(g)}, ${Math.round(b)})`;
}

// White text on a dark cell (relative luminance below one half).
function isDark([r, g, b]) {
  return 0.2126 * r + 0.7152 * g + 0.0722 * b < 128;
}

// ---- numbers ----

// A value for a tooltip: four significant digits.
function formatValue(value) {
  if (value === null || value === undefined) return "no value";
  if (!Number.isFinite(value)) return String(value);
  if (value === 0) return "0";
  const a = Math.abs(value);
  if (a >= 1e5 || a < 1e-3) return value.toExponential(3);
  return String(Number(value.toPrecision(4)));
}

// A value in a cell: at most five characters ("0.88", "-15.8", "153", "22k", "3e-4"). With the
// scale's extent, a value below 0.005 on a scale reaching 0.5 or more reads "0.00", not "3e-4".
function shortValue(value, extent) {
  if (value === null || value === undefined || !Number.isFinite(value)) return "–";
  const a = Math.abs(value);
  const sign = value < 0 ? "-" : "";
  if (a === 0) return "0";
  if (a < 0.005 && extent >= 0.5) return "0.00";
  if (a >= 9999.5) {
    const [n, unit] = a >= 999500 ? [a / 1e6, "M"] : [a / 1e3, "k"];
    return sign + (n >= 9.95 ? n.toFixed(0) : n.toFixed(1)) + unit;
  }
  if (a >= 99.95) return sign + a.toFixed(0);
  if (a >= 9.995) return sign + a.toFixed(1);
  if (a >= 0.005) return sign + a.toFixed(2);
  return sign + a.toExponential(0);
}

// ---- the heatmap ----
// spec: {
//   name            the grid's name (data-grid), for tests and the curious
//   rows, cols      header labels (text), and rowKeys / colKeys: what data-row / data-col hold (default: index)
//   values          [rows][cols] numbers (null: no value)
//   scale           a colour scale (above)
//   corner          the text of the top-left cell (e.g. "layer \ head")
//   cellWidth, cellHeight (px; default 46 x 24)
//   showValues      print each value in its cell (default true); render(cell, i, j) replaces the text
//   tooltip(i, j)   the text shown on hover (default: row · column: value)
//   rowColor(i)     a colour for a row's label (the heads' colours); highlightCol: a column outlined
//   onColumnClick(j)  makes the column labels buttons
// }
function heatmap(spec) {
  const nCols = spec.cols.length;
  const width = spec.cellWidth || 46;
  const height = spec.cellHeight || 24;
  const extent = scaleExtent(spec.scale);
  const rowKeys = spec.rowKeys || spec.rows.map((_, i) => i);
  const colKeys = spec.colKeys || spec.cols.map((_, j) => j);
  const grid = el("div", "heatmap");
  grid.dataset.grid = spec.name || "heatmap";
  grid.style.gridTemplateColumns = `max-content repeat(${nCols}, ${width}px)`;
  grid.style.gridTemplateRows = "auto";  // the header row: as tall as its labels
  grid.style.gridAutoRows = `${height}px`;
  // Column labels read across when every one fits its column, else upwards (rotated).
  const upright = spec.cols.every((label) => label.length * 7 <= width - 6);
  const corner = el("div", "hm-corner", spec.corner || "");
  grid.append(corner);
  spec.cols.forEach((label, j) => {
    const header = el("div", upright ? "hm-col" : "hm-col rotated");
    header.append(el("span", "hm-col-text", label));
    header.dataset.colHeader = String(colKeys[j]);
    header.title = `${colKeys[j]}: ${label}`;
    if (spec.highlightCol === j) header.classList.add("highlight");
    if (spec.onColumnClick) {
      header.classList.add("clickable");
      header.addEventListener("click", () => spec.onColumnClick(j));
    }
    grid.append(header);
  });
  spec.rows.forEach((label, i) => {
    const header = el("div", "hm-row");
    header.append(el("span", "hm-row-text", label));
    header.dataset.rowHeader = String(rowKeys[i]);
    header.title = label;
    if (spec.rowColor) header.style.color = spec.rowColor(i);
    grid.append(header);
    spec.values[i].forEach((value, j) => {
      const cell = el("div", "hm-cell");
      const color = spec.cellRgb ? spec.cellRgb(i, j, value) : scaleRgb(value, spec.scale);
      cell.style.background = cssRgb(color);
      if (isDark(color)) cell.classList.add("dark");
      cell.dataset.row = String(rowKeys[i]);
      cell.dataset.col = String(colKeys[j]);
      if (value !== null && value !== undefined) {
        cell.dataset.value = String(value);
        const { clipped } = scalePosition(value, spec.scale);
        if (clipped) cell.classList.add(clipped > 0 ? "clipped-high" : "clipped-low");
      }
      if (spec.render) spec.render(cell, i, j, value);
      else if (spec.showValues !== false) cell.textContent = shortValue(value, extent);
      if (spec.highlightCol === j) cell.classList.add("highlight");
      cell.title = spec.tooltip ? spec.tooltip(i, j, value)
        : `${label} · ${spec.cols[j]}: ${formatValue(value)}${clippedNote(value, spec.scale)}`;
      grid.append(cell);
    });
  });
  const wrap = el("div", "heatmap-wrap");
  wrap.append(grid);
  return wrap;
}

function clippedNote(value, scale) {
  if (value === null || value === undefined || !Number.isFinite(value)) return "";
  const { clipped } = scalePosition(value, scale);
  if (!clipped) return "";
  const [lo, hi] = scale.kind === "diverging" ? [-scale.limit, scale.limit] : [scale.lo, scale.hi];
  const end = clipped > 0 ? hi : lo;
  return ` (beyond the colour scale, drawn as ${formatValue(end)})`;
}

// A labelled colour bar: what the colour means, the values at its ends (and 0), and how values
// beyond the ends are marked.
function colorBar(scale, label, clippedCount = 0) {
  const wrap = el("div", "colorbar");
  wrap.append(el("span", "colorbar-label", label));
  const lo = scale.kind === "diverging" ? -scale.limit : scale.lo;
  const hi = scale.kind === "diverging" ? scale.limit : scale.hi;
  const strip = el("div", "colorbar-strip");
  const stops = Array.from({ length: 11 }, (_, k) => {
    const value = lo + (hi - lo) * k / 10;
    return `${cssRgb(scaleRgb(value, scale))} ${k * 10}%`;
  });
  strip.style.background = `linear-gradient(to right, ${stops.join(", ")})`;
  const ticks = el("div", "colorbar-ticks");
  ticks.append(el("span", "", formatValue(lo)));
  if (scale.kind === "diverging") ticks.append(el("span", "", "0"));
  ticks.append(el("span", "", formatValue(hi)));
  const bar = el("div", "colorbar-scale");
  bar.append(strip, ticks);
  wrap.append(bar);
  if (clippedCount > 0) {
    const lie = clippedCount === 1 ? "value lies" : "values lie";
    const note = el("span", "colorbar-note",
      `◥ ${clippedCount} ${lie} beyond the scale (the largest would wash out the rest); hover for the value`);
    wrap.append(note);
  }
  return wrap;
}

// How many values of a 2-D array lie beyond a scale.
function countClipped(values, scale) {
  let n = 0;
  for (const row of values) for (const v of row) {
    if (v !== null && v !== undefined && Number.isFinite(v) && scalePosition(v, scale).clipped) n += 1;
  }
  return n;
}
