"use strict";
// anatomy graph page, what a reader does with it: the main view (graph-draw.js), the node panel
// (graph-panel.js), a circuit's slider (graph-circuit.js), pinning nodes into a subgraph drawn by the same
// renderer, supernodes, the exports (Neuronpedia's JSON with the labels, PNG), and the hooks the browser
// tests read (window.anatomyGraph).

const views = { main: null, sub: null };

// ---- pinning, supernodes ----

function togglePin(i) {
  if (i === null) return;
  if (state.pinned.has(i)) {
    state.pinned.delete(i);
    state.checked.delete(i);
    state.supernodes = state.supernodes.map((s) => ({ ...s, members: s.members.filter((m) => m !== i) })).filter((s) => s.members.length > 1);
  } else {
    state.pinned.add(i);
  }
  drawSubgraph();
  views.main.draw();
  if (state.selected !== null) showDetail(state.selected);
}

function drawSubgraphTools() {
  const tools = document.getElementById("subgraph-tools");
  tools.textContent = "";
  document.getElementById("subgraph-count").textContent = state.pinned.size ? `(${state.pinned.size} pinned)` : "";
  document.getElementById("subgraph-help").hidden = state.pinned.size > 0;
  const inGroup = new Set(state.supernodes.flatMap((s) => s.members));
  for (const i of [...state.pinned].sort((a, b) => a - b)) {
    if (inGroup.has(i)) continue;
    const box = el("input");
    box.type = "checkbox";
    box.checked = state.checked.has(i);
    box.dataset.node = String(i);
    box.addEventListener("change", () => { box.checked ? state.checked.add(i) : state.checked.delete(i); });
    const label = el("label");
    label.append(box, document.createTextNode(nodes[i].name));
    tools.append(label);
  }
  if (state.pinned.size) {
    const name = el("input");
    name.type = "text";
    name.placeholder = "supernode name";
    name.id = "supernode-name";
    const group = el("button", "small-button", "Group ticked");
    group.type = "button";
    group.id = "group-button";
    group.addEventListener("click", () => {
      const members = [...state.checked];
      if (members.length < 2) return;
      state.supernodes.push({ name: name.value.trim() || `group ${state.supernodes.length + 1}`, members });
      state.checked.clear();
      drawSubgraph();
    });
    tools.append(name, group);
  }
  state.supernodes.forEach((s, g) => {
    const ungroup = el("button", "small-button", `Ungroup “${s.name}”`);
    ungroup.type = "button";
    ungroup.addEventListener("click", () => { state.supernodes.splice(g, 1); drawSubgraph(); });
    tools.append(ungroup);
  });
}

function drawSubgraph() {
  drawSubgraphTools();
  const sub = document.getElementById("subgraph-view");
  if (!state.pinned.size) { sub.hidden = true; sub.textContent = ""; views.sub = null; return; }
  sub.hidden = false;
  views.sub = new GraphView(sub, { indices: [...state.pinned], groups: state.supernodes, maxHeight: 320 });
}

// ---- export ----

