"use strict";
// anatomy graph page, its drawing: any graph (an attribution graph, a discovered circuit) laid out by
// graph-layout.js and drawn on one canvas from the numbers the library computed. Shape letters: N nodes,
// M edges. graph-panel.js, graph-circuit.js and graph.js (loaded after this file) add the node panel, a
// circuit's slider and the page around it.
//
// DATA.nodes [N]: {id, kind, layer, column, index, port, label, name, value, influence, roles?};
// DATA.edges [M]: [target, source, weight] (indices into nodes), strongest first. Labels reach the page
// only as text (canvas fillText, textContent).
//
// A view opens with the whole graph in sight (the layout's fit) and zooms (wheel, +, −) and pans (drag);
// the layer names (left) and the column labels (bottom) are drawn in bands of their own that stay in view.
// A selection (state.selected, a box) lights its edges in and out and fades the rest until another click
// or Escape; without one, hovering a box does the same until the pointer leaves it.

const POSITIVE = "#2563eb", NEGATIVE = "#dc2626";
const KIND_STYLE = {  // fill, stroke
  token: ["#e6e9ef", "#8a93a3"], embedding: ["#eef0f4", "#9aa3b2"], feature: ["#6d83a8", "#ffffff"],
  error: ["#aab1bd", "#ffffff"], logit: ["#fff1d6", "#d9a441"], logits: ["#fff1d6", "#d9a441"],
  head: ["#dde6fb", "#7f9ae0"], mlp: ["#e0f0e0", "#86b986"], supernode: ["#ede4fb", "#9b7fd1"],
};
const ROLE_MARK = { "name mover": "NM", "negative name mover": "N−", induction: "In", "previous token": "PT",
                    "duplicate token": "DT" };
const PORT_OFFSET = { q: -0.3, k: 0, v: 0.3, "": 0 };
const PORTS = ["", "q", "k", "v"];
const LEFT = 50, BOTTOM = 26, PAD = 10, MIN_RADIUS = 1.6, FADED = 0.07, SHADES = 12;

const nodes = DATA.nodes;
// edgeLimit: the strongest edges drawn while nothing is selected (a selected node's own are drawn all)
const state = { selected: null, hovered: null, pinned: new Set(), supernodes: [], checked: new Set(), edgeLimit: Infinity,
                cursor: -1, labels: new Map() };
let edges = DATA.edges;  // the edges drawn: all of them, or a circuit's top n (graph-circuit.js)
let incoming = [], outgoing = [];

function setEdges(list) {
  edges = list;
  incoming = nodes.map(() => []);
  outgoing = nodes.map(() => []);
  for (const [t, s, w] of edges) { incoming[t].push([s, w]); outgoing[s].push([t, w]); }
}
setEdges(edges);

const fmt = (x) => (x === null || x === undefined ? "–" : Math.abs(x) >= 100 ? x.toFixed(1) : Math.abs(x) >= 1 ? x.toFixed(3) : x.toPrecision(3));
const layerName = (layer) => (layer < 0 ? "input" : layer >= DATA.nLayers ? "output" : `L${layer}`);
const valueName = (node) => (node.kind === "logit" ? "probability" : node.kind === "feature" ? "activation" : "value");

// [{source box, target box, weight, port, pairs}]: edges between boxes, summed per pair (a supernode's
// together), weakest first. Keyed by number, not by string: a page holds 50,000 edges.
function edgeList(indices, plan) {
  const inside = new Uint8Array(nodes.length);
  for (const i of indices) inside[i] = 1;
  const count = plan.boxes.length;
  const sums = new Map();
  for (const [t, s, w] of edges) {
    if (!inside[t] || !inside[s]) continue;
    const a = plan.boxOf.get(s), b = plan.boxOf.get(t);
    if (a === b) continue;
    const port = b.kind === "supernode" ? "" : nodes[t].port;
    const key = (a.id * count + b.id) * 4 + PORTS.indexOf(port);
    let entry = sums.get(key);
    if (entry === undefined) {
      entry = { source: a, target: b, weight: 0, port, pairs: [] };
      sums.set(key, entry);
    }
    entry.weight += w;
    entry.pairs.push([t, s]);
  }
  return [...sums.values()].filter((e) => Number.isFinite(e.weight) && e.weight !== 0)
    .sort((a, b) => Math.abs(a.weight) - Math.abs(b.weight));
}

