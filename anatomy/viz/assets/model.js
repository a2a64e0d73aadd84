// Model view: every layer (rows) x head (columns) as a small heatmap of A[h] (queries down, keys across).
// Click one to open it large beside the grid, level with the clicked row, with its tokens, a colour
// bar and the weight under the pointer. Colour is white -> the head's colour, by the square root of
// the weight, so small weights still show.

const state = { map: INITIAL.map, layer: INITIAL.layer, head: INITIAL.head };
window.anatomyView.state = state;

const main = document.getElementById("main");
const controls = document.getElementById("controls");

// lut(h)[byte]: the [r, g, b] of weight byte/255 in head h's ramp; pixels(h)[byte]: the same as one
// RGBA pixel in a Uint32 (little-endian: alpha in the high byte), to fill images one word at a time.
const luts = [];
const pixelLuts = [];
function lut(head) {
  if (!luts[head]) {
    const color = headRgb(head);
    luts[head] = Array.from({ length: 256 }, (_, byte) => ramp(color, Math.sqrt(byte / 255)));
  }
  return luts[head];
}

function pixels(head) {
  if (!pixelLuts[head]) {
    pixelLuts[head] = Uint32Array.from(lut(head), ([r, g, b]) =>
      ((255 << 24) | (Math.round(b) << 16) | (Math.round(g) << 8) | Math.round(r)) >>> 0);
  }
  return pixelLuts[head];
}

// One head of one layer as an image, one pixel per (query, key).
function headImage(bytes, head, T, S) {
  const canvas = document.createElement("canvas");
  canvas.width = S;
  canvas.height = T;
  const ctx = canvas.getContext("2d");
  const image = ctx.createImageData(S, T);
  const out = new Uint32Array(image.data.buffer);
  const colors = pixels(head);
  const offset = head * T * S;
  for (let p = 0; p < T * S; p++) out[p] = colors[bytes[offset + p]];
  ctx.putImageData(image, 0, 0);
  return canvas;
}

// Draw an image into a w x h box, sharp when enlarged, smoothed when shrunk.
function drawScaled(ctx, image, x, y, w, h) {
  ctx.imageSmoothingEnabled = image.width > w;
  ctx.imageSmoothingQuality = "high";
  ctx.drawImage(image, x, y, w, h);
}

function buildControls() {
  controls.replaceChildren();
  if (DATA.maps.length > 1) {
    controls.append(selectControl("Attention", mapOptions(), state.map, (value) => {
      state.map = value;
      state.layer = 0;
      state.head = 0;
      build();
    }));
  }
  controls.append(el("span", "note",
    "Rows are layers, columns are heads; in each square the queries run down and the keys across. Click a square to enlarge it."));
}

let thumbs = [];       // thumbs[layer][head] = canvas
let building = 0;      // the latest build wins

