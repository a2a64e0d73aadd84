"""The views in a real browser: they draw, respond to the controls, show tokens as text, fetch nothing.

Shape letters: L layers, H heads, T query positions, S key positions.
"""

from __future__ import annotations

import pytest

from anatomy.viz import generation_view, head_view, model_view, neuron_view

from viz_samples import HOSTILE, SENTENCE_A, bert_sized_attention, synthetic_attention

pytestmark = pytest.mark.browser


def assert_tokens_shown_as_text(view, selector: str) -> None:
    texts = view.page.eval_on_selector_all(selector, "nodes => nodes.map(n => n.textContent)")
    for token in HOSTILE:
        assert token in texts, f"{token!r} is not shown as text"
    assert view.page.eval_on_selector_all(f"{selector} *", "nodes => nodes.length") == 0  # no markup inside tokens


def test_head_view_layers_heads_focus_and_sentence_pairs(pair_map, open_view, tmp_path):
    view = open_view(head_view(pair_map).save(tmp_path / "head.html"))
    page = view.page
    assert_tokens_shown_as_text(view, ".column.right .token")

    before, paints = view.canvas(".stage canvas"), view.paints()
    page.select_option("select[name=layer]", "2")
    view.wait_for_paint_after(paints)
    after_layer = view.canvas(".stage canvas")
    assert after_layer != before

    paints = view.paints()
    page.click(".head-toggle[data-head='0']")
    view.wait_for_paint_after(paints)
    assert view.canvas(".stage canvas") != after_layer
    assert page.evaluate("[...window.anatomyView.state.heads].sort()") == [1, 2, 3]

    paints = view.paints()
    page.hover(".column.left .token >> nth=3")
    view.wait_for_paint_after(paints)
    assert page.eval_on_selector_all(".column.left .token.focus", "nodes => nodes.map(n => n.textContent)") == ["like"]
    page.screenshot(path=tmp_path / "head.png")

    page.select_option("select[name=sentences]", "AB")  # sentence A's queries, sentence B's keys
    left = page.eval_on_selector_all(".column.left .token", "nodes => nodes.map(n => n.textContent)")
    right = page.eval_on_selector_all(".column.right .token", "nodes => nodes.map(n => n.textContent)")
    assert left == SENTENCE_A
    assert right == pair_map.keys[len(SENTENCE_A):]
    view.assert_safe()


def test_head_view_encoder_decoder_cross_attention(seq2seq_maps, open_view, tmp_path):
    view = open_view(head_view(seq2seq_maps).save(tmp_path / "seq2seq.html"))
    page = view.page
    page.select_option("select[name=attention]", "2")
    assert page.text_content(".column.left .column-title") == "decoder query"
    assert page.text_content(".column.right .column-title") == "encoder key"
    assert page.eval_on_selector_all(".column.left .token", "n => n.length") == len(seq2seq_maps[2].queries)
    assert page.eval_on_selector_all(".column.right .token", "n => n.length") == len(seq2seq_maps[2].keys)
    page.screenshot(path=tmp_path / "cross.png")
    view.assert_safe()


def test_model_view_opens_the_clicked_layer_and_head(pair_map, open_view, tmp_path):
    view = open_view(model_view(pair_map).save(tmp_path / "model.html"))
    page = view.page
    n_layers, n_heads = pair_map.n_layers, pair_map.n_heads
    assert page.eval_on_selector_all("canvas.thumb", "n => n.length") == n_layers * n_heads
    before = view.canvas("#detail-canvas")
    paints = view.paints()
    page.click("canvas.thumb[data-layer='2'][data-head='3']")
    view.wait_for_paint_after(paints)
    assert page.text_content("#detail h2") == "self-attention · layer 2 · head 3"
    assert view.canvas("#detail-canvas") != before
    page.hover("#detail-canvas", position={"x": 200, "y": 200})
    page.screenshot(path=tmp_path / "model.png", full_page=True)
    view.assert_safe()


def test_neuron_view_follows_query_layer_and_head(pair_map, open_view, tmp_path):
    view = open_view(neuron_view(pair_map, layer=0, head=0, query=1).save(tmp_path / "neuron.html"))
    page = view.page
    assert_tokens_shown_as_text(view, ".neuron .token")
    before, paints = view.canvas("#neuron-canvas"), view.paints()
    page.click(".neuron .token >> nth=4")
    view.wait_for_paint_after(paints)
    assert page.evaluate("window.anatomyView.state.query") == 4
    after_query = view.canvas("#neuron-canvas")
    assert after_query != before
    for name, value in (("layer", "1"), ("head", "2")):
        paints = view.paints()
        page.select_option(f"select[name={name}]", value)
        view.wait_for_paint_after(paints)
    assert view.canvas("#neuron-canvas") != after_query
    page.screenshot(path=tmp_path / "neuron.png", full_page=True)
    view.assert_safe()


def test_generation_view_steps_through_the_output(open_view, tmp_path):
    tokens = ["<SOS>", "Hello", *HOSTILE, "World"]
    weights, _, _ = synthetic_attention(2, 3, len(tokens), causal=True)
    view = open_view(generation_view(weights, tokens, prompt_length=2).save(tmp_path / "generation.html"))
    page = view.page
    assert_tokens_shown_as_text(view, ".text-flow .token")
    before, paints = view.canvas("canvas.strip"), view.paints()
    page.fill("input[name=step]", "4")
    view.wait_for_paint_after(paints)
    assert page.text_content(".text-flow .token.current") == tokens[2 + 4 - 1]
    after_step = view.canvas("canvas.strip")
    assert after_step != before
    paints = view.paints()
    page.select_option("select[name=layer]", "1")
    view.wait_for_paint_after(paints)
    assert view.canvas("canvas.strip") != after_step
    page.screenshot(path=tmp_path / "generation.png")
    view.assert_safe()


