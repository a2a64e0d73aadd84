// Head detection: previous-token, induction and duplicate-token scores of every head, on repeated
// random tokens (anatomy.detect_heads), computed once per model as a job.
import {api, clear, colourBar, el, errorBox, followJob, heatGrid, progressBar, register, state} from "./core.js";

const controls = document.getElementById("heads-controls");
const body = document.getElementById("heads-body");
let kind = "induction";
const cache = new Map();  // model -> scores

function draw(data) {
  const scores = data.scores[kind];
  const heads = [...Array(data.n_heads).keys()].map((h) => `H${h}`);
  const layers = [...Array(data.n_layers).keys()].map((l) => `L${l}`);
  clear(controls, el("span", {class: "segmented"}, data.kinds.map((k) => el("button", {
    type: "button", class: k === kind ? "active" : "", text: k.replace("_", "-"), onclick: () => { kind = k; draw(data); }}))));
  clear(body, el("p", {class: "check ok", text: `✓ ${scores.check}`}),
        heatGrid(layers, heads, scores.values, {extent: 1, corner: "layer \\ head",
                 text: (r, c) => scores.values[r][c] >= 0.05 ? scores.values[r][c].toFixed(2).replace(/^0/, "") : ""}),
        colourBar(1, "mean attention to the expected token", false));
}

async function update() {
  if (cache.has(state.model)) return draw(cache.get(state.model));
  const progress = el("div", {text: "scoring every head…"});
  clear(body, progress);
  try {
    const job = await api("/api/jobs", {kind: "heads", model: state.model});
    const done = await followJob(job, (s) => clear(progress, "scoring: ", progressBar(s.done, s.total), " kinds"));
    cache.set(state.model, done.result);
    draw(done.result);
  } catch (error) {
    clear(body, errorBox(error));
  }
}

register("heads", {update, exportSettings: () => ({kind})});