async function build() {
  const ticket = ++building;
  const map = DATA.maps[state.map];
  const T = map.queries.length;
  const S = map.keys.length;
  // The thumbnails share the page's width with the enlarged head beside them; when that leaves
  // less than 36 px a thumbnail, the enlarged head goes below the grid instead.
  const page = Math.min(document.documentElement.clientWidth, 1600) - 48;
  const labels = 70;
  const detailWidth = Math.max(DETAIL_MIN_WIDTH, detailGeometry(map).width) + 17;  // + its border and padding
  const beside = Math.floor((page - detailWidth - labels - 24) / map.nHeads) - 6;
  const below = Math.floor((page - labels) / map.nHeads) - 6;
  const size = beside >= 36 ? Math.min(84, beside) : Math.max(36, Math.min(84, below));
  const thumbW = S >= T ? size : Math.max(12, Math.round(size * S / T));
  const thumbH = T >= S ? size : Math.max(12, Math.round(size * T / S));

  const grid = el("div", "grid");
  grid.style.gridTemplateColumns = `max-content repeat(${map.nHeads}, ${thumbW}px)`;
  grid.append(el("div", "axis column-label"));
  for (let h = 0; h < map.nHeads; h++) {
    const label = el("div", "axis column-label", `head ${h}`);
    label.style.color = headColor(h);
    grid.append(label);
  }
  thumbs = [];
  for (let layer = 0; layer < map.nLayers; layer++) {
    grid.append(el("div", "axis row", `layer ${layer}`));
    thumbs.push([]);
    for (let h = 0; h < map.nHeads; h++) {
      const canvas = el("canvas", "thumb");
      canvas.dataset.layer = String(layer);
      canvas.dataset.head = String(h);
      canvas.title = `layer ${layer}, head ${h}`;
      sizeCanvas(canvas, thumbW, thumbH);
      canvas.addEventListener("click", () => select(layer, h));
      thumbs[layer].push(canvas);
      grid.append(canvas);
    }
  }
  const detail = el("section", "detail");
  detail.id = "detail";
  detail.style.width = `${detailWidth - 17}px`;  // its text wraps; the grid keeps the rest of the row
  const layout = el("div", "model-layout");
  layout.append(grid, detail);
  main.replaceChildren(layout);
  buildControls();
  select(state.layer, state.head, false);

  // Thumbnails one layer at a time, yielding between layers so the page stays responsive.
  for (let layer = 0; layer < map.nLayers; layer++) {
    const bytes = await layerWeights(state.map, layer);
    if (ticket !== building) return;
    for (let h = 0; h < map.nHeads; h++) {
      const ctx = thumbs[layer][h].getContext("2d");
      drawScaled(ctx, headImage(bytes, h, T, S), 0, 0, thumbW, thumbH);
    }
    if (layer === 0) painted();
    await new Promise((resolve) => setTimeout(resolve, 0));
  }
  window.anatomyView.allLayersDrawn = true;
}

async function select(layer, head, scroll = true) {
  state.layer = layer;
  state.head = head;
  thumbs.forEach((row, l) => row.forEach((canvas, h) => canvas.classList.toggle("selected", l === layer && h === head)));
  const map = DATA.maps[state.map];
  const bytes = await layerWeights(state.map, layer);
  if (state.layer !== layer || state.head !== head) return;
  drawDetail(map, bytes, layer, head);
  placeDetail(layer);
  const detail = document.getElementById("detail").getBoundingClientRect();
  if (scroll && (detail.top < 0 || detail.bottom > window.innerHeight)) {
    document.getElementById("detail").scrollIntoView({ block: "nearest" });
  }
  painted();
}

// The enlarged head level with the clicked row (beside the grid), never below the grid's end;
// at the top when it sits below the grid (a narrow page).
function placeDetail(layer) {
  const detail = document.getElementById("detail");
  const grid = main.querySelector(".grid");
  const thumb = thumbs[layer] && thumbs[layer][0];
  detail.style.marginTop = "0px";
  if (!thumb || detail.offsetTop > grid.offsetTop + 4) return;  // wrapped below the grid
  const offset = thumb.getBoundingClientRect().top - grid.getBoundingClientRect().top;
  const room = grid.offsetHeight - detail.offsetHeight;
  detail.style.marginTop = `${Math.max(0, Math.min(offset, room))}px`;
}

const DETAIL_MIN_WIDTH = 300;  // room for the title, the note and the colour bar

// The enlarged head's size: a cell per (query, key), as large as fits 620 px and the window's height.
function detailGeometry(map) {
  const T = map.queries.length;
  const S = map.keys.length;
  const room = Math.max(240, Math.min(620, window.innerHeight - 200));
  const cell = Math.max(1, Math.min(26, Math.floor(room / Math.max(T, S))));
  const labelled = cell >= 9;
  const font = `${Math.min(12, cell - 1)}px system-ui, sans-serif`;
  const measure = document.createElement("canvas").getContext("2d");
  measure.font = font;
  const widest = (tokens) => Math.max(...tokens.map((t) => measure.measureText(clip(t)).width));
  const left = labelled ? widest(map.queries) + 10 : 44;
  const top = labelled ? widest(map.keys) * 0.75 + 14 : 24;
  const width = left + S * cell + (labelled ? top : 10);
  return { cell, labelled, font, left, top, width, height: top + T * cell + 10 };
}

