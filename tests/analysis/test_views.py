"""The analysis views: offline pages (a CSP that allows no request), every label shown as text,
drawn in a real browser; PNG figures for every kind of result."""

from __future__ import annotations

import shutil
import tempfile
import threading

import pytest

import anatomy
from analysis_models import ids, tiny

HOSTILE = ['<img src=x onerror="window.__pwned=1">', "</script><script>window.__pwned=1</script>", "&amp; $x$"]


def results():
    model = tiny()
    x = ids(2, 6)
    clean_corrupt = (x, ids(2, 6, seed=7))
    found = [
        anatomy.logit_lens(model, x), anatomy.patch(model, *clean_corrupt), anatomy.detect_heads(model, length=8),
        anatomy.integrated_gradients(model, x, 3, steps=8), anatomy.direct_logit_attribution(model, x, 3),
        anatomy.decompose(model, x), anatomy.attention_rollout(model, x),
        anatomy.patch(model, *clean_corrupt, point="attn.z", by="head"),
    ]
    for result in found:  # hostile token text, as a tokenizer could produce
        result.tokens = [[HOSTILE[i % 3] for i in range(6)] for _ in range(2)]
    return found


@pytest.mark.parametrize("index", range(8))
def test_pages_are_offline_and_escape_every_token(index, tmp_path):
    result = results()[index]
    document = result.view().html
    assert "Content-Security-Policy" in document and "default-src 'none'" in document
    assert "<img src=x" not in document and "</script><script>" not in document
    assert result.check in document  # the identity and its measured difference are on the page
    png = result.save(tmp_path / "figure.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_bad_suffix_is_named(tmp_path):
    with pytest.raises(ValueError, match=".html, .png or .svg"):
        anatomy.logit_lens(tiny(), ids(1, 4)).save(tmp_path / "lens.pdf")


def in_browser(check) -> None:
    """check(context) in a headless Debian Chromium, driven by Playwright in a thread of its own: the
    viz tests keep a session-wide Playwright running in this thread, and two cannot share one."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium on PATH")
    sync_api = pytest.importorskip("playwright.sync_api")
    failures = []

    def run():
        try:
            with sync_api.sync_playwright() as playwright, tempfile.TemporaryDirectory() as profile:
                context = playwright.chromium.launch_persistent_context(
                    profile, executable_path=chromium, headless=True,
                    args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
                try:
                    check(context)
                finally:
                    context.close()
        except BaseException as failure:  # handed back to the test's own thread
            failures.append(failure)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    if failures:
        raise failures[0]


@pytest.mark.slow
@pytest.mark.browser
def test_views_draw_in_a_browser_show_tokens_as_text_and_fetch_nothing(tmp_path):
    in_browser(lambda browser: check_every_view(browser, tmp_path))


def check_every_view(browser, tmp_path) -> None:
    for index, result in enumerate(results()):
        path = result.save(tmp_path / f"view{index}.html")
        page = browser.new_page()
        requests, errors = [], []
        page.on("request", lambda request: requests.append(request.url))
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(path.as_uri())
        page.wait_for_function("() => window.anatomyView && window.anatomyView.firstPaint !== null", timeout=15000)
        shaded = result.kind in ("integrated gradients", "gradient x input")
        selector = ".shaded-token" if shaded else "table.grid th, table.grid td"
        inside = ".shaded-token *" if shaded else "table.grid th *, table.grid td *"
        texts = page.eval_on_selector_all(selector, "nodes => nodes.map(n => n.textContent)")
        if result.axes[-1] in ("pos", "key", "vocab") or result.kind == "integrated gradients":
            for token in HOSTILE:
                assert token in texts, (result.kind, token)
        assert page.eval_on_selector_all(inside, "nodes => nodes.length") == 0  # no markup inside
        assert result.check in page.text_content(".check")
        if len(result.tokens) > 1 and page.query_selector("select[name=panel]"):
            paints = page.evaluate("window.anatomyView.paints")
            page.select_option("select[name=panel]", "1")
            page.wait_for_function("(p) => window.anatomyView.paints > p", arg=paints, timeout=10000)
        assert requests == [path.as_uri()], requests
        assert page.evaluate("window.__pwned") is None
        assert errors == []
        page.close()
