"use strict";
// anatomy graph page: any graph (an attribution graph, a discovered circuit), drawn from the numbers
// the library computed. Shape letters: N nodes, M edges.
//
// DATA.nodes [N]: {id, kind, layer, column, index, port, label, name, value, influence};
// DATA.edges [M]: [target, source, weight] (indices into nodes). Rows are layers (inputs at the bottom),
// columns are positions or component slots. Labels reach the page only as text (textContent).

const SVG_NS = "http://www.w3.org/2000/svg";
const FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, Arial, sans-serif";
const POSITIVE = "#2563eb", NEGATIVE = "#dc2626";
const KIND_STYLE = {  // fill, stroke: set as attributes, so that the PNG (an image of the SVG) keeps them
  token: ["#f1f3f7", "#9aa3b2"], embedding: ["#f1f3f7", "#9aa3b2"], feature: ["#7c8fb0", "#ffffff"],
  error: ["#b9bec8", "#ffffff"], logit: ["#fff4e0", "#d9a441"], logits: ["#fff4e0", "#d9a441"],
  head: ["#dde6fb", "#8ea6e6"], mlp: ["#e4f2e4", "#8fc08f"], supernode: ["#ede4fb", "#9b7fd1"],
};
const PORT_OFFSET = { q: -0.3, k: 0, v: 0.3, "": 0 };
const ROW_HEIGHT = 46, LEFT = 64, TOP = 14, LABEL_HEIGHT = 34;

const nodes = DATA.nodes;
const edges = DATA.edges;
const incoming = nodes.map(() => []);
const outgoing = nodes.map(() => []);
for (const [t, s, w] of edges) { incoming[t].push([s, w]); outgoing[s].push([t, w]); }

const state = { selected: null, pinned: new Set(), supernodes: [], checked: new Set(), minShare: 0 };
window.anatomyGraph = { state, nodes, edges };

const fmt = (x) => (x === null || x === undefined ? "–" : Math.abs(x) >= 100 ? x.toFixed(1) : Math.abs(x) >= 1 ? x.toFixed(3) : x.toPrecision(3));
const svg = (tag, attrs = {}) => {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  return node;
};
const textWidth = (() => {
  const ctx = document.createElement("canvas").getContext("2d");
  ctx.font = `11px ${FONT}`;
  return (text) => ctx.measureText(text).width;
})();
const shownText = (text) => text.replace(/\n/g, "↵").replace(/\t/g, "→").replace(/\r/g, "␍");
const layerName = (layer) => (layer < 0 ? "input" : layer >= DATA.nLayers ? "output" : `L${layer}`);

// ---- layout: boxes (one per component; a component's inputs are its ports) in rows and columns ----

function boxKey(node) { return `${node.kind}|${node.layer}|${node.column}|${node.index}`; }

function boxSize(box) {
  const kind = box.kind;
  if (kind === "feature") return [12, 12];
  if (kind === "error") return [11, 11];
  if (kind === "token" || kind === "embedding") return [14, 10];
  const label = box.label;
  return [Math.max(30, Math.min(120, textWidth(label) + 12)), 20];
}

