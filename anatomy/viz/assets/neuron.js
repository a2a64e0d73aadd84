// Neuron view: inside one head, for one query token i (click it on the left):
//   q_i, every key's k_j, their elementwise product q_i ∘ k_j, the score q_i · k_j / √D (the sum of
//   that product, scaled), and the softmax weight A[i, j] recorded in the forward pass.
// Blue cells are positive, red negative; q and k share one scale, q ∘ k has its own.

const state = { map: INITIAL.map, layer: INITIAL.layer, head: INITIAL.head, query: INITIAL.query };
window.anatomyView.state = state;

const main = document.getElementById("main");
const controls = document.getElementById("controls");
const ROW = 20;
const POSITIVE = [33, 102, 172];
const NEGATIVE = [178, 24, 43];

function buildControls() {
  controls.replaceChildren();
  const map = DATA.maps[state.map];
  if (DATA.maps.length > 1) {
    controls.append(selectControl("Attention", mapOptions(), state.map, (value) => {
      state.map = value;
      state.layer = Math.min(state.layer, DATA.maps[value].nLayers - 1);
      state.head = Math.min(state.head, DATA.maps[value].nHeads - 1);
      state.query = 0;
      buildControls();
      buildTokens();
    }));
  }
  controls.append(selectControl("Layer", layerOptions(map.nLayers), state.layer, (value) => { state.layer = value; draw(); }));
  const headOptions = Array.from({ length: map.nHeads }, (_, h) => [h, `${h}`]);
  controls.append(selectControl("Head", headOptions, state.head, (value) => { state.head = value; draw(); }));
}

let queryNodes = [];
let canvas = null;

function buildTokens() {
  const map = DATA.maps[state.map];
  const column = el("div", "column left");
  column.append(el("div", "column-title", "query (click one)"));
  queryNodes = map.queries.map((token, i) => {
    const node = column.appendChild(tokenElement(token, i));
    node.addEventListener("click", () => { state.query = i; draw(); });
    return node;
  });
  canvas = el("canvas");
  canvas.id = "neuron-canvas";
  const stage = el("div", "stage");
  stage.append(el("div", "column-title", ""), canvas);
  const layout = el("div", "neuron");
  layout.append(column, stage);
  const note = el("p", "note",
    "score = q · k / √D is the sum of the q ∘ k row, scaled; the softmax of a query's scores over the keys it " +
    "may see gives its attention weights. The weights shown are the ones recorded in the forward pass " +
    "(masked keys get 0). Blue is positive, red negative.");
  main.replaceChildren(note, layout);
  draw();
}

const ctx0 = document.createElement("canvas").getContext("2d");  // measures labels

function cellColor(value, scale) {
  const t = Math.min(1, Math.abs(value) / scale);
  const [r, g, b] = ramp(value >= 0 ? POSITIVE : NEGATIVE, t);
  return `rgb(${r | 0},${g | 0},${b | 0})`;
}

let drawing = 0;

