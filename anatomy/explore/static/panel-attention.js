// Attention: the head view (who attends to whom in one head), the model view (every layer × head,
// fetched a layer at a time) and the neuron view (q, k, q∘k, q·k/√d, softmax for one query), for
// self-attention, and an encoder-decoder's cross-attention. The weights are the pass's own
// (anatomy.viz's AttentionMap of the trace).
import {api, clear, currentRow, el, errorBox, fmt, isAbort, numberSelect, register, saveState, state, textBody} from "./core.js";

// The views' one grid (anatomy/viz/assets/grid.js, loaded by the page): header cells in the same
// CSS grid as the data, so that every cell sits under its header.
const {heatmap, colorBar, scaleRgb} = window;
const WEIGHTS = {kind: "sequential", lo: 0, hi: 1};
// A long text spreads its attention thin: its canvas is shaded by weight^0.4, so that a weight of 0.05
// shows as clearly as 0.3 does on a linear scale.
const SPREAD = {kind: "sequential", lo: 0, hi: 1, gamma: 0.4};
const LONG = 64;  // tokens: above this a head is drawn on a canvas (a grid of T × S cells would freeze the page)
const THUMB = 54;  // px: a model-view thumbnail, and the blocks its weights are averaged over
const NEURON_KEYS = 32;  // keys the neuron view lists for a long text: those with the largest weights

// A grid of attention weights, [queries][keys]; clicking a cell follows its query.
function weightGrid(name, queries, keys, weights, onRow) {
  const grid = heatmap({name, rows: queries, cols: keys, values: weights, scale: WEIGHTS, corner: "query \\ key",
                        cellWidth: 40, tooltip: (i, j, w) => `${queries[i]} → ${keys[j]}: ${fmt(w, 4)}`});
  if (onRow) grid.addEventListener("click", (event) => {
    const cell = event.target.closest(".hm-cell");
    if (cell) onRow(Number(cell.dataset.row));
  });
  return el("div", {class: "viz"}, grid);
}

const controls = document.getElementById("attention-controls");
const body = document.getElementById("attention-body");
let view = "head";
let map = 0;
let layerCache = new Map();  // "map/layer" -> that layer's thumbnails [H][n][m], for the model view
let cacheKey = "";

async function thumbnails(l) {
  const key = `${map}/${l}`;
  if (!layerCache.has(key)) {
    layerCache.set(key, await api("/api/attention", textBody({map, layer: l, thumbnail: THUMB}), `attention-${key}`));
  }
  return layerCache.get(key);
}

function drawControls(data) {
  const views = el("span", {class: "segmented"}, ["head", "model", "neuron"].map((v) => el("button", {
    type: "button", class: v === view ? "active" : "", text: `${v} view`,
    onclick: () => { view = v; update(); }})));
  const maps = data.maps.length > 1
    ? numberSelect("attention", data.maps.length, map, (v) => { map = v; update(); }, (i) => data.maps[i].name) : null;
  clear(controls, views, maps,
    numberSelect("layer", data.n_layers, state.layer, (v) => { state.layer = v; saveState(); update(); }),
    numberSelect("head", data.n_heads, state.head, (v) => { state.head = v; saveState(); update(); }));
}

function isLong() {
  const n = state.run ? state.run.tokens.length : 0;
  const source = state.run && state.run.source ? state.run.source.tokens.length : 0;
  return Math.max(n, source) > LONG;
}

async function update() {
  const key = `${state.model}\u0000${state.text}\u0000${state.target}`;
  if (key !== cacheKey) { layerCache = new Map(); cacheKey = key; }
  const ask = view === "model" ? {thumbnail: THUMB} : isLong() || view === "neuron" ? {heads: "one"} : {};
  let data;
  try {
    data = await api("/api/attention", textBody({map, layer: state.layer, head: state.head, query: currentRow(), ...ask}), "attention");
  } catch (error) {
    if (!isAbort(error)) clear(body, errorBox(error));
    return;
  }
  drawControls(data);
  if (view === "head") drawHead(data);
  else if (view === "model") {
    layerCache.set(`${map}/${state.layer}`, data);
    await drawModel(data);
  } else drawNeuron(data);
}

