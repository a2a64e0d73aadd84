"""The graph page in Chromium: the whole graph in view at open, a selection that stays, and the numbers the
library computed in its panel (a node's value, its strongest inputs and outputs, what a feature promotes and
suppresses with their signs, its label); the check line and the scores; pinning, supernodes (their edges
summed) and the exports (Neuronpedia's JSON with the pinned nodes and an edited label as its clerp; PNG).
The page draws on a canvas: the tests find a node where the page says it drew it (window.anatomyGraph),
check that the canvas shows it there, and click there as a reader would."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch

import anatomy
from anatomy.circuits import attribution_graph, pruned, save, scores
from anatomy.circuits.features import promoted_tokens
from anatomy.sae import load_transcoders

FIXTURES = Path(__file__).parent / "fixtures"
PROMPT = json.loads((FIXTURES / "graphs" / "README.json").read_text())["prompt"]
FEATURE_FILL = (0x6D, 0x83, 0xA8)  # graph-draw.js's KIND_STYLE.feature


@pytest.fixture(scope="module")
def made():
    model = anatomy.from_pretrained(str(FIXTURES / "graphs" / "llama")).eval()
    transcoders = load_transcoders(FIXTURES / "graphs" / "plt_jumprelu")
    graph = attribution_graph(model, PROMPT, transcoders)
    small = pruned(graph)
    details = promoted_tokens(model, transcoders, small)
    return graph, small, details, scores(graph)


def open_page(browser, path: Path):
    tab = browser.new_page()
    errors = []
    tab.on("pageerror", lambda error: errors.append(str(error)))
    tab.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    tab.goto(path.as_uri())
    tab.wait_for_selector("body[data-paints]")
    return tab, errors


@pytest.fixture()
def page(browser, made, tmp_path):
    graph, small, details, graph_scores = made
    tab, errors = open_page(browser, save(small, tmp_path / "graph.html", details=details, scores=graph_scores))
    yield tab, small
    assert not errors
    tab.close()


def where(tab, index: int, view: str = "main") -> dict:
    """The node's box as the page drew it, in client pixels: {x, y, w, h}."""
    return tab.evaluate("([i, view]) => window.anatomyGraph.clientBox(i, view)", [index, view])


def click_node(tab, index: int, shift: bool = False):
    box = where(tab, index)
    if shift:
        tab.keyboard.down("Shift")
    tab.mouse.click(box["x"], box["y"])
    if shift:
        tab.keyboard.up("Shift")


def busiest_feature(graph) -> int:
    return max((i for i, n in enumerate(graph.nodes) if n.kind == "feature"),
               key=lambda i: int((graph.adjacency[i] != 0).sum() + (graph.adjacency[:, i] != 0).sum()))


def test_at_open_every_node_is_in_view_and_drawn_where_the_page_says(page):
    tab, small = page
    view = tab.evaluate("(() => { const r = document.querySelector('#graph-view canvas').getBoundingClientRect();"
                        " return {left: r.left, top: r.top, right: r.right, bottom: r.bottom,"
                        " width: innerWidth, height: innerHeight}; })()")
    boxes = [where(tab, i) for i in range(len(small))]
    assert all(box is not None for box in boxes)
    assert min(b["x"] - b["w"] / 2 for b in boxes) >= max(view["left"], 0)
    assert max(b["x"] + b["w"] / 2 for b in boxes) <= min(view["right"], view["width"])
    assert min(b["y"] - b["h"] / 2 for b in boxes) >= max(view["top"], 0)
    assert max(b["y"] + b["h"] / 2 for b in boxes) <= min(view["bottom"], view["height"])
    features = [i for i, n in enumerate(small.nodes) if n.kind == "feature"]
    shot = tab.screenshot()  # the pixels: each feature's centre shows the feature's fill
    from io import BytesIO

    from PIL import Image

    image = Image.open(BytesIO(shot)).convert("RGB")
    for i in features:
        pixel = image.getpixel((round(boxes[i]["x"] - 0.5), round(boxes[i]["y"] - 0.5)))
        assert max(abs(a - b) for a, b in zip(pixel, FEATURE_FILL)) <= 24, (small.nodes[i].name, pixel)


