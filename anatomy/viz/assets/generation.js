// Generation view: step through the generated tokens. At step s the model has read positions
// 0 .. t-1 and produces token t = promptLength + s - 1; the shading shows the attention of the
// last position read (row t - 1 of the causal pattern) over everything before it.

const map = DATA.maps[0];
const T = map.queries.length;
const PROMPT = INITIAL.promptLength;
const N_STEPS = T - PROMPT;
const state = { layer: INITIAL.layer, head: "mean", step: 1 };
window.anatomyView.state = state;

const main = document.getElementById("main");
const controls = document.getElementById("controls");
const MEAN_RGB = rgb("#3b5bdb");

const headOptions = [["mean", "mean of heads"], ...Array.from({ length: map.nHeads }, (_, h) => [h, `head ${h}`])];
controls.append(
  selectControl("Layer", layerOptions(map.nLayers), state.layer, (value) => { state.layer = value; draw(); }),
  selectControl("Head", headOptions, state.head, (value) => { state.head = value; draw(); }),
);
const slider = el("input");
slider.type = "range";
slider.min = "1";
slider.max = String(N_STEPS);
slider.value = String(state.step);
slider.name = "step";
slider.addEventListener("input", () => { state.step = Number(slider.value); draw(); });
const stepLabel = el("span", "step-label");
controls.append(control("Step", slider), stepLabel);

const flow = el("div", "text-flow");
const tokenNodes = map.queries.map((token, i) => {
  const node = flow.appendChild(tokenElement(token, i));
  if (i >= PROMPT) node.classList.add("generated");
  return node;
});
const strip = el("canvas");
strip.className = "strip";
const stripTitle = el("p", "note", "");
main.replaceChildren(
  el("p", "note", "Prompt tokens are plain, generated ones underlined. The outlined token is the one being " +
    "produced; the shading is how much the last token read attends to each earlier one."),
  flow, stripTitle, strip,
);

// Attention of query row `row` to key j for the chosen head (or the mean over heads).
function weightOf(bytes, row, j) {
  if (state.head !== "mean") return bytes[(state.head * T + row) * T + j] / 255;
  let sum = 0;
  for (let h = 0; h < map.nHeads; h++) sum += bytes[(h * T + row) * T + j];
  return sum / 255 / map.nHeads;
}

let drawing = 0;

async function draw() {
  const ticket = ++drawing;
  const bytes = await layerWeights(0, state.layer);
  if (ticket !== drawing) return;
  const produced = PROMPT + state.step - 1;
  const row = produced - 1;
  const color = state.head === "mean" ? MEAN_RGB : headRgb(state.head);
  stepLabel.textContent = `step ${state.step} of ${N_STEPS}: producing “${map.queries[produced]}”`;
  tokenNodes.forEach((node, j) => {
    node.classList.toggle("current", j === produced);
    node.classList.toggle("future", j > produced);
    if (j < produced) {
      const w = weightOf(bytes, row, j);
      node.style.background = `rgba(${color[0]},${color[1]},${color[2]},${Math.sqrt(w).toFixed(3)})`;
      node.style.color = w > 0.3 ? "#fff" : "";
      node.title = `${j}: ${map.queries[j]}  weight ${formatWeight(w)}`;
    } else {
      node.style.background = "";
      node.style.color = "";
      node.title = `${j}: ${map.queries[j]}`;
    }
  });
  drawStrip(bytes, row);
  painted();
}

// Every head's row for this step: heads down, the positions read across.
function drawStrip(bytes, row) {
  const cell = Math.max(2, Math.min(22, Math.floor(860 / (row + 1))));
  const left = 64;
  const width = left + (row + 1) * cell + 4;
  const height = map.nHeads * 16 + 4;
  const ctx = sizeCanvas(strip, width, height);
  ctx.font = "11px system-ui, sans-serif";
  ctx.textBaseline = "middle";
  for (let h = 0; h < map.nHeads; h++) {
    const [r, g, b] = headRgb(h);
    ctx.fillStyle = headColor(h);
    ctx.fillText(`head ${h}`, 0, h * 16 + 9);
    for (let j = 0; j <= row; j++) {
      const w = bytes[(h * T + row) * T + j] / 255;
      const [cr, cg, cb] = ramp([r, g, b], Math.sqrt(w));
      ctx.fillStyle = `rgb(${cr | 0},${cg | 0},${cb | 0})`;
      ctx.fillRect(left + j * cell, h * 16 + 2, cell - (cell > 3 ? 1 : 0), 14);
    }
  }
  stripTitle.textContent = `Each head at layer ${state.layer}, positions 0 to ${row} read (colour ∝ √weight):`;
}

draw();