// One head: lines from each query token (left) to the keys it attends to (right), and the grid; for
// a long text, the grid on a canvas (a pixel block per cell, a tooltip and a click per cell).
function drawHead(data) {
  const spec = data.maps[data.map];
  const weights = data.weights[data.heads_shown ? 0 : state.head];
  const follow = (r) => { state.row = r; saveState(); update(); };
  const lead = `${spec.name}, layer ${data.layer}, head ${state.head}: each row (a query) shares its attention over the keys; rows sum to 1.`;
  if (spec.queries.length > LONG || spec.keys.length > LONG) {
    clear(body, el("p", {class: "muted small", text: `${lead} ${spec.queries.length} queries × ${spec.keys.length} keys, one cell a pixel block: hover a cell for its tokens, click it to follow its query.`}),
          canvasGrid(spec.queries, spec.keys, weights, follow));
    return;
  }
  const svg = attentionLines(spec.queries, spec.keys, weights, currentRow());
  const grid = weightGrid("attention", spec.queries, spec.keys, weights, follow);
  clear(body, el("p", {class: "muted small", text: `${lead} Hover a token on the left.`}),
        el("div", {class: "attention-pair"}, svg, grid));
}

// [T][S] weights on one canvas as large as fits (at most 4 px a cell), with the row followed marked.
function canvasGrid(queries, keys, weights, onRow) {
  const cell = Math.max(1, Math.min(4, Math.floor(640 / Math.max(queries.length, keys.length))));
  const canvas = el("canvas", {class: "long-grid", width: String(keys.length * cell), height: String(queries.length * cell),
                               role: "img", "aria-label": `attention weights, ${queries.length} queries × ${keys.length} keys`});
  const ctx = canvas.getContext("2d");
  const image = ctx.createImageData(keys.length, queries.length);
  weights.forEach((row, r) => row.forEach((w, c) => {
    const [red, green, blue] = scaleRgb(w, SPREAD);
    const i = 4 * (r * keys.length + c);
    image.data[i] = red; image.data[i + 1] = green; image.data[i + 2] = blue; image.data[i + 3] = 255;
  }));
  const off = document.createElement("canvas");
  off.width = keys.length; off.height = queries.length;
  off.getContext("2d").putImageData(image, 0, 0);
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(off, 0, 0, canvas.width, canvas.height);
  const focus = currentRow();
  ctx.strokeStyle = "#f59f00";
  ctx.strokeRect(0, focus * cell, canvas.width, cell);
  const at = (event) => {
    const box = canvas.getBoundingClientRect();
    const r = Math.floor((event.clientY - box.top) / (box.height / queries.length));
    const c = Math.floor((event.clientX - box.left) / (box.width / keys.length));
    return r >= 0 && r < queries.length && c >= 0 && c < keys.length ? [r, c] : null;
  };
  const tip = document.getElementById("tooltip");
  canvas.addEventListener("mousemove", (event) => {
    const found = at(event);
    if (!found) { tip.hidden = true; return; }
    const [r, c] = found;
    tip.textContent = `${r} ${queries[r]} → ${c} ${keys[c]}: ${fmt(weights[r][c], 4)}`;
    tip.style.left = `${event.clientX + 12}px`;
    tip.style.top = `${event.clientY + 12}px`;
    tip.hidden = false;
  });
  canvas.addEventListener("mouseleave", () => { tip.hidden = true; });
  canvas.addEventListener("click", (event) => { const found = at(event); if (found) onRow(found[0]); });
  return el("div", {class: "long-grid-wrap viz"}, colorBar(SPREAD, "attention weight (shaded by weight^0.4)"), canvas);
}

const SVG = "http://www.w3.org/2000/svg";
function svgEl(tag, attributes = {}, text = null) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attributes)) node.setAttribute(k, String(v));
  if (text !== null) node.textContent = text;
  return node;
}

