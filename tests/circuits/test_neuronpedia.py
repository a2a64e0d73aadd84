"""The graph JSON: Neuronpedia's schema holds it, and it says what circuit-tracer's `create_graph_files` says.

circuit-tracer's JSON of the same graph (fixtures/graphs/json, written by circuit-tracer 0.5.0) has the same
nodes, with the same fields in the same order and the same defaults, links, weights and influences; only its
error ids differ, on purpose: its "0_{layer}_{position}" is the id of layer 0's feature number `layer` at that
position, and anatomy writes "{layer}_-1_{position}" (the id circuit-tracer's upstream has since moved to), and
its jsNodeId "{layer}_{position}-0" is that of the layer's feature number `position`: anatomy's is
"{layer}_-1-{position}".
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

import anatomy
from anatomy.circuits import save
from anatomy.circuits.attribute import attribution_graph
from anatomy.circuits.neuronpedia import neuronpedia_json
from anatomy.sae import load_transcoders

FIXTURES = Path(__file__).parent / "fixtures"
SCHEMA = json.loads((FIXTURES / "neuronpedia" / "graph-schema.json").read_text())
SETS = ["plt_jumprelu", "plt_relu_skip", "clt_jumprelu"]
PROMPT = json.loads((FIXTURES / "graphs" / "README.json").read_text())["prompt"]


@pytest.fixture(scope="module")
def model():
    return anatomy.from_pretrained(str(FIXTURES / "graphs" / "llama")).eval()


def ours(model, name):
    graph = attribution_graph(model, PROMPT, load_transcoders(FIXTURES / "graphs" / name))
    return neuronpedia_json(graph, slug=name, scan=f"anatomy-fixtures/{name}")


@pytest.mark.parametrize("name", SETS)
def test_the_json_validates_against_neuronpedias_schema(model, name):
    data = ours(model, name)
    jsonschema.validate(data, SCHEMA)
    ids = [node["node_id"] for node in data["nodes"]]
    assert len(ids) == len(set(ids))
    assert {link["source"] for link in data["links"]} | {link["target"] for link in data["links"]} <= set(ids)


def circuit_tracer_error_id(node_id: str, feature_type: str) -> str:
    """circuit-tracer 0.5's error id "0_{layer}_{pos}" as anatomy's "{layer}_-1_{pos}"."""
    if feature_type != "mlp reconstruction error":
        return node_id
    _, layer, position = node_id.split("_")
    return f"{layer}_-1_{position}"


@pytest.mark.parametrize("name", SETS)
def test_the_json_equals_circuit_tracers(model, name):
    data = ours(model, name)
    theirs = json.loads((FIXTURES / "graphs" / "json" / f"{name}.json").read_text())
    their_nodes = {circuit_tracer_error_id(node["node_id"], node["feature_type"]): node for node in theirs["nodes"]}
    our_nodes = {node["node_id"]: node for node in data["nodes"]}
    assert set(our_nodes) == set(their_nodes)
    for node_id, node in our_nodes.items():
        theirs_ = their_nodes[node_id]
        for key in ("feature", "layer", "ctx_idx", "feature_type", "token_prob", "is_target_logit"):
            assert node.get(key, theirs_.get(key)) == pytest.approx(theirs_.get(key), abs=1e-6), (node_id, key)
        if theirs_["influence"] is not None:
            assert node["influence"] == pytest.approx(theirs_["influence"], abs=1e-4)
        if theirs_.get("activation") is not None:
            assert node["activation"] == pytest.approx(theirs_["activation"], abs=1e-4)
    # a link of circuit-tracer's that names a colliding id may mean the feature or the error: either matches
    errors = {node["node_id"] for node in theirs["nodes"] if node["feature_type"] == "mlp reconstruction error"}
    features = {node["node_id"] for node in theirs["nodes"] if node["feature_type"] != "mlp reconstruction error"}

    def meanings(node_id):
        return ([node_id] if node_id in features else []) + \
               ([circuit_tracer_error_id(node_id, "mlp reconstruction error")] if node_id in errors else [])
    our_links = {(link["source"], link["target"]): link["weight"] for link in data["links"]}
    assert len(our_links) == len(theirs["links"])
    for link in theirs["links"]:
        matches = [our_links[(s, t)] for s in meanings(link["source"]) for t in meanings(link["target"]) if (s, t) in our_links]
        assert any(abs(w - link["weight"]) < 1e-4 for w in matches), link
    assert data["metadata"]["prompt_tokens"] == theirs["metadata"]["prompt_tokens"]


@pytest.mark.parametrize("name", SETS)
def test_every_node_carries_every_field_circuit_tracer_writes_and_a_diff_shows_only_numbers(model, name):
    """Node by node, the same fields in the same order with the same defaults (is_target_logit false, run_idx 0,
    token_prob 0.0, activation null off the features, influence null on the logits), and the metadata circuit-tracer
    writes in its order: every value that is not a number is equal, but for the error ids (module docstring) and
    the prompt, which anatomy writes as it was given."""
    data = ours(model, name)
    theirs = json.loads((FIXTURES / "graphs" / "json" / f"{name}.json").read_text())
    assert list(data["metadata"])[:len(theirs["metadata"])] == list(theirs["metadata"])
    mine = ("slug", "scan", "prompt")  # named by the caller; the prompt as given (circuit-tracer's: its ids decoded)
    assert {k: data["metadata"][k] for k in theirs["metadata"] if k not in mine} == \
        {k: v for k, v in theirs["metadata"].items() if k not in mine}
    their_nodes = {circuit_tracer_error_id(node["node_id"], node["feature_type"]): node for node in theirs["nodes"]}
    for node in data["nodes"]:
        theirs_ = their_nodes[node["node_id"]]
        assert list(node) == list(theirs_), node["node_id"]
        for key, value in node.items():
            other = theirs_[key]
            if key in ("node_id", "jsNodeId") and node["feature_type"] == "mlp reconstruction error":
                continue
            if isinstance(value, float) or isinstance(other, float):
                assert value == pytest.approx(other, abs=1e-4), (node["node_id"], key)
            else:
                assert value == other, (node["node_id"], key)


def test_the_json_holds_the_strongest_edges_at_the_precision_they_carry(model):
    from anatomy.circuits import pruned

    graph = pruned(attribution_graph(model, PROMPT, load_transcoders(FIXTURES / "graphs" / "plt_jumprelu")))
    data = neuronpedia_json(graph, max_links=25, labels={graph.nodes[-1].id: "not a feature"})
    jsonschema.validate(data, SCHEMA)
    weights = sorted((w for *_, w in graph.edges()), key=abs, reverse=True)
    assert [link["weight"] for link in data["links"]] == [float(f"{w:.6g}") for w in weights[:25]]
    assert data["metadata"]["links"] == {"max": 25, "in_graph": len(weights)} and len(weights) > 25
    features = {node.id: i for i, node in enumerate(graph.nodes) if node.kind == "feature"}
    first = next(iter(features))
    labelled = neuronpedia_json(graph, labels={first: "a <label>"})
    assert labelled["nodes"][features[first]]["clerp"] == "a <label>"
    numbers = [node[key] for node in labelled["nodes"] for key in ("activation", "influence", "token_prob")
               if node.get(key) is not None]
    assert numbers and all(x == float(f"{x:.6g}") for x in numbers)  # 6 significant digits at most


def test_circuit_tracer_05s_own_error_ids_collide_and_ours_do_not(model):
    # in this fixture circuit-tracer named its error at (layer 0, position 2) "0_0_2", layer 0's feature #0
    # at position 2 too: its JSON holds two nodes with one id, and a link to "0_0_2" means either
    theirs = json.loads((FIXTURES / "graphs" / "json" / "plt_relu_skip.json").read_text())
    kinds = [node["feature_type"] for node in theirs["nodes"] if node["node_id"] == "0_0_2"]
    assert sorted(kinds) == ["cross layer transcoder", "mlp reconstruction error"]
    data = ours(model, "plt_relu_skip")
    ids = [node["node_id"] for node in data["nodes"]]
    assert len(ids) == len(set(ids))
    errors = [node["node_id"] for node in data["nodes"] if node["feature_type"] == "mlp reconstruction error"]
    assert "0_-1_2" in errors and all(re.fullmatch(r"\d+_-1_\d+", node_id) for node_id in errors)
    js_ids = [node["jsNodeId"] for node in data["nodes"] if node["feature_type"] != "cross layer transcoder"]
    assert len(js_ids) == len(set(js_ids))


def test_a_circuit_has_no_place_in_neuronpedias_format():
    import torch

    from anatomy.circuits.graph import Graph, Node

    graph = Graph([Node("embedding", -1, 0), Node("head", 0, 0, 1), Node("logits", 1, 0)], torch.zeros(3, 3), ["x"], 1,
                  kind="circuit")
    with pytest.raises(ValueError, match="attribution graphs"):
        neuronpedia_json(graph)


def test_the_json_is_listed_for_circuit_tracers_local_server(model, tmp_path):
    graph = attribution_graph(model, PROMPT, load_transcoders(FIXTURES / "graphs" / "plt_jumprelu"))
    save(graph, tmp_path / "first.json")
    save(graph, tmp_path / "second.json")
    save(graph, tmp_path / "first.json")  # written again: one entry per slug
    listing = json.loads((tmp_path / "graph-metadata.json").read_text())
    assert [entry["slug"] for entry in listing["graphs"]] == ["second", "first"]


SERVER = """
import json, sys, time, urllib.request
from circuit_tracer.frontend.local_server import serve
folder, port, slug = sys.argv[1], int(sys.argv[2]), sys.argv[3]
server = serve(folder, port=port)
try:
    base = f"http://127.0.0.1:{port}"
    listing = json.load(urllib.request.urlopen(f"{base}/data/graph-metadata.json"))
    graph = json.load(urllib.request.urlopen(f"{base}/graph_data/{slug}.json"))
    page = urllib.request.urlopen(f"{base}/index.html").read()
    body = json.dumps({"qParams": {"pinnedIds": [graph["nodes"][0]["node_id"]], "supernodes": [], "linkType": "both",
                                   "clickedId": "", "sg_pos": ""}}).encode()
    request = urllib.request.Request(f"{base}/save_graph/{slug}", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    saved = urllib.request.urlopen(request).status
    print(json.dumps({"listed": [g["slug"] for g in listing["graphs"]], "nodes": len(graph["nodes"]),
                      "page": len(page), "saved": saved}))
finally:
    server.stop()
"""


@pytest.mark.peer("ANATOMY_CIRCUIT_TRACER_PYTHON")
def test_circuit_tracers_local_server_serves_and_saves_the_graph(model, tmp_path):
    import os
    import socket
    import subprocess

    graph = attribution_graph(model, PROMPT, load_transcoders(FIXTURES / "graphs" / "plt_jumprelu"))
    save(graph, tmp_path / "cat.json")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = subprocess.run([os.environ["ANATOMY_CIRCUIT_TRACER_PYTHON"], "-c", SERVER, str(tmp_path), str(port), "cat"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    ours = json.loads((tmp_path / "cat.json").read_text())
    assert result["listed"] == ["cat"] and result["nodes"] == len(ours["nodes"]) and result["page"] > 0
    assert result["saved"] == 200
    assert ours["qParams"]["pinnedIds"] == [ours["nodes"][0]["node_id"]]  # its save wrote into our file
    jsonschema.validate(ours, SCHEMA)
