"use strict";
// anatomy graph page, a discovered circuit's growth: DATA.circuit holds its faithfulness curve (the share of
// the clean − corrupted gap the top n edges recover, every other edge ablated, at the sizes measured) and
// the size the page opens on (the smallest circuit reaching the target). A slider steps through the
// measured sizes that the page holds edges for; the graph shows the top n edges (DATA.edges is strongest
// first) and the nodes they touch, and the curve beside it marks where the slider is.

// [[n, faithfulness]] for the slider: the measured sizes the page holds edges for, and the size it opens
// on (`--edges N`: not measured, its faithfulness null).
function circuitSizes() {
  const circuit = DATA.circuit;
  const points = circuit.sizes.map((n, i) => [n, circuit.values[i]]).filter(([n]) => n <= DATA.edges.length);
  if (circuit.size && !circuit.sizes.includes(circuit.size)) points.push([circuit.size, null]);
  return points.sort((a, b) => a[0] - b[0]);
}

// The nodes the top n edges touch, with the graph's inputs and outputs always.
function circuitNodes(n) {
  const used = new Set();
  nodes.forEach((node, i) => { if (node.kind === "embedding" || node.kind === "logits") used.add(i); });
  for (const [t, s] of DATA.edges.slice(0, n)) { used.add(t); used.add(s); }
  return [...used].sort((a, b) => a - b);
}

function curveFigure(points, target, chosen) {
  const width = 300, height = 150, left = 34, bottom = 22, top = 8, right = 10;
  const measured = points.filter(([, v]) => v !== null);
  const values = measured.map(([, v]) => v);
  const low = Math.min(0, ...values), high = Math.max(1, ...values);
  const last = Math.max(2, points[points.length - 1][0]);
  const x = (n) => left + (width - left - right) * Math.log10(n) / Math.log10(last);
  const y = (v) => top + (height - top - bottom) * (high - v) / (high - low);
  const node = (tag, attributes) => {
    const made = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [key, value] of Object.entries(attributes)) made.setAttribute(key, String(value));
    return made;
  };
  const figure = node("svg", { viewBox: `0 0 ${width} ${height}`, class: "curve", role: "img",
                               "aria-label": "faithfulness against circuit size" });
  figure.append(node("line", { x1: left, x2: width - right, y1: y(target), y2: y(target), class: "target" }));
  figure.append(node("line", { x1: left, x2: left, y1: top, y2: height - bottom, class: "axis" }));
  figure.append(node("line", { x1: left, x2: width - right, y1: height - bottom, y2: height - bottom, class: "axis" }));
  figure.append(node("polyline", { points: measured.map(([n, v]) => `${x(n)},${y(v)}`).join(" "), class: "line" }));
  const marker = node("line", { x1: x(chosen), x2: x(chosen), y1: top, y2: height - bottom, class: "marker" });
  marker.dataset.size = String(chosen);
  figure.append(marker);
  measured.forEach(([n, v]) => {
    const dot = node("circle", { cx: x(n), cy: y(v), r: n === chosen ? 4.5 : 2.5, class: n === chosen ? "chosen" : "dot" });
    const title = node("title", {});
    title.textContent = `${n} edges: ${fmt(v)}`;
    dot.append(title);
    figure.append(dot);
  });
  for (const v of [0, target, 1]) {
    const label = node("text", { x: left - 4, y: y(v) + 3.5, "text-anchor": "end", class: "tick" });
    label.textContent = String(v);
    figure.append(label);
  }
  for (const n of [1, last]) {
    const label = node("text", { x: x(n), y: height - 6, "text-anchor": n === 1 ? "start" : "end", class: "tick" });
    label.textContent = `${n.toLocaleString()} edge${n === 1 ? "" : "s"}`;
    figure.append(label);
  }
  return figure;
}

function drawCircuitControls() {
  const box = document.getElementById("circuit-growth");
  if (!DATA.circuit) return null;
  const points = circuitSizes();
  if (!points.length) return null;
  box.hidden = false;
  const circuit = DATA.circuit;
  const opening = points.findIndex(([n]) => n === circuit.size);
  const range = el("input");
  range.type = "range";
  range.min = "0";
  range.max = String(points.length - 1);
  range.step = "1";
  range.value = String(opening >= 0 ? opening : points.length - 1);
  range.name = "circuit-size";
  range.setAttribute("aria-label", "circuit size (edges)");
  const said = el("p", "growth-said");
  said.id = "circuit-said";
  const figure = el("div", "growth-curve");
  const update = () => {
    const [n, value] = points[Number(range.value)];
    state.circuitSize = n;
    said.textContent = `the top ${n.toLocaleString()} of ${(circuit.edges ?? DATA.edgesInGraph).toLocaleString()} edges ` +
      (value === null ? "(faithfulness not measured at this size)" : `recover ${fmt(value)} of the gap`) +
      (n === circuit.smallest ? ` (the smallest circuit reaching ${circuit.target})` : "");
    figure.textContent = "";
    figure.append(curveFigure(points, circuit.target, n));
    setEdges(DATA.edges.slice(0, n));
    if (state.selected !== null && !circuitNodes(n).includes(state.selected)) { state.selected = null; }
    drawAll();
    showDetail(state.selected);
  };
  range.addEventListener("input", update);
  const label = el("label", "control");
  label.append(el("span", "label", "Circuit"), range);
  const left = el("div", "growth-control");
  left.append(label, said);
  box.append(left, figure);
  return update;
}
