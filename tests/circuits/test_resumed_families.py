"""Runs that start at a layer, on every family discovery supports: the stack from any layer gives the whole
pass (Stack.run_from, a decoder's last logits or a classifier's labels); node patching and single-edge path
patching started at their layer equal the same runs made whole."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from anatomy.analysis.runs import Run, first_layer, residual_stream, run_patched
from anatomy.circuits.discovery.paths import edge_effects, kv_points, run_ablated, shared_prefix
from anatomy.circuits.discovery.residual import ResidualGraph
from anatomy.trace import trace
from family_models import FAMILIES, VOCAB, family_model
from test_discovery_families import EDGE_FAMILIES, classifier, task_for

MODELS = list(FAMILIES) + ["bert-classifier"]


def model_and_task(name: str):
    if name == "bert-classifier":
        return classifier().double(), task_for(VOCAB, labels=True)
    return family_model(name).double(), task_for(VOCAB)


@pytest.mark.parametrize("name", MODELS)
def test_the_stack_from_any_layer_gives_the_whole_pass(name):
    model, task = model_and_task(name)
    clean, _ = task.inputs(range(len(task)))
    stream = residual_stream(model, clean)
    with torch.no_grad():
        whole = clean.last_logits(model)
        for layer in range(model.config.n_layers + 1):
            resumed = clean.last_logits(model, (layer, stream[layer]))
            assert (resumed - whole).abs().max() < 1e-12 * whole.abs().max(), layer


@pytest.mark.parametrize("name", MODELS)
def test_node_patching_from_its_layer_equals_the_whole_run(name):
    """Each head's z patched with the corrupted run's, in the clean run: from the head's layer as copies in a
    pass, and whole, one at a time."""
    model, task = model_and_task(name)
    rows = range(len(task))
    clean, corrupt = task.inputs(rows)
    points = [f"blocks.{layer}.attn.z" for layer in range(model.config.n_layers)]
    with torch.no_grad(), trace(model, points) as t:
        corrupt.last_logits(model)

    def edit(point, head):
        def fn(x):
            x[:, :, head] = t[point][:, :, head]
            return x
        return fn

    cells = [(point, head) for point in points for head in range(model.config.n_heads)]
    metric = lambda logits: task.score(logits[:, 0], rows)  # noqa: E731
    fast = run_patched(model, clean, [Run({p: edit(p, h)}, first_layer(model, [p])) for p, h in cells], metric)
    whole = torch.stack([run_patched(model, clean, [Run({p: edit(p, h)})], metric)[0] for p, h in cells])
    assert first_layer(model, [points[-1]]) == model.config.n_layers - 1
    assert (fast - whole).abs().max() < 1e-10 * whole.abs().max()
    assert (whole - whole[0]).abs().max() > 1e-6  # the heads differ: the comparison can fail


@pytest.mark.parametrize("family", EDGE_FAMILIES)
def test_single_edges_from_their_layer_equal_whole_runs(family):
    model, task = model_and_task(family)
    graph = ResidualGraph(model)
    rows = range(len(task))
    clean, corrupt = task.inputs(rows)
    ablation = graph.source_values(model, corrupt)
    generator = torch.Generator().manual_seed(0)
    every = graph.allowed.nonzero()
    edges = every[torch.randperm(len(every), generator=generator)[:30]].tolist()
    edges += [[0, len(graph.destinations) - 1]]  # the embeddings into the logits
    metric = lambda logits: task.score(logits[:, 0], rows)  # noqa: E731
    fast, _ = edge_effects(model, graph, clean, ablation, edges, metric)
    ablated = torch.zeros(len(edges), *graph.allowed.shape, dtype=torch.bool)
    for i, (u, v) in enumerate(edges):
        ablated[i, u, v] = True
    whole = task.score(run_ablated(model, graph, clean, ablation, ablated), rows).view(len(edges), len(task))
    assert (fast - whole).abs().max() < 1e-10 * whole.abs().max()


@pytest.mark.parametrize("family", EDGE_FAMILIES)
def test_circuits_from_the_first_position_that_differs_equal_whole_runs(family):
    """Circuits (half their edges ablated at random, one with every edge) run from the clean run's keys and
    values before the first position where the corrupted prompt differs (shared_prefix) equal the same runs
    made whole."""
    model, task = model_and_task(family)
    task = replace(task, corrupt=torch.cat([task.clean[:, :3], task.corrupt[:, 1:4], task.clean[:, 6:]], 1))
    graph = ResidualGraph(model)
    clean, corrupt = task.inputs(range(len(task)))
    ablation = graph.source_values(model, corrupt)
    outputs, _, t = graph.recorded_run(model, clean, ["blocks.0.resid_pre"] + kv_points(model))
    prefix = shared_prefix(model, ablation, outputs, t)
    assert prefix is not None and prefix[0] == (3 if family != "mixtral" else 1)  # corrupted at 3..5 (an MoE's
    # experts, run on the tokens routed to them together, differ in the last bits from position 1 on)
    generator = torch.Generator().manual_seed(0)
    ablated = torch.rand(3, *graph.allowed.shape, generator=generator) < 0.5
    ablated[2] = True
    whole = run_ablated(model, graph, clean, ablation, ablated)
    started = run_ablated(model, graph, clean, ablation, ablated, (0, t["blocks.0.resid_pre"], None), prefix)
    assert (started - whole).abs().max() < 1e-10 * whole.abs().max()
    assert (whole[:len(task)] - whole[len(task):2 * len(task)]).abs().max() > 1e-6  # the circuits differ
