// The logit lens: layer × position, the top tokens read from the residual stream there (the page
// `anatomy analyze lens` writes, for the pass's own residual stream), updated as you type.
import {exportUrl, pageFrame, register} from "./core.js";

const body = document.getElementById("lens-body");
const frame = pageFrame("logit lens");
body.replaceChildren(frame);

async function update() {
  await frame.load(exportUrl("lens", "html", {inline: "1"}));
}

register("lens", {update});
