"use strict";
// anatomy analysis views. A result's payload (anatomy/analysis/views.py: panels(result)) is drawn
// into an element by the function of its layout:
//   ANALYSIS_VIEWS.heatmap(payload, element, options)  patching, head scores, rollout, decomposition
//   ANALYSIS_VIEWS.lens(payload, element, options)     the logit lens: top tokens by layer and position
//   ANALYSIS_VIEWS.dla(payload, element, options)      direct logit attribution: ranked bars, per layer
//   ANALYSIS_VIEWS.tokens(payload, element, options)   integrated gradients, gradient x input
// drawAnalysis(payload, element, options) picks the function by payload.layout; a page that
// fetched a payload (the live explorer) calls it the same way. options.controls: an element for
// the controls (the page's sticky bar); without it they go in a bar at the top of `element`.
// Every control only changes what is drawn: the numbers are the payload's, never recomputed.
// Runs after common.js (el, control, selectControl, painted) and grid.js (heatmap, colorBar).
// Every label reaches the page as text (textContent, title), never as HTML.

const CHECK_PREFIX = { holds: "✓ ", fails: "⚠ ", none: "" };

// The identity line: green when the identity holds, amber when it does not, grey when there is none.
function checkLine(check) {
  const line = el("p", `check ${check.status}`, CHECK_PREFIX[check.status] + check.text);
  line.title = check.rule;
  line.dataset.status = check.status;
  return line;
}

function indices(n) {
  return Array.from({ length: n }, (_, i) => i);
}

// Shared by every layout: the state, the controls bar, the body, redrawn on every change.
function mount(payload, element, options, view) {
  options = options || {};
  const state = Object.assign({ panel: 0 }, view.initial(payload.panels[0], payload));
  const bar = options.controls || element.appendChild(el("div", "controls inline-controls"));
  const body = element.appendChild(el("div", "analysis-body"));
  const redraw = () => {
    const panel = payload.panels[state.panel];
    const controls = [];
    if (payload.panels.length > 1) {
      const names = payload.panels.map((p, index) => [index, p.name]);
      controls.push(selectControl("Sequence", names, state.panel, (value) => {
        state.panel = value;
        Object.assign(state, view.initial(payload.panels[value], payload));
        redraw();
      }, "panel"));
    }
    controls.push(...view.controls(panel, state, redraw, payload));
    bar.replaceChildren(...controls);
    bar.hidden = controls.length === 0;
    const parts = [checkLine(payload.check)];
    if (panel.caption) parts.push(el("p", "note caption", panel.caption));
    if (payload.tokenLegend) parts.push(el("p", "note token-legend", `Tokens: ${payload.tokenLegend}.`));
    body.replaceChildren(...parts, ...view.draw(panel, state, redraw, payload));
    painted();
  };
  redraw();
  return state;
}

// ---- controls ----

// Layers from .. to: two selects over the layers a panel's rows belong to.
function layerRangeControls(layers, state, redraw) {
  const options = layers.map((layer) => [layer, String(layer)]);
  return [
    selectControl("Layers from", options, state.layerFrom, (value) => {
      state.layerFrom = value;
      state.layerTo = Math.max(state.layerTo, value);
      redraw();
    }, "layer-from"),
    selectControl("to", options, state.layerTo, (value) => {
      state.layerTo = value;
      state.layerFrom = Math.min(state.layerFrom, value);
      redraw();
    }, "layer-to"),
  ];
}

// The distinct layers rows belong to (null: a row of no layer, always shown), and the initial range.
function layersOf(rowLayers) {
  return rowLayers ? [...new Set(rowLayers.filter((layer) => layer !== null))].sort((a, b) => a - b) : [];
}

function layerRangeState(rowLayers) {
  const layers = layersOf(rowLayers);
  return layers.length ? { layerFrom: layers[0], layerTo: layers[layers.length - 1] } : {};
}

function inLayerRange(layer, state) {
  return layer === null || layer === undefined || state.layerFrom === undefined
    || (layer >= state.layerFrom && layer <= state.layerTo);
}

// The rows of a panel that the layer range keeps, as indices.
function shownRows(rowLayers, nRows, state) {
  return indices(nRows).filter((i) => !rowLayers || inLayerRange(rowLayers[i], state));
}

// ---- heatmap: patching, head scores, rollout, decomposition ----

const HEATMAP = {
  initial: (panel) => ({ frame: panel.frame || 0, ...layerRangeState(panel.rowLayers) }),
  controls(panel, state, redraw) {
    const controls = [];
    if (panel.frames.length > 1) {
      const frames = panel.frames.map((frame, index) => [index, frame.label]);
      controls.push(selectControl(panel.frameControl || "Show", frames, state.frame,
        (value) => { state.frame = value; redraw(); }, "frame"));
    }
    const layers = layersOf(panel.rowLayers);
    if (layers.length > 1) controls.push(...layerRangeControls(layers, state, redraw));
    return controls;
  },
  draw(panel, state) {
    const frame = panel.frames[state.frame];
    const rows = shownRows(panel.rowLayers, panel.rows.length, state);
    const values = rows.map((i) => frame.values[i]);
    return [
      colorBar(frame.scale, frame.legend, countClipped(values, frame.scale)),
      heatmap({
        name: panel.name, rows: rows.map((i) => panel.rows[i]), rowKeys: rows, cols: panel.cols,
        values, scale: frame.scale, corner: panel.corner,
      }),
    ];
  },
};

