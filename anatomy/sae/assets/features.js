"use strict";
// anatomy feature pages: every feature of an SAE, drawn from the numbers features.py computed.
// Shape letters: F features, N top contexts per feature, W tokens per context, H histogram bins.
//
// Tokens reach the page only as text (textContent, title); nothing is fetched.

const PAGE_SIZE = 24;
const state = { order: [], page: 0, query: "", sort: "density-desc", hideDead: true };
let arrays = null; // the inflated arrays: values [F, N], windows [F, N, W], shades, acts, histogram [F, H], logits

const fmt = (x, digits = 3) => (Math.abs(x) >= 100 ? x.toFixed(0) : Math.abs(x) >= 1 ? x.toFixed(2) : x.toPrecision(digits));
const percent = (p) => (p >= 0.01 ? `${(100 * p).toFixed(1)}%` : p > 0 ? `${(100 * p).toPrecision(2)}%` : "0%");

async function decode() {
  const ints = async (field) => new Int32Array((await inflate(DATA[field])).buffer);
  const floats = async (field) => new Float32Array((await inflate(DATA[field])).buffer);
  const result = {
    values: await floats("values"), windows: await ints("windows"), shades: await inflate(DATA.shades),
    acts: await floats("acts"), histogram: await ints("histogram"),
  };
  if (DATA.promoted) {
    Object.assign(result, { promoted: await ints("promoted"), promotedLogits: await floats("promotedLogits"),
                            suppressed: await ints("suppressed"), suppressedLogits: await floats("suppressedLogits") });
  }
  return result;
}

// The text of a token of a context, shown on one line: a new line as ↵, a tab as →.
function shown(text) {
  return text.replace(/\n/g, "↵").replace(/\r/g, "␍").replace(/\t/g, "→");
}

// ---- which features the list shows, in which order ----

function centerTokens(feature) {
  const { top, window: W, before } = DATA;
  const texts = [];
  for (let n = 0; n < top; n++) {
    if (arrays.values[feature * top + n] <= 0) break;
    const id = arrays.windows[(feature * top + n) * W + before];
    if (id >= 0) texts.push(DATA.texts[id]);
  }
  return texts;
}