class GraphView {
  // container: where the view goes; indices: the nodes it shows; groups: supernodes; maxHeight: its
  // tallest (CSS pixels; the view is as tall as the fitted graph, up to this).
  // maxHeight: a number, or a function of the canvas (its room, measured once it is in the page).
  constructor(container, { indices, groups = [], maxHeight = 640, main = false }) {
    this.container = container;
    this.main = main;
    this.maxHeight = maxHeight;
    container.textContent = "";
    this.canvas = el("canvas", "graph-canvas");
    this.canvas.tabIndex = 0;
    this.canvas.setAttribute("role", "img");
    this.canvas.setAttribute("aria-label", "the graph: click a node for its numbers; arrows move between neighbours");
    const tools = el("div", "view-tools");
    for (const [text, title, action] of [["+", "zoom in", () => this.zoomBy(1.5)], ["−", "zoom out", () => this.zoomBy(1 / 1.5)],
                                         ["fit", "the whole graph", () => { this.fit(); this.draw(); }]]) {
      const button = el("button", "small-button", text);
      button.type = "button";
      button.title = title;
      button.addEventListener("click", action);
      tools.append(button);
    }
    tools.append(el("span", "note", "drag to pan · wheel to zoom"));
    container.append(tools, this.canvas);
    this.listen();
    this.show(indices, groups);
  }

  show(indices, groups = []) {
    this.width = Math.max(200, this.container.clientWidth || 800);
    const room = typeof this.maxHeight === "function" ? this.maxHeight(this.canvas) : this.maxHeight;
    this.plan = packLayout(makeBoxes(indices, groups), DATA.columns.map(shownText),
                           { width: this.width - LEFT - 2 * PAD, height: room - BOTTOM - 2 * PAD });
    this.height = Math.min(room, Math.ceil(this.plan.height * this.plan.fit + BOTTOM + 2 * PAD));
    this.width = Math.min(this.width, Math.ceil(this.plan.width * this.plan.fit + LEFT + 2 * PAD));  // the box fits its content
    this.links = edgeList(indices, this.plan);
    this.ctx = sizeCanvas(this.canvas, this.width, this.height);
    this.fit();
    this.draw();
  }

  fit() {
    const k = this.plan.fit;
    this.k = k;
    this.tx = LEFT + (this.width - LEFT - this.plan.width * k) / 2;
    this.ty = PAD + (this.height - BOTTOM - 2 * PAD - this.plan.height * k) / 2;
  }

  zoomBy(factor, x = (LEFT + this.width) / 2, y = (this.height - BOTTOM) / 2) {
    const k = Math.min(4, Math.max(this.plan.fit / 2, this.k * factor));
    this.tx = x - (x - this.tx) * (k / this.k);
    this.ty = y - (y - this.ty) * (k / this.k);
    this.k = k;
    this.draw();
  }

  // Where box `box` is drawn, in the canvas's CSS pixels: {x, y, w, h} (x, y its centre).
  screen(box) {
    return { x: this.tx + box.x * this.k, y: this.ty + box.y * this.k, w: box.w * this.k, h: box.h * this.k };
  }

  boxAt(x, y) {
    let best = null, distance = Infinity;
    for (const box of this.plan.boxes) {
      const s = this.screen(box);
      const dx = Math.max(0, Math.abs(x - s.x) - Math.max(s.w / 2, 3)), dy = Math.max(0, Math.abs(y - s.y) - Math.max(s.h / 2, 3));
      const d = dx + dy;
      if (d === 0 && Math.hypot(x - s.x, y - s.y) < distance) { best = box; distance = Math.hypot(x - s.x, y - s.y); }
    }
    return best;
  }