async function draw() {
  const ticket = ++drawing;
  const map = DATA.maps[state.map];
  const [q, k, exact] = await Promise.all([
    layerFloats(state.map, "q", state.layer),
    layerFloats(state.map, "k", state.layer),
    layerFloats(state.map, "exact", state.layer),
  ]);
  if (ticket !== drawing) return;
  const { head, query } = state;
  const T = map.queries.length;
  const S = map.keys.length;
  const D = map.dHead;
  const qi = q.subarray((head * T + query) * D, (head * T + query + 1) * D);
  const kj = (j) => k.subarray((head * S + j) * D, (head * S + j + 1) * D);
  const products = Array.from({ length: S }, (_, j) => { const kv = kj(j); return qi.map((x, d) => x * kv[d]); });
  const scores = products.map((p) => p.reduce((sum, x) => sum + x, 0) / Math.sqrt(D));
  const weights = Array.from({ length: S }, (_, j) => exact[(head * T + query) * S + j]);

  let vectorScale = Math.max(...qi.map(Math.abs));
  for (let j = 0; j < S; j++) vectorScale = Math.max(vectorScale, ...kj(j).map(Math.abs));
  const productScale = Math.max(1e-12, ...products.map((p) => Math.max(...p.map(Math.abs))));
  vectorScale = Math.max(vectorScale, 1e-12);

  queryNodes.forEach((node, i) => node.classList.toggle("focus", i === query));

  const cw = Math.max(2, Math.min(12, Math.floor(300 / D)));
  ctx0.font = "600 12px system-ui, sans-serif";
  const labelW = 16 + Math.max(...[map.queries[query], ...map.keys].map((t) => ctx0.measureText(`k: ${clip(t)}`).width));
  const xK = labelW;
  const xP = xK + D * cw + 18;
  const xScore = xP + D * cw + 18;
  const xSoft = xScore + 70;
  const width = xSoft + 150;
  const top = 2 * ROW;  // header row, then the query row
  const height = top + (S + 1) * ROW;
  const ctx = sizeCanvas(canvas, width, height);
  const [hr, hg, hb] = headRgb(head);

  ctx.font = "12px system-ui, sans-serif";
  ctx.textBaseline = "middle";
  ctx.fillStyle = "#6b7280";
  ctx.fillText(`layer ${state.layer} · head ${head} · D = ${D}`, 0, ROW / 2);
  ctx.fillText("q, k", xK, ROW * 1.5);
  ctx.fillText("q ∘ k", xP, ROW * 1.5);
  ctx.fillText("q · k / √D", xScore, ROW * 1.5);
  ctx.fillText("softmax", xSoft, ROW * 1.5);

  const rowY = (n) => top + n * ROW;  // n = 0: the query, n = j + 1: key j
  const cells = (vector, x, y, scale) => vector.forEach((value, d) => {
    ctx.fillStyle = cellColor(value, scale);
    ctx.fillRect(x + d * cw, y + 3, cw - (cw > 3 ? 1 : 0), ROW - 6);
  });

  ctx.fillStyle = "#1f2430";
  ctx.font = "600 12px system-ui, sans-serif";
  ctx.textAlign = "right";
  ctx.fillText(`q: ${clip(map.queries[query])}`, labelW - 8, rowY(0) + ROW / 2);
  cells(qi, xK, rowY(0), vectorScale);
  ctx.font = "12px system-ui, sans-serif";
  for (let j = 0; j < S; j++) {
    const y = rowY(j + 1);
    ctx.textAlign = "right";
    ctx.fillStyle = "#1f2430";
    ctx.fillText(`k: ${clip(map.keys[j])}`, labelW - 8, y + ROW / 2);
    cells(kj(j), xK, y, vectorScale);
    cells(products[j], xP, y, productScale);
    ctx.fillStyle = weights[j] === 0 ? "#b4b9c3" : "#1f2430";
    ctx.fillText(scores[j].toFixed(2), xScore + 48, y + ROW / 2);
    ctx.fillStyle = `rgb(${hr},${hg},${hb})`;
    ctx.fillRect(xSoft, y + 4, 90 * weights[j], ROW - 8);
    ctx.textAlign = "left";
    ctx.fillStyle = "#1f2430";
    ctx.fillText(weights[j].toFixed(3), xSoft + 96, y + ROW / 2);
  }
  ctx.strokeStyle = "#e3e5ea";
  ctx.beginPath();
  ctx.moveTo(0, rowY(1) - 0.5);
  ctx.lineTo(width, rowY(1) - 0.5);
  ctx.stroke();

  canvas.onmousemove = (event) => {
    const box = canvas.getBoundingClientRect();
    const x = event.clientX - box.left;
    const n = Math.floor((event.clientY - box.top - top) / ROW);
    if (n < 0 || n > S) return hideTooltip();
    const vector = n === 0 ? qi : kj(n - 1);
    const who = n === 0 ? `q (query ${query} ${map.queries[query]})` : `k (key ${n - 1} ${map.keys[n - 1]})`;
    const d = Math.floor((x - (x >= xP ? xP : xK)) / cw);
    if (x >= xK && x < xK + D * cw) return showTooltip(`${who}[${d}] = ${vector[d].toFixed(4)}`, event);
    if (n > 0 && x >= xP && x < xP + D * cw) {
      return showTooltip(`(q ∘ k)[${d}] = ${qi[d].toFixed(3)} × ${vector[d].toFixed(3)} = ${products[n - 1][d].toFixed(4)}`, event);
    }
    hideTooltip();
  };
  canvas.onmouseleave = hideTooltip;
  painted();
}

buildControls();
buildTokens();
