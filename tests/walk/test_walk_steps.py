"""The walkthrough shows the pass's own numbers, and each step's recomputation agrees with them."""

import pytest
import torch

from anatomy.walk import (
    seed004_example, seed004_vocab, seed004_words, seq2seq_vocab, toy_model, walkthrough,
)

DEFAULT_TITLES = [
    "Tokens and ids",
    "One-hot vectors",
    "Embedding lookup",
    "Positional encoding",
    "Input to the first layer: X = E + P",
    "Queries, keys and values (head 0)",
    "Dot products QKᵀ",
    "Scaling by √d_k",
    "The causal mask",
    "Row-wise softmax",
    "Weighted sum of values: A·V",
    "Concatenate the heads and project: W_O",
    "Residual and LayerNorm",
    "Feed-forward network",
    "Residual and LayerNorm",
    "The remaining layers (1)",
    "Output projection: logits",
    "Next-token probabilities",
]


@pytest.fixture(scope="module")
def default_walk():
    model, ids, options = seed004_example()
    return walkthrough(model, ids, **options)


def test_seed_004_tokenization():
    words = seed004_words()
    vocab = seed004_vocab()
    assert words == ["<SOS>", "Hello", "World,", "this", "is", "Alejandro!", "<EOS>"]
    assert list(vocab.itos) == ["<EOS>", "<SOS>", "Alejandro!", "Hello", "World,", "is", "this"]
    assert vocab.encode(words) == [1, 3, 4, 6, 5, 2, 0]


def test_the_default_walk_follows_the_seeds_order(default_walk):
    assert default_walk.titles == DEFAULT_TITLES
    assert default_walk.tokens == seed004_words()
    assert default_walk.ok, [step.check.summary for step in default_walk.failures]


def test_every_traced_matrix_shown_is_the_traced_tensor(default_walk):
    t = default_walk.trace
    traced = [m for step in default_walk.steps for m in step.matrices if m.point is not None]
    assert len(traced) >= 15
    for matrix in traced:
        expected = t[matrix.point][matrix.index].double()
        assert torch.equal(matrix.values, expected), matrix.source


def test_the_attention_steps_show_layer_0_head_0(default_walk):
    t = default_walk.trace
    by_title = {step.title: step for step in default_walk.steps}
    pattern = by_title["Row-wise softmax"].matrices[0]
    assert pattern.point == "blocks.0.attn.pattern" and pattern.index == (0, 0)
    assert torch.equal(pattern.values, t["blocks.0.attn.pattern"][0, 0].double())
    torch.testing.assert_close(pattern.values.sum(-1), torch.ones(7, dtype=torch.float64))
    raw = by_title["Dot products QKᵀ"].matrices[0].values
    q, k = t["blocks.0.attn.q"][0, 0].double(), t["blocks.0.attn.k"][0, 0].double()
    torch.testing.assert_close(raw, q @ k.T)
    mask = by_title["The causal mask"].matrices[0]
    assert mask.kind == "mask" and torch.equal(mask.values, torch.ones(7, 7, dtype=torch.bool).tril())
    x = by_title["Input to the first layer: X = E + P"].matrices[0].values
    e = by_title["Embedding lookup"].matrices[1].values
    p = by_title["Positional encoding"].matrices[0].values
    torch.testing.assert_close(x, e + p)


def test_the_default_numbers_are_stable():
    """Seeded: two builds give the same walk, number for number."""
    first = walkthrough(*seed004_example()[:2], **seed004_example()[2])
    second = walkthrough(*seed004_example()[:2], **seed004_example()[2])
    for a, b in zip(first.steps, second.steps):
        for m, n in zip(a.matrices, b.matrices):
            assert torch.equal(m.values, n.values)


WORDS = seed004_words()
VOCAB = seed004_vocab()
IDS = VOCAB.encode(WORDS)
FAMILY_VARIANTS = {
    "paper": {},
    "pre-norm": dict(norm_position="pre", final_norm=True),
    "rotary-rmsnorm-swiglu-gqa": dict(pos_encoding="rotary", norm="rmsnorm", norm_position="pre", final_norm=True,
                                      activation="swiglu", d_model=8, n_heads=4, n_kv_heads=2, attn_bias=False),
    "alibi": dict(pos_encoding="alibi"),
    "learned-gelu-scaled": dict(pos_encoding="learned", activation="gelu", scale_embeddings=True),
}


