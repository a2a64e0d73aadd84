"""The views in a real browser: they draw, respond to the controls, show tokens as text, fetch nothing.

Shape letters: L layers, H heads, T query positions, S key positions.
"""

from __future__ import annotations

import pytest

from anatomy.viz import generation_view, head_view, model_view, neuron_view

from page_geometry import assert_largest_cell_is_visible, grid, misplaced_cells, shows
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
    strip = lambda: page.inner_html(".strip")  # noqa: E731
    before, paints = strip(), view.paints()
    page.fill("input[name=step]", "4")
    view.wait_for_paint_after(paints)
    assert page.text_content(".text-flow .token.current") == tokens[2 + 4 - 1]
    after_step = strip()
    assert after_step != before
    paints = view.paints()
    page.select_option("select[name=layer]", "1")
    view.wait_for_paint_after(paints)
    assert strip() != after_step
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


# Every cell where its labels say: the views' geometry -------------------------------------------


def test_generation_strip_cells_sit_under_the_tokens_they_read(open_view, tmp_path):
    """The per-head strip is one grid: each head's weight on position j under token j's label,
    equal to the weight of that step (row t - 1 of the causal pattern, stored as a byte)."""
    tokens = ["<SOS>", "The", "␣capital", "␣of", "␣France", "␣is", "␣Paris", ".", "↵"]
    weights, _, _ = synthetic_attention(2, 3, len(tokens), causal=True)
    view = open_view(generation_view(weights, tokens, prompt_length=5).save(tmp_path / "generation.html"))
    page = view.page
    for step in (1, 4):
        paints = view.paints()
        page.fill("input[name=step]", str(step))
        view.wait_for_paint_after(paints)
        row = 5 + step - 2  # the last position read, producing token 5 + step - 1
        strip = grid(page, "strip")
        assert misplaced_cells(strip) == []
        assert [strip["cols"][str(j)]["text"] for j in range(row + 1)] == tokens[:row + 1]
        assert len(strip["cells"]) == 3 * (row + 1)
        for cell in strip["cells"]:
            expected = weights[0, int(cell["row"]), row, int(cell["col"])]
            assert abs(cell["value"] - expected) <= 0.5 / 255 + 1e-6
            assert shows(cell["text"], cell["value"])
        assert_largest_cell_is_visible(strip)
    assert "␣ a space" in page.inner_text("#token-legend")
    view.assert_safe()


def test_model_view_thumbnails_sit_under_their_heads_and_beside_their_layers(open_view, tmp_path):
    tokens = [f"t{i}" for i in range(6)]
    weights, _, _ = synthetic_attention(4, 9, len(tokens), causal=True)
    view = open_view(model_view(weights, tokens).save(tmp_path / "model.html"))
    boxes = view.page.evaluate("""() => {
        const box = (n) => { const b = n.getBoundingClientRect(); return [b.left, b.right, b.top, b.bottom]; };
        const labels = [...document.querySelectorAll('.grid .axis')];
        return {heads: labels.filter((n) => n.textContent.startsWith('head ')).map(box),
                layers: labels.filter((n) => n.textContent.startsWith('layer ')).map(box),
                thumbs: [...document.querySelectorAll('canvas.thumb')].map((n) => [+n.dataset.layer, +n.dataset.head, ...box(n)])};
    }""")
    for layer, head, left, right, top, bottom in boxes["thumbs"]:
        x, y = (left + right) / 2, (top + bottom) / 2
        head_label, layer_label = boxes["heads"][head], boxes["layers"][layer]
        assert head_label[0] <= x <= head_label[1], (layer, head, x, head_label)
        assert layer_label[2] <= y <= layer_label[3], (layer, head, y, layer_label)
    view.assert_safe()


def test_model_view_opens_the_enlarged_head_beside_the_clicked_cell(open_view, tmp_path):
    """SmolLM2's shape, 30 layers x 9 heads at 1280 px: the enlarged head opens to the right of the
    grid, level with the clicked row, in view (it opened below all 30 rows)."""
    tokens = ["The", "␣capital", "␣of", "␣France", "␣is"]
    weights, _, _ = synthetic_attention(30, 9, len(tokens), causal=True)
    view = open_view(model_view(weights, tokens).save(tmp_path / "smollm2-model.html"))
    page = view.page
    for layer, head in ((25, 6), (2, 0)):
        paints = view.paints()
        page.click(f"canvas.thumb[data-layer='{layer}'][data-head='{head}']")
        view.wait_for_paint_after(paints)
        page.wait_for_timeout(100)
        layout = page.evaluate(f"""() => {{
            const box = (n) => n.getBoundingClientRect();
            const thumb = box(document.querySelector("canvas.thumb[data-layer='{layer}'][data-head='{head}']"));
            const detail = box(document.getElementById('detail-canvas'));
            return {{thumb: [thumb.left, thumb.right, thumb.top, thumb.bottom], grid: box(document.querySelector('.grid')).right,
                    detail: [detail.left, detail.right, detail.top, detail.bottom], height: window.innerHeight,
                    width: document.documentElement.clientWidth}};
        }}""")
        (t_left, t_right, t_top, t_bottom), (d_left, d_right, d_top, d_bottom) = layout["thumb"], layout["detail"]
        assert page.text_content("#detail h2") == f"self-attention · layer {layer} · head {head}"
        assert d_left >= layout["grid"] and d_right <= layout["width"], layout  # beside the grid, on the page
        assert d_top <= t_bottom + 60 and d_bottom >= t_top, layout  # level with the clicked row
        assert 0 <= d_top and d_bottom <= layout["height"], layout  # in view
        assert t_right - t_left >= 36, layout  # the thumbnails kept a readable size
    view.assert_safe()


def test_head_view_lines_start_and_end_at_their_tokens(pair_map, open_view, tmp_path):
    """The lines are drawn at (i + 1/2) rows from the canvas's top: each token's centre is there."""
    view = open_view(head_view(pair_map).save(tmp_path / "head.html"))
    layout = view.page.evaluate("""() => {
        const row = parseFloat(getComputedStyle(document.documentElement).getPropertyValue('--row'));
        const canvas = document.querySelector('.stage canvas').getBoundingClientRect();
        const centres = (side) => [...document.querySelectorAll(`.column.${side} .token`)].map((n) => {
            const b = n.getBoundingClientRect(); return (b.top + b.bottom) / 2; });
        return {row, top: canvas.top, left: centres('left'), right: centres('right')};
    }""")
    for side in ("left", "right"):
        for i, centre in enumerate(layout[side]):
            assert abs(centre - (layout["top"] + (i + 0.5) * layout["row"])) <= 1, (side, i, layout)
    view.assert_safe()


def test_neuron_view_is_not_blank(pair_map, open_view, tmp_path):
    view = open_view(neuron_view(pair_map, layer=1, head=2, query=3).save(tmp_path / "neuron.html"))
    coloured = view.page.eval_on_selector("#neuron-canvas", """(canvas) => {
        const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
        let n = 0; for (let i = 0; i < data.length; i += 4) if (data[i + 3] > 0 && (data[i] < 200 || data[i + 2] < 200)) n++;
        return n; }""")
    assert coloured > 500  # q, k, q∘k cells, scores and softmax bars are drawn
    view.assert_safe()
