// Attribution for a target token at the predicted position: direct logit attribution as ranked
// bars (the rest summed into one), gradient × input and integrated gradients shading the input
// tokens, attention rollout's row. Integrated gradients run as a job (progress, cancel).
import {
  ApiError, api, cancelJob, checkLine, clear, el, errorBox, fmt, followJob, isAbort, progressBar, register, shade, ink,
  state, textBody,
} from "./core.js";

const controls = document.getElementById("attribution-controls");
const body = document.getElementById("attribution-body");
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

function bars(data) {
  const extent = Math.max(...data.bars.map((b) => Math.abs(b.value)), 1e-9);
  const rows = data.bars.map((bar) => {
    const fill = el("span", {class: "bar-fill signed"});
    fill.style.width = `${50 * Math.abs(bar.value) / extent}%`;
    fill.style.left = bar.value >= 0 ? "50%" : `${50 - 50 * Math.abs(bar.value) / extent}%`;
    fill.style.background = bar.value >= 0 ? "#2f6edc" : "#d64541";
    return el("div", {class: `bar-row${bar.rest ? " rest" : ""}`, title: `${bar.label}: ${fmt(bar.value, 4)}`},
              el("span", {class: "bar-label", text: bar.label}), el("span", {class: "bar-track centred"}, fill),
              el("span", {class: "bar-value", text: fmt(bar.value)}));
  });
  return el("div", {class: "bars"}, el("p", {class: "small", text: `each component's direct contribution to the logit of “${data.target}” at position ${data.position}; they sum to ${fmt(data.total, 4)}`}), rows);
}

function shaded(tokens, values, caption) {
  const extent = Math.max(...values.map((v) => Math.abs(v ?? 0)), 1e-9);
  return el("div", {}, el("p", {class: "small", text: caption}), el("div", {class: "shaded"}, tokens.map((token, i) => {
    const span = el("span", {class: "shaded-token", text: token, title: `${token}: ${fmt(values[i], 4)}`});
    span.style.background = shade(values[i], extent);
    span.style.color = ink(values[i] ?? 0, extent);
    return span;
  })));
}

async function update() {
  drawControls();
  if (job) { cancelJob(job); job = null; }
  if (method === "ig") return integratedGradients();
  let data;
  try {
    data = await api("/api/attribution", textBody({method, target: target || null}), "attribution");
  } catch (error) {
    if (!isAbort(error)) clear(body, errorBox(error));
    return;
  }
  const holds = data.method === "gxi" ? true : (data.error ?? 0) < 1e-3;
  if (data.method === "dla") clear(body, checkLine(data.check, holds), bars(data));
  else if (data.method === "gxi") clear(body, el("p", {class: "check muted", text: data.check}),
    shaded(data.tokens, data.values, `gradient × input for the logit of “${data.target}”: blue raises it, red lowers it`));
  else clear(body, checkLine(data.check, holds),
    shaded(data.tokens, data.values, `attention rollout: how much of the last position's information flowed from each token`));
}

async function integratedGradients() {
  const stop = el("button", {type: "button", text: "cancel", onclick: () => job && cancelJob(job)});
  const progress = el("div", {}, "starting…");
  clear(body, el("div", {class: "job"}, progress, stop));
  try {
    job = await api("/api/jobs", textBody({kind: "ig", target: target || null}));
    const mine = job;
    const done = await followJob(job, (s) => clear(progress, "integrated gradients: ", progressBar(s.done, s.total), " gradients"));
    if (job !== mine) return;
    const data = done.result;
    clear(body, checkLine(data.check, data.converged !== false),
          shaded(data.tokens, data.values, `integrated gradients for the logit of “${data.target}” (${data.steps} gradients): blue raises it, red lowers it; the shares sum to f(x) − f(baseline)`));
  } catch (error) {
    if (!isAbort(error)) clear(body, errorBox(error instanceof ApiError ? error : String(error)));
  } finally {
    job = null;
  }
}

register("attribution", {update, exportSettings: () => ({method: method === "ig" ? "gxi" : method, ...(target ? {target} : {})})});