@pytest.mark.parametrize("variant", list(FAMILY_VARIANTS))
@pytest.mark.parametrize("arch", ["decoder", "encoder"])
@pytest.mark.parametrize("layer,head", [(0, 0), (1, 1)])
def test_every_check_passes(arch, variant, layer, head):
    model = toy_model(len(VOCAB), arch=arch, **FAMILY_VARIANTS[variant])
    walk = walkthrough(model, IDS, tokens=WORDS, vocab=list(VOCAB.itos), layer=layer, head=head)
    assert walk.ok, [step.check.summary for step in walk.failures]
    assert sum(step.check is not None for step in walk.steps) >= 14


@pytest.mark.parametrize("norm_position", ["pre", "post"])
def test_every_check_passes_for_the_encoder_decoder(norm_position):
    vocab = seq2seq_vocab()
    source, target = seed004_words(), seed004_words("Hola Mundo, soy Alejandro!", eos=False)
    model = toy_model(len(vocab), arch="encoder-decoder", norm_position=norm_position,
                      final_norm=norm_position == "pre")
    walk = walkthrough(model, vocab.encode(source), tokens=source, vocab=list(vocab.itos),
                       target_ids=vocab.encode(target), target_tokens=target, layer=1, head=1)
    assert walk.ok, [step.check.summary for step in walk.failures]
    assert vocab.encode(source) == [1, 3, 4, 6, 5, 2, 0]  # the source keeps seed 004's ids
    cross = [s for s in walk.steps if s.section == "Decoder layer 1" and s.title == "Scaling by √d_k"][0]
    assert cross.matrices[0].point == "decoder.blocks.1.cross_attn.scores"
    assert cross.matrices[0].shape == (5, 7)  # rectangular: target positions × source tokens


def test_pre_and_post_norm_narrate_their_own_order():
    post = walkthrough(toy_model(7), IDS, tokens=WORDS).titles
    pre = walkthrough(toy_model(7, norm_position="pre", final_norm=True), IDS, tokens=WORDS).titles
    assert post[post.index("Concatenate the heads and project: W_O") + 1] == "Residual and LayerNorm"
    assert pre[pre.index("Input to the first layer: X = E + P") + 1] == "LayerNorm before the attention"
    assert pre[pre.index("Concatenate the heads and project: W_O") + 1] == "Residual connection"
    assert "LayerNorm before the feed-forward network" in pre and "Final LayerNorm" in pre
    assert "Final LayerNorm" not in post


def test_the_encoder_ends_with_a_pooled_vector():
    walk = walkthrough(toy_model(7, arch="encoder"), IDS, tokens=WORDS)
    assert walk.titles[-1] == "Pooled sentence vector"
    assert walk.titles[walk.titles.index("Scaling by √d_k") + 1] == "The mask (none: bidirectional)"


def test_a_model_that_disagrees_with_its_weights_is_flagged():
    """A hook that alters W_O's output makes the traced tensor differ from the recomputation."""
    model = toy_model(7)
    handle = model.blocks[0].attn.o_proj.register_forward_hook(lambda module, args, out: out + 0.5)
    try:
        walk = walkthrough(model, IDS, tokens=WORDS)
    finally:
        handle.remove()
    assert not walk.ok
    assert [step.title for step in walk.failures] == ["Concatenate the heads and project: W_O"]
    assert "MISMATCH" in walk.failures[0].check.summary


def test_out_of_range_layer_and_head_name_the_range():
    model = toy_model(7)
    with pytest.raises(ValueError, match=r"layer 2 is out of range: this model has 2 layers, choose 0 … 1"):
        walkthrough(model, IDS, layer=2)
    with pytest.raises(ValueError, match=r"head -1 is out of range: this model has 2 heads, choose 0 … 1"):
        walkthrough(model, IDS, head=-1)
    with pytest.raises(ValueError, match="target_ids"):
        walkthrough(toy_model(10, arch="encoder-decoder"), IDS)