function attentionLines(queries, keys, weights, focus) {
  const rowHeight = 20;
  const height = Math.max(queries.length, keys.length) * rowHeight + 10;
  const svg = svgEl("svg", {width: 420, height, class: "lines", role: "img", "aria-label": "attention lines"});
  const left = 140, right = 280;
  const lines = svgEl("g");
  const draw = (only) => {
    lines.replaceChildren();
    queries.forEach((_, q) => {
      if (only !== null && q !== only) return;
      keys.forEach((_, k) => {
        const w = weights[q][k];
        if (w < 0.02) return;
        lines.append(svgEl("line", {x1: left, y1: 14 + q * rowHeight, x2: right, y2: 14 + k * rowHeight,
                                    stroke: "#2f6edc", "stroke-opacity": Math.min(1, w * (only === null ? 0.9 : 1.2)),
                                    "stroke-width": 1 + 3 * w}));
      });
    });
  };
  svg.append(lines);
  queries.forEach((token, q) => {
    const label = svgEl("text", {x: left - 6, y: 18 + q * rowHeight, "text-anchor": "end", class: q === focus ? "focus" : ""}, token);
    label.addEventListener("mouseenter", () => draw(q));
    label.addEventListener("mouseleave", () => draw(null));
    svg.append(label);
  });
  keys.forEach((token, k) => svg.append(svgEl("text", {x: right + 6, y: 18 + k * rowHeight}, token)));
  draw(null);
  return svg;
}

// Every layer × head as a small heatmap (each averaged over at most 54 × 54 blocks of its weights by
// the server), fetched a layer at a time; the clicked one opens beside it.
async function drawModel(data) {
  const spec = data.maps[data.map];
  const grid = el("div", {class: "model-grid"});
  grid.style.gridTemplateColumns = `max-content repeat(${data.n_heads}, 58px)`;
  const enlarged = el("div", {class: "model-enlarged"});
  clear(body, el("p", {class: "muted small", text: `${spec.name}: every layer (row) and head (column)` +
    (Math.max(spec.queries.length, spec.keys.length) > THUMB ? `, each weight the mean of a block of the ${spec.queries.length} × ${spec.keys.length}` : "") +
    "; click one to open it beside the grid."}),
        el("div", {class: "model-pair"}, el("div", {class: "model-scroll"}, grid), enlarged));
  grid.append(el("div", {class: "corner", text: "layer \\ head"}));
  for (let h = 0; h < data.n_heads; h++) grid.append(el("div", {class: "colhead", text: `H${h}`}));
  const showEnlarged = async (l, h) => {
    clear(enlarged, el("h3", {text: `layer ${l}, head ${h}`}), el("p", {class: "muted small", text: "loading…"}));
    let one;
    try {
      one = await api("/api/attention", textBody({map, layer: l, head: h, heads: "one"}), "attention-enlarged");
    } catch (error) {
      if (!isAbort(error)) clear(enlarged, errorBox(error));
      return;
    }
    const long = spec.queries.length > LONG || spec.keys.length > LONG;
    clear(enlarged, el("h3", {text: `layer ${l}, head ${h}`}),
          long ? canvasGrid(spec.queries, spec.keys, one.weights[0], () => {})
               : weightGrid("enlarged head", spec.queries, spec.keys, one.weights[0]));
  };
  for (let l = 0; l < data.n_layers; l++) {
    grid.append(el("div", {class: "rowhead", text: `L${l}`}));
    const cells = [];
    for (let h = 0; h < data.n_heads; h++) {
      const canvas = el("canvas", {width: "54", height: "54", class: "thumb", title: `layer ${l}, head ${h}`});
      grid.append(canvas);
      cells.push(canvas);
    }
    let layerData;
    try {
      layerData = await thumbnails(l);
    } catch (error) {
      if (!isAbort(error)) grid.append(errorBox(error));
      return;
    }
    cells.forEach((canvas, h) => {
      paint(canvas, layerData.thumbnails[h]);
      canvas.addEventListener("click", () => {
        state.layer = l; state.head = h; saveState();
        for (const c of grid.querySelectorAll("canvas.selected")) c.classList.remove("selected");
        canvas.classList.add("selected");
        showEnlarged(l, h);
      });
      if (l === state.layer && h === state.head) { canvas.classList.add("selected"); showEnlarged(l, h); }
    });
  }
}

