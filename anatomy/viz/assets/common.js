"use strict";
// anatomy attention views: what every view shares.
// Shape letters: L layers, H heads, T query positions, S key positions, D head width.
//
// Tokens reach the page only as text: element.textContent, element.title, canvas fillText.
// Nothing here fetches anything; the data is the JSON block in this same file.

// A page that fetches its data (the live explorer) has no data block: it draws with the functions here.
const DATA_BLOCK = document.getElementById("anatomy-data");
const DATA = DATA_BLOCK ? JSON.parse(DATA_BLOCK.textContent) : { view: null, maps: [], initial: {} };
const INITIAL = DATA.initial;

// How tokens show a space or a new line ("␣capital", "↵"), said once per page when a token shown has one.
if (DATA.tokenLegend) {
  const legend = document.getElementById("token-legend");
  if (legend) {
    legend.textContent = `Tokens: ${DATA.tokenLegend}.`;
    legend.hidden = false;
  }
}

// One colour per head: d3's category10 without its grey, then three darker ones; then golden-angle hues.
const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                 "#e377c2", "#17becf", "#bcbd22", "#393b79", "#637939", "#7b4173"];

function headColor(head) {
  return head < PALETTE.length ? PALETTE[head] : `hsl(${(head * 137.5) % 360}, 60%, 42%)`;
}

function rgb(hex) {
  const n = parseInt(hex.slice(1), 16);
  return [(n >> 16) & 255, (n >> 8) & 255, n & 255];
}

// One colour per head as [r, g, b], for canvas pixels (hsl colours resolved once through a canvas).
const headRgbCache = [];
function headRgb(head) {
  if (!headRgbCache[head]) {
    const color = headColor(head);
    if (color.startsWith("#")) {
      headRgbCache[head] = rgb(color);
    } else {
      const ctx = document.createElement("canvas").getContext("2d");
      ctx.fillStyle = color;
      headRgbCache[head] = rgb(ctx.fillStyle);
    }
  }
  return headRgbCache[head];
}

// ---- data: base64(deflate(bytes)) per layer, inflated on first use and kept ----

function base64Bytes(text) {
  if (Uint8Array.fromBase64) return Uint8Array.fromBase64(text);
  const binary = atob(text);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes;
}

