"""The graph page and the graph JSON, measured: first paint in Chromium, and the files' sizes (issue 41's goals).

One case: SmolLM2-135M's attribution graph of the README's 16-token prompt through 30 per-layer JumpReLU
transcoders of 2,304 features (random, calibrated to 42 active per token and layer, circuit_sets.py), pruned
at 0.8 / 0.98: the page with every feature's promoted tokens and label, and Neuronpedia's JSON. Debian's
Chromium, driven by Playwright, opens the page five times; first paint is the page's own record
(window.anatomyView.firstPaint: the first frame after the graph is drawn, in ms since navigation), the
median of the five, and every node must lie inside the drawn view. A second case opens a synthetic graph
of 1,024 positions and 10,000 nodes the same way. There is no peer to alternate with (Neuronpedia's page
needs its server): the rows show anatomy's numbers against the goals (first paint of a 2,600-node graph
<= 1 s; a 16-token graph's JSON < 5 MB), each with the machine's load average. --quick: the tests' tiny
Llama and set.
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from .common import Row, Settings, load_average

PROMPT = "The capital of the state containing Dallas is Austin. The capital of Germany is"  # the README's example
FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "circuits" / "fixtures" / "graphs"
BROWSER_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
IN_VIEW = """() => { const r = document.querySelector('#graph-view canvas').getBoundingClientRect();
  return window.anatomyGraph.nodes.every((_, i) => { const b = window.anatomyGraph.clientBox(i);
    return b && b.x >= r.left && b.x <= r.right && b.y >= r.top && b.y <= r.bottom; }); }"""


def graph_and_details(quick: bool):
    """(the pruned graph, its FeatureDetails, what it is in words)."""
    from ..checkpoints import from_pretrained
    from ..circuits import attribution_graph, pruned
    from ..circuits.features import promoted_tokens
    from ..sae import load_transcoders

    if quick:
        model = from_pretrained(str(FIXTURES / "llama")).eval()
        transcoders = load_transcoders(FIXTURES / "plt_jumprelu")
        prompt, what = json.loads((FIXTURES / "README.json").read_text())["prompt"], "tiny Llama (the tests')"
    else:
        from ..circuits.attribute import prompt_ids
        from .circuit_sets import calibrated_random_transcoders

        model = from_pretrained("smollm2").eval()
        transcoders = calibrated_random_transcoders(model, prompt_ids(model, PROMPT)[None])
        prompt, what = PROMPT, "SmolLM2-135M, 16 tokens"
    small = pruned(attribution_graph(model, prompt, transcoders))
    return small, promoted_tokens(model, transcoders, small), what


def synthetic_graph(positions: int = 1024, features: int = 8975, layers: int = 30, edges: int = 50_000):
    """A graph of `positions` tokens and about 10,000 nodes: features spread over the layers and positions,
    random edges between earlier and later nodes (what the layout and the drawing meet, not a model's)."""
    from ..circuits import Graph, Node

    generator = torch.Generator().manual_seed(0)
    nodes = [Node("token", -1, p, p, label=f"t{p}") for p in range(positions)]
    where = torch.randint(0, positions, (features,), generator=generator).tolist()
    nodes += sorted((Node("feature", k % layers, c, k, value=1.0) for k, c in enumerate(where)), key=lambda n: n.layer)
    nodes += [Node("logit", layers, positions - 1, t, label=f"o{t}", value=0.1) for t in range(10)]
    n = len(nodes)
    adjacency = torch.zeros(n, n)
    targets = torch.randint(positions, n, (edges,), generator=generator)
    sources = (torch.rand(edges, generator=generator) * targets).long()
    adjacency[targets, sources] = torch.randn(edges, generator=generator)
    return Graph(nodes, adjacency, [f"t{p}" for p in range(positions)], layers, meta={"pruned": True})


def first_paints(page_path: Path, opens: int) -> tuple[list[float], bool]:
    """(first paint in ms of each of `opens` loads of the page, whether every node was in view each time)."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    paints, in_view = [], True
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=BROWSER_ARGS)
        for _ in range(opens):
            tab = browser.new_page(viewport={"width": 1280, "height": 860})
            tab.goto(page_path.as_uri())
            tab.wait_for_function("() => window.anatomyView && window.anatomyView.firstPaint !== null", timeout=60_000)
            paints.append(tab.evaluate("window.anatomyView.firstPaint"))
            in_view = in_view and tab.evaluate(IN_VIEW)
            tab.close()
        browser.close()
    return paints, in_view


def bench_page(settings: Settings) -> list[Row]:
    from ..circuits import save

    if shutil.which("chromium") is None and shutil.which("chromium-browser") is None:
        return [Row("page", "first paint of the graph page", "ms", float("nan"), None, False,
                    ["no chromium on PATH (Debian: apt-get install -y chromium)"])]
    opens = 2 if settings.quick else 5
    rows = []
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(temporary)
        graph, details, what = graph_and_details(settings.quick)
        cpu = time.process_time()
        json_file = save(graph, folder / "graph.json", labels=details.labels)
        json_cpu, cpu = time.process_time() - cpu, time.process_time()
        page_file = save(graph, folder / "graph.html", details=details)
        page_cpu = time.process_time() - cpu
        paints, in_view = first_paints(page_file, opens)
        n_edges = int(torch.count_nonzero(graph.adjacency))
        rows.append(Row("page", f"first paint, pruned graph of {len(graph):,} nodes ({what})", "ms",
                        statistics.median(paints), None, False,
                        [f"median of {opens} opens in Chromium {['', 'with every node in view'][in_view] or 'NOT every node in view'}: "
                         f"{', '.join(f'{p:.0f}' for p in paints)} ms (goal <= 1000 for 2,600 nodes); page "
                         f"{page_file.stat().st_size / 1e6:.2f} MB, written in {page_cpu:.1f} s of CPU; load {load_average()}"]))
        rows.append(Row("page", f"graph JSON, the same graph ({n_edges:,} edges)", "MB", json_file.stat().st_size / 1e6,
                        None, False, [f"Neuronpedia's schema, the 50,000 strongest edges at 6 significant digits "
                                      f"(goal < 5 MB), written in {json_cpu:.1f} s of CPU"]))
        if not settings.quick:
            big = save(synthetic_graph(), folder / "big.html")
            paints, in_view = first_paints(big, opens)
            rows.append(Row("page", "first paint, synthetic graph of 10,000 nodes over 1,024 positions", "ms",
                            statistics.median(paints), None, False,
                            [f"median of {opens} opens {['', 'with every node in view'][in_view] or 'NOT every node in view'}: "
                             f"{', '.join(f'{p:.0f}' for p in paints)} ms; 50,000 edges; load {load_average()}"]))
    return rows
