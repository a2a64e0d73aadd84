"""What a graph's features mean, for the page: the tokens each promotes and suppresses (its decoder through the
unembedding, scaled by the final norm's gain, centred over the vocabulary), where it fires hardest on a corpus
(the window around its peak, with its activation on every token) within a budget, and a label from both; each
recomputed here from the model and the transcoders."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer as Backend
from tokenizers.models import WordLevel

import anatomy
from anatomy.checkpoints.tokenizer import Tokenizer
from anatomy.circuits import attribution_graph, pruned
from anatomy.circuits.features import feature_label, promoted_tokens, top_contexts
from anatomy.sae import load_transcoders
from anatomy.sae.contexts import AFTER, BEFORE

FIXTURES = Path(__file__).parent / "fixtures" / "graphs"
PROMPT = json.loads((FIXTURES / "README.json").read_text())["prompt"]


@pytest.fixture(scope="module")
def made():
    model = anatomy.from_pretrained(str(FIXTURES / "llama")).eval()
    transcoders = load_transcoders(FIXTURES / "clt_jumprelu")
    return model, transcoders, pruned(attribution_graph(model, PROMPT, transcoders))


def test_promoted_tokens_are_the_decoders_direct_logits_centred(made):
    model, transcoders, graph = made
    details = promoted_tokens(model, transcoders, graph, k=3)
    gain = model.final_norm.weight.detach()
    unembed = model.lm_head.proj.weight.detach()
    for node in (n for n in graph.nodes if n.kind == "feature"):
        direction = transcoders.decoder_vectors(node.layer)[node.index].detach().sum(0)  # every layer it writes
        logits = unembed @ (gain * direction)
        logits -= logits.mean()
        top, bottom = logits.topk(3), logits.topk(3, largest=False)
        assert [t for t, _ in details.promoted[node.id]] == model.tokenizer.labels(top.indices.tolist())
        assert [v for _, v in details.promoted[node.id]] == pytest.approx(top.values.tolist(), rel=1e-5)
        assert [v for _, v in details.suppressed[node.id]] == pytest.approx(bottom.values.tolist(), rel=1e-5)


def test_a_feature_with_known_promoted_and_suppressed_tokens_shows_them_with_their_signs(made):
    """A decoder row made to raise 'cat' by 3 and 'mat' by 2 and lower 'dog' by 3 and 'red' by 2 over the rest,
    on top of a shift of +5 on every token: the raw logits are all positive, so without the centring its
    'most suppressed' tokens would show positive numbers (the defect a reader saw on SmolLM2). Its tokens
    are shown as everywhere in anatomy: ' cat' as '␣cat', a control character escaped."""
    model, transcoders, graph = made
    node = next(n for n in graph.nodes if n.kind == "feature")
    vocab = model.tokenizer.labels(range(model.config.vocab_size))
    wanted = torch.zeros(model.config.vocab_size)
    for token, logit in (("cat", 3.0), ("mat", 2.0), ("dog", -3.0), ("red", -2.0)):
        wanted[vocab.index(token)] = logit
    wanted += 5.0 - wanted.mean()  # every raw logit positive, the centred ones `wanted - 5`
    unembed = model.lm_head.proj.weight.detach()  # (V, E), V < E: any logits can be made exactly
    row = torch.linalg.lstsq(unembed, wanted[:, None]).solution[:, 0] / model.final_norm.weight.detach()
    decoder = transcoders.decoder_vectors(node.layer)
    saved, tokenizer = decoder[node.index].clone(), model.tokenizer
    # the same ids, two of them written as a reader must not see them raw: a leading space, a control character
    model.tokenizer = Tokenizer(Backend(WordLevel({{"cat": " cat", "dog": "dog\x1a"}.get(piece, piece): i
                                                   for i, piece in enumerate(vocab)}, unk_token="<unk>")))
    try:
        with torch.no_grad():
            decoder[node.index] = 0
            decoder[node.index, 0] = row  # what the feature writes to its own layer; nothing to later ones
            details = promoted_tokens(model, transcoders, graph, k=2)
    finally:
        with torch.no_grad():
            decoder[node.index] = saved
        model.tokenizer = tokenizer
    assert details.promoted[node.id] == [("␣cat", pytest.approx(3.0, abs=1e-3)), ("mat", pytest.approx(2.0, abs=1e-3))]
    assert details.suppressed[node.id] == [("dog\\x1a", pytest.approx(-3.0, abs=1e-3)),
                                           ("red", pytest.approx(-2.0, abs=1e-3))]
    assert details.labels[node.id] == "auto: → ␣cat"


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
        peaks, where = acts.max(dim=1)
        expected = peaks.topk(2)
        shown = details.contexts[node.id]
        assert len(shown) == int((expected.values > 0).sum())
        for context_shown, value, c in zip(shown, expected.values.tolist(), expected.indices.tolist()):
            assert max(context_shown["acts"]) == pytest.approx(value, rel=1e-5)
            assert context_shown["acts"][context_shown["peak"]] == pytest.approx(value, rel=1e-5)
            assert context_shown["tokens"][context_shown["peak"]] == model.tokenizer.labels([int(ids[c, where[c]])])[0]
            assert len(context_shown["tokens"]) <= BEFORE + 1 + AFTER
            checked += 1
    assert details.scanned == len(tokens) and details.seconds is None
    assert checked > 5


def test_the_time_budget_stops_after_the_batch_that_spends_it(made):
    model, transcoders, graph = made
    tokens = np.random.default_rng(1).integers(3, model.config.vocab_size, 16 * 12)
    details = top_contexts(model, transcoders, graph, tokens, promoted_tokens(model, transcoders, graph),
                           context=16, batch=4, seconds=0.0)
    assert details.scanned == 4 * 16 and details.seconds == 0.0
    assert "Top contexts from 64 tokens (a budget of 0 s)." == details.note()


def test_the_label_says_what_the_feature_fires_on_and_promotes_and_that_it_is_automatic():
    contexts = [{"tokens": ["␣the", "␣Dallas", "␣is"], "peak": 1}, {"tokens": ["␣Texas", "."], "peak": 0},
                {"tokens": ["in", "␣Dallas"], "peak": 1}]
    assert feature_label(contexts, [("␣Austin", 2.5), ("␣city", 1.0)]) == "auto: ␣Dallas, ␣Texas → ␣Austin"
    assert feature_label(contexts, []) == "auto: ␣Dallas, ␣Texas →"
    assert feature_label([], []) == ""