def test_zoomed_and_panned_the_layer_names_and_tokens_stay_in_view(page):
    tab, small = page
    canvas = tab.evaluate("(() => { const r = document.querySelector('#graph-view canvas').getBoundingClientRect();"
                          " return {left: r.left, top: r.top, width: r.width, height: r.height}; })()")
    x, y = canvas["left"] + canvas["width"] / 2, canvas["top"] + canvas["height"] / 2
    tab.mouse.move(x, y)
    for _ in range(4):
        tab.mouse.wheel(0, -400)
    tab.mouse.down()
    tab.mouse.move(x - 150, y - 60, steps=4)
    tab.mouse.up()
    boxes = [where(tab, i) for i in range(len(small))]
    hidden = sum(not (canvas["left"] <= b["x"] <= canvas["left"] + canvas["width"]) for b in boxes)
    assert hidden > 0  # zoomed and panned: part of the graph is out of the view
    labels = tab.evaluate("window.anatomyGraph.views.main.bandLabels")
    layers = [label for label in labels if label["band"] == "layers"]
    columns = [label for label in labels if label["band"] == "columns"]
    assert layers and columns
    assert all(0 <= label["x"] <= 50 and 0 <= label["y"] <= canvas["height"] for label in layers)
    assert all(0 <= label["x"] <= canvas["width"] and canvas["height"] - 26 <= label["y"] <= canvas["height"]
               for label in columns)
    for label in columns:  # under the nodes of its column, wherever the pan took them
        shown = [b["x"] - canvas["left"] for b, n in zip(boxes, small.nodes) if n.column == label["column"]]
        assert min(shown) - 60 <= label["x"] <= max(shown) + 60


def test_the_check_line_the_scores_and_the_edges_are_the_graphs(page, made):
    tab, small = page
    graph, _, _, graph_scores = made
    # the drawn graph's own check: what pruning kept of the influence, and its identity on what it keeps,
    # not the whole graph's difference as if it were its own
    assert tab.locator("#check-line").inner_text() == f"Check: {small.check}" and small.check.startswith("pruned to ")
    assert graph.check not in small.check
    assert "check-ok" in tab.locator("#check-line").get_attribute("class")
    assert tab.locator("#scores").inner_text() == f"replacement {round(graph_scores[0], 4)} · completeness {round(graph_scores[1], 4)}"
    drawn = tab.evaluate("window.anatomyGraph.views.main.links.map((l) => [l.pairs[0][0], l.pairs[0][1], l.weight])")
    assert len(drawn) == len(small.edges())
    for t, s, w in drawn:
        assert w == pytest.approx(float(small.adjacency[t, s]), rel=1e-5)


def test_a_click_pins_the_neighbourhood_until_escape(page):
    tab, small = page
    feature = busiest_feature(small)
    click_node(tab, feature)
    expected = {(t, s) for t, s, _ in small.edges() if feature in (t, s)}
    other = next(i for i, n in enumerate(small.nodes) if n.kind == "token" and (feature, i) not in expected)
    for x, y in ((where(tab, other)["x"], where(tab, other)["y"]), (5, 5)):  # over another node, then off the view
        tab.mouse.move(x, y)
        lit = tab.evaluate("window.anatomyGraph.lit()")
        assert {tuple(pair) for link in lit for pair in link["pairs"]} == expected
    assert tab.evaluate("window.anatomyGraph.state.selected") == feature
    assert tab.locator("#detail h2").inner_text() == small.nodes[feature].name
    tab.keyboard.press("Escape")
    assert tab.evaluate("window.anatomyGraph.state.selected") is None and tab.evaluate("window.anatomyGraph.lit()") == []


def test_the_arrows_move_between_neighbours_and_enter_follows_the_strongest_edge(page):
    tab, small = page
    feature = busiest_feature(small)
    a = small.adjacency
    strongest_out = int(a[:, feature].abs().argmax())
    strongest_in = int(a[feature].abs().argmax())
    strongest = strongest_out if a[strongest_out, feature].abs() >= a[feature, strongest_in].abs() else strongest_in
    for key, expected in (("ArrowUp", strongest_out), ("ArrowDown", strongest_in), ("Enter", strongest)):
        click_node(tab, feature)
        tab.keyboard.press(key)
        assert tab.evaluate("window.anatomyGraph.state.selected") == expected, key


def test_a_clicked_feature_shows_its_value_its_edges_and_what_it_promotes(page, made):
    tab, small = page
    _, _, details, _ = made
    feature = busiest_feature(small)
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
    assert weights[0][0] == small.adjacency[feature].abs().argmax().item()
    for field in ("promoted", "suppressed"):
        table = tab.locator(f'#detail table[data-field="{field}"] tr')
        expected = getattr(details, field)[node.id]
        assert table.count() == len(expected)
        for k, (token, logit) in enumerate(expected):
            assert table.nth(k).locator("td").nth(0).inner_text() == token
            assert float(table.nth(k).get_attribute("data-raw")) == pytest.approx(logit, rel=1e-3, abs=1e-4)
    assert tab.locator("#label-input").input_value() == details.labels[node.id]


def test_pinned_nodes_make_a_subgraph_and_a_supernode_sums_its_members_edges(page):
    tab, small = page
    logit = next(i for i, n in enumerate(small.nodes) if n.kind == "logit")
    inputs = small.adjacency[logit].abs().topk(2).indices.tolist()
    for i in inputs + [logit]:
        click_node(tab, i, shift=True)
    assert tab.evaluate("window.anatomyGraph.views.sub.plan.boxes.length") == 3
    for i in inputs:
        tab.locator(f'#subgraph-tools input[data-node="{i}"]').check()
    tab.fill("#supernode-name", "both <b>inputs</b>")
    tab.click("#group-button")
    boxes = tab.evaluate("window.anatomyGraph.views.sub.plan.boxes.map((b) => [b.kind, b.label])")
    assert ["supernode", "both <b>inputs</b>"] in boxes  # a label is text, drawn on the canvas, never markup
    assert tab.locator("b").count() == 0
    links = tab.evaluate("window.anatomyGraph.views.sub.links.map((l) => l.weight)")
    assert links == [pytest.approx(float(small.adjacency[logit, inputs].sum()), rel=1e-5)]


