// Attribution for a target token at the predicted position: direct logit attribution (ranked bars
// and layer by layer), gradient × input, attention rollout, each updated as you type; integrated
// gradients, which take hundreds of passes, run when asked, as a job (progress, cancel). Each is
// drawn in the page as the page `anatomy analyze` writes for its result draws it (analysis.js).
import {api, cancelJobIn, clear, currentModel, drawPayload, el, errorBox, isAbort, register, runJob, state, textBody} from "./core.js";

const controls = document.getElementById("attribution-controls");
const body = document.getElementById("attribution-body");
let method = null;  // chosen by the model until the reader picks one
let target = "";
let ranFor = null;  // the text integrated gradients last ran on

function drawControls() {
  const sums = currentModel().sums_components !== false;
  if (method === null || (method === "dla" && !sums)) method = sums ? "dla" : "gxi";
  const methods = [["dla", "direct logit attribution"], ["ig", "integrated gradients"], ["gxi", "gradient × input"],
                   ["rollout", "attention rollout"]];
  const input = el("input", {type: "text", value: target, placeholder: "the top prediction", size: "14",
                             "aria-label": "target token"});
  input.addEventListener("change", () => { target = input.value; ranFor = null; update(); });
  clear(controls, el("span", {class: "segmented"}, methods.map(([m, label]) => el("button", {
    type: "button", class: m === method ? "active" : "", text: label,
    disabled: m === "dla" && !sums, title: m === "dla" && !sums
      ? "direct logit attribution needs a pre-norm model (its residual stream is a sum of components)" : null,
    onclick: () => { method = m; update(); }}))),
    el("label", {}, "target token ", input));
}

async function update() {
  drawControls();
  if (method === "ig") return integratedGradients();
  cancelJobIn(body);
  let data;
  try {
    data = await api("/api/attribution", textBody({method, ...(target ? {target} : {})}), "attribution");
  } catch (error) {
    if (!isAbort(error)) clear(body, errorBox(error));
    return;
  }
  drawPayload(body, data.view);
}

// Hundreds of forward and backward passes: run on request, not on every keystroke.
function integratedGradients() {
  const key = `${state.model}\u0000${state.text}\u0000${state.target}\u0000${target}`;
  if (ranFor === key && body.querySelector(".analysis-view")) return;
  const run = el("button", {type: "button", class: "run", text: "run integrated gradients",
                            onclick: () => { ranFor = key; runJob(body, textBody({kind: "ig", target: target || null}),
                                                                  "integrated gradients", "gradients so far (it stops once they sum to the difference within 5%)", {bar: false}); }});
  clear(body, el("p", {class: "small"}, ranFor ? "The text changed since the last run. " : "",
                 "Integrated gradients add points along the path until the attributions sum to f(x) − f(baseline) " +
                 "within 5%: hundreds of passes, seconds to a minute on a CPU. ", run));
}

register("attribution", {update, exportSettings: () => ({method, ...(target ? {target} : {})})});
