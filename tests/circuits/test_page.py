"""The graph page in Chromium shows the numbers the library computed: a node's value, its strongest inputs and
outputs with their weights, the check line, the scores; pinning, supernodes (their edges summed), and exports
(JSON in Neuronpedia's schema, with the pinned nodes; PNG); labels only ever as text."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch

import anatomy
from anatomy.circuits import FeatureDetails, Graph, Node, attribution_graph, pruned, save, scores
from anatomy.circuits.features import promoted_tokens
from anatomy.sae import load_transcoders

FIXTURES = Path(__file__).parent / "fixtures"
PROMPT = json.loads((FIXTURES / "graphs" / "README.json").read_text())["prompt"]


@pytest.fixture(scope="module")
def made():
    model = anatomy.from_pretrained(str(FIXTURES / "graphs" / "llama")).eval()
    transcoders = load_transcoders(FIXTURES / "graphs" / "plt_jumprelu")
    graph = attribution_graph(model, PROMPT, transcoders)
    small = pruned(graph)
    details = promoted_tokens(model, transcoders, small)
    return graph, small, details, scores(graph)


@pytest.fixture()
def page(browser, made, tmp_path):
    graph, small, details, graph_scores = made
    path = save(small, tmp_path / "graph.html", details=details, scores=graph_scores)
    tab = browser.new_page()
    errors = []
    tab.on("pageerror", lambda error: errors.append(str(error)))
    tab.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    tab.goto(path.as_uri())
    tab.wait_for_selector("#graph-scroll svg g.node")
    yield tab, small
    assert not errors
    tab.close()


def click_node(tab, index: int, shift: bool = False):
    tab.locator(f'#graph-scroll g.node[data-index="{index}"]').first.click(modifiers=["Shift"] if shift else [])


def test_every_node_is_drawn_and_the_check_line_is_the_graphs(page, made):
    tab, small = page
    graph, _, _, graph_scores = made
    drawn = tab.locator("#graph-scroll g.node").count()
    boxes = {(n.kind, n.layer, n.column, n.index) for n in small.nodes}
    assert drawn == len(boxes)
    # the drawn graph's own check: what pruning kept of the influence, and its identity on what it keeps,
    # not the whole graph's difference as if it were its own
    assert tab.locator("#check-line").inner_text() == f"Check: {small.check}" and small.check.startswith("pruned to ")
    assert graph.check not in small.check
    assert "check-ok" in tab.locator("#check-line").get_attribute("class")
    assert tab.locator("#scores").inner_text() == f"replacement {round(graph_scores[0], 4)} · completeness {round(graph_scores[1], 4)}"
    assert tab.locator("path.edge").count() == len(small.edges())


def test_a_clicked_feature_shows_its_value_and_its_edges(page, made):
    tab, small = page
    _, _, details, _ = made
    feature = max((i for i, n in enumerate(small.nodes) if n.kind == "feature"),
                  key=lambda i: int((small.adjacency[i] != 0).sum()))
    click_node(tab, feature)
    node = small.nodes[feature]
    assert tab.locator("#detail h2").inner_text() == node.name
    shown = float(tab.locator('#detail tr[data-field="value"]').get_attribute("data-raw"))
    assert shown == pytest.approx(node.value, rel=1e-5)
    rows = tab.locator('#detail table[data-field="inputs"] tr')
    weights = [(int(rows.nth(k).get_attribute("data-node")), float(rows.nth(k).get_attribute("data-weight")))
               for k in range(rows.count())]
    assert weights, "a feature of a pruned graph keeps an input"
    for source, weight in weights:
        assert weight == pytest.approx(float(small.adjacency[feature, source]), rel=1e-5)
    strongest = small.adjacency[feature].abs().argmax().item()
    assert weights[0][0] == strongest
    promoted = tab.locator('#detail table[data-field="promoted"] tr')
    expected = details.promoted[node.id]
    assert promoted.count() == len(expected)
    assert promoted.nth(0).locator("td").nth(0).inner_text() == expected[0][0].replace("\n", "↵")


def test_pinned_nodes_make_a_subgraph_and_a_supernode_sums_its_members_edges(page):
    tab, small = page
    logit = next(i for i, n in enumerate(small.nodes) if n.kind == "logit")
    inputs = small.adjacency[logit].abs().topk(2).indices.tolist()
    for i in inputs + [logit]:
        click_node(tab, i, shift=True)
    assert tab.locator("#subgraph-scroll g.node").count() == 3
    for i in inputs:
        tab.locator(f'#subgraph-tools input[data-node="{i}"]').check()
    tab.fill("#supernode-name", "both <b>inputs</b>")
    tab.click("#group-button")
    supernode = tab.locator("#subgraph-scroll g.node.supernode")
    assert supernode.count() == 1
    assert supernode.locator("text").text_content() == "both <b>inputs</b>"  # a label is text, never markup
    edge = tab.locator("#subgraph-scroll path.edge")
    assert edge.count() == 1
    expected = float(small.adjacency[logit, inputs].sum())
    assert float(edge.first.get_attribute("data-weight")) == pytest.approx(expected, rel=1e-5)


def test_the_json_export_is_neuronpedias_with_the_pinned_nodes(page, tmp_path):
    tab, small = page
    features = [i for i, n in enumerate(small.nodes) if n.kind == "feature"][:2]
    for i in features:
        click_node(tab, i, shift=True)
    with tab.expect_download() as download:
        tab.click("#export-json")
    data = json.loads(Path(download.value.path()).read_text())
    schema = json.loads((FIXTURES / "neuronpedia" / "graph-schema.json").read_text())
    jsonschema.validate(data, schema)
    ids = [n["node_id"] for n in data["nodes"]]
    assert data["qParams"]["pinnedIds"] == [ids[i] for i in features]
    assert len(data["links"]) == len(small.edges())


def test_the_png_export_is_a_png(page):
    tab, _ = page
    with tab.expect_download() as download:
        tab.click("#export-png")
    assert Path(download.value.path()).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_circuits_heads_and_ports_are_drawn_with_hostile_labels_as_text(browser, tmp_path):
    nodes = [Node("embedding", -1, 0, label="<img src=x onerror=alert(1)>"),
             Node("head", 0, 1, 1, port="q"), Node("head", 0, 1, 1, port="v"), Node("mlp", 0, 2, label="MLP 0"),
             Node("logits", 1, 0, label="</script><b>x</b>")]
    adjacency = torch.zeros(5, 5)
    adjacency[1, 0], adjacency[2, 0], adjacency[3, 0], adjacency[4, 3], adjacency[4, 1] = 0.5, -0.25, 1.0, 2.0, 0.3
    graph = Graph(nodes, adjacency, ["embed", "H1", "MLP"], 1, kind="circuit", about="a <i>circuit</i>")
    path = save(graph, tmp_path / "circuit.html")
    tab = browser.new_page()
    tab.goto(path.as_uri())
    tab.wait_for_selector("#graph-scroll svg g.node")
    assert tab.locator("img").count() == 0 and tab.locator("b").count() == 0 and tab.locator("i").count() == 0
    assert tab.locator("#graph-scroll g.node.head").count() == 1  # a head's q and v inputs: one box
    assert tab.locator("#graph-scroll path.edge").count() == 5
    tab.locator('#graph-scroll g.node.head').click()
    assert "L0 H1" in tab.locator("#detail h2").inner_text()
    tab.close()


def test_a_page_draws_the_strongest_edges_and_says_how_many_there_are(made):
    from anatomy.circuits.page import graph_payload

    _, small, _, _ = made
    limit = 40
    payload = graph_payload(small, max_edges=limit)
    weights = sorted((abs(w) for *_, w in small.edges()), reverse=True)
    assert len(payload["edges"]) == limit and payload["edgesInGraph"] == len(small.edges())
    assert min(abs(w) for *_, w in payload["edges"]) >= weights[limit - 1] * (1 - 1e-5)
