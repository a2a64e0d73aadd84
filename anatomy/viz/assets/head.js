// Head view: the tokens twice, queries on the left and keys on the right. For every selected head a
// line joins query i to key j; its opacity is the weight A[h, i, j]. Hover a token to see only its lines;
// the band beside the keys then shows, per head, how much the focused query gives to each key.

const STAGE_WIDTH = 300;  // CSS pixels between the two token columns
const BAND = 8;           // width of one head's cell in the band beside the keys
const HIDDEN_BELOW = 4;   // bytes (weight < 4/255): lines too faint to see are not drawn unless focused
const LINE_BUDGET = 4000; // at most this many lines without focus: the strongest

const state = {
  map: INITIAL.map,
  layer: INITIAL.layer,
  heads: new Set(INITIAL.heads),
  filter: "all",
  focus: null,  // {side: "query" | "key", index} while a token is hovered
};
window.anatomyView.state = state;

const main = document.getElementById("main");
const controls = document.getElementById("controls");

function buildControls() {
  controls.replaceChildren();
  const map = DATA.maps[state.map];
  if (DATA.maps.length > 1) {
    controls.append(selectControl("Attention", mapOptions(), state.map, (value) => {
      state.map = value;
      state.layer = Math.min(state.layer, DATA.maps[value].nLayers - 1);
      state.heads = new Set(range([0, DATA.maps[value].nHeads]).filter((h) => state.heads.has(h)));
      state.filter = "all";
      buildControls();
      buildColumns();
    }));
  }
  controls.append(selectControl("Layer", layerOptions(map.nLayers), state.layer, (value) => {
    state.layer = value;
    draw();
  }));
  if (map.sentenceBStart !== null) {
    controls.append(selectControl("Sentences", SENTENCE_FILTERS, state.filter, (value) => {
      state.filter = value;
      buildColumns();
    }, "sentences"));
  }
  controls.append(headToggles(map.nHeads, state.heads, draw));
}

let layout = null;  // the positions and elements of the current columns

function buildColumns() {
  const map = DATA.maps[state.map];
  const [queryRange, keyRange] = sentenceRanges(map, state.filter);
  const rows = range(queryRange);
  const cols = range(keyRange);

  const left = el("div", "column left");
  const right = el("div", "column right");
  const stage = el("div", "stage");
  left.append(el("div", "column-title", map.cross ? "decoder query" : "query"));
  right.append(el("div", "column-title", map.cross ? "encoder key" : "key"));
  const stageTitle = el("div", "column-title");
  stage.append(stageTitle);
  const queryNodes = rows.map((i) => left.appendChild(tokenElement(map.queries[i], i)));
  const keyNodes = cols.map((j) => right.appendChild(tokenElement(map.keys[j], j)));
  const canvas = stage.appendChild(el("canvas"));
  const rowHeight = parseFloat(getComputedStyle(document.documentElement).getPropertyValue("--row"));
  const height = Math.max(rows.length, cols.length) * rowHeight;
  const ctx = sizeCanvas(canvas, STAGE_WIDTH, height);

  queryNodes.forEach((node, a) => hoverable(node, "query", a));
  keyNodes.forEach((node, b) => hoverable(node, "key", b));

  const pair = el("div", "pair");
  pair.append(left, stage, right);
  const note = el("p", "note",
    "Each line joins a query token (left) to a key token it attends to (right); its opacity is the " +
    "attention weight, its colour the head. Hover a token to see only its lines; the coloured cells " +
    "beside the keys then give each head's weight.");
  main.replaceChildren(note, pair);
  layout = { map, rows, cols, ctx, canvas, height, rowHeight, stageTitle, queryNodes, keyNodes };
  state.focus = null;
  draw();
}

function hoverable(node, side, position) {
  node.addEventListener("mouseenter", () => { state.focus = { side, index: position }; draw(); });
  node.addEventListener("mouseleave", () => { state.focus = null; draw(); });
}

let drawing = 0;  // the latest request wins when layers arrive out of order

