"use strict";
// anatomy graph page, its layout: nodes grouped into boxes, boxes packed into rows (layers) and columns
// (positions, or a circuit's component slots), so that the whole graph fits the view it opens in.
// Pure functions of the data; graph-draw.js draws what they return. Shape letters: N nodes, B boxes.
//
// A box is one component: a feature, an error, a token, a logit, a head (its q, k, v inputs and its output
// are its members), an MLP, or a supernode (pinned nodes grouped by the reader). A cell (one layer, one
// column) holds its boxes in lines; a column is as wide as its widest cell needs once wrapped into about r
// lines, and a row as tall as its tallest cell. packLayout tries a few r and keeps the one that lets the
// graph fit the view at the largest scale: Neuronpedia's "columns as wide as the nodes they
// hold", with wrapping for the graphs whose cells hold a hundred features.

const FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, Arial, sans-serif";
const GAP = 4, ROW_GAP = 6, LABEL_HEIGHT = 18, LABEL_MAX = 120, COLUMN_LABEL_MAX = 72;
const KIND_ORDER = { supernode: 0, head: 1, mlp: 2, feature: 3, error: 4 };
const LINES = [1, 1.5, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32, 48, 64];
const MAX_FIT = 2;  // a small graph opens at most twice its natural size

const textWidth = (() => {
  const ctx = document.createElement("canvas").getContext("2d");
  ctx.font = `11px ${FONT}`;
  return (text) => ctx.measureText(text).width;
})();

// The text of a label as the page shows it: tokens reach the page already visible ("␣the", "↵"); any
// other line break or tab still in a label is made visible here.
const shownText = (text) => String(text ?? "").replace(/\n/g, "↵").replace(/\t/g, "⇥").replace(/\r/g, "␍");

function boxKey(node) { return `${node.kind}|${node.layer}|${node.column}|${node.index}`; }

function boxLabel(node) {
  if (node.kind === "head") return `H${node.index}`;
  if (node.kind === "mlp") return "MLP";
  if (node.kind === "feature") return `#${node.index}`;  // shown once zoomed in far enough
  if (node.kind === "error") return "err";
  return node.label || node.name;
}

// [width, height] of a box: small shapes for the many (features, errors, tokens), a labelled box for the few.
function boxSize(kind, label) {
  if (kind === "feature") return [10, 10];
  if (kind === "error") return [9, 9];
  if (kind === "token") return [12, 9];
  return [Math.max(26, Math.min(LABEL_MAX, textWidth(shownText(label)) + 12)), LABEL_HEIGHT];
}

// indices: the nodes to lay out; groups: [{name, members}] drawn as one box each (supernodes).
function makeBoxes(indices, groups = []) {
  const boxes = new Map();
  const grouped = new Map();
  groups.forEach((group, g) => group.members.forEach((i) => grouped.set(i, g)));
  for (const i of indices) {
    const node = nodes[i];
    const g = grouped.get(i);
    const key = g === undefined ? boxKey(node) : `super|${g}`;
    if (!boxes.has(key)) {
      const members = g === undefined ? [] : groups[g].members;
      const mean = (field) => Math.round(members.reduce((a, m) => a + nodes[m][field], 0) / members.length);
      const kind = g === undefined ? node.kind : "supernode";
      const label = g === undefined ? boxLabel(node) : groups[g].name;
      boxes.set(key, { key, kind, label, members: [], influence: 0, roles: node.roles || [],
                       layer: g === undefined ? node.layer : mean("layer"), column: g === undefined ? node.column : mean("column") });
    }
    const box = boxes.get(key);
    box.members.push(i);
    box.influence = Math.max(box.influence, nodes[i].influence ?? 0);
  }
  const list = [...boxes.values()];
  list.forEach((box, id) => { box.id = id; [box.w, box.h] = boxSize(box.kind, box.label); });
  return list;
}

// Boxes into lines no wider than `width` (at least one box a line): [{boxes, width, height}].
function wrap(boxes, width) {
  const lines = [];
  let line = null;
  for (const box of boxes) {
    if (line === null || (line.width + box.w > width && line.boxes.length)) {
      line = { boxes: [], width: -GAP, height: 0 };
      lines.push(line);
    }
    line.boxes.push(box);
    line.width += box.w + GAP;
    line.height = Math.max(line.height, box.h);
  }
  return lines;
}