function download(name, blob) {
  const url = URL.createObjectURL(blob);
  const a = el("a");
  a.href = url;
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

function exportJson() {
  let out;
  if (DATA.neuronpedia) {
    const np = DATA.neuronpedia;
    const ids = np.nodes.map((n) => n.node_id);
    out = {
      metadata: np.metadata,
      qParams: { pinnedIds: [...state.pinned].map((i) => ids[i]), supernodes: state.supernodes.map((s) => [s.name, ...s.members.map((i) => ids[i])]),
                 linkType: "both", clickedId: state.selected === null ? "" : ids[state.selected], sg_pos: "" },
      nodes: np.nodes.map((record, i) => (state.labels.has(i) ? { ...record, clerp: state.labels.get(i) } : record)),
      links: DATA.edges.map(([t, s, w]) => ({ source: ids[s], target: ids[t], weight: w })),
    };
  } else {
    out = { kind: DATA.kind, columns: DATA.columns, nLayers: DATA.nLayers, nodes, edges: DATA.edges,
            shown: edges.length, pinned: [...state.pinned], supernodes: state.supernodes };
  }
  download("graph.json", new Blob([JSON.stringify(out)], { type: "application/json" }));
}

function exportPng() {
  const view = views.main;
  const scale = 2;
  const canvas = document.createElement("canvas");
  canvas.width = view.width * scale;
  canvas.height = view.height * scale;
  const ctx = canvas.getContext("2d");
  ctx.scale(scale, scale);
  view.draw(ctx, view.width, view.height);
  canvas.toBlob((blob) => download("graph.png", blob), "image/png");
}

// ---- the page ----

const EDGE_STEPS = [100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000];
const DEFAULT_EDGES = 2000;  // drawn at open when there are more: the strongest flows, not a hairball

// The edges drawn while nothing is selected: the strongest N (a selected node's own are always drawn).
function edgeControl() {
  const total = DATA.edges.length;
  const steps = [...EDGE_STEPS.filter((n) => n < total), total];
  const range = el("input");
  range.type = "range";
  range.min = "0";
  range.max = String(steps.length - 1);
  range.step = "1";
  range.name = "edge-limit";
  const opening = DATA.circuit ? steps.length - 1 : steps.findIndex((n) => n >= Math.min(total, DEFAULT_EDGES));
  range.value = String(opening);
  const out = el("span", "muted");
  out.id = "edge-limit";
  const update = () => {
    const n = steps[Number(range.value)];
    state.edgeLimit = n >= total ? Infinity : n;
    out.textContent = n >= total ? `all ${total.toLocaleString()}` : `the strongest ${n.toLocaleString()} of ${total.toLocaleString()}`;
  };
  update();
  range.addEventListener("input", () => { update(); redraw(); });
  const wrap = control("Edges", range);
  wrap.append(out);
  return wrap;
}

function drawControls() {
  const bar = document.getElementById("controls");
  const edgesControl = DATA.circuit ? el("span") : edgeControl();  // a circuit's edges: its own slider's
  const json = el("button", "small-button", "Export JSON");
  json.type = "button";
  json.id = "export-json";
  json.addEventListener("click", exportJson);
  const png = el("button", "small-button", "Export PNG");
  png.type = "button";
  png.id = "export-png";
  png.addEventListener("click", exportPng);
  const wrap = el("div", "control");
  wrap.append(json, png);
  bar.append(edgesControl, wrap);
  if (DATA.scores) {
    const scores = el("span", "muted", `replacement ${DATA.scores.replacement} · completeness ${DATA.scores.completeness}`);
    scores.id = "scores";
    bar.append(scores);
  }
}

function drawCheck() {
  const line = document.getElementById("check-line");
  if (!DATA.check) { line.hidden = true; return; }
  line.textContent = `Check: ${DATA.check}`;
  line.className = `note ${DATA.checkOk ? "check-ok" : "check-bad"}`;
}

// The model with features changed, beside what the graph predicts for each of its target logits.
function drawIntervention() {
  const box = document.getElementById("intervention");
  const result = DATA.intervention;
  if (!result) return;
  box.hidden = false;
  box.append(el("h2", "", `Intervention (${result.freeze} frozen): ${result.changes.join(", ")}`));
  if (result.unseen.length) box.append(el("p", "note", `Not nodes of this graph, so no prediction for them: ${result.unseen.join(", ")}`));
  const table = el("table", "intervention-table");
  const head = el("tr");
  for (const name of ["token", "p before", "p after", "logit change", "graph: direct", "through its features"]) head.append(el("th", "", name));
  table.append(head);
  for (const row of result.rows) {
    const tr = el("tr");
    tr.append(el("td", "who", shownText(row.token)));
    for (const key of ["before", "after"]) tr.append(el("td", "num", fmt(row[key])));
    for (const key of ["change", "direct", "through"]) {
      const value = row[key];
      tr.append(el("td", `num ${value > 0 ? "pos" : value < 0 ? "neg" : ""}`, value === undefined ? "–" : fmt(value)));
    }
    table.append(tr);
  }
  box.append(table);
}

function mainIndices() {
  return DATA.circuit && state.circuitSize ? circuitNodes(state.circuitSize) : nodes.map((_, i) => i);
}

// The main view's room: down to the window's bottom, as the page opens.
function mainHeight(canvas) {
  const top = canvas.getBoundingClientRect().top + window.scrollY;
  return Math.max(360, Math.min(1400, window.innerHeight - top - 12));
}

// Lay the main view out again (the shown nodes changed), and the subgraph.
function drawAll() {
  const holder = document.getElementById("graph-view");
  if (views.main === null) views.main = new GraphView(holder, { indices: mainIndices(), maxHeight: mainHeight, main: true });
  else views.main.show(mainIndices());
  drawSubgraph();
}

// Draw again what is laid out (the selection, the pins or the edge filter changed).
function redraw() {
  views.main.draw();
  if (views.sub) views.sub.draw();
}

// What the browser tests read: where each node is drawn (client pixels), and what the views light.
window.anatomyGraph = {
  state, nodes, views,
  edges: () => edges,
  clientBox(i, view = "main") {
    const shown = views[view];
    const box = shown && shown.plan.boxOf.get(i);
    if (!box) return null;
    const s = shown.screen(box), r = shown.canvas.getBoundingClientRect();
    return { x: r.left + s.x, y: r.top + s.y, w: s.w, h: s.h };
  },
  lit: (view = "main") => views[view].lit.map((link) => ({ source: link.source.key, target: link.target.key, weight: link.weight,
                                                            pairs: link.pairs })),
};

drawCheck();
drawControls();
drawIntervention();
const growCircuit = drawCircuitControls();
if (growCircuit) growCircuit(); else drawAll();
showDetail(null);
let lastWidth = window.innerWidth;
window.addEventListener("resize", () => {
  if (window.innerWidth === lastWidth) return;
  lastWidth = window.innerWidth;
  drawAll();
});