// groups: [{name, members}] drawn as one box each (supernodes). Returns boxes with x, y, width, height.
function layout(indices, groups = []) {
  const boxes = new Map();
  const grouped = new Map();
  groups.forEach((group, g) => group.members.forEach((i) => grouped.set(i, g)));
  for (const i of indices) {
    const node = nodes[i];
    const g = grouped.get(i);
    const key = g === undefined ? boxKey(node) : `super|${g}`;
    if (!boxes.has(key)) {
      const members = g === undefined ? [] : groups[g].members;
      const layer = g === undefined ? node.layer : Math.round(members.reduce((a, m) => a + nodes[m].layer, 0) / members.length);
      const column = g === undefined ? node.column : Math.round(members.reduce((a, m) => a + nodes[m].column, 0) / members.length);
      boxes.set(key, { key, members: [], layer, column, kind: g === undefined ? node.kind : "supernode",
                       label: g === undefined ? (node.kind === "head" ? `H${node.index}` : node.kind === "mlp" ? "MLP" : node.label || node.name) : groups[g].name,
                       influence: 0 });
    }
    const box = boxes.get(key);
    box.members.push(i);
    box.influence = Math.max(box.influence, nodes[i].influence ?? 0);
  }
  const list = [...boxes.values()];
  const layers = [...new Set(list.map((b) => b.layer))].sort((a, b) => a - b);
  const rowOf = new Map(layers.map((layer, r) => [layer, r]));
  const nColumns = Math.max(DATA.columns.length, ...list.map((b) => b.column + 1));
  const cells = new Map();
  for (const box of list) {
    const cell = `${box.layer}|${box.column}`;
    if (!cells.has(cell)) cells.set(cell, []);
    cells.get(cell).push(box);
  }
  const order = { supernode: 0, head: 1, mlp: 2, feature: 3, error: 4 };
  const widths = Array.from({ length: nColumns }, (_, c) => Math.max(44, textWidth(shownText(DATA.columns[c] ?? "")) + 12));
  for (const cellBoxes of cells.values()) {
    cellBoxes.sort((a, b) => (order[a.kind] ?? 5) - (order[b.kind] ?? 5) || (b.influence - a.influence));
    const width = cellBoxes.reduce((sum, box) => sum + boxSize(box)[0] + 5, 5);
    const c = cellBoxes[0].column;
    widths[c] = Math.max(widths[c], width);
  }
  const starts = [];
  let x = LEFT;
  for (const w of widths) { starts.push(x); x += w + 10; }
  const height = TOP + layers.length * ROW_HEIGHT + LABEL_HEIGHT;
  for (const cellBoxes of cells.values()) {
    const c = cellBoxes[0].column;
    const total = cellBoxes.reduce((sum, box) => sum + boxSize(box)[0] + 5, -5);
    let bx = starts[c] + (widths[c] - total) / 2;
    const row = layers.length - 1 - rowOf.get(cellBoxes[0].layer);
    for (const box of cellBoxes) {
      [box.width, box.height] = boxSize(box);
      box.x = bx + box.width / 2;
      box.y = TOP + row * ROW_HEIGHT + ROW_HEIGHT / 2;
      bx += box.width + 5;
    }
  }
  const boxOf = new Map();
  for (const box of list) for (const i of box.members) boxOf.set(i, box);
  return { boxes: list, boxOf, layers, starts, widths, width: x + 10, height };
}

// ---- drawing ----

function edgeList(indices, boxOf) {
  // [{source box, target box, weight, port}], edges summed per pair of boxes (a supernode's members' together)
  const inside = new Set(indices);
  const sums = new Map();
  for (const [t, s, w] of edges) {
    if (!inside.has(t) || !inside.has(s)) continue;
    const a = boxOf.get(s), b = boxOf.get(t);
    if (a === b) continue;
    const key = `${a.key}>${b.key}>${nodes[t].port}`;
    if (!sums.has(key)) sums.set(key, { source: a, target: b, weight: 0, port: b.kind === "supernode" ? "" : nodes[t].port, pairs: [] });
    const entry = sums.get(key);
    entry.weight += w;
    entry.pairs.push([t, s]);
  }
  return [...sums.values()];
}

