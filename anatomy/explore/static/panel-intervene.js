// Interventions: zero or scale one head's output or one MLP neuron and see the next-token
// distribution before and after; and activation patching from a second prompt, as a layer ×
// position heatmap, run as a job with progress and a cancel button.
import {
  api, beforeAfterRows, clear, currentModel, el, errorBox, fmt, isAbort, numberSelect, register, runJob,
  textBody,
} from "./core.js";

const controls = document.getElementById("intervene-controls");
const body = document.getElementById("intervene-body");
const patchControls = document.getElementById("patch-controls");
const patchBody = document.getElementById("patch-body");
const settings = {kind: "head", layer: 0, index: 0, scale: 0};
let corrupt = "";

function drawControls() {
  const model = currentModel();
  const kinds = el("span", {class: "segmented"}, [["head", "a head"], ["neuron", "an MLP neuron"]].map(([k, label]) =>
    el("button", {type: "button", class: settings.kind === k ? "active" : "", text: label,
                  onclick: () => { settings.kind = k; settings.index = 0; update(); }})));
  const index = settings.kind === "head"
    ? numberSelect("head", model.n_heads || 1, settings.index, (v) => { settings.index = v; update(); })
    : el("label", {}, "neuron ", (() => {
      const input = el("input", {type: "number", min: "0", max: String((model.d_ff || 1) - 1), value: String(settings.index)});
      input.addEventListener("change", () => { settings.index = Number(input.value) || 0; update(); });
      return input;
    })());
  const scale = el("input", {type: "range", min: "-2", max: "3", step: "0.25", value: String(settings.scale)});
  const shown = el("output", {text: settings.scale === 0 ? "0 (zeroed)" : `× ${settings.scale}`});
  scale.addEventListener("change", () => { settings.scale = Number(scale.value); update(); });
  clear(controls, kinds, numberSelect("layer", model.n_layers || 1, settings.layer, (v) => { settings.layer = v; update(); }),
        index, el("label", {}, "scale ", scale, shown));
  const input = el("input", {type: "text", value: corrupt, size: "36", placeholder: "a second prompt with as many tokens",
                             "aria-label": "corrupted prompt"});
  input.addEventListener("change", () => { corrupt = input.value; });
  clear(patchControls, el("label", {}, "corrupted prompt ", input),
        el("button", {type: "button", text: "patch", onclick: () => { corrupt = input.value; patch(); }}));
}

async function update() {
  drawControls();
  let data;
  try {
    data = await api("/api/intervene", textBody(settings), "intervene");
  } catch (error) {
    if (!isAbort(error)) clear(body, errorBox(error));
    return;
  }
  clear(body, el("p", {class: "small", text: `${data.scale === 0 ? "Zeroing" : `Scaling by ${data.scale}`} ${data.kind} ${data.index} of layer ${data.layer} ` +
    `(${data.point}) moves the next-token distribution by KL = ${fmt(data.kl, 4)} nats.`}), beforeAfterRows(data.rows));
}

function patch() {
  return runJob(patchBody, textBody({kind: "patch", corrupt}), "patching", "cells");
}

register("intervene", {update});
