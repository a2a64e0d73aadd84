"""The circuit panel: the text's attribution graph, built as a job with the transcoders attached to a model,
equal to anatomy.attribution_graph's; refused in words where it cannot be built; drawn by the graph page in the
browser (Debian's Chromium through Playwright)."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

import pytest
from explore_servers import TOKEN, Served, drawn_job_page
from starlette.testclient import TestClient

import anatomy
from anatomy.circuits import attribution_graph, explain_attention, prune, pruned, scores
from anatomy.explore import create_app
from anatomy.sae import load_transcoders

FIXTURES = Path(__file__).resolve().parents[1] / "circuits" / "fixtures" / "graphs"
LLAMA, SET = str(FIXTURES / "llama"), str(FIXTURES / "plt_jumprelu")
TEXT = json.loads((FIXTURES / "README.json").read_text())["prompt"]


@pytest.fixture(scope="module")
def client():
    app = create_app([LLAMA, "toy"], token=TOKEN, hosts=["testserver"], transcoders=[f"{LLAMA}={SET}"])
    with TestClient(app, base_url="http://testserver") as test_client:
        test_client.headers["Authorization"] = f"Bearer {TOKEN}"
        yield test_client


def finished(client, job_id: str) -> tuple[str, dict]:
    with client.stream("GET", f"/api/jobs/{job_id}/events") as response:
        text = "".join(response.iter_text())
    block = text.strip().split("\n\n")[-1]
    return block.split("\n")[0][len("event: "):], json.loads(block.split("\n")[1][len("data: "):])


def test_the_panels_graph_is_the_librarys(client):
    job = client.post("/api/jobs", json={"model": LLAMA, "text": TEXT, "kind": "circuit", "node_threshold": 0.7})
    assert job.status_code == 202, job.text
    kind, last = finished(client, job.json()["id"])
    assert kind == "result", last
    result = last["result"]
    model = anatomy.from_pretrained(LLAMA).eval()
    graph = attribution_graph(model, TEXT, load_transcoders(SET))
    decision = prune(graph, 0.7, 0.98)
    assert result["check"] == graph.check and result["nodes"] == len(pruned(graph, decision=decision))
    assert result["features"] == sum(n.kind == "feature" for n in graph.nodes)
    replacement, completeness = scores(graph, decision.influence)
    assert result["replacement"] == pytest.approx(replacement, abs=1e-6)
    assert result["completeness"] == pytest.approx(completeness, abs=1e-6)
    page = client.get(f"/api/jobs/{job.json()['id']}/page")
    assert page.status_code == 200 and "view-graph" in page.text


def test_the_panels_attention_is_the_librarys(client):
    job = client.post("/api/jobs", json={"model": LLAMA, "text": TEXT, "kind": "circuit", "qk": 3})
    kind, last = finished(client, job.json()["id"])
    assert kind == "result", last
    model = anatomy.from_pretrained(LLAMA).eval()
    transcoders = load_transcoders(SET)
    small = pruned(attribution_graph(model, TEXT, transcoders))
    explain_attention(model, transcoders, small, n=3)
    record = small.meta["attention"]
    assert last["result"]["attention"] == {"edges": 3, "heads": len(record["qk"]), "check": record["check"],
                                           "error": record["error"]}
    page = client.get(f"/api/jobs/{job.json()['id']}/page").text
    data = json.loads(page.split('<script type="application/json" id="anatomy-data">')[1].split("</script>")[0])
    assert [e["target"] for e in data["attention"]["edges"]] == [e["target"] for e in record["edges"]]
    job = client.post("/api/jobs", json={"model": LLAMA, "text": TEXT, "kind": "circuit", "qk": 0})
    assert finished(client, job.json()["id"])[1]["result"]["attention"] is None


def test_the_model_lists_its_transcoders(client):
    models = {m["name"]: m for m in client.get("/api/models").json()["models"]}
    client.post("/api/run", json={"model": LLAMA, "text": TEXT})  # loads it
    models = {m["name"]: m for m in client.get("/api/models").json()["models"]}
    assert models[LLAMA]["transcoders"]["d_transcoder"] == 16 and models["toy"]["transcoders"] is None


@pytest.mark.parametrize("body, words", [
    ({"model": "toy", "text": "Hello World", "kind": "circuit"}, "no transcoders are attached to toy"),
    ({"model": LLAMA, "text": TEXT, "kind": "circuit", "node_threshold": 2}, "'node_threshold' must be a number in [0.0, 1.0]"),
    ({"model": LLAMA, "text": TEXT, "kind": "circuit", "max_logits": 0}, "'max_logits' must be an integer in [1, 10]"),
    ({"model": LLAMA, "text": TEXT, "kind": "circuit", "qk": 51}, "'qk' must be an integer in [0, 50]"),
])
def test_what_cannot_be_built_is_refused_in_words(client, body, words):
    response = client.post("/api/jobs", json=body)
    assert response.status_code == 400 and words in response.json()["error"]


def test_a_set_for_another_model_is_refused_when_attached():
    with pytest.raises(ValueError, match="3 layers of width 32; toy has 2 of 4"):
        create_app(["toy"], token=TOKEN, transcoders=[SET])


@pytest.fixture(scope="module")
def served():
    server = Served([LLAMA, "toy"], transcoders=[f"{LLAMA}={SET}"])
    yield server
    server.stop()


FRESH = "section[data-panel='circuit'] h2 .fresh"


def test_the_panel_builds_the_graph_and_draws_it_in_view(browser, served):
    page = browser.new_page()
    requests = []
    page.on("request", lambda request: requests.append(request.url))
    page.goto(served.url + f"#model={quote(LLAMA)}&text={quote(TEXT)}&panel=circuit")
    page.wait_for_selector("body[data-updated]", timeout=60000)
    page.click("#panel-tabs button:text-is('Circuit')")
    page.wait_for_function(f"() => document.querySelector(\"{FRESH}\")?.textContent === 'not run yet'")
    page.click("#circuit-body button.run")
    page.wait_for_function("() => document.querySelector('#circuit-body iframe[src*=\"/api/jobs/\"]')", timeout=60000)
    frame = drawn_job_page(page)
    assert frame is not None, "the graph page did not draw"
    model = anatomy.from_pretrained(LLAMA).eval()
    graph = attribution_graph(model, TEXT, load_transcoders(SET))
    assert frame.inner_text("#check-line") == f"Check: {pruned(graph).check}"  # the drawn (pruned) graph's own
    outside = frame.evaluate("""() => { const height = innerHeight, width = innerWidth;
        return window.anatomyGraph.nodes.map((_, i) => window.anatomyGraph.clientBox(i))
          .filter((b) => b.x < 0 || b.x > width || b.y < 0 || b.y > height).length; }""")
    assert outside == 0  # the whole graph in the frame's view at open
    page.wait_for_function(f"() => document.querySelector(\"{FRESH}\")?.textContent === 'up to date'")
    # why attention attends: the strongest explained edge's target clicked in the frame shows its heads' QK
    small = pruned(graph)
    explain_attention(model, load_transcoders(SET), small, n=20)
    strongest = max(small.meta["attention"]["edges"], key=lambda e: abs(e["edge"]))
    inside = page.locator("#circuit-body iframe").bounding_box()
    box = frame.evaluate("(i) => window.anatomyGraph.clientBox(i)", small.index(strongest["target"]))
    page.mouse.click(inside["x"] + box["x"], inside["y"] + box["y"])
    frame.wait_for_selector("#qk-section .qk-check")
    qk = small.meta["attention"]["qk"][strongest["heads"][0]["qk"]]
    assert frame.inner_text("#qk-section .qk-check") == qk["check"]
    assert all(url.startswith(f"http://127.0.0.1:{served.port}/") for url in requests if url.startswith("http"))
    page.close()


def test_without_transcoders_the_panel_says_so_and_nothing_else(browser, served):
    page = browser.new_page()
    page.goto(served.url + f"#model=toy&text={quote(TEXT)}&panel=circuit")
    page.wait_for_selector("body[data-updated]", timeout=60000)
    page.click("#panel-tabs button:text-is('Circuit')")
    page.wait_for_function("() => document.querySelector('#circuit-body').textContent.includes('No transcoders')")
    assert page.query_selector_all("#circuit-controls input") == []  # no thresholds for a graph it cannot build
    assert page.text_content(FRESH) == ""  # and no "up to date"
    page.close()
