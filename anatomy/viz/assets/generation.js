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
const strip = el("div", "strip");
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

// Every head's row for this step: heads down, the positions read across, each under its token
// (grid.js: one grid, so each cell sits under its token's label).
const STRIP_SCALE = { kind: "sequential", lo: 0, hi: 1 };

function drawStrip(bytes, row) {
  const n = row + 1;
  const width = n <= 24 ? 40 : n <= 64 ? 22 : 16;  // wide enough for the weight, else for a rotated label
  const values = Array.from({ length: map.nHeads }, (_, h) =>
    Array.from({ length: n }, (_, j) => bytes[(h * T + row) * T + j] / 255));
  const grid = heatmap({
    name: "strip", rows: values.map((_, h) => `head ${h}`), cols: map.queries.slice(0, n), values,
    scale: STRIP_SCALE, corner: "head \\ read", cellWidth: width, cellHeight: 18, showValues: width >= 40,
    rowColor: (h) => headColor(h),
    cellRgb: (h, j, w) => ramp(headRgb(h), Math.sqrt(w)),
    tooltip: (h, j, w) => `head ${h} · ${j}: ${map.queries[j]}  weight ${formatWeight(w)}`,
  });
  strip.replaceChildren(grid);
  stripTitle.textContent = `Each head at layer ${state.layer}, reading positions 0 to ${row} (colour ∝ √weight):`;
}

draw();
