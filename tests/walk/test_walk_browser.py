"""The HTML walk in a real browser (Debian Chromium through Playwright): MathML renders, the
contents list links every step, hovering a cell shows its operands, and nothing is fetched."""

from __future__ import annotations

import pytest

from anatomy.walk import toy_example, walkthrough

pytestmark = pytest.mark.browser

HOSTILE = '![b](https://x.example/i.png) <img src="https://x.example/j.png"> \x1b[2J'


@pytest.fixture(scope="module")
def page(browser, tmp_path_factory):
    model, ids, options = toy_example()
    walk = walkthrough(model, ids + [7], **dict(options, tokens=options["tokens"] + [HOSTILE]))
    path = tmp_path_factory.mktemp("walk") / "walk.html"
    path.write_text(walk.to_html(), encoding="utf-8")
    tab = browser.new_page()
    requests: list[str] = []
    tab.on("request", lambda request: requests.append(request.url))
    tab.goto(path.resolve().as_uri())
    tab.wait_for_load_state("load")
    yield tab, walk, requests, path.resolve().as_uri()
    tab.close()


def test_equations_render_as_mathml(page):
    tab, _, _, _ = page
    assert tab.eval_on_selector_all("math", "nodes => nodes.length") >= 15
    # Rendered, not shown as source: a fraction lays out two rows, so it is taller than one line of text.
    height = tab.eval_on_selector("section#step-8 .eq math", "node => node.getBoundingClientRect().height")
    assert height > 20


def test_the_contents_link_every_step(page):
    tab, walk, _, _ = page
    links = tab.eval_on_selector_all("nav a", "nodes => nodes.map(n => n.getAttribute('href'))")
    assert links == [f"#step-{step.number}" for step in walk.steps]
    tab.click("nav a[href='#step-10']")
    top = tab.eval_on_selector("#step-10", "node => node.getBoundingClientRect().top")
    assert abs(top) < 40  # scrolled to the step


def test_hovering_a_cell_shows_its_operands(page):
    tab, _, _, _ = page
    cell = tab.locator("section#step-7 td[title]").first
    cell.hover()
    assert "q(" in cell.get_attribute("title") and "k(" in cell.get_attribute("title")


def test_nothing_is_fetched_and_tokens_stay_text(page):
    tab, _, requests, url = page
    assert requests == [url]
    assert tab.eval_on_selector_all("img, script, iframe, a[href^='http']", "nodes => nodes.length") == 0
    assert HOSTILE.replace("\x1b", "\\x1b") in tab.text_content("body")
