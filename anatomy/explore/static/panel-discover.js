// Discover: a behaviour's circuit over a dataset of clean/corrupted pairs (anatomy.circuits.discovery),
// run as a job: every edge scored (EAP or EAP-IG), the faithfulness curve of the top-n circuits, the
// strongest edges, and the smallest circuit reaching 80% drawn by the circuits floor's own page.
// The text box plays no part: the pairs are the task's.
import {api, cancelJobIn, clear, el, errorBox, fmt, followJob, isAbort, jobPageUrl, pageFrame, progressBar, register,
        state} from "./core.js";

const controls = document.getElementById("discover-controls");
const body = document.getElementById("discover-body");
const frame = pageFrame("the circuit");
const TASKS = [["ioi", "IOI"], ["greater-than", "greater-than"], ["capital-country", "capital–country"],
               ["sva", "subject–verb"], ["custom", "my pairs"]];
const settings = {task: "ioi", pairs: 50, method: "eap-ig", steps: 5};
const custom = el("textarea", {rows: "4", spellcheck: "false", class: "discover-custom",
  placeholder: '{"clean": "When Mary and John went to the store, John gave a drink to", "corrupt": "When Mary and John went to the store, Tom gave a drink to", "answer": " Mary", "wrong": " John"}'});
const results = new Map();  // model -> the last result shown

function drawControls() {
  const number = (name, max) => el("input", {type: "number", min: "1", max: String(max), value: String(settings[name]),
    "aria-label": name, onchange: (event) => { settings[name] = Number(event.target.value); }});
  clear(controls,
    el("label", {}, "task ", el("select", {"aria-label": "task", onchange: (event) => { settings.task = event.target.value; drawControls(); }},
      TASKS.map(([value, label]) => el("option", {value, text: label, ...(value === settings.task ? {selected: ""} : {})})))),
    settings.task === "custom" ? null : el("label", {}, "pairs ", number("pairs", 200)),
    el("label", {}, "method ", el("select", {"aria-label": "method", onchange: (event) => { settings.method = event.target.value; drawControls(); }},
      [["eap-ig", "EAP-IG"], ["eap", "EAP"]].map(([value, label]) => el("option", {value, text: label, ...(value === settings.method ? {selected: ""} : {})})))),
    settings.method === "eap-ig" ? el("label", {}, "steps ", number("steps", 20)) : null,
    el("button", {type: "button", text: "Discover", onclick: run}),
    settings.task === "custom" ? el("div", {class: "discover-custom-box"},
      el("p", {class: "small muted", text: "One pair a line (JSON): both prompts of a pair have as many tokens; each answer is one token."}),
      custom) : null);
}

function customPairs() {
  const lines = custom.value.split("\n").map((line) => line.trim()).filter(Boolean);
  return lines.map((line, index) => {
    try { return JSON.parse(line); } catch { throw new Error(`line ${index + 1} is not JSON`); }
  });
}

async function run() {
  cancelJobIn(body);
  const request = {kind: "discover", model: state.model, task: settings.task, method: settings.method,
                   pairs: settings.pairs, steps: settings.steps};
  const progress = el("div", {}, "starting…");
  clear(body, el("div", {class: "job"}, progress, el("button", {type: "button", text: "cancel", onclick: () => cancelJobIn(body)})));
  let job = null;
  try {
    if (settings.task === "custom") request.custom = customPairs();
    job = body.job = await api("/api/jobs", request);
    const stages = ["scoring edges", "running circuits"];
    let stage = 0, last = 0;
    const done = await followJob(job, (s) => {
      if (s.done < last) stage = Math.min(stage + 1, stages.length - 1);  // a new stage starts its count again
      last = s.done;
      clear(progress, `${stages[stage]}: `, progressBar(s.done, s.total), " passes");
    });
    if (body.job !== job) return;
    results.set(state.model, {result: done.result, url: jobPageUrl(job)});
    await show(done.result, jobPageUrl(job));
  } catch (error) {
    if (!isAbort(error) && body.job === job) clear(body, errorBox(error));
  } finally {
    if (body.job === job) body.job = null;
  }
}

