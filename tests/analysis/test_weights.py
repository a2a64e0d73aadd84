"""process_weights keeps the function: log-probs within 1e-4 for every family it supports."""

from __future__ import annotations

import pytest
import torch

import anatomy
from analysis_models import FAMILIES, inputs_for, tiny


def log_probs(model, inputs):
    with torch.no_grad():
        logits = model(*inputs).logits if isinstance(inputs, tuple) else model(inputs).logits
    return torch.log_softmax(logits, -1)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_processed_weights_keep_the_log_probs(family):
    model = tiny(**FAMILIES[family])
    inputs = inputs_for(model)
    processed = anatomy.process_weights(model)
    torch.testing.assert_close(log_probs(processed, inputs), log_probs(model, inputs), atol=1e-4, rtol=0)
    stack = processed.decoder if family == "encoder-decoder" else processed
    norm = stack.blocks[0].attn_norm
    assert torch.all(norm.weight == 1)  # folded into the projections
    if family != "decoder-llama":
        assert torch.all(norm.bias == 0)
        assert stack.token_embedding.weight.mean(-1).abs().max() < 1e-6  # centred writers
        assert stack.blocks[1].attn.o_proj.weight.mean(0).abs().max() < 1e-6
    assert processed.lm_head.proj.weight.mean(0).abs().max() < 1e-6  # centred unembedding
    # the original is untouched, to the bit (a change that keeps its function, centring, is a change too)
    fresh = tiny(**FAMILIES[family]).state_dict()
    assert all(torch.equal(value, fresh[name]) for name, value in model.state_dict().items())


def test_a_parallel_block_with_a_shared_norm():
    model = tiny(parallel_residual=True, parallel_shared_norm=True)
    x = inputs_for(model)
    torch.testing.assert_close(log_probs(anatomy.process_weights(model), x), log_probs(model, x), atol=1e-4, rtol=0)


def test_invalid_processing_is_refused_before_anything_is_built():
    with pytest.raises(ValueError, match="pre-norm"):
        anatomy.process_weights(tiny(norm_position="post", final_norm=False))
    with pytest.raises(ValueError, match="LayerNorm"):
        anatomy.process_weights(tiny(**FAMILIES["decoder-llama"]), center_writing_weights=True)