async function draw() {
  const ticket = ++drawing;
  const { map, rows, cols, ctx, height, rowHeight, stageTitle, queryNodes, keyNodes } = layout;
  const bytes = await layerWeights(state.map, state.layer);
  if (ticket !== drawing || layout.map !== map || layout.rows !== rows) return;
  const T = map.queries.length;
  const S = map.keys.length;
  const heads = [...state.heads].sort((a, b) => a - b);
  const focus = state.focus;
  const bandWidth = BAND * map.nHeads;
  const x0 = 4;
  const x1 = focus && focus.side === "query" ? STAGE_WIDTH - bandWidth - 6 : STAGE_WIDTH - 4;
  const y = (position) => position * rowHeight + rowHeight / 2;

  ctx.clearRect(0, 0, STAGE_WIDTH, height);
  queryNodes.forEach((node, a) => node.classList.toggle("focus", focus !== null && focus.side === "query" && focus.index === a));
  keyNodes.forEach((node, b) => node.classList.toggle("focus", focus !== null && focus.side === "key" && focus.index === b));

  // Each (head, query, key) whose weight byte reaches `lowest` gets a line. Without focus, `lowest` rises
  // until at most LINE_BUDGET lines remain: the strongest ones (long lines are slow to draw, and a
  // thousand-token tangle shows nothing). A focused token shows all its lines.
  const visit = (fn) => {
    for (const h of heads) {
      for (let a = 0; a < rows.length; a++) {
        if (focus && focus.side === "query" && focus.index !== a) continue;
        const base = (h * T + rows[a]) * S;
        for (let b = 0; b < cols.length; b++) {
          if (focus && focus.side === "key" && focus.index !== b) continue;
          fn(h, a, b, bytes[base + cols[b]]);
        }
      }
    }
  };
  let lowest = 1;
  if (!focus) {
    const counts = new Uint32Array(256);
    visit((h, a, b, w) => { counts[w] += 1; });
    let kept = 0;
    lowest = 256;
    while (lowest > HIDDEN_BELOW && (kept === 0 || kept + counts[lowest - 1] <= LINE_BUDGET)) kept += counts[--lowest];
  }
  // One stroke per (head, opacity level): 16 levels.
  const levels = heads.map(() => Array.from({ length: 16 }, () => []));
  const slot = new Map(heads.map((h, n) => [h, n]));
  visit((h, a, b, w) => { if (w >= lowest) levels[slot.get(h)][w >> 4].push(a, b); });
  ctx.lineWidth = focus ? 1.5 : 1;  // width 1 takes the fast hairline path
  heads.forEach((h, n) => {
    const [r, g, bl] = headRgb(h);
    levels[n].forEach((segments, level) => {
      if (segments.length === 0) return;
      ctx.strokeStyle = `rgba(${r},${g},${bl},${((level * 16 + 8) / 255).toFixed(3)})`;
      ctx.beginPath();
      for (let k = 0; k < segments.length; k += 2) {
        ctx.moveTo(x0, y(segments[k]));
        ctx.lineTo(x1, y(segments[k + 1]));
      }
      ctx.stroke();
    });
  });
  stageTitle.textContent = `layer ${state.layer} · ${heads.length} of ${map.nHeads} heads` +
    (lowest > HIDDEN_BELOW && !focus ? ` · weights ≥ ${(lowest / 255).toFixed(2)}` : "");

  if (focus && focus.side === "query") {
    heads.forEach((h) => {
      const [r, g, bl] = headRgb(h);
      const offset = (h * T + rows[focus.index]) * S;
      for (let b = 0; b < cols.length; b++) {
        ctx.fillStyle = `rgba(${r},${g},${bl},${(bytes[offset + cols[b]] / 255).toFixed(3)})`;
        ctx.fillRect(x1 + 4 + h * BAND, y(b) - rowHeight / 2 + 3, BAND - 1, rowHeight - 6);
      }
    });
  }
  painted();
}

buildControls();
buildColumns();
