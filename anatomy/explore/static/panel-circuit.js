// The circuit panel: the attribution graph of the text's next token through the model's transcoders
// (anatomy.attribution_graph), built on request as a job (progress layer by layer, cancel), drawn by the
// page `anatomy circuits` writes: hover and click its nodes, pin them, group them, export JSON and PNG.
import {clear, currentModel, el, markFresh, pageFrame, register, runJob, state, textBody} from "./core.js";

const controls = document.getElementById("circuit-controls");
const body = document.getElementById("circuit-body");
const frame = pageFrame("attribution graph");
const settings = {node_threshold: 0.8, edge_threshold: 0.98, qk: 20};
let builtFor = null;  // the model and text the graph on show was built for

function numberInput(name, label, title, max = 1, step = 0.01) {
  const input = el("input", {type: "number", min: "0", max: String(max), step: String(step), value: String(settings[name]),
                             "aria-label": label, title});
  input.addEventListener("change", () => {
    const value = Number(input.value);
    const whole = step < 1 || Number.isInteger(value);
    if (Number.isFinite(value) && whole && value >= 0 && value <= max) settings[name] = value;
    input.value = String(settings[name]);
  });
  return el("label", {}, `${label} `, input);
}

function drawControls() {
  clear(controls,
        numberInput("node_threshold", "node threshold", "keep the nodes that hold this share of the influence on the output"),
        numberInput("edge_threshold", "edge threshold", "keep the edges that hold this share of the edge influence"),
        numberInput("qk", "attention of edges", "why attention attends: this many of the strongest edges across " +
                    "positions split by head, their largest heads' scores by pairs of nodes (click one on the graph)", 50, 1));
}

// Its freshness (core.js markFresh): nothing to show without transcoders, "not run yet" until a graph is
// built for this text, "up to date" once it is.
async function update() {
  const model = currentModel();
  if (!model.transcoders) {
    clear(controls);
    clear(body, el("p", {class: "small"},
                   `No transcoders are attached to ${model.name}. Start the explorer with `,
                   el("code", {text: `--transcoders ${model.name}=RUN`}), " (an ",
                   el("code", {text: "anatomy sae train-transcoders"}),
                   " run, or circuit-tracer's files) to build its graphs."));
    return "empty";
  }
  drawControls();
  const key = `${state.model}\u0000${state.text}\u0000${settings.node_threshold}\u0000${settings.edge_threshold}\u0000${settings.qk}`;
  if (builtFor === key && body.contains(frame)) return "current";
  const run = el("button", {type: "button", class: "run", text: "build the graph", onclick: async () => {
    builtFor = key;
    markFresh("circuit", "updating");
    await runJob(body, textBody({kind: "circuit", ...settings}), "attribution graph", "layers", {frame});
    markFresh("circuit", body.contains(frame) && builtFor === key ? "current" : "error");
  }});
  clear(body, el("p", {class: "small"},
                 builtFor ? "The text changed since the last graph. " : "",
                 `Every direct effect between the tokens, the ${model.transcoders.d_transcoder.toLocaleString()}-feature ` +
                 `transcoders' active features, their errors and the likely next tokens, through the local replacement ` +
                 `model (attention and norms frozen); then pruned. The graph reads the text after a BOS token, as ` +
                 `circuit-tracer does (the first position explains nothing), so its probabilities may differ from the ` +
                 `next-token panel's. Seconds for a small model, up to a minute for SmolLM2 on a short text. `, run));
  return "idle";
}

register("circuit", {update});