  // The box whose neighbourhood is lit: the selection, else the hovered box (main view only).
  focusBox() {
    const i = state.selected ?? state.hovered;
    return i === null ? null : this.plan.boxOf.get(i) || null;
  }

  draw(ctx = this.ctx, width = this.width, height = this.height) {
    const k = this.k, focus = this.focusBox();
    ctx.save();
    ctx.fillStyle = "#ffffff";
    ctx.fillRect(0, 0, width, height);
    ctx.beginPath();
    ctx.rect(LEFT, 0, width - LEFT, height - BOTTOM);
    ctx.clip();
    ctx.strokeStyle = "#eef0f3";
    ctx.lineWidth = 1;
    for (const row of this.plan.rows) {
      const y = this.ty + (row.top + row.height / 2) * k;
      ctx.beginPath(); ctx.moveTo(LEFT, y); ctx.lineTo(width, y); ctx.stroke();
    }
    const near = new Set();
    if (focus) {
      near.add(focus);
      for (const link of this.links) {
        if (link.source === focus) near.add(link.target);
        if (link.target === focus) near.add(link.source);
      }
    }
    this.drawEdges(ctx, focus);
    this.drawBoxes(ctx, focus, near);
    ctx.restore();
    this.drawBands(ctx, width, height, focus);
    if (this.main) painted();
  }

  drawEdges(ctx, focus) {
    const k = this.k;
    const largest = this.links.reduce((m, e) => Math.max(m, Math.abs(e.weight)), 0) || 1;
    const widthScale = Math.min(1.5, Math.max(0.45, Math.sqrt(k)));
    // one stroke per (lit, shade, sign), drawn faint to strong and the lit edges last, on top
    const strokes = new Map();
    const first = Math.max(0, this.links.length - state.edgeLimit);  // links are weakest first
    this.lit = [];
    this.links.forEach((link, j) => {
      const lit = focus !== null && (link.source === focus || link.target === focus);
      if (!lit && j < first) return;
      if (lit) this.lit.push(link);
      const shade = Math.min(SHADES - 1, Math.floor(Math.sqrt(Math.abs(link.weight) / largest) * SHADES));
      const key = (lit ? 2 * SHADES : 0) + 2 * shade + (link.weight > 0 ? 1 : 0);
      if (!strokes.has(key)) strokes.set(key, []);
      strokes.get(key).push(link);
    });
    for (const key of [...strokes.keys()].sort((a, b) => a - b)) {
      const lit = key >= 2 * SHADES, strength = (Math.floor((key % (2 * SHADES)) / 2) + 0.5) / SHADES;
      ctx.strokeStyle = key % 2 ? POSITIVE : NEGATIVE;
      ctx.globalAlpha = focus === null ? 0.12 + 0.55 * strength : lit ? 0.35 + 0.65 * strength : FADED * strength;
      ctx.lineWidth = (0.4 + (lit ? 3.2 : 2.6) * strength * strength) * widthScale;
      ctx.beginPath();
      for (const link of strokes.get(key)) {
        const a = link.source, b = link.target;
        const sx = this.tx + a.x * k, sy = this.ty + (a.y - a.h / 2) * k;
        const tx = this.tx + (b.x + (PORT_OFFSET[link.port] || 0) * b.w) * k, ty = this.ty + (b.y + b.h / 2) * k;
        const my = (sy + ty) / 2;
        ctx.moveTo(sx, sy);
        ctx.bezierCurveTo(sx, my, tx, my, tx, ty);
      }
      ctx.stroke();
    }
    ctx.globalAlpha = 1;
  }

