"""What a graph's features mean, for the page: the tokens each promotes (its decoder through the unembedding,
scaled by the final norm's gain) and where it fires hardest on a corpus (the window around its peak, with its
activation on every token), each recomputed here from the model and the transcoders."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import anatomy
from anatomy.circuits import attribution_graph, pruned
from anatomy.circuits.features import promoted_tokens, top_contexts
from anatomy.sae import load_transcoders
from anatomy.sae.features import AFTER, BEFORE

FIXTURES = Path(__file__).parent / "fixtures" / "graphs"
PROMPT = json.loads((FIXTURES / "README.json").read_text())["prompt"]


@pytest.fixture(scope="module")
def made():
    model = anatomy.from_pretrained(str(FIXTURES / "llama")).eval()
    transcoders = load_transcoders(FIXTURES / "clt_jumprelu")
    return model, transcoders, pruned(attribution_graph(model, PROMPT, transcoders))


def test_promoted_tokens_are_the_decoders_direct_logits(made):
    model, transcoders, graph = made
    details = promoted_tokens(model, transcoders, graph, k=3)
    gain = model.final_norm.weight.detach()
    unembed = model.lm_head.proj.weight.detach()
    for node in (n for n in graph.nodes if n.kind == "feature"):
        direction = transcoders.decoder_vectors(node.layer)[node.index].detach().sum(0)  # every layer it writes
        logits = unembed @ (gain * direction)
        top = logits.topk(3)
        assert [t for t, _ in details.promoted[node.id]] == model.tokenizer.token_texts(top.indices.tolist())
        assert [v for _, v in details.promoted[node.id]] == pytest.approx(top.values.tolist(), rel=1e-5)
        bottom = logits.topk(3, largest=False)
        assert [v for _, v in details.suppressed[node.id]] == pytest.approx(bottom.values.tolist(), rel=1e-5)


def test_top_contexts_are_where_each_feature_fires_hardest(made):
    model, transcoders, graph = made
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, model.config.vocab_size, 16 * 12)
    context = 16
    details = top_contexts(model, transcoders, graph, tokens, promoted_tokens(model, transcoders, graph),
                           context=context, top=2, batch=5)
    ids = torch.from_numpy(tokens.reshape(-1, context))
    with torch.no_grad(), anatomy.trace(model, ["blocks.*.mlp_norm.out"]) as t:
        model(ids)
    checked = 0
    for node in (n for n in graph.nodes if n.kind == "feature"):
        acts = transcoders.encode(node.layer, t[f"blocks.{node.layer}.mlp_norm.out"])[..., node.index]  # (C, T)
        acts[:, 0] = 0
        peaks = acts.max(dim=1).values
        expected = peaks.topk(2).values
        shown = details.contexts[node.id]
        assert len(shown) == int((expected > 0).sum())
        for context_shown, value in zip(shown, expected.tolist()):
            assert max(context_shown["acts"]) == pytest.approx(value, rel=1e-5)
            assert len(context_shown["tokens"]) <= BEFORE + 1 + AFTER
            checked += 1
    assert checked > 5
