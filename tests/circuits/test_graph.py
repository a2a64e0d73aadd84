"""The graph as plain data, and pruning as functions of its adjacency: properties a reader relies on."""

from __future__ import annotations

import math

import pytest
import torch

from anatomy.circuits import save
from anatomy.circuits.graph import Graph, Node
from anatomy.circuits.graph_file import load_graph
from anatomy.circuits.prune import find_threshold, influence, neumann_influence, prune, pruned, scores


def random_graph(seed: int = 0, n_layers: int = 3, n_pos: int = 4, per_cell: int = 3, density: float = 0.5) -> Graph:
    """An attribution-graph-shaped graph: tokens, per layer features and errors, two logits; random edges
    from every earlier node (strictly lower triangular, as graphs are)."""
    generator = torch.Generator().manual_seed(seed)
    nodes = [Node("token", -1, q, 10 + q, label=f"t{q}") for q in range(n_pos)]
    for layer in range(n_layers):
        nodes += [Node("feature", layer, q, k, value=1.0 + k) for q in range(1, n_pos) for k in range(per_cell)]
        nodes += [Node("error", layer, q) for q in range(n_pos)]
    nodes += [Node("logit", n_layers, n_pos - 1, 7, label="a", value=0.6), Node("logit", n_layers, n_pos - 1, 8, label="b", value=0.3)]
    n = len(nodes)
    adjacency = torch.randn(n, n, generator=generator) * (torch.rand(n, n, generator=generator) < density)
    receives = torch.tensor([node.kind in ("feature", "logit") for node in nodes])
    adjacency = adjacency.tril(-1) * receives[:, None]
    weights = torch.tensor([node.value if node.kind == "logit" else 0.0 for node in nodes])
    return Graph(nodes, adjacency, [f"t{q}" for q in range(n_pos)], n_layers, output_weights=weights)


def test_node_ids_are_unique_across_kinds():
    # circuit-tracer 0.5 named the error at (layer 3, position 5) "0_3_5", the id of layer 0's feature 3 there
    error, feature = Node("error", 3, 5), Node("feature", 0, 5, 3)
    assert error.id != feature.id
    with pytest.raises(ValueError, match="unique"):
        Graph([feature, feature], torch.zeros(2, 2), ["a"], 1)


def test_a_graph_refuses_an_edge_that_points_backwards():
    nodes = [Node("token", -1, 0), Node("feature", 0, 0, 1), Node("logit", 1, 0, 2)]
    adjacency = torch.zeros(3, 3)
    adjacency[1, 2] = 1.0  # the logit feeding the feature
    with pytest.raises(ValueError, match="topological order"):
        Graph(nodes, adjacency, ["a"], 1)


@pytest.mark.parametrize("block", [1, 7, 1024])
def test_influence_by_back_substitution_equals_the_neumann_series(block):
    graph = random_graph(seed=block)
    series = neumann_influence(graph.adjacency, graph.output_weights)
    assert torch.allclose(influence(graph.adjacency, graph.output_weights, block=block), series, rtol=1e-5, atol=1e-6)


def test_influence_counts_every_path_once():
    # token -> feature -> logit (shares 1) and token -> logit directly: the token's influence is two paths
    nodes = [Node("token", -1, 0), Node("feature", 0, 0, 0), Node("logit", 1, 0, 0)]
    adjacency = torch.tensor([[0.0, 0, 0], [2.0, 0, 0], [1.0, -3.0, 0]])
    graph = Graph(nodes, adjacency, ["x"], 1, output_weights=torch.tensor([0.0, 0.0, 0.5]))
    # the logit's inputs: 1/4 from the token, 3/4 from the feature; the feature's: all from the token
    assert influence(graph.adjacency, graph.output_weights).tolist() == pytest.approx([0.5 * 0.25 + 0.5 * 0.75, 0.5 * 0.75, 0.0])


def test_find_threshold_keeps_the_fewest_scores_that_hold_the_fraction():
    scores_ = torch.tensor([0.0, 5.0, 1.0, 3.0, 0.0, 1.0])  # total 10
    assert find_threshold(scores_, 0.5) == 5.0  # 5 alone holds half
    assert find_threshold(scores_, 0.8) == 3.0  # 5 + 3
    assert find_threshold(scores_, 0.95) == 1.0
    assert find_threshold(scores_, 1.0) == 1.0