@pytest.mark.slow
def test_512_tokens_12_layers_12_heads_render_and_respond(open_view, tmp_path):
    """BERT-base-sized attention renders and answers a click, for the head and the model view.

    Its first paint is printed (`pytest tests/viz -k 512 -s`) and recorded against the 2 s
    budget in BENCHMARKS.md: tests never assert wall-clock times.
    """
    weights = bert_sized_attention()
    tokens = [f"token{i}" for i in range(weights.shape[-1])]
    for name, make in (("head", head_view), ("model", model_view)):
        path = make(weights, tokens).save(tmp_path / f"{name}-512.html")
        first_paints = []
        for _ in range(2):
            view = open_view(path)
            first_paints.append(view.page.evaluate("window.anatomyView.firstPaint"))
        print(f"{name} view, 512 tokens x 12 layers x 12 heads: first paint {min(first_paints):.0f} ms")
        assert all(paint > 0 for paint in first_paints), "the canvas was never drawn"
        paints = view.paints()
        view.page.select_option("select[name=layer]", "11") if name == "head" else view.page.click(
            "canvas.thumb[data-layer='11'][data-head='11']")
        view.wait_for_paint_after(paints)
        view.page.screenshot(path=tmp_path / f"{name}-512.png")
        view.assert_safe()


# Layout: what a newcomer sees --------------------------------------------------------------------

def test_toy_model_view_grid_sits_left_without_a_gap(open_view, tmp_path):
    """The toy's 2 x 2 grid: the first thumbnail right beside its row label, not pushed to the far right."""
    tokens = ["<SOS>", "Hello", "World,", "this", "is", "Alejandro!", "<EOS>"]
    weights, _, _ = synthetic_attention(2, 2, len(tokens), causal=True)
    view = open_view(model_view(weights, tokens).save(tmp_path / "toy-model.html"))
    boxes = view.page.evaluate("""() => {
        const box = (node) => node.getBoundingClientRect();
        const label = [...document.querySelectorAll('.grid .axis.row')][0];
        const thumb = document.querySelector("canvas.thumb[data-layer='0'][data-head='0']");
        const last = document.querySelector("canvas.thumb[data-layer='0'][data-head='1']");
        return {label: box(label), thumb: box(thumb), last: box(last), page: document.documentElement.clientWidth};
    }""")
    assert boxes["label"]["width"] < 80, boxes  # "layer 0": as wide as its text, not stretched
    assert boxes["thumb"]["left"] - boxes["label"]["right"] <= 12, boxes  # then the grid's gap
    assert boxes["last"]["right"] < boxes["page"] / 2, boxes  # two heads: the grid stays on the left half
    view.assert_safe()


def test_model_view_labels_are_never_under_the_sticky_bar(open_view, tmp_path):
    """MiniLM's shape (6 layers x 12 heads): after a click low in the grid scrolls the page, the head
    labels and the detail's title are below the control bar, not hidden by it."""
    tokens = [f"t{i}" for i in range(13)]
    weights, _, _ = synthetic_attention(6, 12, len(tokens))
    view = open_view(model_view(weights, tokens).save(tmp_path / "minilm-model.html"))
    page = view.page
    page.set_viewport_size({"width": 1280, "height": 600})
    paints = view.paints()
    page.click("canvas.thumb[data-layer='5'][data-head='11']")
    view.wait_for_paint_after(paints)
    page.wait_for_timeout(200)  # the smooth part of scrolling, if any
    layout = page.evaluate("""() => {
        const bar = document.getElementById('controls').getBoundingClientRect();
        const labels = [...document.querySelectorAll('.grid .axis')].filter((n) => n.textContent.startsWith('head '))
            .map((n) => n.getBoundingClientRect().top);
        return {scrolled: window.scrollY, bar: bar.bottom, labels,
                detail: document.querySelector('#detail h2').getBoundingClientRect().top};
    }""")
    assert layout["scrolled"] > 0, "the click did not scroll: the test would prove nothing"
    assert len(layout["labels"]) == 12
    assert all(top >= layout["bar"] - 1 for top in layout["labels"]), layout
    assert layout["detail"] >= layout["bar"] - 1, layout
    view.assert_safe()


def test_the_sandboxed_jupyter_iframe_still_draws(browser, pair_map, tmp_path):
    """What a notebook shows: the view inside <iframe sandbox="allow-scripts" srcdoc=...> runs and paints."""
    notebook = tmp_path / "notebook.html"
    notebook.write_text(f"<!DOCTYPE html><html><body>{head_view(pair_map)._repr_html_()}</body></html>")
    page = browser.new_page()
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    try:
        page.goto(notebook.resolve().as_uri())
        frame = page.frame_locator("iframe")
        frame.locator(".stage canvas").wait_for(timeout=15000)
        view = next(f for f in page.frames if f != page.main_frame)
        view.wait_for_function("() => window.anatomyView && window.anatomyView.firstPaint !== null", timeout=15000)
        assert view.evaluate("document.querySelectorAll('.column.right .token').length") == len(pair_map.keys)
        assert view.evaluate("(() => { try { return window.parent.document.title; } catch (e) { return 'blocked'; } })()") \
            == "blocked"  # the view cannot reach the notebook's page
        assert errors == []
    finally:
        page.close()
