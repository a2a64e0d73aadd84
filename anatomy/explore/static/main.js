// anatomy explore: the input, the tokens and the next token, and the panels below, kept in step.
import {
  abortAll, api, clear, currentModel, el, errorBox, exportUrl, isAbort, markFresh, panels, percent, saveState,
  shareLink, state, status, textBody,
} from "./core.js";
import "./panel-walk.js";
import "./panel-attention.js";
import "./panel-lens.js";
import "./panel-attribution.js";
import "./panel-intervene.js";
import "./panel-heads.js";
import "./panel-features.js";
import "./panel-compare.js";
import "./panel-discover.js";
import "./panel-circuit.js";

const TABS = [["walk", "Walk"], ["attention", "Attention"], ["lens", "Lens"], ["attribution", "Attribution"],
              ["intervene", "Intervene"], ["heads", "Heads"], ["features", "Features"], ["compare", "Compare"],
              ["circuit", "Circuit"], ["discover", "Discover"]];
const DEFAULT_TEXT = {
  decoder: "The capital of France is",
  encoder: "The capital of France is [MASK].",
  "encoder-decoder": "Hello World, this is Alejandro!",
};

const textBox = document.getElementById("text");
const targetBox = document.getElementById("target");
const sampling = {temperature: document.getElementById("temperature"), topK: document.getElementById("top-k"),
                  topP: document.getElementById("top-p")};

function samplingSettings() {
  const topK = Number(sampling.topK.value);
  const topP = Number(sampling.topP.value);
  return {temperature: Number(sampling.temperature.value), top_k: topK > 0 ? topK : null, top_p: topP < 1 ? topP : null};
}

// ---- the first call for a text: tokens and the next-token distribution --------------------------

// The text, the model or a sampling setting changed: whatever was asked for the last text is
// cancelled, every panel says it is updating (or, with no text, shows the empty state), and the
// new text is asked for at once, no pause waited for: the server runs the newest request first and
// drops the ones a later keystroke cancelled before they start (explore/lanes.py).
function changed() {
  state.text = textBox.value;
  state.target = targetBox.value;
  saveState();
  state.generation += 1;
  abortAll();
  if (state.text === "") return showEmpty();
  document.querySelector("main.right").classList.remove("empty");
  for (const name of ["tokens", "next"]) markFresh(name, "updating");
  for (const [name] of TABS) markFresh(name, name === state.panel ? "updating" : "stale");
  run();
}

async function run() {
  const generation = state.generation;
  const began = performance.now();
  status("computing…", "busy");
  let data;
  try {
    data = await api("/api/run", textBody(samplingSettings()), "run");
  } catch (error) {
    if (isAbort(error) || generation !== state.generation) return;
    status("", "");
    // Nothing below describes this text: say so, rather than show the last text's numbers as its.
    state.run = null;
    clear(document.getElementById("tokens"));
    document.getElementById("token-count").textContent = "";
    clear(document.getElementById("next"), errorBox(error));
    document.getElementById("next-summary").textContent = "";
    document.querySelector("main.right").classList.add("stale");
    for (const name of ["tokens", "next"]) markFresh(name, "error");
    for (const [name] of TABS) markFresh(name, "stale");
    return;
  }
  if (generation !== state.generation) return;
  document.querySelector("main.right").classList.remove("stale");
  state.run = data;
  drawTokens(data);
  drawNext(data);
  for (const name of ["tokens", "next"]) markFresh(name, "current");
  document.body.dataset.updated = String(Date.now());  // the tests wait for this
  status(`${Math.round(performance.now() - began)} ms (pass ${data.ms} ms, ${data.computed} of ${data.tokens.length} positions computed)`, "");
  updatePanel();
}

// No text: no request (the server would refuse it), and every panel says what to do.
function showEmpty() {
  state.run = null;
  status("", "");
  clear(document.getElementById("tokens"));
  document.getElementById("token-count").textContent = "";
  clear(document.getElementById("next"), el("p", {class: "muted empty-note", text: "Type a text: its tokens and the model's next token appear here."}));
  document.getElementById("next-summary").textContent = "";
  const right = document.querySelector("main.right");
  right.classList.remove("stale");
  right.classList.add("empty");
  for (const name of ["tokens", "next", ...TABS.map(([n]) => n)]) markFresh(name, "empty");
}