// The faithfulness curve: the share of the clean-minus-corrupted gap recovered by the top n edges
// (log n across), the target's line, and the smallest circuit that reaches it marked.
function curve(result) {
  const width = 520, height = 180, left = 44, bottom = 26, top = 10, right = 12;
  const sizes = result.sizes, values = result.faithfulness.map((v) => (v === null ? 0 : v));
  const low = Math.min(0, ...values), high = Math.max(1, ...values);
  const x = (n) => left + (width - left - right) * Math.log10(n) / Math.max(1e-9, Math.log10(sizes[sizes.length - 1]));
  const y = (v) => top + (height - top - bottom) * (high - v) / (high - low);
  const svg = (tag, attributes) => {
    const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, String(value));
    return node;
  };
  const figure = svg("svg", {viewBox: `0 0 ${width} ${height}`, class: "discover-curve", role: "img",
                              "aria-label": "faithfulness against circuit size"});
  figure.append(svg("line", {x1: left, x2: width - right, y1: y(result.target), y2: y(result.target), class: "target"}));
  figure.append(svg("line", {x1: left, x2: left, y1: top, y2: height - bottom, class: "axis"}));
  figure.append(svg("line", {x1: left, x2: width - right, y1: height - bottom, y2: height - bottom, class: "axis"}));
  figure.append(svg("polyline", {points: sizes.map((n, i) => `${x(n)},${y(values[i])}`).join(" "), class: "line"}));
  sizes.forEach((n, i) => {
    const dot = svg("circle", {cx: x(n), cy: y(values[i]), r: n === result.smallest ? 5 : 3, class: n === result.smallest ? "chosen" : "dot"});
    const title = svg("title", {});
    title.textContent = `${n} edges: ${fmt(values[i])}`;
    dot.append(title);
    figure.append(dot);
  });
  for (const v of [0, result.target, 1]) {
    const label = svg("text", {x: left - 6, y: y(v) + 4, "text-anchor": "end", class: "tick"});
    label.textContent = String(v);
    figure.append(label);
  }
  for (const n of [1, sizes[sizes.length - 1]]) {
    const label = svg("text", {x: x(n), y: height - 8, "text-anchor": n === 1 ? "start" : "end", class: "tick"});
    label.textContent = `${n} edge${n === 1 ? "" : "s"}`;
    figure.append(label);
  }
  return figure;
}

async function show(result, url) {
  const chosen = result.smallest ? `the smallest circuit reaching ${Math.round(100 * result.target)}%: ${result.smallest} of ${result.edges} edges`
    : `no circuit smaller than the model reaches ${Math.round(100 * result.target)}%`;
  clear(body,
    el("p", {class: "discover-summary", text: `${result.task}: ${result.pairs} pairs` + (result.dropped ? ` (${result.dropped} dropped: the model got them wrong)` : "")
      + `; metric clean ${fmt(result.clean)}, everything ablated ${fmt(result.ablated)}; ${chosen}.`}),
    el("p", {class: "small muted", text: result.check}),
    el("div", {class: "discover-row"},
      el("figure", {}, curve(result), el("figcaption", {class: "small muted", text: "faithfulness: the share of the gap the top n edges recover"})),
      el("table", {class: "discover-top"},
        el("thead", {}, el("tr", {}, el("th", {text: "edge"}), el("th", {text: "score"}))),
        el("tbody", {}, result.top.map(([name, score]) => el("tr", {}, el("td", {class: "tok", text: name}), el("td", {class: "num", text: fmt(score)})))))),
    frame);
  await frame.load(url);
}

async function update() {
  drawControls();
  const last = results.get(state.model);
  if (last && !body.job) await show(last.result, last.url);
  else if (!body.job) clear(body, el("p", {class: "muted", text: "Choose a task and press Discover: every edge between the model's heads and MLPs is scored over the task's pairs, then circuits of the top edges are run with everything else ablated."}));
}

register("discover", {update});
