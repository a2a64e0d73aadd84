// Compare: a second model or a second prompt side by side: both next-token distributions, the
// residual stream's divergence layer by layer, and the first new token where greedy outputs differ.
import {api, clear, el, errorBox, fmt, isAbort, percent, register, state, textBody} from "./core.js";

const controls = document.getElementById("compare-controls");
const body = document.getElementById("compare-body");
let other = "";
let otherText = "";
let forModel = null;  // the model the settings above were chosen with: a new model starts afresh

function drawControls() {
  if (forModel !== state.model) {
    other = "";
    otherText = "";
    forModel = state.model;
  }
  const select = el("select", {"aria-label": "second model"}, state.models.map((m) => el("option", {value: m.name, text: m.name})));
  select.value = other || state.model;
  select.addEventListener("change", () => { other = select.value; update(); });
  const input = el("input", {type: "text", value: otherText, size: "36", placeholder: "the same text",
                             "aria-label": "second text"});
  input.addEventListener("change", () => { otherText = input.value; update(); });
  clear(controls, el("label", {}, "second model ", select), el("label", {}, "second text ", input));
}

function side(data) {
  const dist = data.distribution;
  return el("div", {class: "side"}, el("h3", {text: `${data.model}: “${data.text.slice(0, 60)}”`}),
    dist ? el("ol", {class: "dist"}, dist.next.map((row) => el("li", {}, el("span", {class: "tok", text: row.token}), ` ${percent(row.prob)}`)))
         : el("p", {class: "muted", text: "no prediction"}),
    data.greedy_tokens.length ? el("p", {class: "small"}, el("b", {text: "greedy: "}),
      data.greedy_tokens.map((t, i) => el("span", {class: "tok", title: `new token ${i}`, text: t}))) : null);
}

async function update() {
  drawControls();
  let data;
  try {
    data = await api("/api/compare", textBody({model_b: other || state.model, text_b: otherText || state.text}), "compare");
  } catch (error) {
    if (!isAbort(error)) clear(body, errorBox(error));
    return;
  }
  const facts = [];
  if (data.kl !== null) facts.push(`KL(first ‖ second) of the next-token distributions: ${fmt(data.kl, 4)} nats`);
  facts.push(!data.greedy_compared ? "greedy outputs: not compared (an encoder or an encoder-decoder writes none here)"
    : data.first_difference === null ? "greedy outputs agree on every new token"
    : `greedy outputs first differ at new token ${data.first_difference}`);
  const divergence = data.divergence ? el("table", {class: "divergence"},
    el("tr", {}, el("th", {text: "layer"}), el("th", {text: "‖a − b‖ / ‖a‖"}), el("th", {text: "cosine"})),
    data.divergence.map((row) => el("tr", {}, el("td", {text: String(row.layer)}), el("td", {text: fmt(row.relative, 3)}),
                                      el("td", {text: fmt(row.cosine, 4)})))) : el("p", {class: "muted small", text: "the two models differ in width or depth: no layer-by-layer comparison"});
  clear(body, el("div", {class: "sides"}, side(data.sides[0]), side(data.sides[1])),
        el("ul", {}, facts.map((f) => el("li", {text: f}))),
        el("h3", {text: "The residual stream at the last position, after each layer"}), divergence);
}

register("compare", {update});