function chip(token, id, position, onclick) {
  return el("button", {class: "chip", type: "button", title: `position ${position}, id ${id}`, onclick},
            el("span", {class: "tok", text: token}), el("span", {class: "id", text: String(id)}));
}

// The chip of the row the walk and the attention follow (state.row), outlined.
function markRow(box) {
  [...box.children].forEach((node, i) => node.classList.toggle("selected", i === state.row));
}

// The chips of a text; a keystroke's text shares all but its last tokens with the one before, and
// their chips stay (a 500-token text redraws a few chips, not 500).
function drawTokens(data) {
  const box = document.getElementById("tokens");
  const kept = [...box.children].findIndex((node, i) => node.dataset.token !== `${data.ids[i]} ${data.tokens[i]}`);
  const keep = kept === -1 ? Math.min(box.children.length, data.tokens.length) : kept;
  while (box.children.length > keep) box.lastChild.remove();
  box.append(...data.tokens.slice(keep).map((token, j) => {
    const i = keep + j;
    const node = chip(token, data.ids[i], i, () => {
      state.row = i;
      saveState();
      markRow(box);
      updatePanel();
    });
    node.dataset.token = `${data.ids[i]} ${token}`;
    return node;
  }));
  markRow(box);
  document.getElementById("token-count").textContent = `(${data.tokens.length}${data.source ? " in the target" : ""})`;
  const source = document.getElementById("source-tokens");
  source.hidden = !data.source;
  if (data.source) {
    clear(source, el("span", {class: "muted small", text: "source: "}),
          data.source.tokens.map((token, i) => chip(token, data.source.ids[i], -1, null)));
  }
}

function drawNext(data) {
  const box = document.getElementById("next");
  const title = document.getElementById("next-title");
  const summary = document.getElementById("next-summary");
  const dist = data.distribution;
  if (data.arch === "encoder") title.textContent = "The masked word's candidates";
  else if (data.arch === "encoder-decoder") title.textContent = "The translation's next token";
  else title.textContent = "Next token";
  if (!dist) {
    clear(box, el("p", {class: "muted", text: data.note || "no prediction here"}));
    summary.textContent = "";
    return;
  }
  const top = dist.next[0].prob;
  const rows = dist.next.map((row) => el("div", {class: `bar-row${row.kept ? "" : " dropped"}`,
                                                 title: `id ${row.id}: p = ${row.prob.toPrecision(4)}; sampling: ${row.sample_prob.toPrecision(4)}`},
    el("span", {class: "bar-label tok", text: row.token}),
    el("span", {class: "bar-track"}, barFill(row.prob / top)),
    el("span", {class: "bar-value", text: percent(row.prob)}),
    data.arch === "decoder" ? el("button", {class: "append", type: "button", title: "append this token to the text",
                                            text: "+", onclick: () => append(row.text)}) : null));
  const lead = data.arch === "encoder-decoder"
    ? el("p", {class: "small"}, el("b", {text: data.translated ? "The model's translation: " : "Target: "}),
         el("span", {class: "tok", text: data.target}))
    : el("p", {class: "small muted", text: `${data.arch === "encoder" ? "at" : "after"} “${dist.after}” (position ${dist.position})`});
  clear(box, lead, rows);
  summary.textContent = `sampling keeps ${dist.kept} token${dist.kept === 1 ? "" : "s"}, ${percent(dist.kept_mass)} of the probability` +
    (dist.kept < dist.next.length ? "; struck-through tokens are never sampled" : "");
}

function barFill(fraction) {
  const fill = el("span", {class: "bar-fill"});
  fill.style.width = `${Math.max(0.5, 100 * fraction)}%`;
  return fill;
}

function append(text) {
  textBox.value += text;
  changed();
}

// ---- models -----------------------------------------------------------------------------------

async function loadModels() {
  const data = await api("/api/models");
  state.models = data.models;
  const select = document.getElementById("model");
  clear(select, data.models.map((m) => el("option", {value: m.name, text: m.name})));
  if (!data.models.some((m) => m.name === state.model)) state.model = data.models[0].name;
  select.value = state.model;
  select.addEventListener("change", () => {
    state.model = select.value;
    state.layer = 0;
    state.head = 0;
    state.row = null;
    configureInput(true);
    changed();
  });
}

