// anatomy explore: what every panel shares.
//
// The page calls the same JSON API scripts use (docs/explore.md), with the access token from its
// own URL. Text from the model (tokens) reaches the page only as text: textContent, title,
// never innerHTML; the one exception is the walk's steps, HTML that anatomy's walk renderer wrote
// and escaped (anatomy/walk/render_html.py), under a policy that runs no inline script.

const params = new URLSearchParams(location.search);
export const TOKEN = params.get("token") || sessionStorage.getItem("anatomy-token") || "";
if (TOKEN) sessionStorage.setItem("anatomy-token", TOKEN);

// ---- the state, kept in the URL's hash so that a link brings it back ----------------------------

const hash = new URLSearchParams(location.hash.slice(1));
export const state = {
  model: hash.get("model") || "",
  text: hash.get("text") ?? null,
  target: hash.get("target") || "",
  panel: hash.get("panel") || "walk",
  layer: Number(hash.get("layer") || 0),
  head: Number(hash.get("head") || 0),
  row: hash.has("row") ? Number(hash.get("row")) : null,
  models: [],
  run: null,  // the last /api/run answer
  generation: 0,  // bumped by every change of the text, the model or the sampling settings
};

export function saveState() {
  const keep = new URLSearchParams();
  for (const key of ["model", "text", "target", "panel", "layer", "head", "row"]) {
    if (state[key] !== null && state[key] !== "" && state[key] !== undefined) keep.set(key, String(state[key]));
  }
  history.replaceState(null, "", `${location.pathname}${location.search}#${keep.toString()}`);
}

export function shareLink() {
  return `${location.origin}${location.pathname}?token=${encodeURIComponent(TOKEN)}${location.hash}`;
}

// ---- the API ------------------------------------------------------------------------------------

export class ApiError extends Error {}

// POST `path` with `body`; `slot` names a request that a newer one of the same slot cancels (a
// keystroke cancels the previous keystroke's request).
const inFlight = new Map();
export async function api(path, body, slot = null) {
  if (slot && inFlight.has(slot)) inFlight.get(slot).abort();
  const controller = new AbortController();
  if (slot) inFlight.set(slot, controller);
  try {
    const response = await fetch(path, {
      method: body === undefined ? "GET" : "POST",
      headers: {"Authorization": `Bearer ${TOKEN}`, ...(body === undefined ? {} : {"Content-Type": "application/json"})},
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: controller.signal,
    });
    const data = await response.json().catch(() => ({error: `${response.status} ${response.statusText}`}));
    if (!response.ok) throw new ApiError(data.error || `${response.status}`);
    return data;
  } finally {
    if (slot && inFlight.get(slot) === controller) inFlight.delete(slot);
  }
}

export function isAbort(error) {
  return error && error.name === "AbortError";
}

// Cancel every request in flight: the text changed, and none of them describes it any more. The
// server drops a cancelled request that has not started (explore/lanes.py).
export function abortAll() {
  for (const controller of inFlight.values()) controller.abort();
  inFlight.clear();
}

// ---- freshness: whether each panel shows the current text, at a glance ----------------------------

const FRESHNESS = {
  current: "up to date", updating: "updating…", stale: "shows an earlier text", error: "error", empty: "",
  idle: "not run yet",
};

// Mark panel `name` (its data-panel section) as showing the current text, updating, stale, an error,
// nothing (no text, or nothing it can show) or idle (a panel run on request, not run yet); the badge in
// its title says which, and CSS dims what is not current.
export function markFresh(name, kind) {
  const section = document.querySelector(`[data-panel="${name}"]`);
  if (!section) return;
  section.dataset.fresh = kind;
  section.dataset.generation = String(state.generation);
  let badge = section.querySelector(":scope > h2 .fresh");
  if (!badge) {
    badge = el("span", {class: "fresh", role: "status"});
    section.querySelector(":scope > h2")?.append(badge);
  }
  badge.textContent = FRESHNESS[kind] ?? kind;
  badge.title = kind === "current" ? "this panel shows the text in the box" : badge.textContent;
}

// Draw an analysis payload (anatomy/analysis/views.py's, the one `anatomy analyze` pages draw) into
// `element` with the analysis pages' own script (analysis.js, loaded by the page).
export function drawPayload(element, payload) {
  const body = el("div", {class: "viz analysis-view", "data-layout": payload.layout});
  element.replaceChildren(body);
  window.drawAnalysis(payload, body);
  return body;
}

// The request body every panel starts from: the model and the text (and an encoder-decoder's target).
export function textBody(extra = {}) {
  const body = {model: state.model, text: state.text ?? ""};
  if (state.target) body.target_text = state.target;
  return {...body, ...extra};
}

export function exportUrl(panel, format, extra = {}) {
  const query = new URLSearchParams({panel, format, token: TOKEN, model: state.model, text: state.text ?? "",
                                     layer: String(state.layer), head: String(state.head), ...extra});
  if (state.target) query.set("target_text", state.target);
  if (state.row !== null) query.set("row", String(state.row));
  return `/api/export?${query.toString()}`;
}

// ---- drawing helpers ----------------------------------------------------------------------------

export function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "text") node.textContent = value;
    else if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function clear(node, ...children) {
  node.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined));
}

export function fmt(value, digits = 3) {
  if (value === null || value === undefined || !Number.isFinite(value)) return "–";
  if (value === 0) return "0";
  const size = Math.abs(value);
  if (size >= 1000 || size < 0.001) return value.toExponential(1);
  return value.toFixed(size >= 100 ? 0 : size >= 10 ? 1 : digits);
}

export function percent(p) {
  if (p === null || !Number.isFinite(p)) return "–";
  if (p > 0 && p < 1e-4) return "<0.01%";
  return p >= 0.0995 ? `${(100 * p).toFixed(1)}%` : `${(100 * p).toFixed(2)}%`;
}