function drawDetail(map, bytes, layer, head) {
  const T = map.queries.length;
  const S = map.keys.length;
  const { cell, labelled, font, left, top, width, height } = detailGeometry(map);

  const detail = document.getElementById("detail");
  const title = el("h2", "", `${map.name} · layer ${layer} · head ${head}`);
  title.style.color = headColor(head);
  const canvas = el("canvas");
  canvas.id = "detail-canvas";
  const ctx = sizeCanvas(canvas, width, height);
  drawScaled(ctx, headImage(bytes, head, T, S), left, top, S * cell, T * cell);
  ctx.strokeStyle = "#d5d8de";
  ctx.strokeRect(left - 0.5, top - 0.5, S * cell + 1, T * cell + 1);

  ctx.fillStyle = "#1f2430";
  ctx.font = font;
  if (labelled) {
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    map.queries.forEach((token, i) => ctx.fillText(clip(token), left - 6, top + (i + 0.5) * cell));
    ctx.textAlign = "left";
    map.keys.forEach((token, j) => {
      ctx.save();
      ctx.translate(left + (j + 0.5) * cell, top - 6);
      ctx.rotate(-Math.PI / 4);
      ctx.fillText(clip(token), 0, 0);
      ctx.restore();
    });
  } else {
    // Too many tokens to name: mark positions instead; hover for the tokens.
    ctx.font = "11px system-ui, sans-serif";
    const every = Math.ceil(Math.max(T, S) / 8 / 8) * 8;
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (let i = 0; i < T; i += every) ctx.fillText(String(i), left - 6, top + (i + 0.5) * cell);
    ctx.textAlign = "center";
    ctx.textBaseline = "bottom";
    for (let j = 0; j < S; j += every) ctx.fillText(String(j), left + (j + 0.5) * cell, top - 6);
  }

  canvas.addEventListener("mousemove", (event) => {
    const box = canvas.getBoundingClientRect();
    const i = Math.floor((event.clientY - box.top - top) / cell);
    const j = Math.floor((event.clientX - box.left - left) / cell);
    if (i < 0 || j < 0 || i >= T || j >= S) return hideTooltip();
    const w = bytes[(head * T + i) * S + j] / 255;
    showTooltip(`query ${i} ${map.queries[i]}\nkey ${j} ${map.keys[j]}\nweight ≈ ${formatWeight(w)}`, event);
  });
  canvas.addEventListener("mouseleave", hideTooltip);

  const axes = el("p", "note", map.cross
    ? "Rows: decoder tokens (queries). Columns: encoder tokens (keys). Each row sums to 1."
    : "Rows: queries. Columns: keys. Each row sums to 1.");
  detail.replaceChildren(title, axes, canvas, headColorBar(head));
}

function headColorBar(head) {
  const wrap = el("div", "colorbar");
  const canvas = el("canvas");
  const ctx = sizeCanvas(canvas, 160, 12);
  const colors = lut(head);
  for (let x = 0; x < 160; x++) {
    const w = x / 159;
    const [r, g, b] = colors[Math.round(w * w * 255)];  // position x shows weight (x/159)^2: the sqrt scale
    ctx.fillStyle = `rgb(${r},${g},${b})`;
    ctx.fillRect(x, 0, 1, 12);
  }
  wrap.append(el("span", "", "weight 0"), canvas, el("span", "", "1"),
    el("span", "colorbar-note", "colour ∝ √weight: 0.25 is half way"));
  return wrap;
}

build();