  drawBoxes(ctx, focus, near) {
    const k = this.k;
    ctx.font = `${Math.max(8, Math.min(13, 11 * k))}px ${FONT}`;
    ctx.textAlign = "center";
    ctx.textBaseline = "middle";
    for (const box of this.plan.boxes) {
      const { x, y, w, h } = this.screen(box);
      if (x + w < LEFT - 20 || x - w > this.width + 20 || y + h < -20 || y - h > this.height + 20) continue;
      const [fill, stroke] = KIND_STYLE[box.kind] || KIND_STYLE.feature;
      ctx.globalAlpha = focus === null || near.has(box) ? 1 : 0.18;
      ctx.fillStyle = fill;
      ctx.strokeStyle = stroke;
      ctx.lineWidth = 1;
      ctx.beginPath();
      if (box.kind === "feature") ctx.arc(x, y, Math.max(MIN_RADIUS, w / 2), 0, 2 * Math.PI);
      else ctx.rect(x - Math.max(MIN_RADIUS, w / 2), y - Math.max(MIN_RADIUS, h / 2), Math.max(2 * MIN_RADIUS, w), Math.max(2 * MIN_RADIUS, h));
      ctx.fill();
      if (w > 6) ctx.stroke();
      const pinned = this.main && box.members.some((i) => state.pinned.has(i));
      const selected = state.selected !== null && box.members.includes(state.selected);
      const cursor = state.cursor >= 0 && box.members.includes(state.cursor);
      if (pinned || selected || cursor) {
        ctx.globalAlpha = 1;
        ctx.strokeStyle = selected ? "#1d4ed8" : cursor ? "#e67700" : "#1f2430";
        ctx.lineWidth = selected ? 3 : 2;
        ctx.setLineDash(cursor && !selected ? [3, 2] : []);
        ctx.beginPath();
        const r = Math.max(w, h) / 2 + 3;
        if (box.kind === "feature") ctx.arc(x, y, Math.max(r, 5), 0, 2 * Math.PI);
        else ctx.rect(x - w / 2 - 3, y - h / 2 - 3, w + 6, h + 6);
        ctx.stroke();
        ctx.setLineDash([]);
      }
      if (h >= 12 && w >= 20) {
        ctx.fillStyle = "#1f2430";
        ctx.fillText(clipText(ctx, shownText(box.label), w - 4), x, y + 0.5);
      }
      if (box.roles.length && h >= 10) {
        const mark = box.roles.map((role) => ROLE_MARK[role] || role.slice(0, 2)).join(" ");
        ctx.fillStyle = "#7c3aed";
        ctx.font = `600 ${Math.max(7, Math.min(11, 9 * k))}px ${FONT}`;
        ctx.textAlign = "left";
        ctx.fillText(mark, x + w / 2 + 2, y - h / 2 + 1);  // beside the box's top right corner, clear of its edges
        ctx.textAlign = "center";
        ctx.font = `${Math.max(8, Math.min(13, 11 * k))}px ${FONT}`;
      }
    }
    ctx.globalAlpha = 1;
  }

  // The bands that stay in view: layer names on the left, column labels at the bottom.
  drawBands(ctx, width, height, focus) {
    const k = this.k;
    ctx.save();
    ctx.fillStyle = "#ffffff";
    ctx.fillRect(0, 0, LEFT, height);
    ctx.fillRect(0, height - BOTTOM, width, BOTTOM);
    ctx.strokeStyle = "#d8dce3";
    ctx.beginPath(); ctx.moveTo(LEFT - 0.5, 0); ctx.lineTo(LEFT - 0.5, height - BOTTOM + 0.5); ctx.lineTo(width, height - BOTTOM + 0.5); ctx.stroke();
    ctx.font = `11px ${FONT}`;
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    this.bandLabels = [];  // what the bands show, where (CSS pixels of the canvas): the tests read it
    let lastY = Infinity;
    for (const row of this.plan.rows) {  // top to bottom; a label too close to the last one drawn is left out
      const y = this.ty + (row.top + row.height / 2) * k;
      if (y < 6 || y > height - BOTTOM - 4 || (Number.isFinite(lastY) && y - lastY < 12 && row !== this.plan.rows[this.plan.rows.length - 1])) continue;
      ctx.fillStyle = focus && focus.layer === row.layer ? "#1d4ed8" : "#6b7280";
      ctx.fillText(layerName(row.layer), LEFT - 6, y);
      this.bandLabels.push({ band: "layers", text: layerName(row.layer), x: LEFT - 6, y });
      lastY = y;
    }
    ctx.textAlign = "center";
    ctx.beginPath();
    ctx.rect(LEFT, height - BOTTOM, width - LEFT, BOTTOM);
    ctx.clip();
    let lastRight = -Infinity;
    this.plan.columns.forEach((column, c) => {
      const left = this.tx + column.left * k, w = column.width * k, centre = left + w / 2;
      const label = shownText(DATA.columns[c] ?? "");
      if (!label || centre < LEFT || centre > width) return;
      ctx.font = `${focus && focus.column === c ? "600 " : ""}12px ${FONT}`;
      // the label clipped to its column when that leaves a few letters; else whole (at most 80 px), if it
      // does not run into the last label drawn
      const text = clipText(ctx, label, w + 6 >= 26 ? w + 6 : 80);
      const half = ctx.measureText(text).width / 2;
      if (centre - half < lastRight + 3) return;  // no room beside the last label drawn
      ctx.fillStyle = focus && focus.column === c ? "#1d4ed8" : "#1f2430";
      ctx.fillText(text, centre, height - BOTTOM / 2);
      this.bandLabels.push({ band: "columns", text, column: c, x: centre, y: height - BOTTOM / 2 });
      lastRight = centre + half;
    });
    ctx.restore();
  }