function configureInput(resetText) {
  const model = currentModel();
  const arch = model.arch || "decoder";
  document.getElementById("target-box").hidden = arch !== "encoder-decoder";
  document.getElementById("text-label").textContent = arch === "encoder-decoder" ? "Source" : "Text";
  const note = document.getElementById("input-note");
  note.textContent = arch === "encoder" ? "An encoder guesses masked words: type the model's mask token where one is missing."
    : arch === "encoder-decoder" ? "The encoder reads the source; the decoder writes the target (left empty, the model translates)."
    : "The model reads the text and predicts what comes next.";
  const info = document.getElementById("model-info");
  info.textContent = model.n_layers ? `${arch}, ${model.n_layers} layers × ${model.n_heads} heads, d_model ${model.d_model}` : arch;
  if (resetText || state.text === null) {
    textBox.value = model.name && model.name.startsWith("toy") ? toyText(model) : DEFAULT_TEXT[arch];
    targetBox.value = "";
  }
}

function toyText(model) {
  if (model.arch === "encoder") return "Hello World, this <MASK> Alejandro!";
  if (model.arch === "encoder-decoder") return "Hello World, this is Alejandro!";
  return "Hello World, this is";
}

// ---- the panels below -------------------------------------------------------------------------

function drawTabs() {
  const nav = document.getElementById("panel-tabs");
  clear(nav, TABS.map(([name, label]) => el("button", {
    type: "button", class: state.panel === name ? "tab active" : "tab", text: label, "aria-pressed": String(state.panel === name),
    onclick: () => { state.panel = name; saveState(); drawTabs(); updatePanel(); },
  })));
  for (const [name] of TABS) document.querySelector(`[data-panel="${name}"]`).hidden = name !== state.panel;
}

// The open panel, for the current text; its badge says when it shows it.
let panelCall = 0;
async function updatePanel() {
  const name = state.panel;
  const panel = panels.get(name);
  if (!panel) return;
  if (!state.run) {
    markFresh(name, state.text === "" ? "empty" : "stale");
    return;
  }
  const call = ++panelCall;
  const generation = state.generation;
  markFresh(name, "updating");
  let fresh = "current";
  try {
    fresh = (await panel.update()) || "current";
  } catch (error) {
    if (!isAbort(error)) console.error(error);
  }
  if (call === panelCall && generation === state.generation) markFresh(name, fresh);
}

// The exports: every panel's page (as `anatomy viz` / `anatomy analyze` write it), PNG and JSON.
function drawExports() {
  for (const holder of document.querySelectorAll("[data-export]")) {
    const panel = holder.dataset.export;
    const extra = () => (panels.get(panel)?.exportSettings?.() || {});
    clear(holder, ["html", "png", "json"].filter((f) => !(panel === "walk" && f === "png")).map((format) =>
      el("a", {class: "export", href: "#", text: format.toUpperCase(), title: `download this panel as ${format}`,
               onclick: (event) => { event.preventDefault(); location.href = exportUrl(panel, format, extra()); }})));
  }
}

// ---- wiring ---------------------------------------------------------------------------------------

async function start() {
  try {
    await loadModels();
  } catch (error) {
    clear(document.querySelector(".layout"), errorBox(error));
    return;
  }
  configureInput(false);
  if (state.text !== null) textBox.value = state.text;
  if (state.target) targetBox.value = state.target;
  textBox.addEventListener("input", changed);
  targetBox.addEventListener("input", changed);
  for (const input of Object.values(sampling)) input.addEventListener("input", () => {
    document.getElementById("temperature-out").textContent = Number(sampling.temperature.value).toFixed(2);
    document.getElementById("top-p-out").textContent = Number(sampling.topP.value).toFixed(2);
    changed();
  });
  document.getElementById("share").addEventListener("click", async () => {
    await navigator.clipboard?.writeText(shareLink()).catch(() => {});
    status("link copied", "");
  });
  drawTabs();
  drawExports();
  changed();
}

start();
