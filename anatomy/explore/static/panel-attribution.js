// Attribution for a target token at the predicted position: direct logit attribution (ranked bars
// and layer by layer), gradient × input, attention rollout, and integrated gradients as a job
// (progress, cancel); each drawn by the page `anatomy analyze` writes for its result.
import {
  api, cancelJob, clear, el, errorBox, exportUrl, followJob, isAbort, jobPageUrl, pageFrame, progressBar, register,
  textBody,
} from "./core.js";

const controls = document.getElementById("attribution-controls");
const body = document.getElementById("attribution-body");
const frame = pageFrame("attribution");
let method = "dla";
let target = "";
let job = null;

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
  if (job) { cancelJob(job); job = null; }
  if (method === "ig") return integratedGradients();
  clear(body, frame);
  await frame.load(exportUrl("attribution", "html", {method, inline: "1", ...(target ? {target} : {})}));
}

async function integratedGradients() {
  const progress = el("div", {}, "starting…");
  clear(body, el("div", {class: "job"}, progress, el("button", {type: "button", text: "cancel",
                                                                onclick: () => job && cancelJob(job)})));
  try {
    job = await api("/api/jobs", textBody({kind: "ig", target: target || null}));
    const mine = job;
    await followJob(job, (s) => clear(progress, "integrated gradients: ", progressBar(s.done, s.total), " gradients at most"));
    if (job !== mine) return;
    clear(body, frame);
    await frame.load(jobPageUrl(mine));
  } catch (error) {
    if (!isAbort(error)) clear(body, errorBox(error));
  } finally {
    job = null;
  }
}

register("attribution", {update, exportSettings: () => ({method: method === "ig" ? "gxi" : method, ...(target ? {target} : {})})});
