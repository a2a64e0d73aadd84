"""The graph page shows why attention attends, with the library's numbers: a node's explained edges, each edge's
heads (part, share, position pairs), a head's QK attribution (pairs of positions and of nodes, marginals, terms of
no node, the identity's check line and difference); inputs with an explained edge are marked; labels are text."""

from __future__ import annotations

import json

import pytest

from anatomy.circuits import save
from test_attention_edges import explained_graph
from test_page import click_node, open_page


@pytest.fixture(scope="module")
def explained():
    return explained_graph()


@pytest.fixture()
def page(browser, explained, tmp_path):
    _, _, small, edges = explained
    tab, errors = open_page(browser, save(small, tmp_path / "graph.html"))
    yield tab
    assert not errors
    tab.close()


def test_a_clicked_target_shows_its_edges_heads_and_the_qk_of_a_head(page, explained):
    _, _, small, edges = explained
    edge = max(edges, key=lambda e: abs(e.split.edge))
    target = small.index(edge.split.target)
    click_node(page, target)
    page.wait_for_selector("#qk-section")
    block = page.locator(f'.qk-edge[data-source="{edge.split.source.id}"]')
    rows = block.locator('table[data-field="heads"] tr').all()[1:]
    heads = edge.split.heads()
    assert len(rows) == len(heads)
    for tr, ((layer, head), part) in zip(rows, heads):
        cells = tr.locator("td").all_inner_texts()
        assert cells[0].startswith(f"L{layer} H{head}") and cells[1] == page.evaluate(f"fmt({part})")
        assert cells[2] == f"{100 * part / edge.split.edge:.1f}%"
    (layer, head), _ = heads[1]
    block.locator("td.qk-head").nth(1).click()
    detail = block.locator(f'.qk-detail[data-layer="{layer}"][data-head="{head}"]')
    qk = edge.qk[(layer, head)]
    assert detail.locator(".qk-check").inner_text() == qk.check
    shown = float(detail.locator(".qk-check").get_attribute("data-difference"))
    assert abs(shown - (qk.score - qk.pair_total - sum(qk.no_node.values()))) < 1e-9
    pairs = detail.locator('table[data-field="pairs"] tr').all()[1:]
    assert len(pairs) == len(qk.pairs)
    for tr, (q, k, term) in zip(pairs, qk.pairs):
        cells = tr.locator("td").all_inner_texts()
        assert cells[2] == page.evaluate(f"fmt({term})")
    margins = detail.locator('table[data-field="query-marginals"] tr').all()[1:]
    assert [tr.locator("td").all_inner_texts()[1] for tr in margins] == \
        [page.evaluate(f"fmt({v})") for _, v in qk.query_marginals]


def test_an_input_with_an_explained_edge_is_marked_and_opens_it(page, explained):
    _, _, small, edges = explained
    edge = min(edges, key=lambda e: abs(e.split.edge))  # one that starts closed
    click_node(page, small.index(edge.split.target))
    row = page.locator(f'#detail table[data-field="inputs"] tr[data-node="{small.index(edge.split.source)}"]')
    mark = row.locator("button.qk-mark")
    if mark.count() == 0:
        pytest.skip("the edge is not among the 12 strongest inputs the panel lists")
    block = page.locator(f'.qk-edge[data-source="{edge.split.source.id}"] .qk-body')
    if block.is_visible():  # the first edge into a node starts open: close it
        page.locator(f'.qk-edge[data-source="{edge.split.source.id}"] .qk-toggle').click()
    assert block.is_hidden()
    mark.click()
    assert block.is_visible()


def test_hostile_names_are_text(browser, explained, tmp_path):
    _, _, small, edges = explained
    record = json.loads(json.dumps(small.meta["attention"]))
    hostile = '<img src=x onerror="window.bad=1">'
    for node in record["nodes"].values():
        node["name"] = hostile
    graph = small.subgraph(small.mask(*{n.kind for n in small.nodes}), meta=dict(small.meta, attention=record))
    tab, _ = open_page(browser, save(graph, tmp_path / "hostile.html"))
    edge = max(edges, key=lambda e: abs(e.split.edge))
    click_node(tab, small.index(edge.split.target))
    tab.locator("#qk-section td.qk-head").first.click()
    assert hostile in tab.inner_text("#qk-section") and tab.evaluate("window.bad") is None
    assert tab.locator("#qk-section img").count() == 0
    tab.close()
