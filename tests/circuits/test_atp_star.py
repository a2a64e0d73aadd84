"""AtP*'s two fixes, checked numerically (Kramár et al. 2024): the QK fix recomputes a softmax exactly, for
queries and for keys; GradDrop is the mean over the other layers of |AtP| with one layer's residual writes
passing no gradient back, computed here by detaching those writes in a pass of their own."""

from __future__ import annotations

import pytest
import torch

from anatomy.circuits.discovery.nodes import attribute_nodes
from anatomy.circuits.discovery.verify import verify_nodes
from anatomy.trace import trace

from test_discovery import tiny, toy_task


@pytest.mark.parametrize("kind", ["q", "k"])
def test_the_qk_fix_is_exact_for_the_last_layers_queries_and_keys_without_final_norm(kind):
    """A last-layer query or key reaches the logits through its softmax only: the QK fix recomputes that
    softmax exactly and keeps the rest (linear here) linear, so AtP* (unsigned) is |exact|; plain AtP,
    with the softmax saturated (queries scaled up), misses."""
    model, task = tiny(final_norm=False, n_layers=2), toy_task()
    with torch.no_grad():
        model.blocks[1].attn.q_proj.weight *= 30
        model.blocks[1].mlp.fc_out.weight.zero_()  # the heads' outputs then reach the logits linearly
    count = 8 if kind == "q" else 4  # 4 query heads, 2 key/value heads a layer
    star = attribute_nodes(model, task, kind=kind, method="atp*")
    exact = verify_nodes(model, task, star, k=count)
    approx, truth = exact.values
    last = [i for i, name in enumerate(exact.labels["nodes"]) if name.startswith("L1")]
    assert last and (approx[last] - truth[last].abs()).abs().max() <= 1e-5 * truth[last].abs().max()
    plain = verify_nodes(model, task, attribute_nodes(model, task, kind=kind, method="atp"), k=count)
    plain_last = [i for i, name in enumerate(plain.labels["nodes"]) if name.startswith("L1")]
    linear, truth = plain.values[:, plain_last]  # without the fix the softmax is linearised, and misses
    assert (linear - truth).abs().max() > 1e-3 * truth.abs().max()


def atp_with_a_layer_blocked(model, task, blocked: int) -> torch.Tensor:
    """[layers, heads]: AtP of every head's output (attn.z), the gradient taken with layer `blocked`'s attention
    and MLP outputs detached (their values kept), mean over the pairs."""
    rows = range(len(task))
    clean, corrupt = task.inputs(rows)
    points = [f"blocks.{layer}.attn.z" for layer in range(model.config.n_layers)]
    with torch.no_grad(), trace(model, points) as t:
        corrupt.last_logits(model)
    corrupted = {name: t[name] for name in points}
    detach = {f"blocks.{blocked}.{point}": (lambda x: x.detach()) for point in ("attn.out", "mlp.out")}
    with torch.enable_grad(), trace(model, points, detach, grad=True) as t:
        metric = task.score(clean.last_logits(model)[:, 0], rows).sum()
        grads = torch.autograd.grad(metric, [t[name] for name in points], allow_unused=True)
    grads = [torch.zeros_like(t[name]) if grad is None else grad for name, grad in zip(points, grads)]
    return torch.stack([((t[name].detach() - corrupted[name]) * grad).double().sum(dim=(0, 1, 3))
                        for name, grad in zip(points, grads)]) / len(task)  # (layers, heads)


def test_graddrop_is_the_mean_over_the_other_layers_of_abs_atp_with_one_layer_blocked():
    model, task = tiny(n_layers=3), toy_task()
    star = attribute_nodes(model, task, kind="heads", method="atp*").values  # (3, 4)
    blocked = torch.stack([atp_with_a_layer_blocked(model, task, layer).abs() for layer in range(3)])  # (gate, 3, 4)
    expected = torch.stack([sum(blocked[gate, layer] for gate in range(3) if gate != layer) / 2 for layer in range(3)])
    assert (star - expected).abs().max() <= 1e-10 * expected.abs().max()
    plain = attribute_nodes(model, task, kind="heads", method="atp").values.abs()
    assert (star - plain).abs().max() > 1e-3 * plain.abs().max()  # the gates change the estimate: the test can fail