// ---- the logit lens: fixed-width cells, the top-k tokens of each layer at each position ----

const LENS = {
  initial: (panel) => ({ k: 1, target: "top", ...layerRangeState(panel.rowLayers) }),
  controls(panel, state, redraw) {
    const ks = indices(panel.k).map((i) => [i + 1, String(i + 1)]);
    const targets = [["top", "the top token"], ...panel.targets.map((t, index) => [`t${index}`, `p(${t.token})`])];
    return [
      selectControl("Top-k", ks, state.k, (value) => { state.k = value; redraw(); }, "top-k"),
      selectControl("Shade by", targets, state.target, (value) => { state.target = value; redraw(); }, "target"),
      ...layerRangeControls(layersOf(panel.rowLayers), state, redraw),
    ];
  },
  draw(panel, state) {
    const rows = shownRows(panel.rowLayers, panel.rows.length, state);
    const target = state.target === "top" ? null : panel.targets[Number(state.target.slice(1))];
    // The value of a cell: the top token's probability, or the chosen target's.
    const valueOf = (i, j) => (target ? target.probs[i][j] : panel.probs[i][j][0]);
    const values = rows.map((i) => panel.cols.map((_, j) => valueOf(i, j)));
    const legend = target ? `probability of ${target.token}` : "probability of the top token";
    return [
      colorBar(panel.scale, legend),
      heatmap({
        name: panel.name, rows: rows.map((i) => panel.rows[i]), rowKeys: rows, cols: panel.cols,
        colKeys: panel.colKeys,  // the positions, when the panel is a window of a longer text
        values, scale: panel.scale, corner: panel.corner, cellWidth: 104,
        cellHeight: target ? 34 : 8 + 16 * state.k,
        render(cell, r, j, value) {
          const i = rows[r];
          cell.classList.add("lens-cell");
          if (target) {
            cell.append(lensLine("p", shortValue(value, 1), "lens-target", true));  // the colour bar names the token
            cell.append(lensLine(panel.top[i][j][0], shortValue(panel.probs[i][j][0], 1), "lens-minor"));
            return;
          }
          for (let k = 0; k < state.k; k++) {
            const probability = shortValue(panel.probs[i][j][k], 1);
            cell.append(lensLine(panel.top[i][j][k], probability, k ? "lens-minor" : "", k === 0));
          }
        },
        tooltip(r, j) {
          const i = rows[r];
          const top = panel.top[i][j].map((token, k) => `${k + 1}. ${token}  ${formatValue(panel.probs[i][j][k])}`);
          const head = `${panel.rows[i]} · position ${panel.colKeys ? panel.colKeys[j] : j} ${panel.cols[j]}`;
          const chosen = target ? [`p(${target.token}) = ${formatValue(target.probs[i][j])}`] : [];
          return [head, ...chosen, ...top].join("\n");
        },
      }),
    ];
  },
};

// One line of a lens cell: a token and its probability; `shown` marks the probability that is the
// cell's value (the one it is shaded by).
function lensLine(token, probability, className, shown = false) {
  const line = el("div", `lens-line ${className}`);
  const value = el("span", "lens-prob", probability);
  if (shown) value.dataset.shown = "";
  line.append(el("span", "lens-token", token), value);
  return line;
}

// ---- direct logit attribution: the top components at one position, ranked; then per layer ----

const TOP_K_BARS = [5, 10, 20, 40];

