"use strict";
// anatomy analysis views: a grid (layer x position, layer x head, component x position, ...) or a
// row of tokens shaded by their values; one panel per sequence of the batch.
// Runs after the viz views' common.js (DATA, el, control, selectControl, painted, showTooltip).
// Every label reaches the page through textContent or title: never as HTML.

const state = { panel: INITIAL.panel || 0 };

// Colour of a value: white -> blue (sequential, on [lo, hi]) or red <- white -> blue (diverging, around 0).
function shade(value, scale) {
  if (!Number.isFinite(value)) return "rgb(220, 220, 220)";
  let t, color;
  if (scale.diverging) {
    t = Math.min(1, Math.abs(value) / (scale.max || 1));
    color = value >= 0 ? [59, 91, 219] : [214, 40, 40];
  } else {
    t = scale.hi > scale.lo ? (value - scale.lo) / (scale.hi - scale.lo) : 0;
    color = [59, 91, 219];
  }
  const mix = (c) => Math.round(255 + (c - 255) * Math.max(0, Math.min(1, t)));
  return `rgb(${mix(color[0])}, ${mix(color[1])}, ${mix(color[2])})`;
}

function format(value) {
  if (!Number.isFinite(value)) return String(value);
  return Math.abs(value) >= 1000 || (value !== 0 && Math.abs(value) < 0.001) ? value.toExponential(2) : value.toFixed(3);
}

function drawGrid(main, panel) {
  const table = el("table", "grid");
  const head = el("tr");
  head.append(el("th", "corner", panel.corner || ""));
  panel.cols.forEach((label, j) => {
    const th = el("th", "col", label);
    th.title = `${j}: ${label}`;
    head.append(th);
  });
  table.append(head);
  panel.values.forEach((row, i) => {
    const tr = el("tr");
    tr.append(el("th", "row", panel.rows[i]));
    row.forEach((value, j) => {
      const text = panel.text ? panel.text[i][j] : "";
      const td = el("td", "cell", text);
      td.style.background = shade(value, panel.scale);
      td.dataset.row = String(i);
      td.dataset.col = String(j);
      td.title = `${panel.rows[i]} · ${panel.cols[j]}: ${format(value)}${text ? ` (${text})` : ""}`;
      tr.append(td);
    });
    table.append(tr);
  });
  main.append(table);
}

function drawTokens(main, panel) {
  const line = el("div", "shaded-tokens");
  panel.tokens.forEach((token, i) => {
    const span = el("span", "shaded-token", token);
    span.style.background = shade(panel.values[i], panel.scale);
    span.title = `${i}: ${token} = ${format(panel.values[i])}`;
    span.dataset.index = String(i);
    line.append(span);
  });
  main.append(line);
}

function draw() {
  const main = document.getElementById("main");
  main.replaceChildren();
  const panel = DATA.panels[state.panel];
  main.append(el("p", "note check", DATA.check));
  if (panel.caption) main.append(el("p", "note", panel.caption));
  (DATA.layout === "tokens" ? drawTokens : drawGrid)(main, panel);
  painted();
}

function controls() {
  const bar = document.getElementById("controls");
  if (DATA.panels.length > 1) {
    const options = DATA.panels.map((panel, index) => [index, panel.name]);
    bar.append(selectControl("Sequence", options, state.panel, (value) => { state.panel = value; draw(); }, "panel"));
  }
  bar.append(el("span", "note", DATA.legend));
}

controls();
draw();
