"""EAP equals auto-circuit 1.0.1's on the same weights and pairs (a random GPT-2-shaped model), EAP-IG with
the edges interpolated equals its integrated_grad_samples, and ACDC keeps the edges its ACDC keeps.

The fixtures were written by auto-circuit itself, in its own virtual environment
(fixtures/make_autocircuit_fixtures.py): its mask_gradient_prune_scores with grad_function="logit",
answer_function="avg_diff" and mask_val=0, which its documentation states is EAP exactly (Syed et al.
2023), scored on every edge of TransformerLens's split q/k/v inputs. anatomy must match every edge
within 1e-4, and score the same set of edges.

With auto-circuit's environment at hand (.ci/run), tests/test_peer_fixtures.py runs that script again and
finds the committed files.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import anatomy
from anatomy.circuits.discovery import Task, attribute_edges

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def folder() -> Path:
    return FIXTURES / "autocircuit"


def anatomy_scores(folder: Path, method: str, steps: int = 1, path: str = "inputs") -> dict[str, float]:
    model = anatomy.from_pretrained(folder).eval()
    pairs = load_file(str(folder / "pairs.safetensors"))
    n, length = pairs["clean"].shape
    task = Task("fixture", pairs["clean"], pairs["corrupt"], torch.full((n,), length), pairs["answers"], pairs["wrongs"])
    result = attribute_edges(model, task, method=method, steps=steps, path=path)
    graph = result.extra["graph"]
    return {graph.edge_name(u, v): float(result.values[u, v]) for u, v in graph.allowed.nonzero().tolist()}


def test_eap_equals_auto_circuit(folder):
    expected = json.loads((folder / "expected.json").read_text(encoding="utf-8"))["eap"]
    ours = anatomy_scores(folder, "eap")
    assert set(ours) == set(expected)
    worst = max(abs(ours[name] - value) for name, value in expected.items())
    assert worst < 1e-4, worst
    assert max(abs(value) for value in expected.values()) > 1e-2  # the scores compared are not all ~0


def test_eap_ig_with_edges_interpolated_equals_auto_circuit(folder):
    """auto-circuit's integrated_grad_samples=5 moves every edge's mask from 0 to 1 together and sums the
    gradients of the 6 points; anatomy's path="edges" averages the same 6, so it is 1/6 of auto-circuit's.
    (Hanna et al.'s EAP-IG, path="inputs", interpolates the input embeddings instead: another quantity.)"""
    data = json.loads((folder / "expected.json").read_text(encoding="utf-8"))
    samples = int(next(key for key in data if key.startswith("ig"))[2:])
    expected = data[f"ig{samples}"]
    ours = anatomy_scores(folder, "eap-ig", steps=samples, path="edges")
    worst = max(abs(ours[name] * (samples + 1) - value) for name, value in expected.items())
    assert worst < 1e-4, worst
    inputs = anatomy_scores(folder, "eap-ig", steps=samples)
    assert max(abs(inputs[name] * (samples + 1) - value) for name, value in expected.items()) > 1e-2


def test_acdc_keeps_the_edges_auto_circuit_keeps(folder):
    """auto-circuit's acdc_prune_scores (KL, the corrupted outputs patched in), with its edges in anatomy's
    order, keeps the same edges as anatomy's acdc at each tau; the order is anatomy's acdc_order, and no
    decision is within float32's reach of tau (each tested edge moved the KL at least 1e-5 from it)."""
    from anatomy.circuits.discovery.acdc import acdc, acdc_order

    data = json.loads((folder / "expected.json").read_text(encoding="utf-8"))["acdc"]
    model = anatomy.from_pretrained(folder).eval()
    pairs = load_file(str(folder / "pairs.safetensors"))
    n, length = pairs["clean"].shape
    task = Task("fixture", pairs["clean"], pairs["corrupt"], torch.full((n,), length), pairs["answers"], pairs["wrongs"])
    sizes = []
    for tau, expected in data["kl"].items():
        base, exponent = tau.split("e")
        threshold = int(base) * 10.0 ** int(exponent)
        result = acdc(model, task, threshold=threshold, metric="kl")
        graph = result.extra["graph"]
        assert [graph.edge_name(u, v) for u, v in acdc_order(graph)] == data["order"]
        kept = sorted(graph.edge_name(u, v) for u, v in result.extra["kept"].nonzero().tolist())
        assert kept == expected, tau
        margin = (result.values[graph.allowed] - threshold).abs().min().item()
        assert margin > 1e-5, (tau, margin)
        sizes.append(len(kept))
    assert len(set(sizes)) == len(sizes) and 1 <= min(sizes) and max(sizes) < len(data["order"])  # taus that differ
