"""Interventions on the real model, beside the graph's predictions: with everything frozen they coincide (the
graph's edges are the frozen model's direct effects); a change that changes nothing moves nothing."""

from __future__ import annotations

import pytest
import torch

from anatomy.circuits.attribute import attribution_graph
from anatomy.circuits.interventions import FeatureChange, intervene
from family_models import family_model, family_transcoders
from test_attribute import PROMPT, tiny


@pytest.fixture(scope="module", params=["plt", "clt with a skip"])
def setup(request):
    model, transcoders = tiny(cross_layer=request.param != "plt", skip=request.param != "plt", kind="relu" if request.param != "plt" else "jumprelu")
    graph = attribution_graph(model, torch.tensor(PROMPT), transcoders)
    return model, transcoders, graph


def strongest_features(graph, n=3):
    logits = graph.mask("logit")
    scores = graph.adjacency[logits].abs().sum(0) * graph.mask("feature")
    return [graph.nodes[i] for i in scores.topk(n).indices.tolist()]


@pytest.mark.parametrize("how", ["ablate", "clamp", "steer"])
def test_frozen_the_model_moves_as_the_graph_predicts(setup, how):
    model, transcoders, graph = setup
    changes = []
    for node in strongest_features(graph):
        if how == "ablate":
            changes.append(FeatureChange(node.layer, node.index, node.column, value=0.0))
        elif how == "clamp":
            changes.append(FeatureChange(node.layer, node.index, node.column, value=3 * node.value))
        else:
            changes.append(FeatureChange(node.layer, node.index, node.column, add=-2.0))
    result = intervene(model, torch.tensor(PROMPT), transcoders, changes, freeze="all", graph=graph)
    assert result.change.abs().max() > 1e-2  # the change does something
    assert torch.allclose(result.change, result.direct, atol=1e-4 * max(1.0, float(result.change.abs().max())))
    assert not result.unseen


@pytest.mark.parametrize("family, reads, writes, options", [
    ("gemma2", "mlp_norm.normalized", "mlp.out", {}),  # sandwich norms, the logits before the final soft-cap
    ("gpt_neox", "mlp_norm.out", "mlp.out", dict(kind="relu", skip=True)),  # parallel, a skip
    ("opt-post", "resid_mid", "mlp.out", dict(kind="relu", skip=True)),  # post-norm: norms after the sums
    ("olmo2", "resid_mid", "mlp_out_norm.out", {}),
])
def test_frozen_every_familys_model_moves_as_the_graph_predicts(family, reads, writes, options):
    model = family_model(family)
    transcoders = family_transcoders(model, reads, writes, **options)
    graph = attribution_graph(model, torch.tensor(PROMPT), transcoders)
    changes = [FeatureChange(n.layer, n.index, n.column, value=0.0) for n in strongest_features(graph)]
    result = intervene(model, torch.tensor(PROMPT), transcoders, changes, freeze="all", graph=graph)
    assert result.change.abs().max() > 1e-2
    assert torch.allclose(result.change, result.direct, atol=1e-4 * max(1.0, float(result.change.abs().max())))
    kept = intervene(model, torch.tensor(PROMPT), transcoders, [FeatureChange(n.layer, n.index, n.column, value=n.value)
                                                                for n in strongest_features(graph)], freeze="all")
    assert (kept.after - kept.before).abs().max() < 1e-5  # frozen, the model is its own pass


def test_setting_features_to_their_own_values_changes_nothing(setup):
    model, transcoders, graph = setup
    changes = [FeatureChange(n.layer, n.index, n.column, value=n.value) for n in strongest_features(graph)]
    for freeze in ("none", "attention", "all"):
        result = intervene(model, torch.tensor(PROMPT), transcoders, changes, freeze=freeze, graph=graph)
        assert result.change.abs().max() < 1e-4, freeze
        assert (result.after - result.before).abs().max() < 1e-5


def test_unfrozen_the_change_spreads_and_the_graph_follows_it_through_its_features(setup):
    model, transcoders, graph = setup
    changes = [FeatureChange(n.layer, n.index, n.column, value=0.0) for n in strongest_features(graph, 2)]
    frozen = intervene(model, torch.tensor(PROMPT), transcoders, changes, freeze="all", graph=graph)
    live = intervene(model, torch.tensor(PROMPT), transcoders, changes, freeze="none", graph=graph)
    assert not torch.allclose(frozen.change, live.change, atol=1e-4)  # later layers respond
    rows = live.rows()
    assert len(rows) == sum(node.kind == "logit" for node in graph.nodes)
    assert {"token", "before", "after", "change", "direct", "through"} <= set(rows[0])


def test_steering_a_silent_feature_is_no_node_of_the_graph(setup):
    model, transcoders, graph = setup
    nodes = {(n.layer, n.column, n.index) for n in graph.nodes if n.kind == "feature"}
    silent = next(f for f in range(transcoders.d_transcoder) if (1, 3, f) not in nodes)
    result = intervene(model, torch.tensor(PROMPT), transcoders, [FeatureChange(1, silent, 3, add=5.0)], graph=graph)
    assert result.unseen and (result.after - result.before).abs().max() > 1e-4


@pytest.mark.parametrize("change, words", [(FeatureChange(9, 0, value=0.0), "layer 9"),
                                           (FeatureChange(0, 10_000, value=0.0), "feature 10000"),
                                           (FeatureChange(0, 1, position=0, value=0.0), "position 0")])
def test_changes_out_of_range_are_refused(setup, change, words):
    model, transcoders, graph = setup
    with pytest.raises(ValueError, match=words):
        intervene(model, torch.tensor(PROMPT), transcoders, [change])


def test_a_change_is_a_value_or_an_addition():
    with pytest.raises(ValueError, match="one of the two"):
        FeatureChange(0, 1)
    with pytest.raises(ValueError, match="freeze"):
        intervene(None, "x", None, [], freeze="some")


def test_the_graphs_predictions_on_a_chain_of_known_edges():
    """direct and through, numerically, on a graph small enough to add up by hand: f1 (activation 1) feeds
    f2 (activation 4) by 2 and the logit by 1, f2 feeds the logit by 3. Steering f1 by +0.5 (r1 = 0.5 per
    unit) moves the logit directly by 1 x 0.5 = 0.5; through f2, which moves by 2 x 0.5 = 1 (r2 = 1/4), by
    0.5 + 3 x 0.25 = 1.25. Clamping f2 to 0 as well fixes it: through is then 0.5 + 3 x (0 - 4)/4 = -2.5."""
    from types import SimpleNamespace

    from anatomy.circuits.graph import Graph, Node
    from anatomy.circuits.interventions import predictions

    nodes = [Node("feature", 0, 1, 0, value=1.0), Node("feature", 1, 1, 0, value=4.0), Node("logit", 2, 1, 7)]
    adjacency = torch.zeros(3, 3)
    adjacency[1, 0], adjacency[2, 0], adjacency[2, 1] = 2.0, 1.0, 3.0
    graph = Graph(nodes, adjacency, ["<s>", "x"], 2)
    rep = SimpleNamespace(ids=[0, 1])  # two positions: a change at every position touches position 1
    direct, through, unseen = predictions(graph, rep, [FeatureChange(0, 0, add=0.5)])
    assert direct.tolist() == [0.5] and through.tolist() == [1.25] and unseen == []
    direct, through, _ = predictions(graph, rep, [FeatureChange(0, 0, 1, add=0.5), FeatureChange(1, 0, 1, value=0.0)])
    assert direct.tolist() == [0.5 - 3.0] and through.tolist() == [-2.5]
