"""The walkthrough shows the pass's own numbers, each step's recomputation agrees with them, and
so does every line worked by hand, for the toys and for every architecture the core builds."""

import math

import pytest
import torch

from anatomy import ModelConfig, build_model
from anatomy.walk import toy_example, walkthrough
from anatomy.walk.reference import compare

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
    model, ids, options = toy_example()
    return walkthrough(model, ids, **options)


def test_the_default_walk_follows_the_sources_order(default_walk):
    assert default_walk.titles == DEFAULT_TITLES
    assert default_walk.tokens == ["<SOS>", "Hello", "World,", "this", "is", "Alejandro!"]
    assert default_walk.ok, [c.summary for step in default_walk.failures for c in step.checks if not c.ok]


def test_the_last_step_predicts_alejandro_after_is(default_walk):
    last = default_walk.steps[-1]
    assert "After 'is' the most likely word is 'Alejandro!'" in last.text
    probabilities = last.matrices[0]
    row = probabilities.values[probabilities.highlight]
    assert probabilities.rows[probabilities.highlight] == "after 'is'"
    assert probabilities.cols[int(row.argmax())] == "Alejandro!" and float(row.max()) > 0.5
    assert any("→ Alejandro!" in line.text for line in last.worked)


def test_every_traced_matrix_shown_is_the_traced_tensor(default_walk):
    t = default_walk.trace
    traced = [m for step in default_walk.steps for m in step.matrices if m.point is not None]
    assert len(traced) >= 15
    for matrix in traced:
        assert torch.equal(matrix.values, t[matrix.point][matrix.index].double()), matrix.source


def test_each_step_works_one_row_by_hand(default_walk):
    """q·k, a softmax row, a row of A·V, LayerNorm of a row, one FFN neuron, the residual sum and the
    final softmax: each line written out and checked against the model's own number."""
    worked = {step.title: step.worked for step in default_walk.steps}
    assert "×" in worked["Dot products QKᵀ"][0].text  # the sum of products
    assert "exp(" in worked["Row-wise softmax"][0].text and "sum =" in worked["Row-wise softmax"][0].text
    assert "Σ_j A" in worked["Weighted sum of values: A·V"][0].text
    layer_norm = " ".join(line.text for line in worked["Residual and LayerNorm"])
    assert all(word in layer_norm for word in ("mean =", "variance =", "normalised =", "γ", "β"))
    ffn = " ".join(line.text for line in worked["Feed-forward network"])
    assert all(word in ffn for word in ("pre-activation", "activation ReLU", "contribution"))
    assert "exp(logit − max)" in worked["Next-token probabilities"][0].text
    lines = [line for step in default_walk.steps for line in step.worked]
    assert len(lines) >= 20 and all(line.check.ok for line in lines)


def test_a_worked_line_that_disagrees_is_flagged():
    """The checks can fail: a recomputation that differs, or NaN, is a MISMATCH that names NaN."""
    assert not compare("x", "y", torch.tensor([1.0]), torch.tensor([1.5])).ok
    nan = compare("x", "y", torch.tensor([1.0]), torch.tensor([math.nan]))
    assert not nan.ok and "MISMATCH" in nan.summary and "NaN" in nan.summary and "nan" not in nan.summary


def test_the_walk_is_the_same_twice(default_walk):
    again = walkthrough(*toy_example()[:2], **toy_example()[2])
    for a, b in zip(default_walk.steps, again.steps):
        for m, n in zip(a.matrices, b.matrices):
            assert torch.equal(m.values, n.values)


@pytest.mark.parametrize("name", ["toy-encoder", "toy-seq2seq"])
def test_the_other_toys_walk_their_tasks(name):
    model, ids, options = toy_example(name)
    walk = walkthrough(model, ids, **options)
    assert walk.ok and walk.task
    last = walk.steps[-1]
    if name == "toy-encoder":
        assert last.title == "The masked word's probabilities" and "the most likely word is 'is'" in last.text
    else:
        assert any(step.title.startswith("Cross-attention") for step in walk.steps)
        predicted = [last.matrices[0].cols[int(i)] for i in last.matrices[0].values.argmax(-1)]
        assert predicted == ["Hola", "Mundo,", "soy", "Alejandro!", "<EOS>"]


