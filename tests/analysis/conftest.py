"""Fixtures of the analysis tests: a tiny model of each family, and same-weight GPT-2 in anatomy and in
TransformerLens."""

from __future__ import annotations

import pytest

from analysis_models import FAMILIES, tiny


@pytest.fixture(params=list(FAMILIES))
def family_model(request):
    return tiny(**FAMILIES[request.param])


@pytest.fixture(scope="module")
def gpt2_and_transformer_lens():
    """(anatomy, TransformerLens bridge) with the same random GPT-2 weights; skips without transformer-lens."""
    pytest.importorskip("transformer_lens")
    from anatomy.bench.analysis import transformer_lens_pair

    return transformer_lens_pair(n_layers=2, d_model=64, n_heads=4, vocab_size=99, max_seq_len=64)
