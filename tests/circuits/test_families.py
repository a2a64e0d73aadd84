"""Attribution graphs for every decoder family anatomy opens: each graph checks its own identity, and each of its
edges is the frozen model's direct effect (frozen_reference.py: norms, patterns and MLP outputs frozen, float64,
one source at a time).

The transcoder sets read and write where each family's published sets do, or where its layout is most
different: Gemma Scope's ln2.hook_normalized (the stream before the norm's gain) -> hook_mlp_out (after the MLP's
own norm), the MLP's output before a sandwich or post-sublayer norm (so the norm's frozen scale is crossed),
the shared norm of GPT-J, a skip across a parallel block, the residual stream of a post-norm block.
"""

from __future__ import annotations

import pytest
import torch

from anatomy.circuits.attribute import attribution_graph
from family_models import FAMILIES, PROMPT, family_model, family_transcoders
from frozen_reference import frozen_reference

# family -> (the point inside blocks.L the set reads, the point it writes, options)
SETS = {
    "gpt2": ("mlp_norm.normalized", "mlp.out", {}),
    "gpt_neo": ("mlp_norm.out", "mlp.out", dict(kind="relu", skip=True)),
    "gptj": ("attn_norm.out", "mlp.out", {}),
    "gpt_neox": ("mlp_norm.out", "mlp.out", dict(kind="relu", skip=True)),
    "opt": ("mlp_norm.out", "mlp.out", {}),
    "opt-post": ("resid_mid", "mlp.out", dict(kind="relu", skip=True)),
    "llama": ("mlp_norm.out", "mlp.out", dict(cross_layer=True)),
    "mistral": ("resid_mid", "mlp.out", {}),
    "mixtral": ("mlp_norm.out", "mlp.out", {}),
    "qwen2": ("mlp_norm.out", "mlp.out", {}),
    "qwen3": ("mlp_norm.out", "mlp.out", {}),
    "gemma": ("mlp_norm.normalized", "mlp.out", {}),
    "gemma2": ("mlp_norm.normalized", "mlp_out_norm.out", {}),
    "gemma3_text": ("mlp_norm.out", "mlp.out", dict(kind="relu", skip=True)),
    "olmo2": ("resid_mid", "mlp.out", dict(kind="relu", skip=True)),
    "phi3": ("mlp_norm.out", "mlp.out", {}),
    # the variants: a cross-layer set through sandwich norms, a skip on the normalised stream before the gain
    "gemma2-clt": ("mlp_norm.out", "mlp_out_norm.out", dict(cross_layer=True)),
    "gemma3_text-normalized": ("mlp_norm.normalized", "mlp_out_norm.out", dict(kind="relu", skip=True)),
    "olmo2-outnorm": ("resid_mid", "mlp_out_norm.out", {}),
}


def graph_of(case: str):
    family = case if case in FAMILIES else case.rsplit("-", 1)[0]
    model = family_model(family)
    reads, writes, options = SETS[case]
    transcoders = family_transcoders(model, reads, writes, **options)
    return model, transcoders, attribution_graph(model, torch.tensor(PROMPT), transcoders)


@pytest.mark.parametrize("case", list(SETS))
def test_the_graph_of_every_family_checks_its_identity(case):
    _, _, graph = graph_of(case)
    assert graph.error < 1e-5, graph.check
    targets = ~graph.values.isnan()
    total = graph.adjacency[targets].double().sum(1) + graph.unexplained[targets].double()
    assert torch.allclose(total, graph.values[targets].double(), rtol=1e-5, atol=1e-4)
    assert sum(node.kind == "feature" for node in graph.nodes) > 15


@pytest.mark.parametrize("case", list(SETS))
def test_every_edge_of_every_family_is_the_frozen_models_direct_effect(case):
    model, transcoders, graph = graph_of(case)
    reference = frozen_reference(model, transcoders, graph)
    scale = float(reference.abs().max())
    assert scale > 0.1
    worst = float((graph.adjacency.double() - reference).abs().max())
    assert worst < 1e-5 * max(1.0, scale), (case, worst)


@pytest.mark.parametrize("case", list(SETS))
def test_a_capped_graph_of_every_family_is_the_whole_graphs_rows_on_what_it_keeps(case):
    """A capped graph sweeps buckets of rows at several positions (capped.py), the whole graph one position at a
    time: the same rows, on every layout, and its own identity."""
    model, transcoders, whole = graph_of(case)
    n = sum(node.kind == "feature" for node in whole.nodes)
    capped = attribution_graph(model, torch.tensor(PROMPT), transcoders, max_feature_nodes=n // 2, batch_size=4)
    assert sum(node.kind == "feature" for node in capped.nodes) == n // 2
    order = torch.tensor([whole.index(node.id) for node in capped.nodes])
    worst = float((capped.adjacency - whole.adjacency[order][:, order]).abs().max())
    assert worst < 1e-5 * max(1.0, float(whole.adjacency.abs().max())), (case, worst)
    assert capped.error < 1e-5, capped.check
