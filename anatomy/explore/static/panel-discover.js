// Discover: a behaviour's circuit over a dataset of clean/corrupted pairs (anatomy.circuits.discovery),
// run as a job: every edge scored (EAP or EAP-IG), the faithfulness curve of the top-n circuits, the
// strongest edges, and the circuit drawn by the circuits floor's own page (it opens on the smallest
// circuit reaching 80%, with a slider to grow it beside the curve). The text box plays no part: the
// pairs are the task's.
import {api, cancelJobIn, clear, el, errorBox, fmt, followJob, isAbort, jobPageUrl, markFresh, pageFrame, progressBar,
        register, state} from "./core.js";

const controls = document.getElementById("discover-controls");
const body = document.getElementById("discover-body");
const frame = pageFrame("the circuit");
const TASKS = [["ioi", "IOI"], ["greater-than", "greater-than"], ["capital-country", "capital–country"],
               ["sva", "subject–verb"], ["custom", "my pairs"]];
const settings = {task: "ioi", pairs: 100, method: "eap-ig", steps: 5};  // the CLI's defaults
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
  markFresh("discover", "updating");
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
    markFresh("discover", "current");
  } catch (error) {
    if (!isAbort(error) && body.job === job) { clear(body, errorBox(error)); markFresh("discover", "error"); }
  } finally {
    if (body.job === job) body.job = null;
  }
}

async function show(result, url) {
  const chosen = result.smallest ? `the smallest circuit reaching ${Math.round(100 * result.target)}%: ${result.smallest} of ${result.edges} edges`
    : `no circuit smaller than the model reaches ${Math.round(100 * result.target)}%`;
  clear(body,
    el("p", {class: "discover-summary", text: `${result.task}: ${result.pairs} pairs` + (result.dropped ? ` (${result.dropped} dropped: the model got them wrong)` : "")
      + `; metric clean ${fmt(result.clean)}, everything ablated ${fmt(result.ablated)}; ${chosen}.`}),
    el("p", {class: "small muted", text: result.check}),
    frame,
    el("details", {class: "discover-top-edges"}, el("summary", {text: `the ${result.top.length} strongest edges`}),
      el("table", {class: "discover-top"},
        el("thead", {}, el("tr", {}, el("th", {text: "edge"}), el("th", {text: "score"}))),
        el("tbody", {}, result.top.map(([name, score]) => el("tr", {}, el("td", {class: "tok", text: name}), el("td", {class: "num", text: fmt(score)})))))));
  await frame.load(url);
}

// Its freshness (core.js markFresh): "not run yet" until a circuit is found for this model.
async function update() {
  drawControls();
  const last = results.get(state.model);
  if (body.job) return "updating";
  if (last) { await show(last.result, last.url); return "current"; }
  clear(body, el("p", {class: "muted", text: "Choose a task and press Discover: every edge between the model's heads and MLPs is scored over the task's pairs, then circuits of the top edges are run with everything else ablated."}));
  return "idle";
}

register("discover", {update});
