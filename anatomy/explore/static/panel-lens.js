// The logit lens: layer × position, the top token read from the residual stream there, shaded by
// its probability (anatomy.logit_lens on the pass's own residual stream).
import {api, checkLine, clear, colourBar, el, errorBox, heatGrid, isAbort, percent, register, textBody} from "./core.js";

const controls = document.getElementById("lens-controls");
const body = document.getElementById("lens-body");
let top = 3;

async function update() {
  clear(controls, el("label", {}, "tokens per cell (hover) ", (() => {
    const input = el("input", {type: "number", min: "1", max: "10", value: String(top)});
    input.addEventListener("change", () => { top = Math.max(1, Math.min(10, Number(input.value) || 3)); update(); });
    return input;
  })()));
  let data;
  try {
    data = await api("/api/lens", textBody({top}), "lens");
  } catch (error) {
    if (!isAbort(error)) clear(body, errorBox(error));
    return;
  }
  const probs = data.probs.map((layer) => layer.map((cell) => cell[0]));
  const grid = heatGrid(data.rows, data.cols, probs, {
    extent: 1, corner: "layer \\ position", colWidth: "6.5em",
    text: (r, c) => data.tokens[r][c][0],
    title: (r, c) => data.tokens[r][c].map((t, k) => `${t}  ${percent(data.probs[r][c][k])}`).join("\n"),
  });
  clear(body, checkLine(data.check, (data.error ?? 0) < 1e-3), grid, colourBar(1, "probability of the top token", false));
}

register("lens", {update});
