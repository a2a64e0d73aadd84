// The logit lens: layer × position, the top tokens read from the residual stream there (the pass's
// own; explore/lens.py keeps each position's row, so a keystroke computes its new positions only),
// drawn by the analysis pages' own lens view (analysis.js) a page of positions at a time: as many
// as fit the panel's width, the newest by default, with its row labels and column headers sticky.
import {api, clear, drawPayload, el, errorBox, isAbort, register, textBody} from "./core.js";

const controls = document.getElementById("lens-controls");
const body = document.getElementById("lens-body");
const CELL = 105;  // px: a lens cell (analysis.js: 104) and its gap
const LABELS = 120;  // px: the row labels ("resid_post 29")
let start = null;  // the first position shown; null: the newest page

function pageSize() {
  return Math.max(1, Math.floor((body.clientWidth - LABELS) / CELL));
}

async function update() {
  const count = pageSize();
  let data;
  try {
    data = await api("/api/lens", textBody({count, ...(start === null ? {} : {start})}), "lens");
  } catch (error) {
    if (!isAbort(error)) clear(body, errorBox(error));
    return;
  }
  drawPager(data, count);
  drawPayload(body, data.view);
}

function drawPager(data, count) {
  if (data.total <= count) { clear(controls); return; }
  const go = (to) => { start = to; update(); };
  clear(controls,
    el("button", {type: "button", text: "◀ earlier", disabled: data.start === 0,
                  onclick: () => go(Math.max(0, data.start - count))}),
    el("span", {class: "muted small", text: `positions ${data.start}–${data.stop - 1} of ${data.total}`}),
    el("button", {type: "button", text: "later ▶", disabled: data.stop >= data.total,
                  onclick: () => go(data.stop + count >= data.total ? null : data.stop)}),
    el("button", {type: "button", text: "newest", disabled: start === null, onclick: () => go(null)}));
}

register("lens", {update, exportSettings: () => ({})});