function draw(container, indices, groups, { main }) {
  container.textContent = "";
  const plan = layout(indices, groups);
  const root = svg("svg", { width: plan.width, height: plan.height, viewBox: `0 0 ${plan.width} ${plan.height}`,
                            "font-family": FONT, role: "img" });
  root.append(svg("rect", { x: 0, y: 0, width: plan.width, height: plan.height, fill: "#ffffff" }));
  const axis = svg("g", { class: "axis" });
  plan.layers.forEach((layer, r) => {
    const y = TOP + (plan.layers.length - 1 - r) * ROW_HEIGHT + ROW_HEIGHT / 2;
    axis.append(svg("line", { x1: LEFT - 4, x2: plan.width - 6, y1: y, y2: y, stroke: "#eef0f3" }));
    const label = svg("text", { x: LEFT - 10, y: y + 4, "text-anchor": "end", fill: "#6b7280", "font-size": 11 });
    label.textContent = layerName(layer);
    axis.append(label);
  });
  const baseline = TOP + plan.layers.length * ROW_HEIGHT + 16;
  plan.widths.forEach((w, c) => {
    const label = svg("text", { x: plan.starts[c] + w / 2, y: baseline, "text-anchor": "middle", class: "column-label",
                                fill: "#1f2430", "font-size": 12, "data-column": c });
    label.textContent = shownText(DATA.columns[c] ?? "");
    axis.append(label);
  });
  root.append(axis);

  const links = edgeList(indices, plan.boxOf).filter((e) => Number.isFinite(e.weight) && e.weight !== 0);
  const largest = links.reduce((m, e) => Math.max(m, Math.abs(e.weight)), 0) || 1;
  links.sort((a, b) => Math.abs(a.weight) - Math.abs(b.weight));
  const edgeGroup = svg("g");
  const drawn = [];
  for (const link of links) {
    const share = Math.abs(link.weight) / largest;
    if (share < state.minShare) continue;
    const { source: a, target: b } = link;
    const sx = a.x, sy = a.y - a.height / 2;
    const tx = b.x + (PORT_OFFSET[link.port] || 0) * b.width, ty = b.y + b.height / 2;
    const my = (sy + ty) / 2;
    const path = svg("path", {
      class: "edge", d: `M${sx},${sy} C${sx},${my} ${tx},${my} ${tx},${ty}`,
      stroke: link.weight > 0 ? POSITIVE : NEGATIVE, "stroke-width": (0.5 + 3.5 * share).toFixed(2),
      "stroke-opacity": (0.2 + 0.6 * Math.sqrt(share)).toFixed(3), fill: "none",
    });
    path.dataset.source = a.key;
    path.dataset.target = b.key;
    path.dataset.weight = String(link.weight);
    const title = svg("title");
    title.textContent = `${a.label ?? ""} → ${b.label ?? ""}${link.port ? ` (${link.port})` : ""}: ${fmt(link.weight)}`;
    path.append(title);
    edgeGroup.append(path);
    drawn.push(path);
  }
  root.append(edgeGroup);

  const nodeGroup = svg("g");
  for (const box of plan.boxes) {
    const [fill, stroke] = KIND_STYLE[box.kind] || KIND_STYLE.feature;
    const g = svg("g", { class: `node ${box.kind}`, "data-key": box.key, "data-index": box.members[0] });
    const shape = box.kind === "feature"
      ? svg("circle", { class: "shape", cx: box.x, cy: box.y, r: box.width / 2, fill, stroke })
      : svg("rect", { class: "shape", x: box.x - box.width / 2, y: box.y - box.height / 2, width: box.width, height: box.height,
                      rx: box.kind === "error" ? 1 : 4, fill, stroke });
    g.append(shape);
    if (box.width >= 30) {
      const label = svg("text", { x: box.x, y: box.y + 4, "text-anchor": "middle", "font-size": 11, fill: "#1f2430" });
      label.textContent = shownText(box.label);
      g.append(label);
    }
    if (box.members.some((i) => state.pinned.has(i)) && main) g.classList.add("pinned");
    if (box.members.includes(state.selected)) g.classList.add("selected");
    g.addEventListener("mouseenter", (event) => hover(root, box, plan, event));
    g.addEventListener("mousemove", moveTooltip);
    g.addEventListener("mouseleave", () => unhover(root));
    g.addEventListener("click", (event) => {
      const i = box.kind === "supernode" ? box.members[0] : box.members[0];
      if (event.shiftKey) togglePin(box.kind === "supernode" ? null : i);
      else select(i);
    });
    nodeGroup.append(g);
  }
  root.append(nodeGroup);
  container.append(root);
  return { root, plan, drawn };
}

// ---- hover (the tooltip is common.js's) ----

function moveTooltip(event) {
  tooltip.style.left = `${event.clientX + 14}px`;
  tooltip.style.top = `${event.clientY + 12}px`;
}

