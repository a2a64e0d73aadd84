// Features: the sparse autoencoder's features most active on the text (each with its activation at
// every token), one feature opened (the tokens its decoder direction promotes and suppresses), and
// a slider that steers the model with it (its decoder direction added at the SAE's point).
import {api, beforeAfterRows, clear, currentModel, el, errorBox, fmt, isAbort, register, textBody} from "./core.js";

const controls = document.getElementById("features-controls");
const body = document.getElementById("features-body");
let sae = null;
let opened = null;
let alpha = 0;

function shadedTokens(tokens, acts, peak) {
  return el("div", {class: "shaded"}, tokens.map((token, i) => {
    const span = el("span", {class: "shaded-token", text: token, title: `${token}: ${fmt(acts[i], 4)}`});
    const t = peak > 0 ? Math.max(0, acts[i] ?? 0) / peak : 0;
    span.style.background = `rgba(230, 119, 0, ${0.06 + 0.8 * t})`;
    return span;
  }));
}

function drawControls() {
  const saes = currentModel().saes || [];
  if (!saes.length) { clear(controls); return; }
  if (!saes.some((s) => s.name === sae)) sae = saes[0].name;
  const select = el("select", {"aria-label": "sparse autoencoder"},
                    saes.map((s) => el("option", {value: s.name, text: `${s.name} (${s.kind}, ${s.d_sae} features at ${s.point})`})));
  select.value = sae;
  select.addEventListener("change", () => { sae = select.value; opened = null; update(); });
  clear(controls, el("label", {}, "autoencoder ", select));
}

async function update() {
  drawControls();
  let data;
  try {
    data = await api("/api/features", textBody({sae}), "features");
  } catch (error) {
    if (!isAbort(error)) clear(body, errorBox(error));
    return;
  }
  const list = el("div", {class: "feature-list"}, data.features.map((f) => el("div", {
    class: `feature-row${f.id === opened ? " open" : ""}`, onclick: () => { opened = f.id; alpha = 0; update(); }},
    el("span", {class: "feature-id", text: `F${f.id}`}), el("span", {class: "feature-peak", text: fmt(f.peak)}),
    shadedTokens(data.tokens, f.acts, f.peak))));
  clear(body, el("p", {class: "check ok", text: `✓ ${data.check}; ${fmt(data.l0, 3)} features active per token`}),
        el("p", {class: "muted small", text: `The ${data.features.length} features with the largest activation on this text ` +
          `(of ${data.d_sae}); each token shaded by how strongly it fires. Click one to open it.`}),
        el("div", {class: "features-pair"}, list, el("div", {class: "feature-detail", id: "feature-detail"})));
  if (opened !== null) await openFeature(opened);
}

async function openFeature(index) {
  const detail = document.getElementById("feature-detail");
  let data, steered;
  try {
    [data, steered] = await Promise.all([
      api("/api/feature", textBody({sae, feature: index}), "feature"),
      api("/api/steer", textBody({sae, feature: index, alpha}), "steer"),
    ]);
  } catch (error) {
    if (!isAbort(error)) clear(detail, errorBox(error));
    return;
  }
  const peak = Math.max(...data.acts.map((a) => a ?? 0), 0);
  const logits = data.logits ? el("div", {class: "sides"},
    el("div", {}, el("h3", {text: "promotes"}), el("ol", {class: "dist"}, data.logits.promoted.map((t, i) =>
      el("li", {}, el("span", {class: "tok", text: t}), ` +${fmt(data.logits.promoted_values[i])}`)))),
    el("div", {}, el("h3", {text: "suppresses"}), el("ol", {class: "dist"}, data.logits.suppressed.map((t, i) =>
      el("li", {}, el("span", {class: "tok", text: t}), ` ${fmt(data.logits.suppressed_values[i])}`)))))
    : el("p", {class: "muted small", text: data.logits_note || ""});
  const slider = el("input", {type: "range", min: "-20", max: "20", step: "0.5", value: String(alpha), "aria-label": "steering strength"});
  slider.addEventListener("change", () => { alpha = Number(slider.value); openFeature(index); });
  clear(detail, el("h3", {text: `Feature ${index}`}), shadedTokens(data.tokens, data.acts, peak),
    el("p", {class: "small muted", text: "its direct effect on each token's logit, per unit of activation:"}), logits,
    el("h3", {text: "Steer with it"}),
    el("label", {}, "α ", slider, el("output", {text: ` ${alpha}`})),
    el("p", {class: "small", text: `adding ${alpha} × its decoder direction at ${steered.point} moves the next-token distribution ` +
      `by KL = ${fmt(steered.kl, 4)} nats`}),
    beforeAfterRows(steered.rows, 10));
}

register("features", {update});