function matches(feature, query) {
  if (!query) return true;
  if (/^#?\d+$/.test(query)) return feature === Number(query.replace("#", ""));
  const q = query.toLowerCase();
  if (centerTokens(feature).some((t) => t.trim().toLowerCase().includes(q))) return true;
  if (!DATA.promoted) return false;
  for (let j = 0; j < DATA.logitK; j++) {
    const id = arrays.promoted[feature * DATA.logitK + j];
    if (id >= 0 && DATA.texts[id].trim().toLowerCase().includes(q)) return true;
  }
  return false;
}

function updateOrder() {
  const features = [];
  for (let f = 0; f < DATA.nFeatures; f++) {
    if (state.hideDead && DATA.density[f] === 0 && !/^#?\d+$/.test(state.query)) continue;
    if (matches(f, state.query.trim())) features.push(f);
  }
  const by = {
    "density-desc": (a, b) => DATA.density[b] - DATA.density[a],
    "density-asc": (a, b) => DATA.density[a] - DATA.density[b],
    "peak-desc": (a, b) => DATA.peak[b] - DATA.peak[a],
    "id": (a, b) => a - b,
  }[state.sort];
  features.sort((a, b) => by(a, b) || a - b);
  state.order = features;
  state.page = 0;
}

// ---- drawing ----

function histogramCanvas(counts, labels, width, height, color, title) {
  const canvas = el("canvas", "histogram");
  const ctx = sizeCanvas(canvas, width, height);
  const max = Math.max(1, ...counts);
  const bar = width / counts.length;
  ctx.fillStyle = color;
  counts.forEach((c, i) => {
    const h = (c / max) * (height - 14);
    ctx.fillRect(i * bar + 0.5, height - 12 - h, Math.max(1, bar - 1), h);
  });
  ctx.fillStyle = "#6b7280";
  ctx.font = "10px system-ui, sans-serif";
  ctx.textBaseline = "bottom";
  ctx.fillText(labels[0], 0, height);
  const right = labels[1];
  ctx.fillText(right, width - ctx.measureText(right).width, height);
  canvas.title = title;
  return canvas;
}

function activationHistogram(feature) {
  const H = DATA.histogramEdges.length - 1;
  const counts = Array.from(arrays.histogram.subarray(feature * H, (feature + 1) * H));
  const first = counts.findIndex((c) => c > 0);
  const last = H - 1 - [...counts].reverse().findIndex((c) => c > 0);
  if (first < 0) return el("div", "muted", "never fired");
  const shownCounts = counts.slice(first, last + 1);
  const edges = DATA.histogramEdges;
  return histogramCanvas(shownCounts, [fmt(edges[first], 2), fmt(edges[last + 1], 2)], 210, 64, "#e8590c",
    `activation values where it fires (log-spaced bins from ${fmt(edges[first], 2)} to ${fmt(edges[last + 1], 2)})`);
}

function tokenList(title, ids, logits, feature, sign) {
  const box = el("div", "logits");
  box.append(el("div", "label", title));
  const K = DATA.logitK;
  for (let j = 0; j < K; j++) {
    const id = ids[feature * K + j];
    if (id < 0) continue;
    const chip = el("span", `chip ${sign}`, DATA.labels[id]);
    chip.title = `${DATA.labels[id]}: ${logits[feature * K + j].toFixed(3)} per unit of activation`;
    box.append(chip);
  }
  return box;
}

function contextLine(feature, n) {
  const { top, window: W, before } = DATA;
  const row = el("div", "context");
  const base = (feature * top + n) * W;
  for (let w = 0; w < W; w++) {
    const id = arrays.windows[base + w];
    if (id < 0) continue;
    const span = el("span", w === before ? "tok peak" : "tok", shown(DATA.texts[id]));
    const shade = arrays.shades[base + w] / 255;
    if (shade > 0) span.style.background = `rgba(232, 89, 12, ${(0.08 + 0.8 * shade).toFixed(3)})`;
    span.title = `${DATA.labels[id]}: ${fmt(arrays.acts[base + w])}`;
    row.append(span);
  }
  return row;
}

function card(feature) {
  const box = el("article", "feature");
  box.id = `f${feature}`;
  const head = el("header", "feature-head");
  head.append(el("h2", "", `Feature ${feature}`),
    el("span", "muted", `fires on ${percent(DATA.density[feature])} of tokens · highest ${fmt(DATA.peak[feature])}`));
  box.append(head);
  const facts = el("div", "facts");
  const hist = el("div", "hist");
  hist.append(el("div", "label", "activations"), activationHistogram(feature));
  facts.append(hist);
  if (DATA.promoted) {
    facts.append(tokenList("promotes", arrays.promoted, arrays.promotedLogits, feature, "up"),
                 tokenList("suppresses", arrays.suppressed, arrays.suppressedLogits, feature, "down"));
  }
  box.append(facts);
  const contexts = el("div", "contexts");
  for (let n = 0; n < DATA.top; n++) {
    if (arrays.values[feature * DATA.top + n] <= 0) break;
    contexts.append(contextLine(feature, n));
  }
  if (!contexts.childElementCount) contexts.append(el("div", "muted", "no context: it never fired on this text"));
  box.append(contexts);
  return box;
}

function drawList() {
  const list = document.getElementById("features");
  list.replaceChildren();
  const start = state.page * PAGE_SIZE;
  const shownFeatures = state.order.slice(start, start + PAGE_SIZE);
  for (const f of shownFeatures) list.append(card(f));
  const status = document.getElementById("status");
  status.textContent = state.order.length
    ? `${start + 1}–${start + shownFeatures.length} of ${state.order.length} features`
    : "no feature matches";
  document.getElementById("prev").disabled = state.page === 0;
  document.getElementById("next").disabled = start + PAGE_SIZE >= state.order.length;
  painted();
}

function summary() {
  const box = el("section", "summary");
  const stats = (DATA.meta && DATA.meta.stats) || {};
  const facts = [];
  if (stats.l0 !== undefined) facts.push(["L0", fmt(stats.l0)]);
  if (stats.fve !== undefined) facts.push(["variance explained", stats.fve.toFixed(3)]);
  if (stats.loss_recovered !== undefined) facts.push(["CE loss recovered", stats.loss_recovered.toFixed(3)]);
  if (stats.dead !== undefined) facts.push(["dead (held out)", percent(stats.dead)]);
  const dh = DATA.densityHistogram;
  facts.push(["features", `${DATA.nFeatures.toLocaleString()} (${dh.dead} never fired here)`]);
  const table = el("dl", "stats");
  for (const [k, v] of facts) table.append(el("dt", "", k), el("dd", "", v));
  const density = el("div", "density");
  density.append(el("div", "label", "feature density: log10 share of tokens each fires on"),
    histogramCanvas(dh.counts, [dh.lo.toFixed(1), "0"], 360, 80, "#3b5bdb",
      `how many features fire on each share of tokens (log10, from ${dh.lo.toFixed(1)} to 0)`));
  box.append(table, density);
  return box;
}

function controls() {
  const bar = document.getElementById("controls");
  const search = el("input");
  search.type = "search";
  search.id = "search";
  search.placeholder = "a token (Paris), or #123";
  search.addEventListener("input", () => { state.query = search.value; updateOrder(); drawList(); });
  const sort = selectControl("Sort", [["density-desc", "density, highest first"], ["density-asc", "density, lowest first"],
    ["peak-desc", "highest activation"], ["id", "feature number"]], state.sort,
    (v) => { state.sort = v; updateOrder(); drawList(); }, "sort");
  const dead = el("input");
  dead.type = "checkbox";
  dead.checked = state.hideDead;
  dead.id = "hide-dead";
  dead.addEventListener("change", () => { state.hideDead = dead.checked; updateOrder(); drawList(); });
  const prev = el("button", "small-button", "◀ previous");
  prev.id = "prev";
  prev.addEventListener("click", () => { state.page -= 1; drawList(); window.scrollTo(0, 0); });
  const next = el("button", "small-button", "next ▶");
  next.id = "next";
  next.addEventListener("click", () => { state.page += 1; drawList(); window.scrollTo(0, 0); });
  bar.append(control("Search", search), sort, control("Hide silent", dead), prev, el("span", "status", ""), next);
  bar.querySelector(".status").id = "status";
}

async function main() {
  arrays = await decode();
  controls();
  const main = document.getElementById("main");
  const list = el("div", "feature-list");
  list.id = "features";
  main.append(summary(), list);
  const wanted = /^#f(\d+)$/.exec(window.location.hash);
  if (wanted) {
    state.query = wanted[1];
    document.getElementById("search").value = `#${wanted[1]}`;
  }
  updateOrder();
  drawList();
}

main();
