"""A discovered circuit's page in Chromium: it opens on the smallest circuit reaching the target, a slider grows
it by the curve's sizes with the curve's marker following; a head is one box whose q, k, v inputs and output
are all in its panel, with the library's weights; the heads' roles are the detectors', shown as badges; the
box fits its content. Labels only ever as text."""

from __future__ import annotations

import pytest
import torch

import anatomy
from anatomy.circuits import Graph, Node, save
from anatomy.circuits.discovery import attribute_edges, faithfulness, make_task
from anatomy.circuits.discovery.circuit import circuit_for_page
from anatomy.circuits.discovery.roles import head_roles

PAIRS = [{"clean": "Hello World, this is", "corrupt": "Hello World, is this", "answer": " Alejandro!", "wrong": " is"},
         {"clean": "World, this is", "corrupt": "World, is this", "answer": " Alejandro!", "wrong": " this"},
         {"clean": "Hello World, this", "corrupt": "Hello World, is", "answer": " is", "wrong": " this"}]


@pytest.fixture(scope="module")
def discovered(prenorm):
    model = anatomy.from_pretrained(prenorm).eval()
    task = make_task(model, "custom", PAIRS)
    edges = attribute_edges(model, task, method="eap")
    curve = faithfulness(model, task, edges, target=0.5)
    return model, task, edges, curve


def opened(browser, path):
    tab = browser.new_page()
    errors = []
    tab.on("pageerror", lambda error: errors.append(str(error)))
    tab.goto(path.as_uri())
    tab.wait_for_selector("body[data-paints]")
    return tab, errors


def drawn_pairs(tab) -> set[tuple[int, int]]:
    return {tuple(p) for link in tab.evaluate("window.anatomyGraph.views.main.links.map((l) => l.pairs)") for p in link}


def test_the_page_opens_on_the_smallest_circuit_and_the_slider_grows_it(browser, discovered, tmp_path):
    model, task, edges, curve = discovered
    circuit = circuit_for_page(model, task, edges, curve)
    sizes, values = curve.extra["sizes"], curve.values.tolist()
    smallest = curve.extra["smallest"] or sizes[-1]
    order = sorted(circuit.edges(), key=lambda e: -abs(e[2]))
    tab, errors = opened(browser, save(circuit, tmp_path / "circuit.html"))
    assert drawn_pairs(tab) == {(t, s) for t, s, _ in order[:smallest]}
    assert tab.locator(".curve line.marker").get_attribute("data-size") == str(smallest)
    said = tab.locator("#circuit-said").inner_text()
    assert said.startswith(f"the top {smallest:,} of {edges.extra['graph'].edge_count:,} edges recover "
                           f"{values[sizes.index(smallest)]:.3g}")
    slider = tab.locator('input[name="circuit-size"]')
    slider.fill(str(len(sizes) - 1))  # every edge
    assert drawn_pairs(tab) == {(t, s) for t, s, _ in order}
    assert tab.locator(".curve line.marker").get_attribute("data-size") == str(sizes[-1])
    canvas = tab.evaluate("document.querySelector('#graph-view canvas').getBoundingClientRect().width")
    world = tab.evaluate("(() => { const v = window.anatomyGraph.views.main; return v.plan.width * v.k; })()")
    assert canvas <= world + 50 + 2 * 10 + 2  # the box fits its content: the drawing, its label band and padding
    assert not errors
    tab.close()


def test_a_size_off_the_curve_opens_as_asked_and_says_it_was_not_measured(browser, discovered, tmp_path):
    model, task, edges, curve = discovered
    assert 3 not in curve.extra["sizes"]
    circuit = circuit_for_page(model, task, edges, curve, size=3, roles=False)
    order = sorted(circuit.edges(), key=lambda e: -abs(e[2]))
    tab, errors = opened(browser, save(circuit, tmp_path / "circuit.html"))
    assert drawn_pairs(tab) == {(t, s) for t, s, _ in order[:3]}
    assert "(faithfulness not measured at this size)" in tab.locator("#circuit-said").inner_text()
    assert not errors
    tab.close()


def test_the_roles_are_the_detectors(discovered):
    model, task, edges, curve = discovered
    circuit = circuit_for_page(model, task, edges, curve)
    heads = sorted({(n.layer, n.index) for n in circuit.nodes if n.kind == "head"})
    expected = head_roles(model, task, heads)["roles"]
    assert circuit.meta["roles"] == {f"L{l}H{h}": r for (l, h), r in expected.items() if r}


def test_a_head_is_one_box_with_its_inputs_and_its_output(browser, tmp_path):
    nodes = [Node("embedding", -1, 0, label="<img src=x onerror=alert(1)>"),
             Node("head", 0, 1, 1, port="q"), Node("head", 0, 1, 1, port="v"), Node("head", 0, 1, 1),
             Node("mlp", 0, 2, label="MLP 0"), Node("logits", 1, 0, label="</script><b>x</b>")]
    adjacency = torch.zeros(6, 6)
    adjacency[1, 0], adjacency[2, 0], adjacency[4, 0], adjacency[5, 4], adjacency[5, 3] = 0.5, -0.25, 1.0, 2.0, 0.3
    graph = Graph(nodes, adjacency, ["embed", "H1", "MLP"], 1, kind="circuit", about="a <i>circuit</i>",
                  meta={"roles": {"L0H1": ["name mover", "induction"]}})
    tab, errors = opened(browser, save(graph, tmp_path / "circuit.html"))
    assert tab.locator("img").count() == 0 and tab.locator("b").count() == 0 and tab.locator("i").count() == 0
    heads = tab.evaluate("window.anatomyGraph.views.main.plan.boxes.filter((b) => b.kind === 'head').map((b) => b.members)")
    assert heads == [[1, 2, 3]]  # its q and v inputs and its output: one box
    box = tab.evaluate("window.anatomyGraph.clientBox(1)")
    tab.mouse.click(box["x"], box["y"])
    assert tab.locator("#detail h2").inner_text() == "L0 H1"
    assert [b.inner_text() for b in tab.locator("#detail .badge").all()] == ["name mover", "induction"]
    tables = {t.get_attribute("data-field") + t.evaluate("t => t.previousElementSibling.textContent"): t
              for t in tab.locator("#detail table[data-field]").all()}
    assert set(tables) == {"inputsStrongest inputs (q)", "inputsStrongest inputs (v)", "outputsStrongest outputs"}
    for title, source, target in (("inputsStrongest inputs (q)", 0, 1), ("inputsStrongest inputs (v)", 0, 2),
                                  ("outputsStrongest outputs", 5, 3)):
        row = tables[title].locator("tr").first
        node = int(row.get_attribute("data-node"))
        assert node == source and float(row.get_attribute("data-weight")) == pytest.approx(float(adjacency[target, source] if title.startswith("inputs") else adjacency[source, target]))
    assert not errors
    tab.close()