def test_pruning_keeps_inputs_and_outputs_and_leaves_no_dangling_node():
    graph = random_graph(seed=3, density=0.3)
    decision = prune(graph, 0.6, 0.9)
    kept = [graph.nodes[i] for i in decision.node_mask.nonzero().flatten().tolist()]
    assert {node.id for node in kept} >= {node.id for node in graph.nodes if node.kind in ("token", "logit")}
    small = pruned(graph, 0.6, 0.9)
    has_out, has_in = (small.adjacency != 0).any(0), (small.adjacency != 0).any(1)
    for i, node in enumerate(small.nodes):
        if node.kind in ("feature", "error"):
            assert has_out[i], node.name
        if node.kind == "feature":
            assert has_in[i], node.name
    assert len(small) < len(graph)
    # every edge kept is an edge of the graph, with its weight
    for t, s, w in small.edges():
        assert w == graph.adjacency[graph.index(small.nodes[t]), graph.index(small.nodes[s])]


def test_pruning_at_threshold_one_keeps_every_connected_node():
    graph = random_graph(seed=4, density=0.9)
    assert prune(graph, 1.0, 1.0).node_mask.all()


def test_scores_are_one_when_errors_carry_nothing_and_fall_as_they_carry_more():
    graph = random_graph(seed=5)
    errors = graph.mask("error")
    without = Graph(graph.nodes, graph.adjacency * ~errors[None, :], graph.columns, graph.n_layers,
                    output_weights=graph.output_weights)
    assert scores(without) == pytest.approx((1.0, 1.0))
    louder = graph.adjacency.clone()
    louder[:, errors] *= 10
    loud = Graph(graph.nodes, louder, graph.columns, graph.n_layers, output_weights=graph.output_weights)
    assert scores(loud)[0] < scores(graph)[0] < 1.0
    assert scores(loud)[1] < scores(graph)[1] < 1.0


def test_a_graph_round_trips_through_safetensors(tmp_path):
    graph = random_graph(seed=6)
    graph.meta["prompt"] = "é \u202e <script>"
    graph.values = torch.randn(len(graph))
    path = save(graph, tmp_path / "g.safetensors")
    back = load_graph(path)
    assert back.nodes == graph.nodes
    assert torch.equal(back.adjacency, graph.adjacency)
    assert torch.equal(back.values, graph.values)
    assert back.meta == graph.meta and back.columns == graph.columns and back.n_layers == graph.n_layers
    assert math.isnan(back.error)


def test_a_file_that_is_not_a_graph_is_refused(tmp_path):
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(2)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(ValueError, match="not a graph"):
        load_graph(tmp_path / "other.safetensors")


def test_a_circuits_components_fit_the_same_type():
    # a discovered circuit: embeddings, a head with its q/k/v inputs, an MLP, the logits
    nodes = [Node("embedding", -1, 0, label="embeddings"),
             Node("head", 0, 1, 1, port="q"), Node("head", 0, 1, 1, port="k"), Node("head", 0, 1, 1, port="v"),
             Node("head", 0, 1, 1), Node("mlp", 0, 4, label="MLP 0"), Node("logits", 1, 0, label="logits")]
    adjacency = torch.zeros(7, 7)
    adjacency[1, 0], adjacency[2, 0], adjacency[3, 0] = 0.5, -0.2, 0.1  # into the head's inputs
    adjacency[4, 1], adjacency[4, 2], adjacency[4, 3] = 1.0, 1.0, 1.0  # the head's inputs into its output
    adjacency[5, 4], adjacency[5, 0], adjacency[6, 5], adjacency[6, 4] = 0.3, 0.7, 1.2, -0.4
    graph = Graph(nodes, adjacency, ["embed", "H1", "", "", "MLP"], 1, kind="circuit")
    assert len({node.id for node in graph.nodes}) == 7
    assert graph.nodes[1].name == "L0 H1 (q)"
    assert influence(graph.adjacency, graph.output_weights)[0] > 0
