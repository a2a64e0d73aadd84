"""Shared fixtures for the attention views: synthetic attention, hostile tokens, a headless Chromium.

Shape letters: L layers, H heads, T query positions, S key positions, D head width.
"""

from __future__ import annotations

import pytest

from anatomy.viz import AttentionMap
from viz_samples import HOSTILE, SENTENCE_A, SENTENCE_B, synthetic_attention

@pytest.fixture
def pair_map() -> AttentionMap:
    """A sentence pair with hostile tokens in sentence B, with q and k: 3 layers, 4 heads."""
    tokens = SENTENCE_A + SENTENCE_B
    weights, q, k = synthetic_attention(3, 4, len(tokens))
    return AttentionMap("self-attention", weights, tokens, tokens, q=q, k=k, sentence_b_start=len(SENTENCE_A))


@pytest.fixture
def seq2seq_maps() -> list[AttentionMap]:
    """An encoder-decoder's encoder self, decoder self (causal) and cross-attention: 2 layers, 2 heads."""
    source = ["<SOS>", "Hello", "World,", HOSTILE[0], "<EOS>"]
    target = ["<SOS>", "Hola", HOSTILE[1], "Mundo"]
    enc, _, _ = synthetic_attention(2, 2, len(source), seed=1)
    dec, _, _ = synthetic_attention(2, 2, len(target), seed=2, causal=True)
    cross, _, _ = synthetic_attention(2, 2, len(target), len(source), seed=3)
    return [
        AttentionMap("encoder self-attention", enc, source, source),
        AttentionMap("decoder self-attention", dec, target, target),
        AttentionMap("cross-attention", cross, target, source, cross=True),
    ]


class OpenedView:
    """A page showing one saved view, with every request and script error it caused."""

    def __init__(self, browser, path):
        self.url = path.resolve().as_uri()
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.page = browser.new_page()
        self.page.on("request", lambda request: self.requests.append(request.url))
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.goto(self.url)
        self.page.wait_for_function("() => window.anatomyView && window.anatomyView.firstPaint !== null", timeout=15000)

    def paints(self) -> int:
        return self.page.evaluate("window.anatomyView.paints")

    def wait_for_paint_after(self, before: int) -> None:
        self.page.wait_for_function("(before) => window.anatomyView.paints > before", arg=before, timeout=10000)

    def canvas(self, selector: str) -> str:
        """The pixels of a canvas, as a data URL, to compare before and after an action."""
        return self.page.eval_on_selector(selector, "canvas => canvas.toDataURL()")

    def assert_safe(self) -> None:
        """Nothing was fetched, no token's script ran, no script failed."""
        assert self.requests == [self.url], f"requests besides the file itself: {self.requests}"
        assert self.page.evaluate("window.__pwned") is None, "a token's markup ran as script"
        assert self.errors == [], self.errors

    def close(self) -> None:
        self.page.close()


@pytest.fixture
def open_view(browser):
    opened = []

    def open_(path) -> OpenedView:
        view = OpenedView(browser, path)
        opened.append(view)
        return view

    yield open_
    for view in opened:
        view.close()
