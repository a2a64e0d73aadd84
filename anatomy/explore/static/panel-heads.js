// Head detection: previous-token, induction and duplicate-token scores of every head, on repeated
// random tokens (anatomy.detect_heads), computed once per model as a job, each kind drawn by the
// page `anatomy analyze heads` writes.
import {api, clear, el, errorBox, exportUrl, followJob, pageFrame, progressBar, register, state} from "./core.js";

const controls = document.getElementById("heads-controls");
const body = document.getElementById("heads-body");
const frame = pageFrame("head scores");
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
  clear(body, frame);
  await frame.load(exportUrl("heads", "html", {kind, inline: "1"}));
}

register("heads", {update, exportSettings: () => ({kind})});
