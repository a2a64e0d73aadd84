"""ACDC: the fast one (runs from the tested edge's layer, edges tested several at a time by speculation)
equals ACDC written plainly (every circuit run whole, one edge at a time, from Conmy et al.'s Algorithm 1);
a run started at a layer equals the whole run; with no threshold nothing goes, with a huge one everything
goes and the circuit is the corrupted run; bad arguments are refused."""

from __future__ import annotations

import pytest
import torch

from anatomy.circuits.discovery.acdc import acdc, acdc_order
from anatomy.circuits.discovery.paths import run_ablated
from anatomy.circuits.discovery.residual import ResidualGraph

from test_discovery import tiny, toy_task


def strong(parallel: bool = False, n_layers: int = 2):
    """tiny() with larger weights: the corruption moves the next token's distribution far (KL about 1.4)."""
    model = tiny(n_layers=n_layers, parallel=parallel)
    generator = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype) * 0.3)
    return model


def plain_acdc(model, task, threshold: float, metric: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept [U, V], effects [U, V]): Algorithm 1 with whole runs, one edge at a time."""
    graph = ResidualGraph(model)
    rows = range(len(task))
    clean, corrupt = task.inputs(rows)
    ablation = graph.source_values(model, corrupt)
    with torch.no_grad():
        clean_logits = clean.last_logits(model)[:, 0].double()

    def distance(removed):
        logits = run_ablated(model, graph, clean, ablation, removed[None]).double()
        if metric == "task":
            return -task.score(logits, rows).mean().item()
        p = torch.log_softmax(clean_logits, -1)
        return (p.exp() * (p - torch.log_softmax(logits, -1))).sum(-1).mean().item()

    removed = torch.zeros_like(graph.allowed)
    effects = torch.zeros(graph.allowed.shape, dtype=torch.float64)
    current = distance(removed)
    for u, v in acdc_order(graph):
        removed[u, v] = True
        value = distance(removed)
        effects[u, v] = value - current
        if value - current < threshold:
            current = value
        else:
            removed[u, v] = False
    return graph.allowed & ~removed, effects


@pytest.mark.parametrize("metric, parallel", [("kl", False), ("task", False), ("kl", True)])
def test_fast_acdc_is_plain_acdc(metric, parallel):
    model, task, threshold = strong(parallel), toy_task(), 0.01
    kept, effects = plain_acdc(model, task, threshold, metric)
    result = acdc(model, task, threshold=threshold, metric=metric, max_bytes=2**20)  # chunks of pairs too
    assert torch.equal(result.extra["kept"], kept)
    assert (result.values - effects).abs().max() < 1e-9
    count = int(result.extra["graph"].allowed.sum())
    assert 5 < int(kept.sum()) < count - 5  # some edges stay and some go: the comparison can fail
    assert result.extra["runs"] < 2 * count  # speculation tested most edges a batch at a time


def test_no_threshold_keeps_what_matters_and_a_huge_one_leaves_the_corrupted_run():
    model, task = strong(), toy_task()
    graph = ResidualGraph(model)
    everything = acdc(model, task, threshold=1e9)
    assert not everything.extra["kept"].any()
    rows = range(len(task))
    clean, corrupt = task.inputs(rows)
    with torch.no_grad():
        p = torch.log_softmax(clean.last_logits(model)[:, 0].double(), -1)
        q = torch.log_softmax(corrupt.last_logits(model)[:, 0].double(), -1)
    assert everything.extra["distance"] == pytest.approx((p.exp() * (p - q)).sum(-1).mean().item(), abs=1e-9)
    nothing = acdc(model, task, threshold=0.0)  # an edge goes only if leaving it out brings the circuit closer
    assert int(nothing.extra["kept"].sum()) > graph.edge_count // 2
    assert nothing.extra["distance"] <= 1e-12 and (nothing.values[~nothing.extra["kept"] & graph.allowed] < 0).all()


@pytest.mark.parametrize("layer", [0, 1, 2])
def test_a_run_started_at_a_layer_is_the_whole_run(layer):
    model, task = tiny(n_layers=3), toy_task()
    graph = ResidualGraph(model)
    clean, corrupt = task.inputs(range(len(task)))
    ablation = graph.source_values(model, corrupt)
    outputs = graph.source_values(model, clean)
    from anatomy.trace import trace

    with torch.no_grad(), trace(model, [f"blocks.{layer}.resid_pre"]) as t:
        clean.hidden(model)
    generator = torch.Generator().manual_seed(0)
    late = torch.tensor([node.layer >= layer for node in graph.destinations])
    ablated = (torch.rand(3, *graph.allowed.shape, generator=generator) < 0.5) & late[None, None, :]
    whole = run_ablated(model, graph, clean, ablation, ablated)
    started = run_ablated(model, graph, clean, ablation, ablated, (layer, t[f"blocks.{layer}.resid_pre"], outputs))
    assert (whole - started).abs().max() < 1e-12
    if layer == 0:
        return
    with pytest.raises(ValueError, match=f"started at layer {layer} cannot ablate an edge into an earlier"):
        run_ablated(model, graph, clean, ablation, torch.ones(1, *graph.allowed.shape, dtype=torch.bool),
                    (layer, t[f"blocks.{layer}.resid_pre"], outputs))


def test_bad_arguments_are_refused():
    model, task = tiny(n_layers=1), toy_task()
    with pytest.raises(ValueError, match=r"threshold must be a finite number >= 0, got -1"):
        acdc(model, task, threshold=-1)
    with pytest.raises(ValueError, match=r"threshold must be a finite number >= 0, got nan"):
        acdc(model, task, threshold=float("nan"))
    with pytest.raises(ValueError, match=r"metric='l2' is not supported; allowed values: kl, task"):
        acdc(model, task, threshold=0.1, metric="l2")