const DLA = {
  initial: (panel) => ({ position: panel.position, k: 10, ...layerRangeState(panel.componentLayers) }),
  controls(panel, state, redraw) {
    const positions = panel.positions.map((token, t) => [t, `${t} · ${token}`]);
    const ks = TOP_K_BARS.filter((k) => k < panel.components.length).concat([panel.components.length])
      .map((k) => [k, String(k)]);
    if (!ks.some(([k]) => k === state.k)) state.k = ks[Math.min(1, ks.length - 1)][0];
    const layers = layersOf(panel.componentLayers);
    return [
      selectControl("Position", positions, state.position,
        (value) => { state.position = value; redraw(); }, "position"),
      selectControl("Top-k", ks, state.k, (value) => { state.k = value; redraw(); }, "top-k"),
      ...(layers.length > 1 ? layerRangeControls(layers, state, redraw) : []),
    ];
  },
  draw(panel, state, redraw) {
    const t = state.position;
    const column = panel.values.map((row) => row[t]);
    // Ranked by size among the components of the chosen layers; the rest summed into one bar.
    const candidates = indices(column.length).filter((c) => inLayerRange(panel.componentLayers[c], state));
    candidates.sort((a, b) => Math.abs(column[b]) - Math.abs(column[a]));
    const kept = candidates.slice(0, state.k);
    const keptSet = new Set(kept);
    const rest = indices(column.length).filter((c) => !keptSet.has(c));
    const bars = kept.map((c) => ({ label: panel.components[c], value: column[c], key: String(c) }));
    if (rest.length) {
      const sum = rest.reduce((total, c) => total + column[c], 0);
      const label = `other ${rest.length} component${rest.length === 1 ? "" : "s"}`;
      bars.push({ label, value: sum, key: "other", other: true });
    }
    const target = panel.targets ? panel.targets[t] : "the target";
    const title = el("p", "dla-title",
      `Logit of ${target} at position ${t} (${panel.positions[t]}) = ${formatValue(panel.logits[t])}, ` +
      "the sum of these bars");
    const perLayer = panel.groups;
    const groupRows = shownRows(perLayer.rowLayers, perLayer.rows.length, state);
    const groupValues = groupRows.map((i) => perLayer.values[i]);
    return [
      title,
      barChart(bars, panel.name),
      el("h2", "section-title", "Per layer, at every position (click a position to rank its components)"),
      colorBar(perLayer.scale, perLayer.legend, countClipped(groupValues, perLayer.scale)),
      heatmap({
        name: `${panel.name} per layer`, rows: groupRows.map((i) => perLayer.rows[i]), rowKeys: groupRows,
        cols: panel.positions, values: groupValues, scale: perLayer.scale, corner: "component \\ position",
        highlightCol: t, onColumnClick: (j) => { state.position = j; redraw(); },
      }),
    ];
  },
};

// Horizontal bars from one zero line: label | bar | value, one CSS grid, so each bar is beside its label.
function barChart(bars, name) {
  const lo = Math.min(0, ...bars.map((b) => b.value));
  const hi = Math.max(0, ...bars.map((b) => b.value));
  const span = hi - lo || 1;
  const chart = el("div", "bars");
  chart.dataset.bars = name;
  for (const bar of bars) {
    const label = el("div", "bar-label", bar.label);
    label.dataset.barLabel = bar.key;
    const track = el("div", "bar-track");
    const fill = el("div", `bar-fill ${bar.other ? "other" : bar.value >= 0 ? "positive" : "negative"}`);
    const from = (Math.min(0, bar.value) - lo) / span;
    fill.style.left = `${(100 * from).toFixed(2)}%`;
    fill.style.width = `${(100 * Math.abs(bar.value) / span).toFixed(2)}%`;
    const zero = el("div", "bar-zero");
    zero.style.left = `${(100 * (0 - lo) / span).toFixed(2)}%`;
    track.append(zero, fill);
    const value = el("div", "bar-value", formatValue(bar.value));
    for (const part of [track, value]) {
      part.dataset.bar = bar.key;
    }
    value.dataset.value = String(bar.value);
    track.title = `${bar.label}: ${formatValue(bar.value)}`;
    chart.append(label, track, value);
  }
  return chart;
}

// ---- attributions: each token with its value, shaded ----

const TOKENS = {
  initial: () => ({}),
  controls: () => [],
  draw(panel) {
    const strip = el("div", "token-strip");
    strip.dataset.grid = panel.name;
    panel.tokens.forEach((token, j) => {
      const block = el("div", "token-block");
      const label = el("div", "token-label", token);
      label.dataset.colHeader = String(j);
      label.title = `${j}: ${token}`;
      const color = scaleRgb(panel.values[j], panel.scale);
      const shown = shortValue(panel.values[j], scaleExtent(panel.scale));
      const cell = el("div", `token-value${isDark(color) ? " dark" : ""}`, shown);
      cell.style.background = cssRgb(color);
      cell.dataset.col = String(j);
      if (panel.values[j] !== null) {
        cell.dataset.value = String(panel.values[j]);
        const { clipped } = scalePosition(panel.values[j], panel.scale);
        if (clipped) cell.classList.add(clipped > 0 ? "clipped-high" : "clipped-low");
      }
      cell.title = `${j}: ${token} = ${formatValue(panel.values[j])}${clippedNote(panel.values[j], panel.scale)}`;
      block.append(label, cell);
      strip.append(block);
    });
    return [
      ...(panel.summary ? [el("p", "note summary", panel.summary)] : []),
      colorBar(panel.scale, panel.legend, countClipped([panel.values], panel.scale)),
      strip,
    ];
  },
};

const ANALYSIS_VIEWS = {
  heatmap: (payload, element, options) => mount(payload, element, options, HEATMAP),
  lens: (payload, element, options) => mount(payload, element, options, LENS),
  dla: (payload, element, options) => mount(payload, element, options, DLA),
  tokens: (payload, element, options) => mount(payload, element, options, TOKENS),
};

function drawAnalysis(payload, element, options) {
  const draw = ANALYSIS_VIEWS[payload.layout];
  if (!draw) throw new Error(`no view for layout ${payload.layout}`);
  return draw(payload, element, options);
}

// The page: its one result, with the controls in the page's sticky bar.
if (DATA.view === "analysis") {
  window.anatomyView.state = drawAnalysis(DATA.analysis, document.getElementById("main"),
    { controls: document.getElementById("controls") });
}
