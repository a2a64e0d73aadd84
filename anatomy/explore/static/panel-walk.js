// The walk: the real pass, step by step, for a chosen layer, head and row (anatomy.walk's builders).
// Every step is listed with its check; a step's body (the HTML anatomy's walk renderer writes: MathML,
// shaded matrices, the worked row, the float64 check) comes when the step is opened, and the steps
// that cost as much as a pass (the float64 logits over the whole vocabulary) are only computed then.
import {api, clear, currentModel, currentRow, el, errorBox, isAbort, numberSelect, register, saveState, state, textBody} from "./core.js";

const controls = document.getElementById("walk-controls");
const summary = document.getElementById("walk-summary");
const steps = document.getElementById("walk-steps");
const opened = new Set([1]);  // the step numbers open: the first one, then the reader's

function drawControls() {
  const model = currentModel();
  clear(controls,
    numberSelect("layer", model.n_layers || 1, state.layer, (v) => { state.layer = v; saveState(); update(); }),
    numberSelect("head", model.n_heads || 1, state.head, (v) => { state.head = v; saveState(); update(); }),
    el("span", {class: "muted small", text: "the row worked by hand: click a token; open a step to see its numbers"}));
}

async function update() {
  drawControls();
  let data;
  try {
    data = await api("/api/walk", textBody({layer: state.layer, head: state.head, row: currentRow(), open: [...opened]}), "walk");
  } catch (error) {
    if (isAbort(error)) return;
    summary.textContent = "";
    clear(steps, errorBox(error));
    return;
  }
  summary.className = data.ok ? "check ok" : "check warn";
  summary.textContent = `${data.ok ? "✓" : "!"} ${data.steps.length} steps, ${data.checks} checks: ` +
    (data.ok ? "every recomputation in float64 matches the model's own tensors" : "a recomputation differs from the model") +
    ` (largest |diff| ${data.worst.toExponential(1)}); layer ${data.layer}, head ${data.head}, row ${data.row}` +
    (data.later ? `; ${data.later} step${data.later === 1 ? "" : "s"} as costly as a pass computed when opened` : "");
  clear(steps, data.steps.map(stepBox));
}

function stepBox(s) {
  const mark = s.ok === null ? el("span", {class: "later", title: "computed when opened", text: "○"})
    : el("span", {class: s.ok ? "ok" : "bad", text: s.ok ? "✓" : "✗"});
  const box = el("details", {class: "step", "data-step": String(s.number), open: opened.has(s.number)},
                 el("summary", {}, mark, ` ${s.number}. `, el("span", {class: "muted small", text: `${s.section} · `}), s.title));
  if (s.html !== null) {
    const content = document.createElement("div");
    // The walk renderer's own HTML: every token and label in it escaped by anatomy (render_html.py).
    content.innerHTML = s.html;
    box.append(content);
  }
  box.addEventListener("toggle", () => {
    if (box.open === opened.has(s.number)) return;
    if (box.open) opened.add(s.number); else opened.delete(s.number);
    if (box.open && s.html === null) update();
  });
  return box;
}

register("walk", {update});