// A <select> of numbers lo..hi-1, calling onchange with the number.
export function numberSelect(label, count, value, onchange, name = (i) => String(i)) {
  const select = el("select", {"aria-label": label, onchange: () => onchange(Number(select.value))});
  for (let i = 0; i < count; i++) select.append(el("option", {value: String(i), text: name(i)}));
  select.value = String(Math.min(value, count - 1));
  return el("label", {}, `${label} `, select);
}

export function status(text, kind = "") {
  const node = document.getElementById("status");
  node.textContent = text;
  node.className = `status ${kind}`;
}

export function errorBox(error) {
  return el("p", {class: "error", text: error instanceof Error ? error.message : String(error)});
}

// ---- panels -------------------------------------------------------------------------------------

// Each panel registers update(): called when the text, the model or a shared setting changes (it may
// return its freshness, markFresh's kind, when that is not "current"),
// only while the panel is shown; it fetches what it draws.
export const panels = new Map();
export function register(name, panel) {
  panels.set(name, panel);
}

// Follow a job's progress by Server-Sent Events; resolves with its result, rejects on error.
export function followJob(job, onProgress) {
  return new Promise((resolve, reject) => {
    const source = new EventSource(`/api/jobs/${encodeURIComponent(job.id)}/events?token=${encodeURIComponent(TOKEN)}`);
    source.addEventListener("progress", (event) => onProgress(JSON.parse(event.data)));
    source.addEventListener("result", (event) => { source.close(); resolve(JSON.parse(event.data)); });
    source.addEventListener("error", (event) => {
      source.close();
      reject(new ApiError(event.data ? JSON.parse(event.data).error : "the job's connection was lost"));
    });
    source.addEventListener("cancelled", () => { source.close(); reject(new ApiError("cancelled")); });
  });
}

export async function cancelJob(job) {
  await fetch(`/api/jobs/${encodeURIComponent(job.id)}`, {method: "DELETE", headers: {"Authorization": `Bearer ${TOKEN}`}});
}

export function progressBar(done, total) {
  const bar = el("progress", {max: String(Math.max(1, total)), value: String(done)});
  return el("span", {class: "progress"}, bar, ` ${done} / ${total}`);
}

export function currentModel() {
  return state.models.find((m) => m.name === state.model) || {};
}

// The position the walk works by hand and the attention's neuron view follows: the clicked token,
// else the last one.
export function currentRow() {
  const n = state.run ? state.run.tokens.length : 1;
  return state.row !== null && state.row >= 0 && state.row < n ? state.row : n - 1;
}

// A page of its own in a frame (the circuits floor's graph page): its script and style stay apart
// from this one's. The analysis panels are drawn in the page itself instead (drawPayload).
export function pageFrame(title) {
  const frame = el("iframe", {class: "analysis-frame", title, sandbox: "allow-scripts"});
  frame.load = (src) => {
    if (frame.dataset.src === src) return Promise.resolve();
    frame.dataset.src = src;
    return new Promise((resolve) => {
      frame.addEventListener("load", () => resolve(), {once: true});
      frame.src = src;
    });
  };
  return frame;
}

export function jobPageUrl(job) {
  return `/api/jobs/${encodeURIComponent(job.id)}/page?token=${encodeURIComponent(TOKEN)}`;
}

// A long analysis as a job (POST /api/jobs with `body`): its progress and a cancel button in `box`,
// then its result drawn in `box` as the analysis pages draw it (its payload, result.view), or, given a
// `frame` (pageFrame), the job's own page in it. A newer job in the same box cancels this one (cancelJobIn).
export async function runJob(box, body, what, unit, {bar = true, frame = null} = {}) {
  cancelJobIn(box);
  const progress = el("div", {}, "starting…");
  clear(box, el("div", {class: "job"}, progress,
                el("button", {type: "button", text: "cancel", onclick: () => cancelJobIn(box)})));
  let job = null;
  try {
    job = box.job = await api("/api/jobs", body);
    const done = await followJob(job, (s) => clear(progress, `${what}: `, bar ? progressBar(s.done, s.total) : String(s.done), ` ${unit}`));
    if (box.job !== job) return;
    if (frame === null) {
      drawPayload(box, done.result.view);
    } else {
      clear(box, frame);
      await frame.load(jobPageUrl(job));
    }
  } catch (error) {
    if (!isAbort(error) && box.job === job) clear(box, errorBox(error));
  } finally {
    if (box.job === job) box.job = null;
  }
}

export function cancelJobIn(box) {
  if (box.job) cancelJob(box.job);
  box.job = null;
}

// Two next-token distributions side by side (before and after an intervention or a steering):
// one row per token, a bar and a percentage for each.
export function beforeAfterRows(rows, count = 12) {
  const top = Math.max(...rows.map((r) => Math.max(r.before, r.after)), 1e-9);
  const bar = (fraction, kind) => {
    const fill = el("span", {class: `bar-fill ${kind}`});
    fill.style.width = `${Math.max(0.5, 100 * fraction)}%`;
    return el("span", {class: "bar-track"}, fill);
  };
  return [
    el("div", {class: "pair-head"}, el("span", {}), el("span", {text: "before"}), el("span", {}), el("span", {text: "after"}),
       el("span", {})),
    rows.slice(0, count).map((row) => el("div", {class: "pair-row", title: `${row.token}: ${percent(row.before)} → ${percent(row.after)}`},
      el("span", {class: "bar-label tok", text: row.token}), bar(row.before / top, "before"),
      el("span", {class: "bar-value", text: percent(row.before)}), bar(row.after / top, "after"),
      el("span", {class: "bar-value", text: percent(row.after)}))),
  ];
}