function hover(root, box, plan, event) {
  const keys = new Set([box.key]);
  for (const path of root.querySelectorAll("path.edge")) {
    const touches = path.dataset.source === box.key || path.dataset.target === box.key;
    path.classList.toggle("dim", !touches);
    if (touches) { keys.add(path.dataset.source); keys.add(path.dataset.target); }
  }
  for (const g of root.querySelectorAll("g.node")) g.classList.toggle("dim", !keys.has(g.dataset.key));
  const node = nodes[box.members[0]];
  const lines = box.kind === "supernode"
    ? [`${box.label}: ${box.members.length} nodes`]
    : [node.name, ...(node.value !== null ? [`${valueName(node)} ${fmt(node.value)}`] : []),
       ...(node.influence !== null ? [`influence ${fmt(node.influence)}`] : [])];
  showTooltip(lines.join("\n"), event);
}

function unhover(root) {
  for (const item of root.querySelectorAll(".dim")) item.classList.remove("dim");
  hideTooltip();
}

function valueName(node) {
  return node.kind === "logit" ? "probability" : node.kind === "feature" ? "activation" : "value";
}

// ---- the node panel ----

const detail = document.getElementById("detail");

function select(i) {
  state.selected = i;
  drawAll();
  showDetail(i);
}

function row(cells) {
  const tr = el("tr");
  for (const [text, className, onClick] of cells) {
    const td = el("td", className || "", text);
    if (onClick) td.addEventListener("click", onClick);
    tr.append(td);
  }
  return tr;
}

function edgeTable(title, list, field) {
  const wrap = el("div");
  wrap.append(el("h3", "", title));
  if (!list.length) { wrap.append(el("p", "note", "none")); return wrap; }
  const table = el("table");
  table.dataset.field = field;
  const sorted = [...list].sort((a, b) => Math.abs(b[1]) - Math.abs(a[1])).slice(0, 12);
  for (const [j, w] of sorted) {
    const tr = row([[nodes[j].name + (field === "inputs" && nodes[state.selected].port ? ` (${nodes[state.selected].port})` : ""), "who", () => select(j)],
                    [fmt(w), `num ${w > 0 ? "pos" : "neg"}`]]);
    tr.dataset.node = String(j);
    tr.dataset.weight = String(w);
    table.append(tr);
  }
  wrap.append(table);
  if (list.length > 12) wrap.append(el("p", "note", `and ${list.length - 12} more`));
  return wrap;
}

