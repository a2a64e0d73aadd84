"""Every intermediate of anatomy equals transformers' within 1e-5 (float32), padded or not."""

from __future__ import annotations

import pytest

from anatomy.checkpoints.parity import parity_rows

from checkpoint_cases import CASES

TOL = 1e-5


@pytest.mark.parametrize("pad", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("case", list(CASES))
def test_every_intermediate_matches_transformers(hf_checkpoint, case, pad):
    rows = parity_rows(hf_checkpoint(case), pad=pad, tol=TOL)
    names = [r.name for r in rows]
    # embeddings, one hidden state and one attention pattern per layer, at least
    assert sum(".attn.pattern" in n for n in names) >= 2 and sum("resid" in n or "final_norm" in n for n in names) >= 3
    if CASES[case][0] != "BertModel" and not CASES[case][0].endswith(("GPT2Model", "LlamaModel")):
        assert "logits" in names
    bad = [(r.name, r.reference, r.max_abs_diff) for r in rows if not r.ok]
    assert not bad, f"beyond {TOL}: {bad}"


def test_parity_sees_a_wrong_weight(hf_checkpoint, monkeypatch):
    """The comparison is not vacuous: one scaled key projection shows up downstream."""
    import torch

    from anatomy.checkpoints import parity

    load = parity.from_pretrained

    def damaged(*args, **kwargs):
        model = load(*args, **kwargs)
        with torch.no_grad():
            model.blocks[1].attn.k_proj.weight.mul_(1.01)
        return model

    monkeypatch.setattr(parity, "from_pretrained", damaged)
    rows = {r.name: r for r in parity_rows(hf_checkpoint("llama-gqa"), tol=TOL)}
    assert rows["blocks.0.attn.pattern"].ok
    assert not rows["blocks.1.attn.pattern"].ok and not rows["logits"].ok
