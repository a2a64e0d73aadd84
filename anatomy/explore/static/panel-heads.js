// Head detection: previous-token, induction and duplicate-token scores of every head, on repeated
// random tokens (anatomy.detect_heads), computed once per model as a job, each kind drawn by the
// page `anatomy analyze heads` writes, in the page (analysis.js).
import {api, clear, drawPayload, el, errorBox, followJob, isAbort, progressBar, register, state} from "./core.js";

const controls = document.getElementById("heads-controls");
const body = document.getElementById("heads-body");
const KINDS = [["previous_token", "previous-token"], ["induction", "induction"], ["duplicate", "duplicate"]];
let kind = "induction";
const scored = new Set();  // models whose scores are computed

function drawControls() {
  clear(controls, el("span", {class: "segmented"}, KINDS.map(([k, label]) => el("button", {
    type: "button", class: k === kind ? "active" : "", text: label, onclick: () => { kind = k; update(); }}))));
}

async function update() {
  drawControls();
  if (!scored.has(state.model)) {
    const progress = el("div", {text: "scoring every head…"});
    clear(body, progress);
    try {
      const job = await api("/api/jobs", {kind: "heads", model: state.model});
      await followJob(job, (s) => clear(progress, "scoring: ", progressBar(s.done, s.total), " kinds of head"));
      scored.add(state.model);
    } catch (error) {
      clear(body, errorBox(error));
      return;
    }
  }
  let data;
  try {
    data = await api("/api/heads", {model: state.model, kind}, "heads");
  } catch (error) {
    if (!isAbort(error)) clear(body, errorBox(error));
    return;
  }
  drawPayload(body, data.view);
}

register("heads", {update, exportSettings: () => ({kind})});