  listen() {
    let drag = null;
    const canvas = this.canvas;
    const local = (event) => { const r = canvas.getBoundingClientRect(); return [event.clientX - r.left, event.clientY - r.top]; };
    canvas.addEventListener("pointerdown", (event) => {
      const [x, y] = local(event);
      drag = { x, y, tx: this.tx, ty: this.ty, moved: false };
      canvas.setPointerCapture(event.pointerId);
    });
    canvas.addEventListener("pointermove", (event) => {
      const [x, y] = local(event);
      if (drag) {
        if (Math.hypot(x - drag.x, y - drag.y) > 3) drag.moved = true;
        if (drag.moved) { this.tx = drag.tx + x - drag.x; this.ty = drag.ty + y - drag.y; this.draw(); }
        return;
      }
      this.hover(this.boxAt(x, y), event);
    });
    canvas.addEventListener("pointerup", (event) => {
      const [x, y] = local(event);
      const clicked = drag && !drag.moved;
      drag = null;
      if (!clicked) return;
      canvas.focus({ preventScroll: true });
      const box = this.boxAt(x, y);
      if (box && event.shiftKey) togglePin(box.kind === "supernode" ? null : box.members[0]);
      else select(box ? box.members[0] : null);
    });
    canvas.addEventListener("pointerleave", () => this.hover(null));
    canvas.addEventListener("wheel", (event) => {
      event.preventDefault();
      const [x, y] = local(event);
      this.zoomBy(Math.exp(-event.deltaY * 0.0015), x, y);
    }, { passive: false });
  }

  hover(box, event) {
    if (box === null) {
      hideTooltip();
      if (state.hovered !== null) { state.hovered = null; if (this.main) this.draw(); }
      return;
    }
    const node = nodes[box.members[0]];
    const label = state.labels.get(box.members[0]) ?? DATA.details[String(box.members[0])]?.label;
    const lines = box.kind === "supernode" ? [`${box.label}: ${box.members.length} nodes`]
      : [box.members.length > 1 && box.kind === "head" ? `L${node.layer} H${node.index}` : node.name,
         ...(label ? [label] : []), ...(box.roles.length ? [box.roles.join(", ")] : []),
         ...(node.value !== null ? [`${valueName(node)} ${fmt(node.value)}`] : []),
         ...(node.influence !== null ? [`influence ${fmt(node.influence)}`] : [])];
    showTooltip(lines.join("\n"), event);
    if (this.main && state.selected === null && state.hovered !== box.members[0]) {
      state.hovered = box.members[0];
      this.draw();
    }
  }
}

function clipText(ctx, text, width) {
  if (ctx.measureText(text).width <= width) return text;
  let shown = text;
  while (shown.length > 1 && ctx.measureText(`${shown}…`).width > width) shown = shown.slice(0, -1);
  return `${shown}…`;
}
