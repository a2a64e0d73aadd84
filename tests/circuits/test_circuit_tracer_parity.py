"""anatomy's attribution graphs equal circuit-tracer 0.5.0's on the same weights, node for node.

The fixtures were written by circuit-tracer itself (fixtures/make_graph_fixtures.py, run in its own virtual
environment, nnsight backend): a tiny random Llama, three transcoder sets in circuit-tracer's format
(per-layer JumpReLU, per-layer ReLU with a skip, cross-layer JumpReLU) and, for each, the graph circuit-tracer
computed on one prompt, what its `prune_graph` kept and its `compute_graph_scores`. Nodes are matched by
what they are (a feature by layer, position and index; an error by layer and position; a token; a logit),
never by their place in either list; adjacency, activations, influence and scores must agree within 1e-4.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import anatomy
from anatomy.circuits.attribute import attribution_graph
from anatomy.circuits.graph import Node
from anatomy.circuits.prune import prune, scores
from anatomy.sae import load_transcoders

FIXTURES = Path(__file__).parent / "fixtures" / "graphs"
SETS = ["plt_jumprelu", "plt_relu_skip", "clt_jumprelu"]
SETTINGS = json.loads((FIXTURES / "README.json").read_text())


@pytest.fixture(scope="module")
def model():
    return anatomy.from_pretrained(str(FIXTURES / "llama")).eval()


def circuit_tracer_ids(expected: dict, n_layers: int) -> list[str]:
    """The ids of circuit-tracer's nodes, in its order: [features, errors (layer by layer), tokens, logits]."""
    tokens = expected["input_tokens"].tolist()
    T = len(tokens)
    features = expected["active_features"][expected["selected_features"]].tolist()
    ids = [Node("feature", layer, position, feature).id for layer, position, feature in features]
    ids += [Node("error", layer, position).id for layer in range(n_layers) for position in range(T)]
    ids += [Node("token", -1, position, token).id for position, token in enumerate(tokens)]
    ids += [Node("logit", n_layers, T - 1, token).id for token in expected["logit_ids"].tolist()]
    return ids


def aligned(graph, expected: dict) -> torch.Tensor:
    """[N]: for each of circuit-tracer's nodes, the index of the same node in anatomy's graph."""
    ids = circuit_tracer_ids(expected, graph.n_layers)
    assert sorted(ids) == sorted(node.id for node in graph.nodes), "the two graphs have different nodes"
    return torch.tensor([graph.index(node_id) for node_id in ids])


@pytest.mark.parametrize("name", SETS)
def test_the_graph_equals_circuit_tracers(model, name):
    expected = load_file(str(FIXTURES / f"{name}.graph.safetensors"))
    graph = attribution_graph(model, SETTINGS["prompt"], load_transcoders(FIXTURES / name))
    assert graph.meta["prompt_ids"] == expected["input_tokens"].tolist()  # the same BOS in front
    order = aligned(graph, expected)
    ours = graph.adjacency[order][:, order]
    assert (ours - expected["adjacency"]).abs().max() < 1e-4
    assert_the_rest_equal(graph, expected, order)


def assert_the_rest_equal(graph, expected: dict, order: torch.Tensor) -> None:
    """Beyond the adjacency: a graph with edges to compare, the same activations and target probabilities, and
    anatomy's own check."""
    assert (expected["adjacency"] != 0).sum() > 0.2 * expected["adjacency"].numel() / 2
    n_features = len(expected["selected_features"])
    values = torch.tensor([graph.nodes[i].value for i in order[:n_features].tolist()])
    assert (values - expected["activation_values"]).abs().max() < 1e-4
    probabilities = torch.tensor([node.value for node in graph.nodes if node.kind == "logit"])
    assert (probabilities - expected["logit_probabilities"]).abs().max() < 1e-5
    assert graph.error < 1e-4, graph.check


@pytest.mark.parametrize("name", SETS)
def test_pruning_and_scores_equal_circuit_tracers(model, name):
    expected = load_file(str(FIXTURES / f"{name}.graph.safetensors"))
    graph = attribution_graph(model, SETTINGS["prompt"], load_transcoders(FIXTURES / name))
    assert_pruning_and_scores_equal(graph, expected)


def assert_pruning_and_scores_equal(graph, expected: dict) -> None:
    """prune(graph, 0.8, 0.98) keeps the nodes and edges circuit-tracer's prune_graph kept, with its cumulative
    influence; scores(graph) are its compute_graph_scores, within 1e-4."""
    order = aligned(graph, expected)
    decision = prune(graph, 0.8, 0.98)
    assert torch.equal(decision.node_mask[order], expected["node_mask"].bool())
    assert (decision.cumulative[order] - expected["cumulative"]).abs().max() < 1e-4
    # the edges kept, as (target id, source id) pairs
    kept = decision.node_mask.nonzero().flatten().tolist()
    ours = {(graph.nodes[kept[t]].id, graph.nodes[kept[s]].id) for t, s in decision.edge_mask.nonzero().tolist()}
    ids = circuit_tracer_ids(expected, graph.n_layers)
    theirs = {(ids[t], ids[s]) for t, s in expected["edge_mask"].nonzero().tolist()
              if expected["node_mask"][t] and expected["node_mask"][s]}
    assert ours == theirs
    replacement, completeness = scores(graph)
    assert abs(replacement - float(expected["scores"][0])) < 1e-4
    assert abs(completeness - float(expected["scores"][1])) < 1e-4


@pytest.mark.parametrize("name", SETS)
def test_a_feature_cap_keeps_the_features_circuit_tracer_keeps(model, name):
    path = FIXTURES / f"{name}.capped.safetensors"
    expected = load_file(str(path))
    with safe_open(str(path), "pt") as handle:
        header = handle.metadata()
    graph = attribution_graph(model, SETTINGS["prompt"], load_transcoders(FIXTURES / name),
                              max_feature_nodes=int(header["max_feature_nodes"]), batch_size=int(header["batch_size"]),
                              update_interval=int(header["update_interval"]))
    order = aligned(graph, expected)
    assert (graph.adjacency[order][:, order] - expected["adjacency"]).abs().max() < 1e-4
