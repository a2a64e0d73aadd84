"use strict";
// anatomy graph page, why attention attends (DATA.attention: circuits/attention_edges.py's record). A selected
// node's explained edges (into it, then out of it) are listed under its panel, and its inputs that have one
// are marked; an edge opens to the heads it crosses (each head's part, its share of the edge, the (query, key)
// position pairs that carry it), and a head to its QK attribution: its score at that pair split into pairs of
// positions and of nodes (query side x key side), each side's marginals, the terms of no node and the identity
// with its difference. Every number is the library's; every label is set as text. This file only reads the
// panel the page draws (#detail, its inputs table's rows by data-node) and calls select().

const qkData = DATA.attention;
const qkIndex = new Map(nodes.map((node, i) => [node.id, i]));

function qkName(id) {
  const known = qkData.nodes[id];
  return known ? shownText(known.name) : id;
}

function qkCell(text, className, onClick) {
  const td = el("td", className || "", text);
  if (onClick) { td.addEventListener("click", onClick); td.classList.add("who"); }
  return td;
}

function qkTermCell(value) {
  return qkCell(fmt(value), `num ${value > 0 ? "pos" : value < 0 ? "neg" : ""}`);
}

// A table of [label cells..., value] rows; a label that names a node of the graph selects it when clicked.
function qkTable(field, head, rows) {
  const table = el("table", "qk-table");
  table.dataset.field = field;
  const tr = el("tr");
  for (const text of head) tr.append(el("th", "", text));
  table.append(tr);
  for (const cells of rows) {
    const line = el("tr");
    for (const cell of cells) line.append(cell);
    table.append(line);
  }
  return table;
}

function qkNodeCell(id) {
  const i = qkIndex.get(id);
  return qkCell(qkName(id), "", i === undefined ? null : () => select(i));
}

function qkPosition(p) {
  return `${shownText(DATA.columns[p] ?? String(p))} @${p}`;
}

function qkDetail(qk) {
  const box = el("div", "qk-detail");
  box.dataset.layer = String(qk.layer);
  box.dataset.head = String(qk.head);
  box.append(el("h4", "", `L${qk.layer} H${qk.head} at ${qkPosition(qk.query)} → ${qkPosition(qk.key)}: ` +
                           `attention ${fmt(qk.pattern)}, score ${fmt(qk.score)}`));
  const difference = qk.score - qk.pair_total - Object.values(qk.no_node).reduce((a, b) => a + b, 0);
  const check = el("p", "note qk-check", qk.check);
  check.dataset.difference = String(difference);
  box.append(check);
  for (const note of qk.notes) box.append(el("p", "note", note));
  box.append(el("h5", "", "Pairs of positions (their nodes' pair terms, summed)"));
  box.append(qkTable("position-pairs", ["query side", "key side", "term"],
                     qk.position_pairs.map(([q, k, v]) => [qkCell(qkPosition(q)), qkCell(qkPosition(k)), qkTermCell(v)])));
  box.append(el("h5", "", "Pairs of nodes"));
  box.append(qkTable("pairs", ["query side", "key side", "term"],
                     qk.pairs.map(([q, k, v]) => [qkNodeCell(q), qkNodeCell(k), qkTermCell(v)])));
  const sides = el("div", "qk-sides");
  for (const [title, field, list] of [["Query side", "query-marginals", qk.query_marginals],
                                      ["Key side", "key-marginals", qk.key_marginals]]) {
    const side = el("div");
    side.append(el("h5", "", `${title} (each node against the whole other side)`));
    side.append(qkTable(field, ["node", "term"], list.map(([id, v]) => [qkNodeCell(id), qkTermCell(v)])));
    sides.append(side);
  }
  box.append(sides);
  box.append(el("h5", "", "Terms of no node (biases, positions, the first position)"));
  box.append(qkTable("no-node", ["terms", "value"], Object.entries(qk.no_node).map(([name, v]) => [qkCell(name), qkTermCell(v)])));
  return box;
}

function qkEdgeBlock(edge, open) {
  const block = el("div", "qk-edge");
  block.dataset.target = edge.target;
  block.dataset.source = edge.source;
  const toggle = el("button", "qk-toggle", `${qkName(edge.source)} → ${qkName(edge.target)}: ${fmt(edge.edge)}`);
  toggle.type = "button";
  const body = el("div", "qk-body");
  body.hidden = !open;
  toggle.addEventListener("click", () => { body.hidden = !body.hidden; });
  block.append(toggle, body);
  body.append(el("p", "note", edge.check));
  const shown = el("div");
  const rows = edge.heads.map((h) => {
    const open = () => {
      shown.textContent = "";
      if (h.qk !== null) shown.append(qkDetail(qkData.qk[h.qk]));
    };
    const pairs = h.pairs.slice(0, 2).map(([q, k, v]) => `${q}←${k} ${fmt(v)}`).join(", ");
    const label = `L${h.layer} H${h.head}` + (h.qk !== null ? " ▸" : "");
    return [qkCell(label, h.qk !== null ? "qk-head" : "", h.qk !== null ? open : null), qkTermCell(h.part),
            qkCell(h.share === null ? "–" : `${(100 * h.share).toFixed(1)}%`, "num"), qkCell(pairs, "note")];
  });
  body.append(qkTable("heads", ["head", "part", "share", "query ← key"], rows));
  const rest = [["residual", edge.residual], ["skips", edge.skips]].filter(([, v]) => v !== 0);
  if (rest.length) body.append(el("p", "note", rest.map(([name, v]) => `${name} ${fmt(v)}`).join(", ")));
  body.append(shown);
  const first = edge.heads.find((h) => h.qk !== null);
  if (first && open) shown.append(qkDetail(qkData.qk[first.qk]));
  return block;
}

function qkSection(i) {
  const id = nodes[i].id;
  const into = qkData.edges.filter((e) => e.target === id);
  const from = qkData.edges.filter((e) => e.source === id);
  if (!into.length && !from.length) return null;
  const section = el("section", "qk");
  section.id = "qk-section";
  section.append(el("h3", "", "Why attention moved it"));
  section.append(el("p", "note", qkData.check));
  into.forEach((edge, n) => section.append(qkEdgeBlock(edge, n === 0)));
  from.forEach((edge) => section.append(qkEdgeBlock(edge, false)));
  return section;
}

// After the page draws a node's panel: the section, and a mark on each input row whose edge is explained.
function qkDecorate() {
  const i = state.selected;
  if (i === null || i === undefined || detail.querySelector("#qk-section")) return;
  const section = qkSection(i);
  if (!section) return;
  const explained = new Set(qkData.edges.filter((e) => e.target === nodes[i].id).map((e) => e.source));
  for (const tr of detail.querySelectorAll('table[data-field="inputs"] tr[data-node]')) {
    const source = nodes[Number(tr.dataset.node)];
    if (!source || !explained.has(source.id)) continue;
    const mark = el("button", "qk-mark", "heads");
    mark.type = "button";
    mark.title = "the heads this edge crosses, and why they attended there";
    mark.addEventListener("click", () => {
      const block = section.querySelector(`.qk-edge[data-source="${CSS.escape(source.id)}"]`);
      block.querySelector(".qk-body").hidden = false;
      block.scrollIntoView({ block: "nearest" });
    });
    const td = el("td");
    td.append(mark);
    tr.append(td);
  }
  detail.append(section);
}

if (qkData && qkData.edges.length) {
  new MutationObserver(qkDecorate).observe(detail, { childList: true });
}