function showDetail(i) {
  detail.textContent = "";
  if (i === null) { detail.append(el("p", "note", "Hover a node for its edges; click one for its numbers.")); return; }
  const node = nodes[i];
  detail.append(el("h2", "", node.name));
  const facts = el("table", "facts");
  facts.append(row([["kind"], [node.kind + (node.port ? ` (${node.port} input)` : "")]]));
  facts.append(row([["layer"], [layerName(node.layer)]]));
  if (DATA.columns[node.column] !== undefined) {
    facts.append(row([[DATA.kind === "attribution graph" ? "position" : "column"], [`${node.column}: ${shownText(DATA.columns[node.column])}`]]));
  }
  if (node.kind === "feature") facts.append(row([["feature"], [`#${node.index}`]]));
  if (node.value !== null) {
    const tr = row([[valueName(node)], [fmt(node.value), "num"]]);
    tr.dataset.field = "value";
    tr.dataset.raw = String(node.value);
    facts.append(tr);
  }
  if (node.influence !== null) {
    const tr = row([["influence"], [fmt(node.influence), "num"]]);
    tr.title = "the share of the total influence on the output held by the nodes at least as influential as this one";
    facts.append(tr);
  }
  const inputSum = incoming[i].reduce((a, [, w]) => a + w, 0);
  if (incoming[i].length) {
    const tr = row([["inputs shown"], [`${fmt(inputSum)} over ${incoming[i].length} edges`, "num"]]);
    tr.dataset.field = "input-sum";
    tr.dataset.raw = String(inputSum);
    facts.append(tr);
  }
  detail.append(facts);
  const buttons = el("div", "buttons");
  const pin = el("button", "small-button", state.pinned.has(i) ? "Unpin" : "Pin");
  pin.type = "button";
  pin.id = "pin-button";
  pin.addEventListener("click", () => togglePin(i));
  buttons.append(pin);
  detail.append(buttons);
  detail.append(edgeTable("Strongest inputs", incoming[i], "inputs"));
  detail.append(edgeTable("Strongest outputs", outgoing[i], "outputs"));
  const extra = DATA.details[String(i)];
  if (extra) {
    for (const [title, field, cls] of [["Promotes", "promoted", "pos"], ["Suppresses", "suppressed", "neg"]]) {
      if (!extra[field].length) continue;
      detail.append(el("h3", "", `${title} (direct effect on the logits)`));
      const table = el("table");
      table.dataset.field = field;
      for (const [text, logit] of extra[field]) table.append(row([[shownText(text), "who"], [fmt(logit), `num ${cls}`]]));
      detail.append(table);
    }
    if (extra.contexts.length) {
      detail.append(el("h3", "", "Top contexts"));
      for (const context of extra.contexts) {
        const line = el("div", "context");
        const peak = Math.max(...context.acts, 1e-9);
        context.tokens.forEach((token, k) => {
          const span = el("span", "", shownText(token));
          const a = context.acts[k];
          if (a > 0) span.style.background = `rgba(37, 99, 235, ${(0.12 + 0.6 * a / peak).toFixed(2)})`;
          span.title = `${fmt(a)}`;
          line.append(span);
        });
        detail.append(line);
      }
    }
  }
}

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
  drawAll();
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
      drawAll();
    });
    tools.append(name, group);
  }
  state.supernodes.forEach((s, g) => {
    const ungroup = el("button", "small-button", `Ungroup “${s.name}”`);
    ungroup.type = "button";
    ungroup.addEventListener("click", () => { state.supernodes.splice(g, 1); drawAll(); });
    tools.append(ungroup);
  });
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
      nodes: np.nodes,
      links: edges.map(([t, s, w]) => ({ source: ids[s], target: ids[t], weight: w })),
    };
  } else {
    out = { kind: DATA.kind, columns: DATA.columns, nLayers: DATA.nLayers, nodes, edges,
            pinned: [...state.pinned], supernodes: state.supernodes };
  }
  download("graph.json", new Blob([JSON.stringify(out)], { type: "application/json" }));
}

function exportPng() {
  const source = document.querySelector("#graph-scroll svg");
  const text = new XMLSerializer().serializeToString(source);
  const url = URL.createObjectURL(new Blob([text], { type: "image/svg+xml" }));
  const image = new Image();
  image.onload = () => {
    const scale = 2;
    const canvas = document.createElement("canvas");
    canvas.width = source.width.baseVal.value * scale;
    canvas.height = source.height.baseVal.value * scale;
    const ctx = canvas.getContext("2d");
    ctx.scale(scale, scale);
    ctx.drawImage(image, 0, 0);
    URL.revokeObjectURL(url);
    canvas.toBlob((blob) => download("graph.png", blob), "image/png");
  };
  image.src = url;
}

// ---- the page ----

function drawControls() {
  const bar = document.getElementById("controls");
  const range = el("input");
  range.type = "range";
  range.min = "0";
  range.max = "0.5";
  range.step = "0.01";
  range.value = String(state.minShare);
  range.name = "min-share";
  const out = el("span", "muted", "all");
  range.addEventListener("input", () => {
    state.minShare = Number(range.value);
    out.textContent = state.minShare ? `≥ ${Math.round(state.minShare * 100)}% of the largest` : "all";
    drawAll();
  });
  const edgesControl = control("Edges", range);
  edgesControl.append(out);
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

function drawAll() {
  draw(document.getElementById("graph-scroll"), nodes.map((_, i) => i), [], { main: true });
  drawSubgraphTools();
  const sub = document.getElementById("subgraph-scroll");
  if (state.pinned.size) {
    sub.hidden = false;
    draw(sub, [...state.pinned], state.supernodes, { main: false });
  } else {
    sub.hidden = true;
    sub.textContent = "";
  }
  painted();
}

drawCheck();
drawControls();
drawAll();