async function inflate(text) {
  const stream = new Blob([base64Bytes(text)]).stream().pipeThrough(new DecompressionStream("deflate"));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

const layerCache = new Map();

// The [H, T, S] weights of one layer as bytes: weight = byte / 255.
function layerWeights(mapIndex, layer) {
  return cached(`${mapIndex}/weights/${layer}`, () => inflate(DATA.maps[mapIndex].weights[layer]));
}

// Exact float32 arrays of one layer: "exact" weights [H, T, S], "q" [H, T, D], "k" [H, S, D].
function layerFloats(mapIndex, field, layer) {
  return cached(`${mapIndex}/${field}/${layer}`,
    async () => new Float32Array((await inflate(DATA.maps[mapIndex][field][layer])).buffer));
}

function cached(key, make) {
  if (!layerCache.has(key)) layerCache.set(key, make());
  return layerCache.get(key);
}

// ---- page state for tests and for the curious: window.anatomyView ----

window.anatomyView = { view: DATA.view, firstPaint: null, paints: 0 };

// Call after drawing: records the time of the first frame that shows it.
function painted() {
  requestAnimationFrame(() => {
    const view = window.anatomyView;
    if (view.firstPaint === null) view.firstPaint = performance.now();
    view.paints += 1;
    document.body.dataset.paints = String(view.paints);
  });
}

// ---- the sticky control bar: its height, as --sticky, so that nothing scrolls under it ----
// CSS reads it for scroll-padding (scrollIntoView stops below the bar) and for labels that stay
// visible beneath the bar (the model view's head labels).

function trackStickyBar() {
  const bar = document.getElementById("controls");
  if (!bar) return;
  const update = () => document.documentElement.style.setProperty("--sticky", `${bar.offsetHeight}px`);
  new ResizeObserver(update).observe(bar);
  update();
}
trackStickyBar();

// ---- elements (text only) ----

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

const SPECIAL = /^(\[[A-Z]+\]|<\/?s>|<pad>|<unk>|<\|endoftext\|>)$/;

function tokenElement(token, index) {
  const node = el("div", SPECIAL.test(token) ? "token special" : "token", token);
  node.title = `${index}: ${token}`;
  node.dataset.index = String(index);
  return node;
}

function control(label, input) {
  const wrap = el("label", "control");
  wrap.append(el("span", "label", label), input);
  return wrap;
}

// A <select> of (value, text) pairs; onChange receives the value as a number when it is one.
function selectControl(label, options, value, onChange, name) {
  const select = el("select");
  select.name = name || label.toLowerCase();
  for (const [optionValue, text] of options) {
    const option = el("option", "", text);
    option.value = String(optionValue);
    select.append(option);
  }
  select.value = String(value);
  select.addEventListener("change", () => {
    const v = select.value;
    onChange(/^-?\d+$/.test(v) ? Number(v) : v);
  });
  return control(label, select);
}

function layerOptions(nLayers) {
  return Array.from({ length: nLayers }, (_, layer) => [layer, `${layer}`]);
}

function mapOptions() {
  return DATA.maps.map((map, index) => [index, map.name]);
}

// Coloured toggle per head; click toggles, double-click keeps only that head.
function headToggles(nHeads, active, onChange) {
  const wrap = el("div", "heads");
  const buttons = [];
  const refresh = () => buttons.forEach((button, head) => button.classList.toggle("off", !active.has(head)));
  for (let head = 0; head < nHeads; head++) {
    const button = el("button", "head-toggle");
    button.type = "button";
    button.dataset.head = String(head);
    const swatch = el("span", "swatch");
    swatch.style.background = headColor(head);
    button.append(swatch, document.createTextNode(`${head}`));
    button.title = `head ${head}: click to show or hide, double-click to show only this head`;
    button.addEventListener("click", () => {
      active.has(head) ? active.delete(head) : active.add(head);
      refresh();
      onChange();
    });
    button.addEventListener("dblclick", () => {
      active.clear();
      active.add(head);
      refresh();
      onChange();
    });
    buttons.push(button);
    wrap.append(button);
  }
  const all = el("button", "small-button", "all");
  all.type = "button";
  all.addEventListener("click", () => { for (let h = 0; h < nHeads; h++) active.add(h); refresh(); onChange(); });
  const none = el("button", "small-button", "none");
  none.type = "button";
  none.addEventListener("click", () => { active.clear(); refresh(); onChange(); });
  wrap.append(all, none);
  refresh();
  return control("Heads", wrap);
}

// A canvas sized in CSS pixels, drawn sharp on high-density screens.
function sizeCanvas(canvas, width, height) {
  const ratio = window.devicePixelRatio || 1;
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(height * ratio);
  canvas.style.width = `${width}px`;
  canvas.style.height = `${height}px`;
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  return ctx;
}

const tooltip = document.getElementById("tooltip");

function showTooltip(text, event) {
  tooltip.textContent = text;
  tooltip.hidden = false;
  tooltip.style.left = `${event.clientX + 14}px`;
  tooltip.style.top = `${event.clientY + 12}px`;
}

function hideTooltip() {
  tooltip.hidden = true;
}

// Sentence pairs: which query and key positions a filter keeps, as [start, end) ranges.
const SENTENCE_FILTERS = [["all", "all"], ["AA", "A → A"], ["BB", "B → B"], ["AB", "A → B"], ["BA", "B → A"]];

function sentenceRanges(map, filter) {
  const b = map.sentenceBStart;
  const whole = [[0, map.queries.length], [0, map.keys.length]];
  if (b === null || filter === "all") return whole;
  const part = { A: [0, b], B: [b, map.queries.length] };
  return [part[filter[0]], part[filter[1]]];
}

function range([start, end]) {
  return Array.from({ length: end - start }, (_, i) => start + i);
}

// White -> colour ramp for heatmaps: weight w in [0, 1] as an [r, g, b] pixel.
function ramp(color, w) {
  return [255 - (255 - color[0]) * w, 255 - (255 - color[1]) * w, 255 - (255 - color[2]) * w];
}

// A token cut to n characters for canvas labels (the tooltip shows it whole).
function clip(token, n = 18) {
  return token.length > n ? `${token.slice(0, n - 1)}…` : token;
}

function formatWeight(w) {
  return w.toFixed(3);
}
