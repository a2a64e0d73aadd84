// Attribution for a target token at the predicted position: direct logit attribution (ranked bars
// and layer by layer), gradient × input, attention rollout, and integrated gradients as a job
// (progress, cancel); each drawn by the page `anatomy analyze` writes for its result.
import {cancelJobIn, clear, el, exportUrl, pageFrame, register, runJob, textBody} from "./core.js";

const controls = document.getElementById("attribution-controls");
const body = document.getElementById("attribution-body");
const frame = pageFrame("attribution");
let method = "dla";
let target = "";

function drawControls() {
  const methods = [["dla", "direct logit attribution"], ["ig", "integrated gradients"], ["gxi", "gradient × input"],
                   ["rollout", "attention rollout"]];
  const input = el("input", {type: "text", value: target, placeholder: "the top prediction", size: "14",
                             "aria-label": "target token"});
  input.addEventListener("change", () => { target = input.value; update(); });
  clear(controls, el("span", {class: "segmented"}, methods.map(([m, label]) => el("button", {
    type: "button", class: m === method ? "active" : "", text: label, onclick: () => { method = m; update(); }}))),
    el("label", {}, "target token ", input));
}

async function update() {
  drawControls();
  cancelJobIn(body);
  if (method === "ig") return integratedGradients();
  clear(body, frame);
  await frame.load(exportUrl("attribution", "html", {method, inline: "1", ...(target ? {target} : {})}));
}

function integratedGradients() {
  return runJob(body, frame, textBody({kind: "ig", target: target || null}), "integrated gradients",
                "gradients at most");
}

register("attribution", {update, exportSettings: () => ({method: method === "ig" ? "gxi" : method, ...(target ? {target} : {})})});