# Every architecture the core builds, generically from its config: tiny models (d_model 32, 2 layers).
BASE = dict(arch="decoder", vocab_size=99, d_model=32, n_heads=4, n_layers=2, d_ff=37, max_seq_len=32)
ARCHITECTURES = {
    "paper-post-norm": dict(norm_position="post", activation="relu"),
    "gqa-rotary-rmsnorm-swiglu": dict(n_kv_heads=2, pos_encoding="rotary", norm="rmsnorm", activation="swiglu"),
    "rotary-interleaved-partial": dict(pos_encoding="rotary", rotary_dim=4, rotary_layout="interleaved"),
    "rope-llama3-scaling": dict(pos_encoding="rotary", rope_scaling="llama3", rope_scaling_factor=8.0,
                                rope_original_max_len=16),
    "alibi": dict(pos_encoding="alibi"),
    "parallel-neox": dict(parallel_residual=True, pos_encoding="rotary", rotary_dim=4),
    "parallel-gptj": dict(parallel_residual=True, parallel_shared_norm=True),
    "sandwich-gemma": dict(norm_position="sandwich", norm="rmsnorm", norm_plus_one=True, activation="geglu_tanh",
                           pos_encoding="rotary", qk_norm="per_head", query_pre_attn_scalar=16.0, attn_softcap=20.0,
                           final_logit_softcap=10.0, sliding_window=3, layer_types=("sliding", "full"),
                           scale_embeddings=True),
    "post-sublayer-olmo": dict(norm_position="post_sublayer", norm="rmsnorm", qk_norm="across_heads",
                               pos_encoding="rotary"),
    "mixture-of-experts": dict(n_experts=4, n_experts_per_token=2, activation="swiglu", norm="rmsnorm"),
    "gpt2-learned": dict(pos_encoding="learned", activation="gelu_tanh"),
    "opt-projected": dict(pos_encoding="learned", pos_offset=2, d_embed=16),
    "bert-encoder": dict(arch="encoder", pos_encoding="learned", norm_position="post", embed_norm=True,
                         type_vocab_size=2, head="masked-lm", lm_head_transform=True, lm_head_bias=True, pooler=True),
    "encoder-decoder": dict(arch="encoder-decoder", decoder_n_layers=1),
}


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_every_architecture_walks_with_every_check_passing(name):
    config = ModelConfig(**{**BASE, **ARCHITECTURES[name]})
    model = build_model(config, seed=0)
    options = {"target_ids": [1, 2, 3, 4]} if config.arch == "encoder-decoder" else {}
    for layer in range(1 if config.arch == "encoder-decoder" else config.n_layers):
        walk = walkthrough(model, list(range(3, 13)), layer=layer, head=1, **options)
        assert walk.ok, [c.summary for step in walk.failures for c in step.checks if not c.ok]
        assert sum(len(step.worked) for step in walk.steps) >= 5


def test_sliding_window_layers_show_their_window():
    config = ModelConfig(**{**BASE, **ARCHITECTURES["sandwich-gemma"]})
    walk = walkthrough(build_model(config, seed=0), list(range(3, 13)), layer=0)
    mask = next(step for step in walk.steps if step.title == "The causal mask").matrices[0].values
    assert int(mask.sum(-1).max()) == 3  # each query sees itself and the 2 keys before it


def test_bad_arguments_name_the_range():
    model, ids, options = toy_example()
    with pytest.raises(ValueError, match=r"layer 5 is out of range: this model has 2 layers, choose 0 … 1"):
        walkthrough(model, ids, layer=5)
    with pytest.raises(ValueError, match=r"choose 0 … 1"):
        walkthrough(model, ids, head=2)
    with pytest.raises(ValueError, match="needs target_ids"):
        walkthrough(toy_example("toy-seq2seq")[0], ids)


def step_text(walk, title_start: str) -> str:
    step = next(step for step in walk.steps if step.title.startswith(title_start))
    return " ".join([step.equation, step.latex] + [m.name for m in step.matrices]
                    + [c.summary for c in step.checks] + [w.text for w in step.worked])


def test_the_narration_follows_the_model():
    # Llama's block: pre-norm RMSNorm, no biases, SwiGLU.
    llama = ModelConfig(**{**BASE, **ARCHITECTURES["gqa-rotary-rmsnorm-swiglu"], "attn_bias": False,
                           "attn_out_bias": False, "mlp_bias": False})
    walk = walkthrough(build_model(llama, seed=0), list(range(3, 13)))
    qkv = step_text(walk, "Queries, keys and values")
    assert "K = X̂·W_k" in qkv and "V = X̂·W_v" in qkv and "b_k" not in qkv and r"K = \hat X W_k" in qkv
    ffn = step_text(walk, "Feed-forward network")
    assert "FFN(x̂) = (SiLU(x̂·W_gate) ⊙ x̂·W_up)·W_down" in ffn
    assert "b_1" not in ffn and "b_2" not in ffn and "W_1" not in ffn and "W_down[" in ffn
    assert "gate" in next(s for s in walk.steps if s.title == "Feed-forward network").text
    norm = step_text(walk, "RMSNorm before the attention")
    assert "γ and ε" in norm and "β" not in norm
    # The paper's block: post-norm LayerNorm with biases, ReLU.
    toy_walk = walkthrough(*toy_example()[:2], **toy_example()[2])
    qkv = step_text(toy_walk, "Queries, keys and values")
    assert "Q = X·W_q + b_q,   K = X·W_k + b_k" in qkv
    assert "FFN(x) = max(0, x·W_1 + b_1)·W_2 + b_2" in step_text(toy_walk, "Feed-forward network")
    assert "γ, β and ε" in step_text(toy_walk, "Residual and LayerNorm")


def test_an_encoder_without_its_mask_guesses_the_words_that_are_there():
    model, _, options = toy_example("toy-encoder")
    tokenizer = model.tokenizer if hasattr(model, "tokenizer") else __import__("anatomy").load_tokenizer("toy-encoder")
    ids = tokenizer.encode("Hello World")
    walk = walkthrough(model, ids, **{**options, "tokens": tokenizer.labels(ids)})
    last = walk.steps[-1]
    assert last.title == "Each word's probabilities" and "has no <MASK>" in last.text and "after" not in last.text
    assert last.matrices[0].rows[0].startswith("at ")