function paint(canvas, weights) {
  const ctx = canvas.getContext("2d");
  const rows = weights.length, cols = weights[0].length;
  const image = ctx.createImageData(cols, rows);
  for (let r = 0; r < rows; r++) for (let c = 0; c < cols; c++) {
    const w = weights[r][c], i = 4 * (r * cols + c);
    image.data[i] = 255 - 208 * w; image.data[i + 1] = 255 - 145 * w; image.data[i + 2] = 255 - 35 * w; image.data[i + 3] = 255;
  }
  const off = document.createElement("canvas");
  off.width = cols; off.height = rows;
  off.getContext("2d").putImageData(image, 0, 0);
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(off, 0, 0, canvas.width, canvas.height);
}

// One query inside one head: for each key, the softmax weight, q·k/√d, and q∘k (the products q·k
// sums), first the two numbers that decide the weight, then the products (as many dimensions as
// fit; the grid scrolls sideways beside its sticky key labels). A long text lists the keys with
// the largest weights.
function drawNeuron(data) {
  const n = data.neuron;
  if (!n) { clear(body, el("p", {class: "muted", text: "this attention keeps no q and k vectors"})); return; }
  const spec = data.maps[data.map];
  const d = n.q.length;
  const keep = Math.min(d, 8);
  let keys = spec.keys.map((_, s) => s);
  if (keys.length > NEURON_KEYS) {
    keys = keys.sort((a, b) => n.weights[b] - n.weights[a]).slice(0, NEURON_KEYS).sort((a, b) => a - b);
  }
  const cols = ["softmax", "q·k/√d", ...[...Array(keep).keys()].map((i) => `q∘k[${i}]`)];
  const values = keys.map((s) => [n.weights[s], n.scores[s], ...n.q_times_k[s].slice(0, keep)]);
  const products = {kind: "diverging", limit: Math.max(...n.q_times_k.flat().map(Math.abs), 1e-9)};
  const scores = {kind: "diverging", limit: Math.max(...n.scores.map(Math.abs), 1e-9)};
  const labels = keys.map((s) => `${s} ${spec.keys[s]}`);
  const grid = heatmap({name: "neuron", rows: labels, cols, values, scale: products, corner: "key", cellWidth: 50,
                        cellRgb: (i, j, v) => scaleRgb(v, j === 0 ? WEIGHTS : j === 1 ? scores : products),
                        tooltip: (i, j, v) => `${labels[i]} · ${cols[j]}: ${fmt(v, 5)}`});
  clear(body,
    el("p", {class: "muted small", text: `query “${spec.queries[n.query]}” (position ${n.query}) in layer ${data.layer}, head ${n.head}: ` +
      `q·k sums q∘k over its ${d} dimensions` + (d > keep ? ` (the first ${keep} shown)` : "") +
      `, is divided by √${d} = ${Math.sqrt(d).toFixed(3)}, and the softmax over the keys gives the weights.` +
      (keys.length < spec.keys.length ? ` The ${keys.length} keys of ${spec.keys.length} with the largest weights.` : "") +
      " Click a token to change the query."}),
    el("p", {class: "small"}, el("b", {text: "q = "}), el("code", {text: `[${n.q.slice(0, keep).map((v) => fmt(v)).join(", ")}${d > keep ? ", …" : ""}]`})),
    el("div", {class: "viz neuron-grid"}, grid));
}

register("attention", {update, exportSettings: () => ({view: view === "neuron" ? "neuron" : view})});
