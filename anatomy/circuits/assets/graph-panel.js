"use strict";
// anatomy graph page, the node panel: what a click shows of a box. Its numbers (value, influence), its
// strongest inputs (a head's by its q, k and v inputs) and outputs, each a link to that node; for a
// feature the tokens its decoder direction promotes and suppresses, its top contexts (the token where it
// fires hardest marked) and its label, which the reader may edit (the JSON export's clerp).

const detail = document.getElementById("detail");
const HELP = "Click a node for its numbers; drag to pan, wheel or +/− to zoom. With a node selected: ↑ its strongest " +
             "output, ↓ its strongest input, ←/→ step through its neighbours, Enter follows the marked edge, Escape clears.";

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
    const tr = row([[nodes[j].name, "who", () => select(j)], [fmt(w), `num ${w > 0 ? "pos" : "neg"}`]]);
    tr.dataset.node = String(j);
    tr.dataset.weight = String(w);
    if (state.cursor === j) tr.classList.add("cursor");
    table.append(tr);
  }
  wrap.append(table);
  if (list.length > 12) wrap.append(el("p", "note", `and ${list.length - 12} more`));
  return wrap;
}

// The members of the selected node's box: a head's q, k, v inputs and its output are one box.
function boxMembers(i) {
  const box = views.main && views.main.plan.boxOf.get(i);
  return box ? box.members : [i];
}

function showDetail(i) {
  detail.textContent = "";
  if (i === null) { detail.append(el("p", "note", HELP)); return; }
  const members = boxMembers(i);
  const node = nodes[i];
  const head = node.kind === "head";
  detail.append(el("h2", "", head ? `L${node.layer} H${node.index}` : node.name));
  if (node.roles && node.roles.length) {
    const badges = el("div", "badges");
    for (const role of node.roles) badges.append(el("span", "badge", role));
    detail.append(badges);
  }
  const facts = el("table", "facts");
  facts.append(row([["kind"], [node.kind + (members.length > 1 ? ` (${members.map((m) => nodes[m].port || "output").join(", ")})` : "")]]));
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
  const inputs = members.flatMap((m) => incoming[m]);
  if (inputs.length) {
    const sum = inputs.reduce((a, [, w]) => a + w, 0);
    const tr = row([["inputs shown"], [`${fmt(sum)} over ${inputs.length} edges`, "num"]]);
    tr.dataset.field = "input-sum";
    tr.dataset.raw = String(sum);
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
  const extra = DATA.details[String(i)];
  if (node.kind === "feature") detail.append(labelEditor(i, extra));
  for (const m of members) {
    if (!incoming[m].length && !nodes[m].port) continue;
    detail.append(edgeTable(nodes[m].port ? `Strongest inputs (${nodes[m].port})` : "Strongest inputs", incoming[m], "inputs"));
  }
  const outputs = members.flatMap((m) => outgoing[m]);
  detail.append(edgeTable("Strongest outputs", outputs, "outputs"));
  if (extra) featureDetails(extra);
}

function featureDetails(extra) {
  for (const [title, field, cls] of [["Promotes", "promoted", "pos"], ["Suppresses", "suppressed", "neg"]]) {
    if (!extra[field].length) continue;
    detail.append(el("h3", "", `${title} (direct effect on the logits, centred)`));
    const table = el("table");
    table.dataset.field = field;
    for (const [text, logit] of extra[field]) {
      const tr = row([[shownText(text), "who"], [fmt(logit), `num ${logit > 0 ? "pos" : logit < 0 ? "neg" : ""}`]]);
      tr.dataset.raw = String(logit);
      table.append(tr);
    }
    detail.append(table);
  }
  if (!extra.contexts.length) return;
  detail.append(el("h3", "", "Top contexts"));
  if (DATA.contextsNote) detail.append(el("p", "note", DATA.contextsNote));
  for (const context of extra.contexts) {
    const line = el("div", "context");
    line.dataset.field = "context";
    const peak = Math.max(...context.acts, 1e-9);
    context.tokens.forEach((token, k) => {
      const span = el("span", k === context.peak ? "peak" : "", shownText(token));
      const a = context.acts[k];
      if (a > 0) span.style.background = `rgba(37, 99, 235, ${(0.1 + 0.55 * a / peak).toFixed(2)})`;
      span.title = `${shownText(token)}: ${fmt(a)}`;
      line.append(span);
    });
    detail.append(line);
  }
}

// The feature's label: the library's automatic one ("auto: …") until the reader writes their own.
function labelEditor(i, extra) {
  const wrap = el("div", "label-editor");
  const input = el("input");
  input.type = "text";
  input.id = "label-input";
  input.placeholder = "a label for this feature";
  input.value = state.labels.get(i) ?? extra?.label ?? "";
  input.addEventListener("change", () => {
    state.labels.set(i, input.value.trim());
    note.textContent = "your label (the JSON export's clerp)";
  });
  const note = el("p", "note", state.labels.has(i) ? "your label (the JSON export's clerp)"
    : extra?.label ? "automatic: the tokens it fires on → the token it promotes most; edit it (the JSON export's clerp)" : "");
  wrap.append(el("h3", "", "Label"), input, note);
  return wrap;
}

// ---- selection and the keyboard ----

function select(i) {
  state.selected = i;
  state.cursor = -1;
  state.hovered = null;
  redraw();
  showDetail(i);
}

// The selected box's neighbours, strongest edge first: [[node, weight, "in" | "out"]].
function neighbours(i) {
  const members = boxMembers(i);
  const own = new Set(members);
  const list = [...members.flatMap((m) => incoming[m].map(([j, w]) => [j, w, "in"])),
                ...members.flatMap((m) => outgoing[m].map(([j, w]) => [j, w, "out"]))].filter(([j]) => !own.has(j));
  return list.sort((a, b) => Math.abs(b[1]) - Math.abs(a[1]));
}

document.addEventListener("keydown", (event) => {
  if (event.target instanceof HTMLInputElement || event.target instanceof HTMLTextAreaElement) return;
  const view = views.main;
  if (event.key === "Escape") { if (state.selected !== null) select(null); return; }
  if (event.key === "+" || event.key === "=") { view.zoomBy(1.5); return; }
  if (event.key === "-") { view.zoomBy(1 / 1.5); return; }
  if (event.key === "0") { view.fit(); view.draw(); return; }
  if (state.selected === null || !["ArrowUp", "ArrowDown", "ArrowLeft", "ArrowRight", "Enter"].includes(event.key)) return;
  event.preventDefault();
  const list = neighbours(state.selected);
  if (!list.length) return;
  if (event.key === "ArrowUp" || event.key === "ArrowDown") {
    const next = list.find(([, , side]) => side === (event.key === "ArrowUp" ? "out" : "in"));
    if (next) select(next[0]);
    return;
  }
  if (event.key === "Enter") { select(state.cursor >= 0 ? state.cursor : list[0][0]); return; }
  const at = list.findIndex(([j]) => j === state.cursor);
  const step = event.key === "ArrowRight" ? 1 : -1;
  state.cursor = list[(at < 0 ? (step > 0 ? 0 : list.length - 1) : (at + step + list.length) % list.length)][0];
  redraw();
  showDetail(state.selected);
});