def test_the_json_export_is_neuronpedias_with_the_pinned_nodes_and_the_labels(page):
    tab, small = page
    features = [i for i, n in enumerate(small.nodes) if n.kind == "feature"][:2]
    for i in features:
        click_node(tab, i, shift=True)
    click_node(tab, features[0])
    tab.fill("#label-input", "a cat <detector>")
    tab.locator("#label-input").press("Enter")
    with tab.expect_download() as download:
        tab.click("#export-json")
    data = json.loads(Path(download.value.path()).read_text())
    schema = json.loads((FIXTURES / "neuronpedia" / "graph-schema.json").read_text())
    jsonschema.validate(data, schema)
    ids = [n["node_id"] for n in data["nodes"]]
    assert data["qParams"]["pinnedIds"] == [ids[i] for i in features]
    assert data["nodes"][features[0]]["clerp"] == "a cat <detector>"
    assert data["nodes"][features[1]]["clerp"].startswith("auto: ")
    assert len(data["links"]) == len(small.edges())


def test_the_png_export_is_a_png(page):
    tab, _ = page
    with tab.expect_download() as download:
        tab.click("#export-png")
    assert Path(download.value.path()).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_page_holds_the_strongest_edges_strongest_first(made):
    from anatomy.circuits.page import graph_payload

    _, small, _, _ = made
    limit = 40
    payload = graph_payload(small, max_edges=limit)
    weights = sorted((abs(w) for *_, w in small.edges()), reverse=True)
    assert len(payload["edges"]) == limit and payload["edgesInGraph"] == len(small.edges())
    assert [abs(w) for *_, w in payload["edges"]] == pytest.approx(weights[:limit], rel=1e-5)


def test_a_graph_of_many_positions_and_nodes_opens_in_view(browser, tmp_path):
    """1,024 positions and 4,000 nodes (a synthetic graph: the layout is what is tested; `anatomy bench --only page`
    opens 10,000)."""
    from anatomy.circuits import Graph, Node

    generator = torch.Generator().manual_seed(0)
    positions, layers, per_layer = 1024, 6, 496
    nodes = [Node("token", -1, p, p, label=f"t{p}") for p in range(positions)]
    for layer in range(layers):
        columns = torch.randint(0, positions, (per_layer,), generator=generator).tolist()
        nodes += [Node("feature", layer, c, k, value=1.0) for k, c in enumerate(columns)]
    nodes.append(Node("logit", layers, positions - 1, 7, label="x", value=0.9))
    n = len(nodes)
    adjacency = torch.zeros(n, n)
    targets = torch.randint(positions, n, (20_000,), generator=generator)
    sources = (torch.rand(20_000, generator=generator) * targets).long()
    adjacency[targets, sources] = torch.randn(20_000, generator=generator)
    graph = Graph(nodes, adjacency, [f"t{p}" for p in range(positions)], layers, kind="attribution graph",
                  meta={"pruned": True})
    tab, errors = open_page(browser, save(graph, tmp_path / "big.html"))
    canvas = tab.evaluate("(() => { const r = document.querySelector('#graph-view canvas').getBoundingClientRect();"
                          " return [r.left, r.top, r.right, r.bottom]; })()")
    inside = tab.evaluate("""(box) => window.anatomyGraph.nodes.every((_, i) => {
        const b = window.anatomyGraph.clientBox(i);
        return b.x >= box[0] && b.x <= box[2] && b.y >= box[1] && b.y <= box[3]; })""", canvas)
    assert inside and not errors
    tab.close()


def test_a_soft_capped_models_page_says_its_rows_explain_the_logits_before_the_cap(browser, tmp_path):
    model = anatomy.from_pretrained(str(FIXTURES / "graphs" / "gemma2")).eval()
    transcoders = load_transcoders(FIXTURES / "graphs" / "gemma2_plt", mlp_out_norm=True)
    graph = attribution_graph(model, PROMPT, transcoders)
    tab = browser.new_page()
    tab.goto(save(pruned(graph), tmp_path / "capped.html").as_uri())
    line = tab.locator("#logits-line").inner_text()
    assert "before the final soft-cap" in line and "c = 5" in line
    tab.close()
    path = save(pruned(attribution_graph(anatomy.from_pretrained(str(FIXTURES / "graphs" / "llama")).eval(), PROMPT,
                                         load_transcoders(FIXTURES / "graphs" / "plt_jumprelu"))), tmp_path / "plain.html")
    assert 'id="logits-line"' not in path.read_text()  # no cap, nothing to say
