"""Exact path patching of single edges from the destination's layer, and verification that samples outside
the top k: the fast runs equal whole runs with the edge ablated (every kind of destination, parallel blocks,
q/k norms, mean ablation); the sample is drawn from bands of rank outside the top k, none twice; the largest
exact effect outside and the recall are what the exact effects of every verified edge say."""

from __future__ import annotations

import pytest
import torch

from anatomy.circuits.discovery.edges import attribute_edges, top_edges
from anatomy.circuits.discovery.paths import edge_effects, run_ablated
from anatomy.circuits.discovery.residual import ResidualGraph
from anatomy.circuits.discovery.verify import outside_sample, verify_edges

from test_discovery import tiny, toy_task


@pytest.mark.parametrize("parallel, qk_norm, mean", [(False, "none", False), (True, "none", False),
                                                     (False, "per_head", False), (False, "none", True)])
def test_single_edges_from_their_layer_equal_whole_runs(parallel, qk_norm, mean):
    model, task = tiny(n_layers=3, parallel=parallel, qk_norm=qk_norm), toy_task()
    graph = ResidualGraph(model)
    clean, corrupt = task.inputs(range(len(task)))
    ablation = graph.source_values(model, corrupt)
    if mean:  # one value per position for every pair: [U, 1, T, E]
        ablation = ablation.mean(1, keepdim=True)
    edges = graph.allowed.nonzero().tolist()
    rows = range(len(task))
    metric = lambda logits: task.score(logits[:, 0], rows)  # noqa: E731
    fast, _ = edge_effects(model, graph, clean, ablation, edges, metric, max_tokens=3 * 7 * len(task))
    ablated = torch.zeros(len(edges), *graph.allowed.shape, dtype=torch.bool)
    for i, (u, v) in enumerate(edges):
        ablated[i, u, v] = True
    whole = task.score(run_ablated(model, graph, clean, ablation, ablated), rows).view(len(edges), len(task))
    tolerance = 1e-12 if qk_norm == "none" else 1e-5  # q/k RMSNorms compute in float32
    assert (fast - whole).abs().max() < tolerance
    assert (whole - whole[0]).abs().max() > 1e-3  # the edges differ: the comparison can fail


def test_the_sample_outside_is_drawn_from_bands_of_rank():
    model, task = tiny(n_layers=3), toy_task()
    result = attribute_edges(model, task, method="eap")
    count = result.extra["graph"].edge_count
    drawn = outside_sample(result, 5, 20, seed=1)
    ranks = [rank for rank, *_ in drawn]
    assert len(drawn) == 20 == len(set(ranks)) and min(ranks) > 5 and ranks == sorted(ranks)
    bands, low = [], 6  # ranks k+1..2k, 2k+1..4k, ..., the rest
    while low <= count:
        bands.append((low, min(count, 2 * low - 2)))
        low = 2 * low - 1
    assert len(bands) == 6 and bands[-1][1] == count
    assert [sum(low <= r <= high for r in ranks) for low, high in bands] == [4, 4, 3, 3, 3, 3]
    ranked = top_edges(result, count)
    assert all(ranked[rank - 1] == (u, v, score) for rank, u, v, score in drawn)
    assert outside_sample(result, 5, 20, seed=1) == drawn and outside_sample(result, 5, 20, seed=2) != drawn
    assert len(outside_sample(result, 5, count, seed=1)) == count - 5  # asked for more: every edge outside


def test_verification_reports_the_largest_miss_outside_and_the_recall():
    model, task = tiny(n_layers=2), toy_task()
    result = attribute_edges(model, task, method="eap")
    count = result.extra["graph"].edge_count
    k = 6
    checked = verify_edges(model, task, result, k, sample=count - k)  # every edge: the truth is known
    everything = torch.tensor([row["exact"] for row in checked.extra["sample"]])
    top = checked.values[1]  # the exact effects of the estimate's top k
    exact = torch.cat([top, everything.double()])
    assert checked.extra["outside"]["exact"] == pytest.approx(float(everything[everything.abs().argmax()]))
    truth = set(exact.abs().argsort(descending=True)[:k].tolist())
    assert checked.extra["recall"] == pytest.approx(len(truth & set(range(k))) / k)
    assert checked.extra["recall"] < 1  # EAP misses some of the exact top 6 here: the recall can tell
    assert "outside the top 6" in checked.check and "recall" in checked.check
    alone = verify_edges(model, task, result, k)
    assert torch.equal(alone.values, checked.values) and "outside" not in alone.extra


def test_a_late_corruption_computes_only_the_positions_from_it(monkeypatch):
    """Pairs that differ from position 4 on: every run reads the clean run's first 4 positions from a cache and
    computes the rest, and equals the whole run."""
    from anatomy.circuits.discovery import paths
    from anatomy.circuits.discovery.tasks import Task

    model, base = tiny(n_layers=3), toy_task()
    corrupt = base.clean.clone()
    corrupt[:, 4:6] = (corrupt[:, 4:6] + 7) % 40
    task = Task("late", base.clean, corrupt, torch.full((len(base),), 7), base.answers, base.wrongs)
    graph = ResidualGraph(model)
    rows = range(len(task))
    clean, corrupted = task.inputs(rows)
    ablation = graph.source_values(model, corrupted)
    held = []
    real = paths.run_patched
    monkeypatch.setattr(paths, "run_patched", lambda *args, prefix, **kwargs: held.append(prefix[0]) or real(
        *args, prefix=prefix, **kwargs))
    edges = graph.allowed.nonzero().tolist()
    metric = lambda logits: task.score(logits[:, 0], rows)  # noqa: E731
    fast, _ = paths.edge_effects(model, graph, clean, ablation, edges, metric)
    ablated = torch.zeros(len(edges), *graph.allowed.shape, dtype=torch.bool)
    for i, (u, v) in enumerate(edges):
        ablated[i, u, v] = True
    whole = task.score(run_ablated(model, graph, clean, ablation, ablated), rows).view(len(edges), len(task))
    assert held == [4] and (fast - whole).abs().max() < 1e-12