// The packed layout of `boxes` for a view of view.width x view.height (the world's pixels at scale 1):
// each box gets x, y (its centre); rows [{layer, top, height}] top (outputs) to bottom (inputs); columns
// [{left, width}]; the world's width and height; fit, the largest scale (at most MAX_FIT) at which it fits the view.
function packLayout(boxes, columnLabels, view) {
  const layers = [...new Set(boxes.map((b) => b.layer))].sort((a, b) => b - a);  // outputs at the top
  const nColumns = Math.max(columnLabels.length, ...boxes.map((b) => b.column + 1), 1);
  const cells = new Map();
  for (const box of boxes) {
    const cell = `${box.layer}|${box.column}`;
    if (!cells.has(cell)) cells.set(cell, []);
    cells.get(cell).push(box);
  }
  const columnGap = nColumns > 64 ? 4 : 10;
  const demand = new Array(nColumns).fill(0);  // the width of a column's widest cell on one line
  const least = new Array(nColumns).fill(12);  // its widest box (and its label, when there is room for it)
  for (const cellBoxes of cells.values()) {
    cellBoxes.sort((a, b) => (KIND_ORDER[a.kind] ?? 5) - (KIND_ORDER[b.kind] ?? 5) || b.influence - a.influence);
    const c = cellBoxes[0].column;
    demand[c] = Math.max(demand[c], cellBoxes.reduce((sum, box) => sum + box.w + GAP, -GAP));
    least[c] = Math.max(least[c], ...cellBoxes.map((box) => box.w));
  }
  if (nColumns <= 32) columnLabels.forEach((label, c) => { least[c] = Math.max(least[c], Math.min(COLUMN_LABEL_MAX, textWidth(label) + 8)); });
  const rowOf = new Map(layers.map((layer, r) => [layer, r]));
  const attempt = (r) => {
    const widths = demand.map((d, c) => Math.max(least[c], Math.ceil(d / r)));
    const heights = layers.map(() => 12);
    const wrapped = new Map();
    for (const [cell, cellBoxes] of cells) {
      const lines = wrap(cellBoxes, widths[cellBoxes[0].column]);
      wrapped.set(cell, lines);
      const row = rowOf.get(cellBoxes[0].layer);
      heights[row] = Math.max(heights[row], lines.reduce((sum, line) => sum + line.height + GAP, -GAP));
    }
    const width = widths.reduce((a, w) => a + w + columnGap, columnGap);
    const height = heights.reduce((a, h) => a + h + ROW_GAP * 2, 0);
    return { r, widths, heights, wrapped, width, height, fit: Math.min(MAX_FIT, view.width / width, view.height / height) };
  };
  let best = null;
  for (const r of LINES) {
    const tried = attempt(r);
    if (best !== null && tried.fit < best.fit * 0.9) break;  // past the best: more lines only make it taller
    if (best === null || tried.fit > best.fit + 1e-9) best = tried;
    if (tried.fit >= 1 || tried.widths.every((w, c) => w === least[c])) break;  // it fits, or nothing narrows further
  }
  const columns = [];
  let x = columnGap;
  for (const width of best.widths) { columns.push({ left: x, width }); x += width + columnGap; }
  const rows = [];
  let y = 0;
  layers.forEach((layer, r) => { rows.push({ layer, top: y, height: best.heights[r] + ROW_GAP * 2 }); y += best.heights[r] + ROW_GAP * 2; });
  for (const [cell, lines] of best.wrapped) {
    const first = lines[0].boxes[0];
    const column = columns[first.column], row = rows[rowOf.get(first.layer)];
    const total = lines.reduce((sum, line) => sum + line.height + GAP, -GAP);
    let top = row.top + (row.height - total) / 2;
    for (const line of lines) {
      let left = column.left + (column.width - line.width) / 2;
      for (const box of line.boxes) {
        box.x = left + box.w / 2;
        box.y = top + line.height / 2;
        left += box.w + GAP;
      }
      top += line.height + GAP;
    }
  }
  const boxOf = new Map();
  for (const box of boxes) for (const i of box.members) boxOf.set(i, box);
  return { boxes, boxOf, rows, columns, width: best.width, height: best.height, fit: best.fit, lines: best.r };
}
