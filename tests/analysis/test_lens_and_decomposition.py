"""The logit lens ends at the model's own prediction; the components of the residual stream sum to
it; their direct logit attributions sum to the logit; run_with_cache takes text, batches and ids."""

from __future__ import annotations

import pytest
import torch

import anatomy
from analysis_models import inputs_for, tiny


def test_the_lens_last_layer_is_the_models_log_probs(family_model):
    inputs = inputs_for(family_model)
    result = anatomy.logit_lens(family_model, inputs)
    with torch.no_grad():
        if family_model.config.arch == "encoder-decoder":
            logits = family_model(*inputs).logits
        else:
            logits = family_model(inputs).logits
    n_layers = family_model.config.n_layers
    assert result.values.shape == (n_layers + 1, *logits.shape)
    torch.testing.assert_close(result.values[-1], torch.log_softmax(logits, -1), atol=1e-5, rtol=0)
    assert result.error < 1e-5 and "max |diff|" in result.check
    assert result.extra["top_ids"].shape == (n_layers + 1, *logits.shape[:2], 5)  # the top 5 by default


def test_the_lens_first_layer_reads_the_embeddings():
    model = tiny()
    x = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.no_grad():
        embeddings = model.token_embedding(x) + model.position_embedding(torch.arange(5))
        expected = torch.log_softmax(model.lm_head(model.final_norm(embeddings)), -1)
    torch.testing.assert_close(anatomy.logit_lens(model, x).values[0], expected)


@pytest.mark.parametrize("family", ["decoder", "decoder-llama", "encoder", "encoder-decoder"])
def test_components_sum_to_the_final_residual(family):
    from analysis_models import FAMILIES

    model = tiny(**FAMILIES[family])
    result = anatomy.decompose(model, inputs_for(model))
    names = result.labels["component"]
    n_heads, n_layers = model.config.n_heads, model.config.n_layers
    crosses = n_layers * n_heads if family == "encoder-decoder" else 0
    assert sum(name.endswith(tuple(f"H{h}" for h in range(n_heads))) for name in names) == n_layers * n_heads + crosses
    prefix = "decoder." if family == "encoder-decoder" else ""
    with torch.no_grad(), anatomy.trace(model, f"{prefix}blocks.1.resid_post") as t:
        if family == "encoder-decoder":
            model(*inputs_for(model))
        else:
            model(inputs_for(model))
    torch.testing.assert_close(result.values.sum(0), t[f"{prefix}blocks.1.resid_post"], atol=1e-5, rtol=0)
    assert result.error < 1e-5


def test_zeroing_a_heads_output_removes_exactly_its_component():
    model = tiny()
    x = inputs_for(model)
    parts = anatomy.decompose(model, x)
    head = parts.labels["component"].index("L1H2")

    def zero(h):
        h = h.clone()
        h[:, :, 2] = 0
        return h

    with torch.no_grad():
        with anatomy.trace(model, "blocks.1.resid_mid") as clean:
            model(x)
        with anatomy.trace(model, "blocks.1.resid_mid", interventions={"blocks.1.attn.head_out": zero}) as t:
            model(x)
    # The stream after layer 1's attention (before its MLP reads it) loses exactly that head's component.
    torch.testing.assert_close(t["blocks.1.resid_mid"], clean["blocks.1.resid_mid"] - parts.values[head], atol=1e-5, rtol=0)


def test_post_norm_models_refuse_decomposition():
    with pytest.raises(ValueError, match="pre-norm"):
        anatomy.decompose(tiny(norm_position="post", final_norm=False), torch.tensor([[1, 2, 3]]))


@pytest.mark.parametrize("family", ["decoder", "decoder-llama", "encoder-decoder"])
def test_direct_logit_attributions_sum_to_the_logit(family):
    from analysis_models import FAMILIES

    model = tiny(**FAMILIES[family])
    x = inputs_for(model)
    result = anatomy.direct_logit_attribution(model, x, target=7)
    with torch.no_grad():
        logits = (model(*x) if family == "encoder-decoder" else model(x)).logits
    assert result.values.shape[1:] == logits.shape[:2]
    torch.testing.assert_close(result.values.sum(0), logits[..., 7], atol=1e-4, rtol=0)
    assert result.error < 1e-4
    per_position = anatomy.direct_logit_attribution(model, x, target=None)  # each position's top token
    torch.testing.assert_close(per_position.values.sum(0), logits.max(-1).values, atol=1e-4, rtol=0)


def test_direct_logit_attribution_of_the_embedding_by_hand():
    """The token embedding's contribution through a frozen LayerNorm, computed from its definition."""
    model = tiny()
    x = torch.tensor([[5, 6, 7]])
    result = anatomy.direct_logit_attribution(model, x, target=11)
    with torch.no_grad(), anatomy.trace(model, "blocks.1.resid_post") as t:
        model(x)
    final, norm = t["blocks.1.resid_post"], model.final_norm
    embed = model.token_embedding(x)
    sigma = (final.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()
    expected = ((embed - embed.mean(-1, keepdim=True)) / sigma * norm.weight) @ model.lm_head.proj.weight[11]
    torch.testing.assert_close(result.values[result.labels["component"].index("embed")], expected.detach())


def test_bad_targets_are_named():
    model = tiny()
    with pytest.raises(ValueError, match="vocab_size=99"):
        anatomy.direct_logit_attribution(model, torch.tensor([[1, 2]]), target=500)
    with pytest.raises(ValueError, match=r"\[batch, pos\]"):
        anatomy.direct_logit_attribution(model, torch.tensor([[1, 2]]), target=torch.zeros(3, 3, dtype=torch.long))


def word_tokenizer() -> anatomy.Tokenizer:
    """A word-level tokenizer over a few words, with no template: "<pad>" is id 0."""
    from tokenizers import Tokenizer as Backend
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    words = ["<pad>"] + "the cat sat on a mat dog ran".split()
    backend = Backend(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    backend.pre_tokenizer = WhitespaceSplit()
    return anatomy.Tokenizer(backend, pad_id=0)


def test_run_with_cache_takes_text_a_padded_batch_and_ids():
    model = tiny()
    tokenizer = word_tokenizer()
    output, cache = anatomy.run_with_cache(model, ["the cat sat", "a dog ran on the mat"], tokenizer=tokenizer)
    assert cache.tokens == [["the", "cat", "sat", "", "", ""], ["a", "dog", "ran", "on", "the", "mat"]]
    assert cache["blocks.0.attn.pattern"].shape == (2, 4, 6, 6)
    # The padded row's real tokens equal the unpadded pass.
    alone, alone_cache = anatomy.run_with_cache(model, "the cat sat", tokenizer=tokenizer)
    torch.testing.assert_close(output.logits[0, :3], alone.logits[0], atol=1e-5, rtol=0)
    ids_output, ids_cache = anatomy.run_with_cache(model, torch.tensor([1, 2, 3]), ["hook_embed"])
    torch.testing.assert_close(ids_output.logits, alone.logits)
    assert list(ids_cache) == ["embed"] and ids_cache.tokens == [["1", "2", "3"]]
    model.tokenizer = tokenizer
    assert anatomy.run_with_cache(model, "the cat")[1].tokens == [["the", "cat"]]


def test_text_without_a_tokenizer_says_what_to_do():
    with pytest.raises(anatomy.InputError, match="tokenizer"):
        anatomy.run_with_cache(tiny(), "the cat")
    with pytest.raises(anatomy.InputError, match="string"):
        anatomy.run_with_cache(tiny(), torch.zeros(2, 2))
