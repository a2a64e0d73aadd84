"use strict";
// anatomy graph page, what a reader does with it: a node's numbers (its value, its strongest inputs and outputs,
// what it promotes, where it fires), pinning nodes into a subgraph, supernodes, the exports (Neuronpedia's
// JSON, PNG). The drawing is graph-draw.js's (loaded before this file).

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
drawIntervention();
drawAll();
