// The walk: the real pass, step by step, for a chosen layer, head and row (anatomy.walk's builders;
// the steps arrive as the HTML anatomy's walk renderer writes: MathML, shaded matrices, the worked
// row, the float64 check).
import {api, clear, currentModel, currentRow, el, errorBox, isAbort, numberSelect, register, saveState, state, textBody} from "./core.js";

const controls = document.getElementById("walk-controls");
const summary = document.getElementById("walk-summary");
const steps = document.getElementById("walk-steps");

function drawControls() {
  const model = currentModel();
  clear(controls,
    numberSelect("layer", model.n_layers || 1, state.layer, (v) => { state.layer = v; saveState(); update(); }),
    numberSelect("head", model.n_heads || 1, state.head, (v) => { state.head = v; saveState(); update(); }),
    el("span", {class: "muted small", text: "the row worked by hand: click a token"}));
}

async function update() {
  drawControls();
  summary.textContent = "computing the walk…";
  let data;
  try {
    data = await api("/api/walk", textBody({layer: state.layer, head: state.head, row: currentRow()}), "walk");
  } catch (error) {
    if (isAbort(error)) return;
    summary.textContent = "";
    clear(steps, errorBox(error));
    return;
  }
  summary.className = data.ok ? "check ok" : "check warn";
  summary.textContent = `${data.ok ? "✓" : "!"} ${data.steps.length} steps, ${data.checks} checks: ` +
    (data.ok ? "every recomputation in float64 matches the model's own tensors" : "a recomputation differs from the model") +
    ` (largest |diff| ${data.worst.toExponential(1)}); layer ${data.layer}, head ${data.head}, row ${data.row}`;
  const contents = el("ol", {class: "walk-contents"}, data.steps.map((s) =>
    el("li", {}, el("a", {href: `#`, text: s.title, class: s.ok ? "" : "bad",
                          onclick: (event) => { event.preventDefault(); document.getElementById(`step-${s.number}`)?.scrollIntoView({block: "start"}); }}))));
  const body = document.createElement("div");
  // The walk renderer's own HTML: every token and label in it escaped by anatomy (render_html.py).
  body.innerHTML = data.steps.map((s) => s.html).join("");
  clear(steps, el("details", {class: "contents"}, el("summary", {text: "Steps"}), contents), body);
}

register("walk", {update});
